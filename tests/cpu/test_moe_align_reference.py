"""moe_align on the CPU: the torch reference (the CPU op) against the brute-force definition, the worst-case sizes,
the fake implementation's shapes, opcheck, input errors, and a host emulation of the kernels' schedule (warp
slices, CTA chunks, prefixes, scan, fill) that must reproduce the reference exactly."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.moe.kernel import CHUNK, SINGLE_MAX, THREADS
from humming_gen.reference.moe import local_experts, max_padded_size, moe_align_reference
from moe_cases import brute_force, expert_map, random_ids


def _as_lists(result) -> dict[str, list[int]]:
    return {k: v.tolist() for k, v in result._asdict().items()}


def _assert_same(got: dict[str, list[int]], want: dict[str, list[int]]) -> None:
    for name in want:
        assert got[name] == want[name], f"{name} differs: got {got[name][:40]}, want {want[name][:40]}"


@pytest.mark.parametrize("block_m", [16, 64, 128])
@pytest.mark.parametrize("topk", [1, 2, 8])
@pytest.mark.parametrize("m", [1, 5, 1000])
@pytest.mark.parametrize("num_experts", [1, 8, 64, 256])
def test_reference_matches_definition(num_experts, m, topk, block_m):
    seed = num_experts * 7919 + m * 31 + topk * 7 + block_m
    ids = random_ids(m, topk, num_experts, seed)
    _assert_same(_as_lists(hg.moe_align(ids, num_experts, block_m)), brute_force(ids, num_experts, block_m))
    dropped = random_ids(m, topk, num_experts, seed + 1, dropped=0.3, dtype=torch.int32)
    _assert_same(_as_lists(hg.moe_align(dropped, num_experts, block_m)), brute_force(dropped, num_experts, block_m))
    # expert parallelism: this rank holds about a quarter of the global experts
    local = max(1, num_experts // 4)
    table = expert_map(num_experts, local, rank=1 if num_experts >= 2 * local else 0, seed=seed)
    mapped = random_ids(m, topk, num_experts, seed + 2, dropped=0.1)
    _assert_same(_as_lists(hg.moe_align(mapped, local, block_m, table)), brute_force(mapped, local, block_m, table))


def test_reference_skips_out_of_range_ids():
    """The kernels skip ids past either end (no host check on a GPU); the reference does the same."""
    ids = random_ids(300, 4, 16, seed=5, dropped=0.1, out_of_range=True)
    assert int(ids.min()) < -1 and int(ids.max()) >= 16
    want = brute_force(ids, 16, 32)
    _assert_same(_as_lists(moe_align_reference(ids, 16, 32)), want)
    table = expert_map(16, 5, rank=2, seed=1)
    table[3] = 9  # a map entry past the local experts is skipped too
    _assert_same(_as_lists(moe_align_reference(ids, 5, 32, table)), brute_force(ids, 5, 32, table))


def test_worst_case_size_is_reached_and_never_exceeded():
    e, bm = 8, 16
    # every expert used once: the padding is at its largest
    singles = torch.arange(e).reshape(e, 1)
    assert int(moe_align_reference(singles, e, bm).num_tokens_post_pad) == max_padded_size(e, e, bm) == e * bm
    few = torch.tensor([[3]])  # fewer assignments than experts: the bound uses numel, not E
    assert max_padded_size(1, 256, 128) == 128 and moe_align_reference(few, 256, 128).sorted_ids.numel() == 128
    for seed in range(20):
        ids = random_ids(37, 3, e, seed, dropped=0.2)
        assert int(moe_align_reference(ids, e, bm).num_tokens_post_pad) <= max_padded_size(ids.numel(), e, bm)


def test_empty_input():
    got = _as_lists(hg.moe_align(torch.empty(0, 8, dtype=torch.int32), 16, 64))
    assert got == {"sorted_ids": [], "expert_ids": [], "num_tokens_post_pad": [0], "expert_offsets": [0] * 17,
                   "expert_counts": [0] * 16, "inverse": []}


def test_fake_shapes_depend_only_on_sizes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        ids = torch.empty(7, 8, dtype=torch.int64, device="cuda")
        table = torch.empty(256, dtype=torch.int32, device="cuda")
        out = torch.ops.humming_gen.moe_align(ids, 64, 16, table)
    max_padded = max_padded_size(56, 64, 16)
    assert max_padded == 56 + 56 * 15  # 56 assignments, at most 56 of the 64 experts used (a whole 56 blocks)
    assert [tuple(t.shape) for t in out] == [(max_padded,), (max_padded // 16,), (1,), (65,), (64,), (56,)]
    assert all(t.dtype == torch.int32 and t.device.type == "cuda" for t in out)


def test_opcheck_on_the_cpu():
    for args in [(random_ids(10, 2, 8, 0, dropped=0.2), 8, 16, None),
                 (random_ids(33, 4, 16, 1, dtype=torch.int32), 4, 8, expert_map(16, 4, 2, 3))]:
        result = torch.library.opcheck(torch.ops.humming_gen.moe_align.default, args)
        assert all(v == "SUCCESS" for v in result.values()), result


def test_compile_fullgraph_dynamic_m():
    def routed(ids):
        r = hg.moe_align(ids, 8, 16)
        return r.sorted_ids, r.inverse

    compiled = torch.compile(routed, fullgraph=True, dynamic=True)
    for m in (3, 10, 50):
        ids = random_ids(m, 2, 8, m)
        for got, want in zip(compiled(ids), routed(ids)):
            assert torch.equal(got, want)


@pytest.mark.parametrize("call, message", [
    (lambda: hg.moe_align(torch.zeros(4, 2, dtype=torch.float32), 8, 16), "topk_ids.dtype is torch.float32"),
    (lambda: hg.moe_align(torch.zeros(8, dtype=torch.int32), 8, 16), "topk_ids must be (M, topk)"),
    (lambda: hg.moe_align(torch.zeros(4, 2, dtype=torch.int32).t(), 8, 16), "must be contiguous"),
    (lambda: hg.moe_align(torch.zeros(4, 2, dtype=torch.int32), 0, 16), "num_experts must be an int >= 1, got 0"),
    (lambda: hg.moe_align(torch.zeros(4, 2, dtype=torch.int32), 8, 0), "block_m must be an int >= 1, got 0"),
    (lambda: hg.moe_align(torch.zeros(4, 2, dtype=torch.int32), 2048, 16), "num_experts = 2048 is above 1024"),
    (lambda: hg.moe_align(torch.full((4, 2), 8), 8, 16), "topk_ids must lie in [-1, 8)"),
    (lambda: hg.moe_align(torch.full((4, 2), -2), 8, 16), "got range [-2, -2]"),
    (lambda: hg.moe_align(torch.zeros(4, 2, dtype=torch.int32), 8, 16, torch.zeros(8, dtype=torch.float32)),
     "expert_map must be a contiguous 1-D int32 / int64"),
    (lambda: hg.moe_align(torch.zeros(4, 2, dtype=torch.int32), 2, 16, torch.tensor([0, 2])),
     "expert_map values must lie in [-1, 2)"),
    (lambda: hg.moe_align(torch.full((4, 2), 5), 2, 16, torch.tensor([0, 1, -1])), "topk_ids must lie in [-1, 3)"),
    (lambda: hg.moe_align(torch.zeros(4, 2, dtype=torch.int32), 8, 2 ** 30), "pads beyond"),
])
def test_errors_name_the_argument(call, message):
    with pytest.raises((ValueError, TypeError), match=None) as info:
        call()
    assert message in str(info.value), str(info.value)


# ---- the kernels' schedule, emulated on the host ---------------------------------------------------------------

def _expert_of_position(offsets: list[int], num_experts: int, position: int) -> int:
    lo, hi = 0, num_experts  # fill.cuh.j2's binary search
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if offsets[mid] <= position:
            lo = mid
        else:
            hi = mid
    return lo


def _emulate(ids: torch.Tensor, num_experts: int, block_m: int, table: torch.Tensor | None) -> dict[str, list[int]]:
    """The generated kernels step by step (templates/moe): grid and chunks as humming_gen.moe.align launches them,
    warps walking their slices 32 lanes at a time, prefixes over warps and CTAs, the scan, fill and scatter.
    Outputs start as poison (-7), so a position no loop writes shows."""
    numel = ids.numel()
    local = local_experts(ids, num_experts, table).tolist()
    single = numel <= SINGLE_MAX
    warps = THREADS["single" if single else "scatter"] // 32
    grid = 1 if single else -(-numel // CHUNK)
    chunk = -(-numel // (32 * warps)) * 32 * warps if single else CHUNK
    slice_ = chunk // warps
    max_padded = max_padded_size(numel, num_experts, block_m)
    out = {"sorted_ids": [-7] * max_padded, "expert_ids": [-7] * (max_padded // block_m),
           "num_tokens_post_pad": [-7], "expert_offsets": [-7] * (num_experts + 1),
           "expert_counts": [-7] * num_experts, "inverse": [-7] * numel}

    def bounds(b: int, w: int) -> tuple[int, int]:
        begin = min(b * chunk + w * slice_, numel)
        return begin, min(begin + slice_, numel)

    def steps(begin: int, end: int):
        for first in range(begin, end, 32):
            lanes = [local[i] if i < end else -1 for i in range(first, first + 32)]
            yield first, lanes

    counts_of = [[[0] * num_experts for _ in range(warps)] for _ in range(grid)]
    for b in range(grid):
        for w in range(warps):
            for _, lanes in steps(*bounds(b, w)):
                for e in set(lanes) - {-1}:
                    counts_of[b][w][e] += lanes.count(e)
    partials = [[sum(counts_of[b][w][e] for w in range(warps)) for e in range(num_experts)] for b in range(grid)]
    for b in range(grid):
        warp_next = [[0] * num_experts for _ in range(warps)]
        counts = [0] * num_experts
        for e in range(num_experts):
            running = sum(partials[c][e] for c in range(b))
            for w in range(warps):
                warp_next[w][e] = running
                running += counts_of[b][w][e]
            counts[e] = sum(partials[c][e] for c in range(grid))
        offsets = [0]
        for e in range(num_experts):
            offsets.append(offsets[-1] + -(-counts[e] // block_m) * block_m)
        total = offsets[-1]
        threads = THREADS["single" if single else "scatter"]
        first, stride = b * threads, grid * threads
        if b == 0:
            out["expert_offsets"], out["expert_counts"], out["num_tokens_post_pad"] = offsets, counts, [total]
        for t in range(threads):  # each thread's grid-stride loops of fill_outputs
            for blk in range(first + t, max_padded // block_m, stride):
                start = blk * block_m
                out["expert_ids"][blk] = _expert_of_position(offsets, num_experts, start) if start < total else -1
            for e in range((first + t) >> 5, num_experts, stride >> 5):
                for position in range(offsets[e] + counts[e] + t % 32, offsets[e + 1], 32):
                    out["sorted_ids"][position] = numel
            for position in range(total + first + t, max_padded, stride):
                out["sorted_ids"][position] = numel
        for w in range(warps):
            for first_i, lanes in steps(*bounds(b, w)):
                begin, end = bounds(b, w)
                for lane, e in enumerate(lanes):
                    i = first_i + lane
                    if i >= end:
                        continue
                    position = -1
                    if e >= 0:
                        position = offsets[e] + warp_next[w][e] + lanes[:lane].count(e)
                        out["sorted_ids"][position] = i
                    out["inverse"][i] = position
                for e in set(lanes) - {-1}:
                    warp_next[w][e] += lanes.count(e)
    return out


@pytest.mark.parametrize("m, topk, num_experts, block_m, mapped", [
    (1, 8, 256, 64, False),       # decode: one CTA, most warps idle
    (5, 2, 3, 16, True),
    (512, 8, 64, 16, False),      # numel = SINGLE_MAX: the largest single-CTA case
    (513, 8, 64, 48, True),       # one past: two CTAs of the multi-CTA pair, a block_m that is no power of two
    (1500, 8, 300, 128, False),   # three CTAs, the last one partly empty; more experts than threads per CTA
])
def test_kernel_schedule_reproduces_the_reference(m, topk, num_experts, block_m, mapped):
    table = expert_map(2 * num_experts, num_experts, 1, seed=m) if mapped else None
    ids = random_ids(m, topk, 2 * num_experts if mapped else num_experts, seed=m + topk, dropped=0.1,
                     out_of_range=True)
    _assert_same(_emulate(ids, num_experts, block_m, table),
                 _as_lists(moe_align_reference(ids, num_experts, block_m, table)))

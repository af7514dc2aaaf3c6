"""humming_gen.moe_align on the GPU against the torch reference (humming_gen.reference.moe), every output bit for
bit, padding and the tail past the padded total included: outputs are poisoned before the launch. One-CTA and
multi-CTA kernels, int32 / int64 ids, expert maps, -1 and out-of-range ids; opcheck, CUDA-graph replay with new
routing, no host synchronisation, torch.compile at dynamic M."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.moe.align import _empty_outputs, _launch
from humming_gen.moe.kernel import CHUNK, SINGLE_MAX
from humming_gen.reference.moe import moe_align_reference
from moe_cases import expert_map, random_ids

pytestmark = pytest.mark.gpu

POISON = -0x55555556  # 0xAAAAAAAA as int32: no output ever holds it


def _aligned(ids: torch.Tensor, num_experts: int, block_m: int, table: torch.Tensor | None):
    """The kernels' outputs, written into tensors filled with POISON first."""
    outputs = _empty_outputs(ids, num_experts, block_m)
    for t in outputs:
        t.fill_(POISON)
    _launch(ids, num_experts, block_m, table, outputs)
    return outputs


def _check(got, ids: torch.Tensor, num_experts: int, block_m: int, table: torch.Tensor | None) -> None:
    want = moe_align_reference(ids.cpu(), num_experts, block_m, None if table is None else table.cpu())
    for name, g, w in zip(want._fields, got, want):
        g = g.cpu()
        assert g.dtype == torch.int32 and g.shape == w.shape, (name, g.shape, w.shape)
        bad = (g != w).nonzero().flatten()
        assert bad.numel() == 0, (f"{name}: {bad.numel()} of {w.numel()} entries differ, first at {int(bad[0])}: "
                                  f"got {int(g[bad[0]])}, want {int(w[bad[0]])}")


# (M, topk): decode, a few tokens, the largest one-CTA case, one past it (two CTAs), a ragged last CTA, 16k tokens
SIZES = [(1, 8), (5, 2), (SINGLE_MAX // 8, 8), (SINGLE_MAX + 1, 1), (1000, 8), (16384, 8)]
CASES = []
for _e in (1, 8, 64, 256):
    for _n, (_m, _k) in enumerate(SIZES):
        _bm = (16, 64, 128)[(_n + _e) % 3]
        _dtype = "int64" if _n % 2 else "int32"
        CASES.append(pytest.param(_e, _m, _k, _bm, _dtype, id=f"e{_e}-m{_m}-k{_k}-bm{_bm}-{_dtype}"))


@pytest.mark.parametrize("variant", ["plain", "dropped", "mapped"])
@pytest.mark.parametrize("num_experts, m, topk, block_m, dtype", CASES)
def test_matches_reference(num_experts, m, topk, block_m, dtype, variant):
    seed = num_experts * 131 + m + topk
    torch_dtype = getattr(torch, dtype)
    table = None
    if variant == "mapped":  # this rank holds num_experts of 4 * num_experts global experts
        table = expert_map(4 * num_experts, num_experts, 2, seed=seed).cuda()
        ids = random_ids(m, topk, 4 * num_experts, seed, dropped=0.05, dtype=torch_dtype).cuda()
    else:
        ids = random_ids(m, topk, num_experts, seed, dropped=0.3 if variant == "dropped" else 0.0,
                         dtype=torch_dtype).cuda()
    got = _aligned(ids, num_experts, block_m, table)
    torch.cuda.synchronize()
    _check(got, ids, num_experts, block_m, table)


@pytest.mark.parametrize("m, topk", [(100, 4), (3 * CHUNK // 4 + 7, 4)], ids=["one-cta", "multi-cta"])
def test_out_of_range_ids_are_skipped(m, topk):
    ids = random_ids(m, topk, 32, seed=m, dropped=0.1, out_of_range=True).cuda()
    _check(_aligned(ids, 32, 64, None), ids, 32, 64, None)
    table = expert_map(32, 12, 1, seed=2)
    table[5] = 40  # a map entry past the local experts
    table = table.cuda()
    _check(_aligned(ids, 12, 64, table), ids, 12, 64, table)


@pytest.mark.parametrize("m, topk", [(7, 8), (4 * CHUNK, 8)], ids=["one-cta", "multi-cta"])
def test_many_experts_odd_block_int64_map(m, topk):
    """1024 experts (dynamic shared memory above 48 KiB), block_m 48, an int64 map: 1024 of 1500 global experts."""
    table = expert_map(1500, 1024, 0, seed=7, dtype=torch.int64).cuda()
    ids = random_ids(m, topk, 1500, seed=8, dropped=0.05).cuda()
    _check(_aligned(ids, 1024, 48, table), ids, 1024, 48, table)


@pytest.mark.parametrize("m", [1, 300, 16384])
def test_one_expert_takes_everything_or_nothing(m):
    ids = torch.full((m, 8), 5, dtype=torch.int32, device="cuda")
    _check(_aligned(ids, 64, 128, None), ids, 64, 128, None)
    ids.fill_(-1)
    _check(_aligned(ids, 64, 128, None), ids, 64, 128, None)


def test_no_tokens():
    ids = torch.empty(0, 8, dtype=torch.int32, device="cuda")
    got = _aligned(ids, 16, 64, None)
    _check(got, ids, 16, 64, None)
    assert int(got[2].cpu()) == 0


def test_public_api_and_device_errors():
    ids = random_ids(33, 4, 16, seed=1).cuda()
    result = hg.moe_align(ids, 16, 32)
    assert isinstance(result, hg.MoeAlignment) and result.sorted_ids.device == ids.device
    _check(tuple(result), ids, 16, 32, None)
    with pytest.raises(ValueError, match="expert_map is on cpu"):
        hg.moe_align(ids, 4, 32, expert_map(16, 4, 0, seed=1))


@pytest.mark.parametrize("m", [3, 1000])
def test_opcheck(m):
    args = (random_ids(m, 8, 64, seed=m, dropped=0.1).cuda(), 16, 64, expert_map(64, 16, 3, seed=1).cuda())
    result = torch.library.opcheck(torch.ops.humming_gen.moe_align.default, args)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("m", [4, 2000], ids=["one-cta", "multi-cta"])
def test_cuda_graph_replay_with_new_routing(m):
    static = random_ids(m, 8, 256, seed=0).cuda()
    hg.moe_align(static, 256, 64)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = hg.moe_align(static, 256, 64)
    for seed in (1, 2):
        for t in result:
            t.fill_(POISON)
        static.copy_(random_ids(m, 8, 256, seed=seed, dropped=0.2).cuda())
        graph.replay()
        torch.cuda.synchronize()
        _check(tuple(result), static, 256, 64, None)


def test_no_host_sync():
    ids = random_ids(3000, 8, 128, seed=3).cuda()
    table = expert_map(128, 32, 1, seed=4).cuda()
    for m in (7, 3000):
        hg.moe_align(ids[:m], 32, 16, table)  # compile and load first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        results = [hg.moe_align(ids[:m], 32, 16, table) for m in (7, 3000)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for m, result in zip((7, 3000), results):
        _check(tuple(result), ids[:m], 32, 16, table)


def test_compile_fullgraph_dynamic_m():
    def routed(ids):
        r = hg.moe_align(ids, 64, 16)
        return r.sorted_ids, r.expert_ids, r.inverse

    compiled = torch.compile(routed, fullgraph=True, dynamic=True)
    for m in (3, 100, 1500):
        ids = random_ids(m, 4, 64, seed=m).cuda()
        for got, want in zip(compiled(ids), routed(ids)):
            assert torch.equal(got, want)

"""The MoE top-k reduction kernel (humming_gen.moe.reduce) on the GPU, bit for bit:

- against topk_sum_reference (elementwise fp32 adds in the kernel's order, on the GPU);
- against the torch path QuantMoE took before the kernel: torch.sum(y.view(M, top_k, H), dim=1,
  dtype=torch.float32) over rows whose skipped slots hold zeros, then the cast (and copy_ into `out`). Same
  summation order, so the same bits: this is the promise that replacing the torch path changed no output.

Skipped slots come from moe_align's `inverse` (-1 ids, out-of-range ids, experts expert_map sends to -1); their rows
hold NaN here, so reading one would show. Outputs are poisoned before launch.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.moe.reduce import topk_reduce
from humming_gen.reference.moe import topk_sum_reference
from moe_cases import expert_map, random_ids

pytestmark = pytest.mark.gpu

# (M, top_k, H): decode, ragged rows (H / 8 not a multiple of the CTA's 128 vectors), gpt-oss (2880), top_k above
# the 4 accumulators (8, 9), DeepSeek-V3 at M = 4096 (H = 7168), a wide row
CASES = [(1, 1, 8), (1, 8, 7168), (7, 2, 2880), (128, 4, 2048), (300, 9, 264), (4096, 8, 7168), (64, 6, 16384),
         (33, 3, 40)]


def _rows(m: int, top_k: int, h: int, dtype, seed: int) -> torch.Tensor:
    """Router-weighted-looking rows spanning many binades (so the summation order shows in the bits)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    scale = torch.exp2(torch.randint(-10, 10, (m * top_k, 1), generator=g, device="cuda").float())
    return (torch.randn(m * top_k, h, generator=g, device="cuda") * scale).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _first_difference(got: torch.Tensor, want: torch.Tensor) -> str:
    bad = (_bits(got) != _bits(want)).nonzero()
    if not bad.numel():
        return ""
    r, c = bad[0].tolist()
    return (f"{bad.shape[0]} of {want.numel()} differ, first at ({r}, {c}): got {got[r, c].item()}, "
            f"want {want[r, c].item()}")


@pytest.mark.parametrize("variant", ["plain", "dropped", "mapped"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m, top_k, h", CASES, ids=[f"m{m}-k{k}-h{h}" for m, k, h in CASES])
def test_bitwise_equal_to_the_torch_path(m, top_k, h, dtype, variant):
    seed = m * 31 + top_k * 7 + h
    num_experts = 16
    table = None
    if variant == "mapped":  # this rank holds 16 of 64 global experts: most slots are elsewhere
        table = expert_map(64, num_experts, 1, seed=seed).cuda()
        ids = random_ids(m, top_k, 64, seed, dropped=0.1, dtype=torch.int32).cuda()
    else:
        ids = random_ids(m, top_k, num_experts, seed, dropped=0.2 if variant == "dropped" else 0.0,
                         out_of_range=variant == "dropped", dtype=torch.int32).cuda()
    routing = hg.moe_align(ids, num_experts, 16, table)
    y = _rows(m, top_k, h, dtype, seed)
    skipped = routing.inverse < 0
    if variant != "plain":
        assert skipped.any()
    garbage = torch.where(skipped[:, None], torch.full((), float("nan"), dtype=dtype, device="cuda"), y)
    zeroed = torch.where(skipped[:, None], torch.zeros((), dtype=dtype, device="cuda"), y)

    out = torch.full((m, h), float("nan"), dtype=dtype, device="cuda")
    assert topk_reduce(garbage, routing.inverse, top_k, out) is out
    torch.cuda.synchronize()
    new = topk_reduce(garbage, routing.inverse, top_k)  # its own output tensor

    # the torch path QuantMoE.run took before: fp32 sum over the slots (zeros where skipped), cast / copy_ into out
    total = torch.sum(zeroed.view(m, top_k, h), dim=1, dtype=torch.float32)
    old_new, old_out = total.to(dtype), torch.full_like(out, float("nan")).copy_(total)
    assert not (message := _first_difference(out, old_out)), "out= vs torch.sum then copy_: " + message
    assert not (message := _first_difference(new, old_new)), "vs torch.sum then .to: " + message
    ref = topk_sum_reference(garbage, routing.inverse, top_k, dtype)
    assert not (message := _first_difference(out, ref)), "vs topk_sum_reference: " + message
    if variant == "mapped":
        dropped_tokens = skipped.view(m, top_k).all(dim=1)
        assert (_bits(out[dropped_tokens]) == 0).all(), "a token with every slot skipped must give +0.0 rows"


def test_strided_and_unaligned_out_and_y():
    """`out` as a row-strided view (written in place, its stride passed) and at an odd element offset (through a
    temporary); y as a row-strided view of a wider buffer."""
    m, top_k, h, dtype = 37, 4, 1024, torch.bfloat16
    ids = random_ids(m, top_k, 8, 3, dropped=0.25, dtype=torch.int32).cuda()
    routing = hg.moe_align(ids, 8, 16)
    wide = _rows(m, top_k, h + 64, dtype, 5)
    y = wide[:, 8:8 + h]
    want = topk_sum_reference(y, routing.inverse, top_k, dtype)
    buf = torch.full((m, h + 40), float("nan"), dtype=dtype, device="cuda")
    for out in (buf[:, 16:16 + h], buf[:, 1:1 + h]):
        assert topk_reduce(y, routing.inverse, top_k, out) is out
        assert not (message := _first_difference(out, want)), message


def test_cuda_graph_replay_without_sync():
    m, top_k, h, dtype = 64, 8, 2048, torch.bfloat16
    ids = random_ids(m, top_k, 16, 9, dropped=0.1, dtype=torch.int32).cuda()
    routing = hg.moe_align(ids, 16, 16)
    y = _rows(m, top_k, h, dtype, 9)
    out = torch.empty(m, h, dtype=dtype, device="cuda")
    topk_reduce(y, routing.inverse, top_k, out)  # warm: compiled and loaded
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        topk_reduce(y, routing.inverse, top_k, out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        topk_reduce(y, routing.inverse, top_k, out)
    torch.cuda.current_stream().wait_stream(stream)
    y.copy_(_rows(m, top_k, h, dtype, 10))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = topk_sum_reference(y, routing.inverse, top_k, dtype)
    assert not (message := _first_difference(out, want)), message


@pytest.mark.parametrize("m", [1, 7, 128, 1000])
def test_quant_moe_output_is_the_old_torch_paths_bits(m):
    """QuantMoE's forward with the indexed down GEMM (top-k reduction kernel, GEMM2 into torch.empty rows) against its
    former body run by hand: the same GEMM launches into zero-filled rows, then torch.sum over the slots in fp32 and
    the cast. MoE GEMMs never split K, so their rows are the same bits in both; the outputs must be too. (The grouped
    down GEMM applies the router weight in the reduction instead: test_quant_moe_grouped_down.py checks its bits.)"""
    torch.manual_seed(m)
    e, h, i, top_k = 16, 512, 256, 8
    moe = hg.QuantMoE.from_float(torch.randn(e, 2 * i, h, device="cuda") * 0.05,
                                 torch.randn(e, h, i, device="cuda") * 0.05, "w4a16-int4-g128", dtype=torch.bfloat16,
                                 down_gemm="indexed")
    x = torch.randn(m, h, device="cuda").bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(m, e, device="cuda"), -1), top_k, dim=-1)
    ids = torch.where(torch.rand(m, top_k, device="cuda") < 0.1, torch.full_like(ids, -1), ids).to(torch.int32)
    got = moe(x, weights, ids)

    gemm1, gemm2 = moe._launchers[moe.bucket_for(m, top_k)]
    routing = hg.moe_align(ids, e, gemm1.kernel.plan.tuning.block_m)
    act = torch.empty(m * top_k, i, dtype=torch.bfloat16, device="cuda")
    assert moe.fused_activation
    gemm1.moe(x, act, routing, top_k)
    y = torch.zeros(m * top_k, h, dtype=torch.bfloat16, device="cuda")
    gemm2.moe(act, y, routing, 1, weights.float().contiguous().view(-1))
    old = torch.sum(y.view(m, top_k, h), dim=1, dtype=torch.float32).to(torch.bfloat16)
    assert not (message := _first_difference(got, old)), message

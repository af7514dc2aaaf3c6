"""QuantMoE(topk_reduce="atomic") on the GPU: GEMM2's epilogue adds each router-weighted assignment row into its
token's fp32 row (red.global.add.f32), then a cast. Against the float64 reference from the dequantized experts
(relative Frobenius error below TOLERANCE: bf16 activations and the bf16 rounding of GEMM1's output / the gated
activation, as in test_quant_moe; the atomic sum itself adds fp32 values, in any order), and against the
deterministic layer on the same weights (closer still: only the rounding of GEMM2's rows to bf16 and the summation
order differ). Both pipelines (pipeline="standard" everywhere, "warp_specialized" on sm_90a), M = 0 / 1 / 7 / 128 /
4096; dropped slots (-1 ids, experts expert_map sends to -1) add nothing and a token with every slot dropped gives a
zero row; `out` is poisoned (NaN) before the call.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import reference_fused_moe
from humming_gen.targets import Target

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 8e-3}   # against float64, as test_quant_moe
AGAINST_DETERMINISTIC = {torch.bfloat16: 8e-3, torch.float16: 2e-3}
E, H, I, TOP_K = 16, 512, 256, 8
MS = [0, 1, 7, 128, 4096]


def _layers(pipeline: str, dtype, scheme: str = "w4a16-int4-g128", seed: int = 0):
    torch.manual_seed(seed)
    s = hg.scheme(scheme)
    q13 = s.quantize(torch.randn(E, 2 * I, H, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(E, H, I, device="cuda") * 0.05)
    b2 = (torch.randn(E, H, device="cuda") * 0.1).to(dtype)
    try:
        atomic = hg.QuantMoE.from_quantized(q13, q2, dtype=dtype, bias2=b2, pipeline=pipeline, topk_reduce="atomic")
    except ValueError as e:
        if pipeline == "warp_specialized":
            pytest.skip(f"no warp-specialized MoE kernels here: {e}")
        raise
    plain = hg.QuantMoE.from_quantized(q13, q2, dtype=dtype, bias2=b2, pipeline=pipeline)
    assert all(k[1].plan.tuning.pipeline == pipeline for k in atomic._kernels)
    assert all(k[1].name.endswith("_atomic") for k in atomic._kernels)
    return atomic, plain, q13.dequantize().double(), q2.dequantize().double(), b2.double()


def _routing(m: int, num_ids: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    weights, ids = torch.topk(torch.softmax(torch.randn(m, num_ids, device="cuda", generator=g), -1), TOP_K, dim=-1)
    ids = torch.where(torch.rand(m, TOP_K, device="cuda", generator=g) < 0.1, torch.full_like(ids, -1), ids)
    if m > 2:
        ids[2] = -1  # every slot dropped: a zero row
    return weights, ids.to(torch.int32)


def _rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("pipeline", ["standard", "warp_specialized"])
@pytest.mark.parametrize("m", MS, ids=[f"m{m}" for m in MS])
def test_atomic_matches_reference_and_deterministic(m, pipeline, dtype):
    atomic, plain, w13, w2, b2 = _layers(pipeline, dtype)
    x = torch.randn(m, H, device="cuda").to(dtype)
    weights, ids = _routing(m, E, seed=m + 1)
    out = torch.full((m, H), float("nan"), dtype=dtype, device="cuda")
    assert atomic(x, weights, ids) is not None
    got = hg.fused_moe(x, atomic, weights, ids, output=out)
    assert got.data_ptr() == out.data_ptr() and out.shape == (m, H)
    if m == 0:
        return
    assert torch.isfinite(out).all(), "non-finite output (an unwritten or poisoned element)"
    ref = reference_fused_moe(x.double(), w13, w2, weights.double(), ids, activation=atomic.activation,
                              gate_up_layout=atomic.gate_up_layout, bias2=b2)
    err = _rel(out, ref)
    assert err < TOLERANCE[dtype], f"relative error {err:.3g} against float64 (limit {TOLERANCE[dtype]})"
    det = _rel(out, plain(x, weights, ids).double())
    assert det < AGAINST_DETERMINISTIC[dtype], f"relative difference {det:.3g} to topk_reduce='deterministic'"
    if m > 2:
        assert (out[2] == 0).all(), "a token whose slots are all dropped must give a zero row"


@pytest.mark.parametrize("pipeline", ["standard", "warp_specialized"])
def test_atomic_with_an_expert_map(pipeline):
    """Expert parallelism: global ids, this rank holds the upper half; other ranks' experts add nothing."""
    atomic, _, w13, w2, b2 = _layers(pipeline, torch.bfloat16, seed=3)
    table = torch.full((2 * E,), -1, dtype=torch.int32, device="cuda")
    table[E:] = torch.arange(E, dtype=torch.int32, device="cuda")
    m = 300
    x = torch.randn(m, H, device="cuda").bfloat16()
    weights, ids = _routing(m, 2 * E, seed=7)
    out = torch.full((m, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    hg.fused_moe(x, atomic, weights, ids, expert_map=table, output=out)
    ref = reference_fused_moe(x.double(), w13, w2, weights.double(), ids, expert_map=table, bias2=b2)
    assert _rel(out, ref) < TOLERANCE[torch.bfloat16]
    elsewhere = ((ids < 0) | (table[ids.long().clamp(min=0)] < 0)).all(dim=1)
    assert elsewhere.any() and (out[elsewhere] == 0).all()


def test_atomic_with_8bit_activations():
    """W8A8 (per-token fp8 activations; int8 where the target has no fp8 MMA): the atomic store multiplies by the
    token scale of the row the assignment read, as the row store does."""
    scheme = "w8a8-fp8-channel" if Target.current().has("mma_fp8") else "w8a8-int8-channel"
    atomic, plain, _, _, _ = _layers("standard", torch.bfloat16, scheme=scheme, seed=5)
    for m in (7, 1000):
        x = torch.randn(m, H, device="cuda").bfloat16()
        weights, ids = _routing(m, E, seed=m)
        got, want = atomic(x, weights, ids), plain(x, weights, ids)
        assert torch.isfinite(got).all() and _rel(got, want.double()) < AGAINST_DETERMINISTIC[torch.bfloat16]


def test_atomic_cuda_graph_replay_without_sync():
    from test_quant_moe import capture_without_sync

    atomic = _layers("standard", torch.bfloat16, seed=9)[0]
    m = 64
    x = torch.randn(m, H, device="cuda").bfloat16()
    weights, ids = _routing(m, E, seed=1)
    graph, out = capture_without_sync(atomic, x, weights, ids)
    weights2, ids2 = _routing(m, E, seed=2)
    weights.copy_(weights2)
    ids.copy_(ids2)
    graph.replay()
    torch.cuda.synchronize()
    want = atomic(x, weights, ids)
    assert _rel(out, want.double()) < 1e-3  # the same sums, added in another order

"""QuantMoE's warp-specialized indexed GEMMs (sm_90a: the buckets from 17 rows per expert on) on the GPU against the
float64 reference MoE, beside the standard pipeline's buckets of the same layer.

GEMM-level checks launch a bucket's kernels into NaN-poisoned outputs: a GEMM must write exactly the routed
assignment rows. Tolerances are relative Frobenius errors, as tests/gpu/test_quant_moe.py (QuantMoE rounds GEMM1's
output and the gated activation to the layer's dtype before GEMM2; the reference does too).
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import local_experts, reference_fused_moe, routed_rows_gemm
from test_quant_moe import _rel, _routing, capture_without_sync

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 8e-3}
SCHEMES = {
    "int4-g128": dict(weight="int4", group_size=128),
    "uint4-g64-zp": dict(weight="uint4", group_size=64, zero_point="int"),
    "int8-channel": dict(weight="int8"),
    "mxfp4": dict(weight="float4e2m1", group_size=32, scale_dtype="float8e8m0"),
}
# (id, scheme, dtype, experts, hidden, intermediate, top_k, activation, gate_up_layout, biases)
CASES = [
    ("int4-e8-top2-silu-split", "int4-g128", torch.bfloat16, 8, 512, 256, 2, "silu_mul", "split", False),
    ("mxfp4-e64-top8-swiglu-interleaved-bias", "mxfp4", torch.bfloat16, 64, 512, 256, 8, "swiglu_oai", "interleaved",
     True),
    # H = 384: the down GEMM's last 256-row tile holds one 128-row layout block
    ("int8-e8-top2-gelu-upfirst-bias-fp16", "int8-channel", torch.float16, 8, 384, 384, 2, "gelu_mul", "up_first",
     True),
    ("uint4zp-e64-top8-silu-split", "uint4-g64-zp", torch.bfloat16, 64, 256, 128, 8, "silu_mul", "split", False),
]
# rows per expert M * top_k / E: E = 8, top-2 -> 1, 2, 25, 50, 75, 1024; E = 64, top-8 -> 1, 1, 13, 25, 38, 512: the
# standard buckets (8, 16) and every warp-specialized one (token tiles 64, 128) in one sequence of batches
MS = (1, 7, 100, 200, 300, 4096)


def _layer(case, seed=0, fused=None, pipeline=None, quantized=None):
    _, scheme, dtype, e, h, i, top_k, act, layout, biases = case
    torch.manual_seed(seed)
    if quantized is None:
        s = hg.QuantScheme(**SCHEMES[scheme])
        q13 = s.quantize(torch.randn(e, 2 * i, h, device="cuda") * 0.05)
        q2 = s.quantize(torch.randn(e, h, i, device="cuda") * 0.05)
        b13 = (torch.randn(e, 2 * i, device="cuda") * 0.1).to(dtype) if biases else None
        b2 = (torch.randn(e, h, device="cuda") * 0.1).to(dtype) if biases else None
    else:
        q13, q2, b13, b2 = quantized
    moe = hg.QuantMoE.from_quantized(q13, q2, activation=act, gate_up_layout=layout, bias13=b13, bias2=b2,
                                     dtype=dtype, fused_activation=fused, pipeline=pipeline)
    return moe, q13, q2, b13, b2


def _reference(moe, q13, q2, b13, b2, x, weights, ids, expert_map=None):
    return reference_fused_moe(x.double(), q13.dequantize().double(), q2.dequantize().double(), weights.double(), ids,
                               activation=moe.activation, gate_up_layout=moe.gate_up_layout, expert_map=expert_map,
                               bias13=None if b13 is None else b13.double(),
                               bias2=None if b2 is None else b2.double(), intermediate_dtype=moe.dtype,
                               fused_activation=moe.fused_activation)


def _pipelines(moe, m, top_k):
    g1, g2 = moe._launchers[moe.bucket_for(m, top_k)]
    return g1.kernel.plan.pipeline, g2.kernel.plan.pipeline


@pytest.mark.parametrize("fused", [False, True], ids=["torch-activation", "fused-activation"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_quant_moe_with_warp_specialized_buckets_matches_reference(case, fused):
    moe, q13, q2, b13, b2 = _layer(case, fused=fused)
    dtype, top_k = case[2], case[6]
    errors, seen = {}, set()
    for m in MS:
        x = torch.randn(m, moe.hidden, device="cuda").to(dtype)
        weights, ids = _routing(m, moe.num_experts, top_k, drop=0.1 if m > 1 else 0.0)  # -1 ids: skipped slots
        out = torch.full((m, moe.hidden), float("nan"), dtype=dtype, device="cuda")
        hg.fused_moe(x, moe, weights, ids, output=out)
        ref = _reference(moe, q13, q2, b13, b2, x, weights, ids)
        assert torch.isfinite(out).all(), f"m={m}: non-finite output"
        errors[m] = _rel(out, ref)
        seen.add(_pipelines(moe, m, top_k))
    assert seen == {("standard", "standard"), ("warp_specialized", "warp_specialized")}, seen
    bad = {m: err for m, err in errors.items() if not err < TOLERANCE[dtype]}
    assert not bad, f"{case[0]}: relative error above {TOLERANCE[dtype]} at {bad} (all {errors})"


@pytest.mark.parametrize("rows", [25, 50, 200], ids=lambda r: f"rows{r}-per-expert")  # token tiles 64, 64, 128
@pytest.mark.parametrize("case", CASES[:3], ids=[c[0] for c in CASES[:3]])
def test_warp_specialized_gemms_write_exactly_the_routed_rows(case, rows):
    """Both GEMMs of a warp-specialized bucket alone, into NaN-poisoned outputs: routed assignment row i of GEMM1
    holds x[i // top_k] @ W13_e^T (+ b13_e), of GEMM2 weight_i * (a[i] @ W2_e^T (+ b2_e)); rows of dropped
    assignments stay untouched."""
    moe, q13, q2, b13, b2 = _layer(case, seed=3, fused=False)  # a fused GEMM1 writes act(gate, up)
    dtype, top_k, e = case[2], case[6], case[3]
    m = rows * e // top_k
    bucket = moe.bucket_for(m, top_k)
    gemm1, gemm2 = moe._launchers[bucket]
    assert gemm1.kernel.plan.pipeline == gemm2.kernel.plan.pipeline == "warp_specialized"
    x = torch.randn(m, moe.hidden, device="cuda").to(dtype)
    weights, ids = _routing(m, e, top_k, drop=0.2)
    routing = hg.moe_align(ids, e, gemm1.kernel.plan.tuning.block_m)
    expert = local_experts(ids, e).reshape(-1)
    routed = expert >= 0
    rows = (torch.arange(m * top_k, device="cuda") // top_k)[routed]

    h = torch.full((m * top_k, 2 * moe.intermediate), float("nan"), dtype=dtype, device="cuda")
    gemm1.moe(x, h, routing, top_k)
    ref1 = routed_rows_gemm(x[rows], q13.dequantize(), expert[routed], b13)
    assert torch.isfinite(h[routed]).all(), "a routed row of GEMM1 was not written"
    assert torch.isnan(h[~routed]).all(), "GEMM1 wrote a dropped assignment's row"
    assert _rel(h[routed], ref1) < TOLERANCE[dtype]

    a2 = torch.randn(m * top_k, moe.intermediate, device="cuda").to(dtype)
    y = torch.full((m * top_k, moe.hidden), float("nan"), dtype=dtype, device="cuda")
    flat = weights.reshape(-1).float().contiguous()
    gemm2.moe(a2, y, routing, 1, flat)
    ref2 = routed_rows_gemm(a2[routed], q2.dequantize(), expert[routed], b2) * flat.double()[routed, None]
    assert torch.isfinite(y[routed]).all(), "a routed row of GEMM2 was not written"
    assert torch.isnan(y[~routed]).all(), "GEMM2 wrote a dropped assignment's row"
    assert _rel(y[routed], ref2) < TOLERANCE[dtype]


@pytest.mark.parametrize("case", [CASES[1], CASES[2]], ids=[CASES[1][0], CASES[2][0]])
def test_every_bucket_warp_specialized_matches_the_standard_layer(case):
    """QuantMoE(pipeline='warp_specialized'): every bucket's kernels warp-specialized (token tiles 8 .. 128), against
    the reference and the all-standard layer on the same weights."""
    ws, q13, q2, b13, b2 = _layer(case, seed=11, fused=True, pipeline="warp_specialized")
    std, *_ = _layer(case, fused=True, pipeline="standard", quantized=(q13, q2, b13, b2))
    assert {g.kernel.plan.pipeline for pair in ws._launchers for g in pair} == {"warp_specialized"}
    assert {g.kernel.plan.pipeline for pair in std._launchers for g in pair} == {"standard"}
    dtype, top_k = case[2], case[6]
    for m in (1, 7, 60, 300):
        x = torch.randn(m, ws.hidden, device="cuda").to(dtype)
        weights, ids = _routing(m, ws.num_experts, top_k, drop=0.1)
        out_ws, out_std = ws(x, weights, ids), std(x, weights, ids)
        ref = _reference(ws, q13, q2, b13, b2, x, weights, ids)
        assert _rel(out_ws, ref) < TOLERANCE[dtype], f"m={m}"
        assert _rel(out_ws, out_std.double()) < TOLERANCE[dtype], f"m={m}"


def test_expert_map_with_other_ranks_experts_on_warp_specialized_buckets():
    """Expert parallelism: global ids through expert_map (-1 for the other rank's half); a token whose slots are all
    elsewhere gets a zero row; M puts the batch on a warp-specialized bucket."""
    case = CASES[1]  # mxfp4, 64 experts, top-8, swiglu, interleaved, biases
    moe, q13, q2, b13, b2 = _layer(case, seed=5)
    e = moe.num_experts
    expert_map = torch.full((2 * e,), -1, dtype=torch.int32, device="cuda")
    expert_map[e:] = torch.arange(e, dtype=torch.int32, device="cuda")  # this rank holds the upper half
    m, top_k = 4096, case[6]
    x = torch.randn(m, moe.hidden, device="cuda").bfloat16()
    weights = torch.rand(m, top_k, device="cuda")
    ids = torch.randint(0, 2 * e, (m, top_k), device="cuda", dtype=torch.int32)
    ids[0] = torch.arange(top_k, device="cuda")  # every slot on the other rank
    ids[1, 0] = -1
    assert _pipelines(moe, m, top_k) == ("warp_specialized", "warp_specialized")
    out = moe(x, weights, ids, expert_map=expert_map)
    ref = _reference(moe, q13, q2, b13, b2, x, weights, ids, expert_map=expert_map)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert _rel(out, ref) < TOLERANCE[torch.bfloat16]


def test_cuda_graph_replay_with_new_routing_on_a_warp_specialized_bucket():
    """The units of the persistent grid follow the routed total read on the device: a captured forward replays
    correctly with a new routing (other experts, other padding), with no host sync."""
    case = CASES[0]
    moe, q13, q2, b13, b2 = _layer(case, seed=7)
    m, top_k = 300, case[6]
    assert _pipelines(moe, m, top_k) == ("warp_specialized", "warp_specialized")
    x = torch.randn(m, moe.hidden, device="cuda").bfloat16()
    weights, ids = _routing(m, moe.num_experts, top_k)
    graph, out = capture_without_sync(moe, x, weights, ids)
    new_weights, new_ids = _routing(m, moe.num_experts, top_k, drop=0.3)
    new_ids[: m // 2] = 0  # one crowded expert: more m blocks than the captured routing had
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    graph.replay()
    torch.cuda.synchronize()
    ref = _reference(moe, q13, q2, b13, b2, x, weights, ids)
    assert _rel(out, ref) < TOLERANCE[torch.bfloat16]

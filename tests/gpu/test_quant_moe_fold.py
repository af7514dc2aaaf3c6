"""QuantMoE w4a8-mxfp4-fp8 with folded e8m0 group scales (the warp-specialized MoE kernels widen e2m1 codes to e4m3
times 2^d, each expert row's 2^r multiplies the output; humming_gen.components.numeric.exponent_fold) and with the
planted fallback (one expert row of one GEMM spans more than the window: that GEMM promotes its group scales, the
other still folds), on the GPU against the float64 references of tests/gpu/test_quant_moe_a8_ws.py.

Weights: Gaussian times a power of two per (expert, row, group) drawn from 2^-4 .. 2^4, so the deltas and row
factors differ from group to group, row to row and expert to expert (a delta or row factor read for the wrong
row, k step or expert shows as a large error); built on the CPU from a seed, so whether a GEMM folds is known
(asserted). The fallback plants one group 2^-16 below the rest of its row. Routing, poisoning and tolerances as
test_quant_moe_a8_ws.py (the fold is exact, so its bounds hold).
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import local_experts
from test_quant_moe import _rel, _routing
from test_quant_moe_a8 import LAYER_TOLERANCE, _check_rows, _per_expert, _reference
from test_quant_moe_a8_ws import SMALL_M, SMALL_M_LAYER_TOLERANCE, _pipelines_of, _ragged_routing

pytestmark = pytest.mark.gpu

SCHEME = "w4a8-mxfp4-fp8"
M_VALUES = (1, 7, 128, 1000)
EXPERTS = (8, 19)
H, I = 512, 256
ACTIVATIONS = (("swiglu_oai", "interleaved"), ("silu_mul", "split"))  # gpt-oss's, and Qwen3's / DeepSeek's
PLANTS = (None, "w13", "w2")  # None: both GEMMs fold; else that GEMM's weight has a row that does not
TOLERANCE = LAYER_TOLERANCE["float8e4m3"]


def _weight(e: int, n: int, k: int, seed: int, wide: bool) -> torch.Tensor:
    """(e, n, k) on the CPU; wide: row 5 of expert e // 2 gets a group 12+ binades below its others."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(e, n, k, generator=g) * 0.02
    w *= 2.0 ** torch.randint(-4, 5, (e, n, k // 32), generator=g).repeat_interleave(32, dim=2)
    if wide:
        w[e // 2, 5, 64:96] = w[e // 2, 5, 64:96].abs().clamp(min=0.01) * 2.0 ** -16
    return w


def _layer(e: int, *, seed: int, plant: str | None, pipeline: str | None = None, dtype=torch.bfloat16,
           biases: bool = False, fused: bool = False, activation: str = "silu_mul", layout: str = "split"):
    s = hg.scheme(SCHEME)
    q13 = s.quantize(_weight(e, 2 * I, H, seed, plant == "w13").cuda())
    q2 = s.quantize(_weight(e, H, I, seed + 1, plant == "w2").cuda())
    torch.manual_seed(seed)
    b13 = (torch.randn(e, 2 * I, device="cuda") * 0.1).to(dtype) if biases else None
    b2 = (torch.randn(e, H, device="cuda") * 0.1).to(dtype) if biases else None
    moe = hg.QuantMoE.from_quantized(q13, q2, activation=activation, gate_up_layout=layout, bias13=b13, bias2=b2,
                                     dtype=dtype, fused_activation=fused, pipeline=pipeline)
    assert moe.fold_scales == (plant != "w13", plant != "w2"), moe.fold_scales
    for pair in moe._launchers:
        for g, folds in zip(pair, moe.fold_scales):
            ws = g.kernel.plan.pipeline == "warp_specialized"
            assert g.kernel.name.endswith("_fold") == (ws and folds), g.kernel.name
    return moe, q13, q2, b13, b2


def _layer_cases():
    for activation, layout in ACTIVATIONS:
        for e in EXPERTS:
            for plant in PLANTS:
                for fused in (False, True):
                    yield pytest.param(activation, layout, e, plant, fused,
                                       id=f"{activation}-e{e}-{plant or 'folded'}-{'fused' if fused else 'torch'}")


@pytest.mark.parametrize("activation,layout,e,plant,fused", list(_layer_cases()))
def test_folded_quant_moe_matches_reference(activation: str, layout: str, e: int, plant: str | None,
                                            fused: bool) -> None:
    """fused_moe into a poisoned (M, H) output for M in M_VALUES and top-k 2 and 8, the default buckets (standard
    below 17 rows per expert, folded warp-specialized from there on), ragged routing, an outlier token."""
    moe, q13, q2, b13, b2 = _layer(e, seed=e, plant=plant, biases=e == 8, fused=fused, activation=activation,
                                   layout=layout)
    errors, seen = {}, set()
    for m in M_VALUES:
        for top_k in (2, 8):
            x = torch.randn(m, H, device="cuda").to(moe.dtype)
            x[0, :5] *= 20
            if top_k == 8 and e == 8:
                weights, ids = _routing(m, e, top_k, drop=0.1 if m > 1 else 0.0)
            else:
                weights, ids = _ragged_routing(m, e, min(top_k, e - 2), drop=0.1 if m > 1 else 0.0)
            out = torch.full((m, H), float("nan"), dtype=moe.dtype, device="cuda")
            assert hg.fused_moe(x, moe, weights, ids, output=out) is out
            assert torch.isfinite(out).all(), f"m={m} top_k={top_k}: rows left unwritten or non-finite"
            errors[(m, top_k)] = _rel(out, _reference(moe, x, weights, ids, q13, q2, b13, b2))
            seen.add(_pipelines_of(moe, m, ids.shape[1]))
    assert seen == {("standard", "standard"), ("warp_specialized", "warp_specialized")}, seen
    bad = {k: err for k, err in errors.items() if not err < (SMALL_M_LAYER_TOLERANCE if k[0] < SMALL_M else TOLERANCE)}
    assert not bad, f"relative error above the bound at (m, top_k) {bad} (all {errors})"


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p or "folded")
def test_folded_gemms_write_exactly_the_routed_rows(plant: str | None) -> None:
    """moe_gemm of every bucket forced onto the warp-specialized pipeline, on moe_align's routing, into poisoned
    outputs: GEMM1 row i = q(x)[i // top_k] @ w13_e^T + b13_e, GEMM2 row i = (q(a)[i] @ w2_e^T + b2_e) *
    topk_weight[i]; rows of dropped slots stay NaN."""
    e = 19
    moe, q13, q2, b13, b2 = _layer(e, seed=7, plant=plant, pipeline="warp_specialized", biases=True)
    act = moe.activation_schemes[0]
    w13, w2 = q13.dequantize().double(), q2.dequantize().double()
    tiles = set()
    for m in M_VALUES + (300, 400):  # M x top-2 / 19 experts rows per expert: 300 -> 32, 400 -> 43 (tile 64)
        top_k = 2
        x = torch.randn(m, H, device="cuda").bfloat16()
        weights, ids = _ragged_routing(m, e, top_k, drop=0.2 if m > 1 else 0.0)
        bm = moe.block_m(m, top_k)
        tiles.add(bm)
        r = hg.moe_align(ids, e, bm)
        h = torch.full((m * top_k, 2 * I), float("nan"), dtype=torch.bfloat16, device="cuda")
        hg.moe_gemm(x, moe, "w13", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad, top_k=top_k, block_m=bm,
                    out=h)
        expert = local_experts(ids, e).reshape(-1)
        routed = expert >= 0
        rows = (torch.arange(m * top_k, device="cuda") // top_k)[routed]
        xq = act.quantize(x).dequantize(torch.float64)
        ref = _per_expert(xq[rows], expert[routed], w13) + b13.double()[expert[routed]]
        assert torch.isnan(h[~routed]).all(), f"m={m}: a dropped assignment's row was written"
        _check_rows(h[routed], ref, torch.bfloat16, f"w13 m={m} block_m={bm}")
        a = torch.randn(m * top_k, I, device="cuda").bfloat16()
        y = torch.full((m * top_k, H), float("nan"), dtype=torch.bfloat16, device="cuda")
        hg.moe_gemm(a, moe, "w2", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad, top_k=1, block_m=bm,
                    topk_weights=weights.reshape(-1), out=y)
        aq = act.quantize(a).dequantize(torch.float64)
        ref2 = ((_per_expert(aq[routed], expert[routed], w2) + b2.double()[expert[routed]])
                * weights.reshape(-1).double()[routed, None])
        assert torch.isnan(y[~routed]).all(), f"m={m}: a dropped assignment's row was written (w2)"
        _check_rows(y[routed], ref2, torch.bfloat16, f"w2 m={m} block_m={bm}")
    assert tiles == {8, 16, 64, 128}, tiles


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p or "folded")
def test_folded_fp16_expert_map_and_dropped_tokens(plant: str | None) -> None:
    """fp16 layer with biases and the fused swiglu, expert parallelism: ids are global over 2E experts, expert_map
    sends the lower half to -1; a token whose slots are all elsewhere gets a zero row."""
    e = 19
    moe, q13, q2, b13, b2 = _layer(e, seed=31, plant=plant, dtype=torch.float16, biases=True, fused=True,
                                   activation="swiglu_oai", layout="interleaved")
    expert_map = torch.full((2 * e,), -1, dtype=torch.int32, device="cuda")
    expert_map[e:] = torch.arange(e, dtype=torch.int32, device="cuda")
    for m in M_VALUES:
        x = torch.randn(m, H, device="cuda").half()
        weights = torch.rand(m, 4, device="cuda")
        ids = torch.randint(0, 2 * e, (m, 4), device="cuda", dtype=torch.int32)
        ids[0] = torch.tensor([0, 1, -1, 5], device="cuda")  # every slot elsewhere or dropped
        if m > 1:
            ids[1, 2] = -1
        out = torch.full((m, H), float("nan"), dtype=torch.float16, device="cuda")
        hg.fused_moe(x, moe, weights, ids, expert_map=expert_map, output=out)
        ref = _reference(moe, x, weights, ids, q13, q2, b13, b2, expert_map=expert_map)
        assert torch.equal(out[0], torch.zeros_like(out[0])), f"m={m}: a token with no local slot"
        if m > 1:
            assert torch.isfinite(out).all(), f"m={m}: rows left unwritten or non-finite"
            err = _rel(out, ref)
            assert err < TOLERANCE, f"m={m}: relative error {err:.3g}"

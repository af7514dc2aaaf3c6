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
from test_quant_moe_a8 import LAYER_TOLERANCE, _check_rows, check_expert_map, check_routed_gemms
from test_quant_moe_a8_ws import SMALL_M, SMALL_M_LAYER_TOLERANCE, _ragged_routing, layer_errors

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
           biases: bool = False, fused: bool | None = None, activation: str = "silu_mul", layout: str = "split"):
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
    errors, seen = layer_errors(moe, q13, q2, b13, b2)
    assert seen == {("standard", "standard"), ("warp_specialized", "warp_specialized")}, seen
    bad = {k: err for k, err in errors.items() if not err < (SMALL_M_LAYER_TOLERANCE if k[0] < SMALL_M else TOLERANCE)}
    assert not bad, f"relative error above the bound at (m, top_k) {bad} (all {errors})"


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p or "folded")
def test_folded_gemms_write_exactly_the_routed_rows(plant: str | None) -> None:
    """check_routed_gemms (test_quant_moe_a8.py) on every bucket forced onto the warp-specialized pipeline, folded
    where the GEMM folds, with ragged routing; M = 300 and 400 give 32 and 43 rows per expert (the 64-token tile)."""
    moe, q13, q2, b13, b2 = _layer(19, seed=7, plant=plant, pipeline="warp_specialized", biases=True, fused=False)
    tiles = check_routed_gemms(moe, q13, q2, b13, b2, M_VALUES + (300, 400), _ragged_routing, f"plant={plant}")
    assert tiles == {8, 16, 64, 128}, tiles


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p or "folded")
def test_folded_fp16_expert_map_and_dropped_tokens(plant: str | None) -> None:
    """check_expert_map through fused_moe into a poisoned output, fp16 with biases and the fused swiglu."""
    moe, q13, q2, b13, b2 = _layer(19, seed=31, plant=plant, dtype=torch.float16, biases=True, fused=True,
                                   activation="swiglu_oai", layout="interleaved")
    check_expert_map(moe, q13, q2, b13, b2, poisoned=True)


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p or "folded")
def test_folded_grouped_gemms_match_the_reference(plant: str | None) -> None:
    """grouped_moe_gemm on a folded layer's weights (warp-specialized, kernels ending in _fold where the GEMM folds):
    contiguous segments of ragged lengths (empty experts too) and the masked layout with counts of 0, max_m and
    past it, into NaN-poisoned outputs, against q(a) @ w_e^T + b_e in float64 (q: the scheme's activation
    quantization of the rows); rows past the segments or counts stay NaN."""
    e, max_m = 19, 96
    moe, q13, q2, b13, b2 = _layer(e, seed=11, plant=plant, biases=True, fused=False)  # w13 alone
    act = moe.activation_schemes[0]
    g = torch.Generator().manual_seed(3)
    for weight, q, b, k, n, folds in (("w13", q13, b13, H, 2 * I, plant != "w13"), ("w2", q2, b2, I, H, plant != "w2")):
        w = q.dequantize().double()
        counts = torch.randint(0, 80, (e,), generator=g)
        counts[[0, 4, 9]] = 0
        offsets = torch.zeros(e + 1, dtype=torch.int32)
        offsets[1:] = torch.cumsum(counts, 0)
        rows = int(offsets[-1])
        a = torch.randn(rows + 5, k, device="cuda").bfloat16()  # 5 rows past the last segment
        out = torch.full((rows + 5, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        launcher = moe.grouped_launcher(weight, "grouped_contiguous", rows // e)
        assert launcher.kernel.name.endswith("_fold") == folds, launcher.kernel.name
        hg.grouped_moe_gemm(a, moe, weight, offsets.cuda(), layout="grouped_contiguous", out=out)
        aq = act.quantize(a).dequantize(torch.float64)
        ref = torch.cat([aq[offsets[j]:offsets[j + 1]] @ w[j].T + b[j].double() for j in range(e)])
        _check_rows(out[:rows], ref, torch.bfloat16, f"{weight} contiguous plant={plant}")
        assert torch.isnan(out[rows:]).all(), f"{weight}: rows past the last segment were written"
        mcounts = torch.randint(0, max_m + 1, (e,), generator=g).to(torch.int32)
        mcounts[0], mcounts[1], mcounts[2] = 0, max_m, max_m + 7
        am = torch.randn(e, max_m, k, device="cuda").bfloat16()
        outm = torch.full((e, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        hg.grouped_moe_gemm(am, moe, weight, mcounts.cuda(), layout="grouped_masked", out=outm, expected_m=48)
        aqm = act.quantize(am.reshape(-1, k)).dequantize(torch.float64).reshape(e, max_m, k)
        for j in range(e):
            c = min(int(mcounts[j]), max_m)
            if c:
                _check_rows(outm[j, :c], aqm[j, :c] @ w[j].T + b[j].double(), torch.bfloat16,
                            f"{weight} masked expert {j} plant={plant}")
            assert torch.isnan(outm[j, c:]).all(), f"{weight} masked expert {j}: rows past its count were written"

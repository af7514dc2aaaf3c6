"""Grouped MoE GEMMs (grouped_contiguous, grouped_masked) on the warp-specialized pipeline (sm_90a) on the GPU against
float64 references, through humming_gen.grouped_moe_gemm on a QuantMoE's own weights: 16-bit (W4A16 int4 g128,
MXFP4) and 8-bit (fp8 channel, fp8 block128, int8 channel) schemes, ragged windows with empty experts, E up to 257
and up to 4096 rows, forced onto the pipeline (every token tile) and by the default choice (from 17 rows per expert).
Outputs are poisoned (NaN): rows past an expert's count (masked) and past the segments (contiguous) must stay so.
Tolerances are those of the standard pipeline's grouped tests (tests/gpu/test_quant_moe.py, test_quant_moe_a8.py);
8-bit references quantize the rows with the scheme's ActivationScheme, as the layer does.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from moe_cases import w8a8
from test_quant_moe import TOLERANCE, _rel
from test_quant_moe_a8 import _check_rows

pytestmark = pytest.mark.gpu

PRESETS = ("w4a16-int4-g128", "w4a16-mxfp4", "w8a8-fp8-channel", "w8a8-fp8-block128", "w8a8-int8-channel")
H, I = 512, 256  # multiples of 128: the block128 activation groups tile both GEMMs' K


def _layer(preset: str, e: int, pipeline: str | None, seed: int):
    torch.manual_seed(seed)
    s = hg.scheme(preset)
    q13 = s.quantize(torch.randn(e, 2 * I, H, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(e, H, I, device="cuda") * 0.05)
    b13 = (torch.randn(e, 2 * I, device="cuda") * 0.1).bfloat16()
    b2 = (torch.randn(e, H, device="cuda") * 0.1).bfloat16()
    # the grouped GEMMs run w13 alone, which a layer that fuses the gated activation refuses
    moe = hg.QuantMoE.from_quantized(q13, q2, bias13=b13, bias2=b2, pipeline=pipeline, fused_activation=False)
    return moe, q13, q2, b13, b2


def _reference_rows(moe, index: int, a: torch.Tensor) -> torch.Tensor:
    """Rows of `a` as the kernel reads them in float64: quantized and dequantized where the scheme quantizes."""
    act = moe.activation_schemes[index]
    return a.double() if act is None else act.quantize(a).dequantize(torch.float64)


def _check(moe, index: int, out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    if moe.activation_schemes[index] is None:
        assert torch.isfinite(out).all(), f"{what}: a row was not written"
        assert _rel(out, ref) < TOLERANCE[torch.bfloat16], what
    else:
        _check_rows(out, ref, torch.bfloat16, what)


def _counts(e: int, per_expert: int, seed: int) -> torch.Tensor:
    """Ragged rows per expert around `per_expert`: a third of the experts (expert 0 among them) get none."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 2 * per_expert + 1, (e,), generator=g)
    counts[torch.randperm(e, generator=g)[: e // 3]] = 0
    counts[0] = 0
    return counts


@pytest.mark.parametrize("pipeline", ["warp_specialized", None], ids=["forced", "default"])
@pytest.mark.parametrize("preset", PRESETS)
def test_grouped_contiguous_on_the_warp_specialized_pipeline(preset: str, pipeline: str | None) -> None:
    """Segments of ragged lengths (empty ones too) over 257 experts, up to about 5100 rows; rows past the segments
    stay NaN."""
    e = 257
    moe, q13, q2, b13, b2 = _layer(preset, e, pipeline, seed=5)
    for index, (weight, q, b, k, n) in enumerate((("w13", q13, b13, H, 2 * I), ("w2", q2, b2, I, H))):
        w = q.dequantize().double()
        for per_expert in (2, 8, 30):  # about 340, 1400 and 5100 rows: token tiles 8 .. 32 forced, 32 by default
            counts = _counts(e, per_expert, seed=per_expert)
            offsets = torch.zeros(e + 1, dtype=torch.int32)
            offsets[1:] = torch.cumsum(counts, 0)
            rows = int(offsets[-1])
            launcher = moe.grouped_launcher(weight, "grouped_contiguous", -(-rows // e), pipeline)
            if pipeline or -(-rows // e) > 16:
                assert launcher.kernel.plan.pipeline == "warp_specialized"
            a = torch.randn(rows, k, device="cuda").bfloat16()
            out = torch.full((rows + 5, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            hg.grouped_moe_gemm(a, moe, weight, offsets.cuda(), layout="grouped_contiguous", out=out[:rows],
                                pipeline=pipeline)
            aq = _reference_rows(moe, index, a)
            ref = torch.cat([aq[offsets[j]:offsets[j + 1]] @ w[j].T + b[j].double() for j in range(e)])
            assert torch.isnan(out[rows:]).all(), f"{weight}: rows past the segments were written"
            _check(moe, index, out[:rows], ref, f"{preset} {weight} contiguous rows={rows}")


@pytest.mark.parametrize("pipeline", ["warp_specialized", None], ids=["forced", "default"])
@pytest.mark.parametrize("preset", PRESETS)
def test_grouped_masked_on_the_warp_specialized_pipeline(preset: str, pipeline: str | None) -> None:
    """DeepEP low-latency layout (E, max_m, K) with counts: an idle expert, a full one, one whose count exceeds
    max_m (clamped); rows past each count stay NaN. max_m up to 512 over 8 experts (4096 rows)."""
    e = 8
    moe, q13, q2, b13, b2 = _layer(preset, e, pipeline, seed=7)
    for index, (weight, q, b, k, n) in enumerate((("w13", q13, b13, H, 2 * I), ("w2", q2, b2, I, H))):
        w = q.dequantize().double()
        for max_m in (5, 40, 512):
            counts = torch.randint(0, max_m + 1, (e,), dtype=torch.int32)
            counts[0], counts[1], counts[2] = 0, max_m, max_m + 7
            a = torch.randn(e, max_m, k, device="cuda").bfloat16()
            out = torch.full((e, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            hg.grouped_moe_gemm(a, moe, weight, counts.cuda(), layout="grouped_masked", out=out, pipeline=pipeline)
            aq = _reference_rows(moe, index, a.reshape(-1, k)).reshape(e, max_m, k)
            for j in range(e):
                c = min(int(counts[j]), max_m)
                assert torch.isnan(out[j, c:]).all(), f"{weight} expert {j}: rows past its count were written"
                if c:
                    _check(moe, index, out[j, :c], aq[j, :c] @ w[j].T + b[j].double(),
                           f"{preset} {weight} masked expert {j} max_m={max_m}")


def test_grouped_ws_matches_the_standard_pipeline() -> None:
    """The same grouped GEMM on both pipelines (W4A16, 64 experts, 4096 rows): outputs within the bf16 bound."""
    e = 64
    moe, q13, _, _, _ = _layer("w4a16-int4-g128", e, None, seed=11)
    counts = _counts(e, 64, seed=3)
    offsets = torch.zeros(e + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(counts, 0)
    a = torch.randn(int(offsets[-1]), H, device="cuda").bfloat16()
    outs = [hg.grouped_moe_gemm(a, moe, "w13", offsets.cuda(), layout="grouped_contiguous", pipeline=p)
            for p in ("standard", "warp_specialized")]
    assert _rel(outs[1], outs[0].double()) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("preset", ("w4a16-int4-g128", "w8a8-fp8-channel"))
def test_grouped_masked_expected_m_is_only_a_hint(preset: str) -> None:
    """expected_m picks the tile of a (E, 512, K) buffer: 4 rows per expert an 8-row tile (the standard pipeline's;
    W8A8's warp-specialized, heuristics.choose.ws_moe_from_rows), 20 the warp-specialized 64-row one, against 128
    rows from max_m. Counts far past expected_m (up to max_m and past
    it, clamped) must still be computed in full, and every tile must agree with the float64 reference; rows past
    each count stay NaN."""
    e, max_m = 8, 512
    moe, q13, _, b13, _ = _layer(preset, e, None, seed=13)
    w = q13.dequantize().double()
    counts = torch.tensor([0, 1, 3, 9, 40, 200, max_m, max_m + 9], dtype=torch.int32)
    a = torch.randn(e, max_m, H, device="cuda").bfloat16()
    aq = _reference_rows(moe, 0, a.reshape(-1, H)).reshape(e, max_m, H)
    small = "warp_specialized" if w8a8(preset) else "standard"
    for expected_m, tile in ((4, (small, 8)), (20, ("warp_specialized", 64)), (None, ("warp_specialized", 128))):
        launcher = moe.grouped_launcher("w13", "grouped_masked", max_m if expected_m is None else expected_m)
        assert (launcher.kernel.plan.pipeline, launcher.kernel.plan.tuning.block_m) == tile
        out = torch.full((e, max_m, 2 * I), float("nan"), dtype=torch.bfloat16, device="cuda")
        hg.grouped_moe_gemm(a, moe, "w13", counts.cuda(), layout="grouped_masked", out=out, expected_m=expected_m)
        for j in range(e):
            c = min(int(counts[j]), max_m)
            assert torch.isnan(out[j, c:]).all(), f"expected_m={expected_m} expert {j}: rows past its count written"
            if c:
                _check(moe, 0, out[j, :c], aq[j, :c] @ w[j].T + b13[j].double(),
                       f"{preset} masked expected_m={expected_m} expert {j} count {c}")

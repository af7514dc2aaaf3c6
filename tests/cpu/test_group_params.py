"""Group parameters (scales, zero points) in the kernel layout, on the CPU: which path compose picks for a group
size, how many rows the tensors and a stage hold, and a float64 emulation of what the kernel reads.

The emulation repacks a quantized weight with `prepare_weight` on the CPU, unpacks its codes, runs every code
through the converter's `emulate`, finds each element's group row with the arithmetic of the generated source
(templates/pipeline/standard.cuh.j2 and memory/group_params_cp_async.cuh.j2) and applies the scale step. A row
outside the stage or past the tensor, or a tensor row holding the wrong group, shows up as a mismatch against
`QuantizedWeight.dequantize()`.
"""

from __future__ import annotations

import math

import pytest
import torch

from codegen_cases import case_by_id
from humming_gen.codegen.compose import compose
from humming_gen.pipelines.common import K_ALIGN, arbitrary_rows_per_stage, kernel_group_size
from humming_gen.components.numeric.convert import select_converter
from humming_gen.components.numeric.scale_apply import (FloatZeroPointScale, IntZeroPoint, IntZeroPointScale,
                                                         SubtractOffset, SubtractOffsetScale)
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import generate
from humming_gen.layer.weights import prepare_weight
from humming_gen.schemes import QuantScheme
from humming_gen.schemes.packing import permute_group_rows, unpack_codes
from humming_gen.targets import get_target

# --- which path, how many rows ------------------------------------------------------------------------
@pytest.mark.parametrize("group_size", [8, 24, 40, 100, 7, 16, 48, 128, 384])
def test_group_plan_rows(group_size: int) -> None:
    """Multiples of 16 keep their kernel group (48 -> 16, 384 -> 128); other sizes keep their own, and their
    rows cover every padded k: the last row, (k_pad - 1) // g, exists."""
    target = get_target("sm_90a")
    layer = LayerConfig(1000, 1000, QuantScheme("int4", group_size=group_size))
    for _, tuning in choose_tunings(layer, target).buckets:
        plan = compose(layer, ComputeConfig(), tuning, target)
        g = plan.group
        arbitrary = group_size % 16 != 0
        assert g.arbitrary == arbitrary
        assert g.group_size == (group_size if arbitrary else kernel_group_size(group_size))
        assert g.rows == math.ceil(plan.layout.k_pad / g.group_size) == (plan.layout.k_pad - 1) // g.group_size + 1
        if arbitrary:
            assert g.rows_per_stage == min(g.rows, arbitrary_rows_per_stage(group_size, tuning.block_k))
            assert g.rows_per_stage <= (tuning.block_k - 1) // group_size + 2


@pytest.mark.parametrize("block_k", [64, 128, 256])
def test_arbitrary_rows_per_stage_is_the_most_a_k_tile_touches(block_k: int) -> None:
    for g in range(1, 300):
        touched = max((k0 + block_k - 1) // g - k0 // g + 1 for k0 in range(0, g * block_k, block_k))
        assert arbitrary_rows_per_stage(g, block_k) == touched, g


def test_block_scale_with_k_side_not_multiple_of_16() -> None:
    layer = LayerConfig(512, 1000, QuantScheme("float8e4m3", block_size=(128, 24), scale_dtype="float32"))
    target = get_target("sm_80")
    plan = compose(layer, ComputeConfig(), choose_tunings(layer, target).for_m(1), target)
    assert plan.group.arbitrary and plan.group.group_size == 24 and plan.group.rows == math.ceil(1024 / 24)


# --- the generated source -------------------------------------------------------------------------------
@pytest.mark.parametrize("case_id, odd", [("w4a16-int4-g24-bf16-m4096", False),
                                          ("w4a16-int4-g7-bf16-n1001k1000-m1", True)])
def test_source_reads_rows_from_k(case_id: str, odd: bool) -> None:
    plan = case_by_id(case_id).plan("sm_90a")
    src = generate(plan, "nvrtc")
    g = plan.group
    assert f"constexpr int kGroupSize = {g.group_size};" in src
    assert f"constexpr int kGroupTensorRows = {g.rows};" in src
    assert f"constexpr int kGroupRows = {g.rows_per_stage};" in src
    assert "kGroupSizeInStage" not in src and "kKTilesPerGroup" not in src  # the multiple-of-16 path's constants
    assert "first_group_row(kt)" in src and "gmem_row = min(row0 + row, cfg::kGroupTensorRows - 1)" in src
    assert ("(k + 1) / cfg::kGroupSize - row0" in src) == odd  # odd groups: each element of a pair its own row
    assert ("void load_group_pair(" in src) == (not odd)


# --- float64 emulation of what the kernel reads ----------------------------------------------------------
def kernel_group_row(plan, k: torch.Tensor) -> torch.Tensor:
    """Global group row the kernel reads for element k, asserting it lies in the stage and in the tensor."""
    g, t = plan.group, plan.tuning
    kt = k // t.block_k
    if g.arbitrary:  # first_group_row(kt); load_group_pair_at: k / kGroupSize - row0
        row0 = kt * t.block_k // g.group_size
        in_stage = k // g.group_size - row0
    else:  # kt * kGroupRowsPerKTile / kKTilesPerGroup; (wk * kWarpK + ks * 16) / kGroupSizeInStage
        row0 = kt * g.rows_per_stage // max(1, g.group_size // t.block_k)
        in_stage = (k % t.block_k) // 16 * 16 // min(g.group_size, t.block_k)
    assert int(in_stage.min()) >= 0 and int(in_stage.max()) < g.rows_per_stage, "row outside the stage"
    row = row0 + in_stage
    assert int(row.max()) < g.rows, "row past the tensor (zero-filled by the loader)"
    return row


def _unpermute(t: torch.Tensor) -> torch.Tensor:
    idx = permute_group_rows(torch.arange(t.shape[-1]))
    return t[..., torch.argsort(idx)]


def emulate_weight(plan, qw) -> torch.Tensor:
    """(N, K) float64 weight as the kernel dequantizes it from the prepared tensors."""
    pw = prepare_weight(plan, qw, "cpu")
    # its values, wherever its code renders (the plan's own where it renders one: scale_carries_exponent)
    converter = next((c for c in plan.components if "convert_pair" in c.provides),
                     select_converter(qw.scheme.weight, plan.layer.dtype))
    assert converter.bias == plan.layout.converter_bias
    apply = next(c for c in plan.components if hasattr(c, "expression"))
    codes = unpack_codes(pw.b, plan.layout.b_layout, plan.layout.n_pad, plan.layout.k_pad)[: qw.n, : qw.k].long()
    table = torch.tensor([converter.emulate(c) for c in range(1 << qw.scheme.weight.bits)], dtype=torch.float64)
    x = table[codes]
    rows = kernel_group_row(plan, torch.arange(plan.layout.k_pad))[: qw.k]  # the kernel also reads rows for padded k
    assert tuple(pw.b_scale.shape) == (plan.group.rows, plan.layout.n_pad)
    scale = _unpermute(pw.b_scale.double())[rows, : qw.n].t()
    zero = None if pw.b_zero is None else _unpermute(pw.b_zero.double())[rows, : qw.n].t()
    if plan.layout.out_scale:  # the epilogue's column factor (each row's range factor of carried exponents)
        scale = scale * pw.out_scale.double()[: qw.n, None]
    if isinstance(apply, (SubtractOffsetScale, SubtractOffset)):
        return (x - apply.offset) * scale
    if isinstance(apply, (IntZeroPointScale, IntZeroPoint)):
        return (x + zero) * scale
    assert isinstance(apply, FloatZeroPointScale)
    return (x - apply.offset) * scale + zero


# (id, scheme, activation dtype, exact): exact where every prepared value is exact in the 16-bit type
EMULATED = [
    ("int4-g8", QuantScheme("int4", group_size=8), "bfloat16", True),
    ("int4-g24", QuantScheme("int4", group_size=24), "bfloat16", True),
    ("int4-g7", QuantScheme("int4", group_size=7), "bfloat16", True),
    ("int4-g100-fp16", QuantScheme("int4", group_size=100), "float16", True),
    ("uint4-g40-zpint", QuantScheme("uint4", group_size=40, zero_point="int"), "bfloat16", True),
    ("uint4-g7-zpint", QuantScheme("uint4", group_size=7, zero_point="int"), "float16", True),
    ("uint4-g100-zpfloat", QuantScheme("uint4", group_size=100, zero_point="float"), "bfloat16", False),
    ("uint4-g24-zpfloat-fp16", QuantScheme("uint4", group_size=24, zero_point="float"), "float16", False),
    ("fp4-g24-e8m0", QuantScheme("float4e2m1", group_size=24, scale_dtype="float8e8m0"), "bfloat16", True),
    ("fp8-block128x24", QuantScheme("float8e4m3", block_size=(128, 24), scale_dtype="float32"), "bfloat16", False),
    # multiples of 16 through the same emulation (scales repeated for 48, a group spanning k tiles for 512)
    ("int4-g48", QuantScheme("int4", group_size=48), "bfloat16", True),
    ("int4-g512", QuantScheme("int4", group_size=512), "bfloat16", True),
]


@pytest.mark.parametrize("m", [1, 4096])  # block_k 256 (split-K, four k warps) and 64
@pytest.mark.parametrize("case", EMULATED, ids=[c[0] for c in EMULATED])
def test_prepared_scales_dequantize_like_the_reference(case, m: int) -> None:
    _, scheme, dtype, exact = case
    n, k = 200, 1000  # N and K padded (256, 1024): partial last group, rows past K
    torch.manual_seed(n + k)
    qw = scheme.quantize(torch.randn(n, k) * 0.05)
    layer = LayerConfig(n, k, scheme, dtype=dtype)
    target = get_target("sm_90a")
    plan = compose(layer, ComputeConfig(), choose_tunings(layer, target).for_m(m), target)
    assert plan.layout.k_pad == math.ceil(k / K_ALIGN) * K_ALIGN
    got, want = emulate_weight(plan, qw), qw.dequantize(torch.float64)
    if exact:
        assert torch.equal(got, want)
    else:  # scales rounded to the 16-bit type (fp32 block scales; float zero terms z * scale)
        torch.testing.assert_close(got, want, rtol=0, atol=2**-8 * float(want.abs().max()))


# (id, scheme, compute type, weight magnitude): float weights whose group scales carry the converter's 2^126 (bf16);
# magnitudes that push rows' scales past what the carried exponent leaves room for (2^1)
CARRIED = [
    ("mxfp4-bf16", QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0"), "bfloat16", 0.05),
    ("mxfp4-bf16-large", QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0"), "bfloat16", 2.0**100),
    ("nvfp4-bf16", QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True),
     "bfloat16", 0.05),
    ("fp8-g48-bf16", QuantScheme("float8e4m3", group_size=48, scale_dtype="bfloat16"), "bfloat16", 0.05),
]


@pytest.mark.parametrize("pipeline, m", [("standard", 1), ("standard", 64), ("warp_specialized", 256)])
@pytest.mark.parametrize("case", CARRIED, ids=[c[0] for c in CARRIED])
def test_group_scales_carry_the_converter_exponent(case, pipeline: str, m: int) -> None:
    """Groups smaller than a warp's k slice: the converter renders no multiply (scale_carries_exponent), the scales
    hold 2^exponent_shift less each row's factor, which out_scale restores; the weight the kernel sees is exactly
    the reference's, also where rows' scales are too large to carry the whole 2^126.
    The kernel computes (x * scale) in one rounding of the 16-bit type, so rows must not lose the carried bits."""
    _, scheme, dtype, magnitude = case
    n, k = 200, 1000
    torch.manual_seed(7)
    qw = scheme.quantize(torch.randn(n, k, dtype=torch.float64) * magnitude)
    layer = LayerConfig(n, k, scheme, dtype=dtype)
    target = get_target("sm_90a")
    plan = compose(layer, ComputeConfig(), choose_tunings(layer, target, pipeline=pipeline).for_m(m), target)
    converter = next(c for c in plan.components if "convert_pair" in c.provides)
    assert converter.scale_carries_exponent and plan.layout.scale_exponent == converter.exponent_shift > 0
    assert "fma2" not in generate(plan).split("convert_pair(u32 codes) {")[1].split("}")[0]
    pw = prepare_weight(plan, qw, "cpu")
    if magnitude > 1:  # some rows keep part of the exponent in out_scale
        assert bool((pw.out_scale[:n] > 1).any())
    assert torch.equal(emulate_weight(plan, qw), qw.dequantize(torch.float64))


@pytest.mark.parametrize("scale_dtype, dtype, top", [("float32", "bfloat16", 3.9999), ("float16", "bfloat16", 3.998046875)])
def test_carried_scales_that_round_up_in_the_compute_type(scale_dtype: str, dtype: str, top: float) -> None:
    """A row's largest scale just below a power of two that the 16-bit type does not hold (fp32 / fp16 scales)
    rounds up to that power once carried; it must not overflow (the layer was refused as out of range), and the
    kernel's weight, with its one rounding per product, is the converter-multiply path's."""
    from numerics_check import emulate_prepared_weight

    from humming_gen.pipelines import common
    from humming_gen.schemes import QuantizedWeight

    scheme = QuantScheme("float4e2m1", group_size=32, scale_dtype=scale_dtype)
    n, k = 128, 512
    torch.manual_seed(3)
    qw = scheme.quantize(torch.randn(n, k, dtype=torch.float64) * 0.05)
    scales = qw.scales.clone()
    scales[3, 5] = top  # one group of row 3
    qw = QuantizedWeight(scheme, qw.codes, scales)
    layer = LayerConfig(n, k, scheme, dtype=dtype)
    target = get_target("sm_90a")
    weights = {}
    for carry in (True, False):
        old, common.CARRY_CONVERTER_EXPONENT = common.CARRY_CONVERTER_EXPONENT, carry
        try:
            plan = compose(layer, ComputeConfig(), choose_tunings(layer, target).for_m(1), target)
        finally:
            common.CARRY_CONVERTER_EXPONENT = old
        assert bool(plan.layout.scale_exponent) == carry
        weights[carry] = emulate_prepared_weight(plan, qw, prepare_weight(plan, qw, "cpu"))
    assert torch.equal(weights[True], weights[False])


def test_fp16_layers_keep_the_converter_multiply() -> None:
    """fp16 compute: a row whose largest scale needs part of 2^14 in out_scale would push its small products below
    fp16's exact range (review reproducer: scales 2^8 and 2^-18 in one row), so fp16 layers keep the multiply; the
    kernel's weight of that row is then exact."""
    from numerics_check import emulate_prepared_weight

    from humming_gen.schemes import QuantizedWeight

    scheme = QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0")
    n, k = 64, 256
    torch.manual_seed(4)
    qw = scheme.quantize(torch.randn(n, k, dtype=torch.float64) * 0.05)
    scales = qw.scales.clone()
    scales[0, 0], scales[0, 1] = 2.0**8, 2.0**-18
    qw = QuantizedWeight(scheme, qw.codes, scales)
    layer = LayerConfig(n, k, scheme, dtype="float16")
    target = get_target("sm_90a")
    for m, tuning in choose_tunings(layer, target).buckets:
        plan = compose(layer, ComputeConfig(), tuning, target)
        assert plan.layout.scale_exponent == 0, m
        assert "fma2" in generate(plan).split("convert_pair(u32 codes) {")[1].split("}")[0]
    got = emulate_prepared_weight(plan, qw, prepare_weight(plan, qw, "cpu"))
    assert torch.equal(got[0], qw.dequantize(torch.float64)[0])


def test_hoisted_groups_keep_the_converter_multiply() -> None:
    """Groups a warp's k slice lies in (g128) may be hoisted to fp32 partial sums in some buckets: the layer keeps
    the converter's own multiply in every bucket (one layout for the layer)."""
    scheme = QuantScheme("float4e2m1", group_size=128, scale_dtype="float8e8m0")
    layer = LayerConfig(512, 1024, scheme, dtype="bfloat16")
    target = get_target("sm_90a")
    for m, tuning in choose_tunings(layer, target).buckets:
        plan = compose(layer, ComputeConfig(), tuning, target)
        assert plan.layout.scale_exponent == 0 and not plan.layout.out_scale, m


@pytest.mark.parametrize("dtype, hint", [("bfloat16", "rescale the weights"), ("float16", "use bfloat16")])
def test_scales_out_of_range_name_the_true_reason(dtype: str, hint: str) -> None:
    """Finite fp32 scales beyond the compute type: bf16 layers are not told to use bf16."""
    import torch

    from humming_gen.config import ComputeConfig, LayerConfig
    from humming_gen.targets import get_target

    scheme = QuantScheme("int4", group_size=128, scale_dtype="float32")
    qw = scheme.quantize(torch.randn(128, 256))
    qw.scales = qw.scales * (1e39 if dtype == "bfloat16" else 1e6)
    layer = LayerConfig(n=128, k=256, scheme=scheme, dtype=dtype)
    plan = compose(layer, ComputeConfig(), choose_tunings(layer, get_target("sm_90a")).for_m(1), get_target("sm_90a"))
    with pytest.raises(ValueError, match=hint):
        prepare_weight(plan, qw, "cpu")

"""Quantization schemes: scale rules per standard, round trips with error bounds, odd shapes, MoE, activations,
presets and config validation."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from humming_gen.formats import dtype
from humming_gen.schemes.presets import list_presets, preset
from humming_gen.schemes.quantize import QuantizedActivation, quantize_activation, quantize_weight
from humming_gen.schemes.scheme import ActivationScheme, QuantizedWeight, QuantScheme
from helpers import brute_force_encode, random_weight, relative_error

N, K = 37, 300  # odd on purpose: K is not a multiple of 128, 32 or 16, N not of 128

# (id, scheme, relative Frobenius error bound on random_weight): ~1.25x the worst of 5 seeds. The 0.2% outliers
# (8 sigma) inflate channel/tensor/block scales, hence the larger bounds of the coarse granularities.
SCHEMES = [
    ("int4-g128-bf16", QuantScheme("int4", group_size=128, scale_dtype="bfloat16"), 0.24),
    ("int4-channel-fp16", QuantScheme("int4", granularity="channel", scale_dtype="float16"), 0.34),
    ("int3-g128", QuantScheme("int3", group_size=128), 0.48),
    ("int2-g64", QuantScheme("int2", group_size=64), 0.9),
    ("int8-channel-fp32", QuantScheme("int8", scale_dtype="float32"), 0.02),
    ("int8-tensor", QuantScheme("int8", granularity="tensor", scale_dtype="float32"), 0.06),
    ("int5-block", QuantScheme("int5", block_size=(16, 64), scale_dtype="float32"), 0.24),
    ("uint4-g128-zp-int", QuantScheme("uint4", group_size=128, zero_point="int"), 0.17),
    ("uint4-g128-zp-float", QuantScheme("uint4", group_size=128, zero_point="float"), 0.17),
    ("uint4-g100-zp-float16", QuantScheme("uint4", group_size=100, zero_point="float", zero_point_dtype="float16"),
     0.16),
    ("uint8-channel-zp", QuantScheme("uint8", zero_point="int", scale_dtype="float32"), 0.014),
    ("uint3-block-zp", QuantScheme("uint3", block_size=(8, 32), zero_point="int"), 0.43),
    ("fp8-channel", QuantScheme("float8e4m3", scale_dtype="float32"), 0.035),
    ("fp8-tensor", QuantScheme("float8e4m3", granularity="tensor", scale_dtype="float32"), 0.035),
    ("fp8-block128", QuantScheme("float8e4m3", block_size=128, scale_dtype="float32"), 0.035),
    ("e5m2-channel", QuantScheme("float8e5m2", scale_dtype="bfloat16"), 0.07),
    ("fp6e2m3-g32-e8m0", QuantScheme("float6e2m3", group_size=32, scale_dtype="float8e8m0"), 0.045),
    ("fp6e3m2-g32-e8m0", QuantScheme("float6e3m2", group_size=32, scale_dtype="float8e8m0"), 0.07),
    ("mxfp4-rceil", QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0"), 0.17),
    ("mxfp4-floor", QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", scale_rule="floor"), 0.17),
    ("mxfp4-even", QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", scale_rule="even"), 0.17),
    ("mxfp8", QuantScheme("float8e4m3", group_size=32, scale_dtype="float8e8m0"), 0.037),
    ("nvfp4", QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True), 0.12),
    ("fp4-g16-e5m2", QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e5m2"), 0.125),
    ("e0m3-g64", QuantScheme("float4e0m3", group_size=64), 0.19),
    ("e0m7-channel", QuantScheme("float8e0m7"), 0.02),
    ("e3m4-channel", QuantScheme("float8e3m4", scale_dtype="float32"), 0.016),
    ("custom-fp5e2m2-g32", QuantScheme("float5e2m2", group_size=32), 0.063),
]
SCHEME_IDS = [s[0] for s in SCHEMES]


def _divisor_and_zero(q: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element (scale * global scale) and zero point, from the stored tensors."""
    s = q.scheme
    full = s.expand_scales(q.scales.to(torch.float64), q.n, q.k)
    if q.global_scale is not None:
        g = q.global_scale.to(torch.float64)
        full = full * (g.reshape(-1, 1, 1) if g.dim() else g)
    z = torch.zeros_like(full)
    if q.zero_points is not None:
        z = s.expand_scales(q.zero_points.to(torch.float64), q.n, q.k)
    return full, z


def _scale_eps(d) -> float:
    """Relative half-ulp of a scale format (how far a rounded scale can be from the raw one)."""
    return 0.0 if d.name == "float8e8m0" else 2.0 ** -(d.mantissa_bits + 1)


# --- round trips and rounding ------------------------------------------------------------------------------
@pytest.mark.parametrize("case", SCHEMES, ids=SCHEME_IDS)
def test_round_trip_error_bound(case) -> None:
    _, scheme, bound = case
    w = random_weight(N, K, seed=1)
    q = scheme.quantize(w)
    assert q.codes.dtype == torch.uint8 and q.codes.shape == (N, K)
    assert q.scales.dtype == torch.float32 and tuple(q.scales.shape) == scheme.scale_shape(N, K)
    assert torch.isfinite(q.scales).all() and (q.scales > 0).all()
    dq = q.dequantize()
    assert dq.dtype == torch.float32 and dq.shape == w.shape
    assert relative_error(dq, w) < bound


@pytest.mark.parametrize("case", SCHEMES, ids=SCHEME_IDS)
def test_codes_are_nearest_given_stored_scales(case) -> None:
    """Codes are RNE(w / scale + zero) with the STORED (already rounded) scales: dequantize() is consistent."""
    _, scheme, _ = case
    w = random_weight(N, K, seed=2)
    q = scheme.quantize(w)
    full, z = _divisor_and_zero(q)
    x = (w.to(torch.float64) / full + z).numpy().ravel()
    expect = brute_force_encode(scheme.weight.name, x).reshape(N, K)
    assert np.array_equal(q.codes.numpy().astype(np.int64), expect)


@pytest.mark.parametrize("case", [c for c in SCHEMES if c[1].weight.is_int], ids=lambda c: c[0])
def test_int_elementwise_bound(case) -> None:
    """|w - dq| <= scale/2, plus the clipping a rounded-down scale can cause (qrange * half-ulp of the scale)."""
    _, scheme, _ = case
    w = random_weight(N, K, seed=3)
    q = scheme.quantize(w)
    full, _ = _divisor_and_zero(q)
    qrange = (1 << scheme.weight.bits) - 1
    bound = full * (0.5 + qrange * _scale_eps(scheme.scale_dtype)) * (1 + 1e-9)
    assert ((q.dequantize(torch.float64) - w.to(torch.float64)).abs() <= bound).all()


# MX (e8m0) and two-level scales have their own tests below.
@pytest.mark.parametrize("case", [c for c in SCHEMES if c[1].zero_point is None and not c[1].global_scale
                                  and c[1].scale_dtype.name != "float8e8m0"], ids=lambda c: c[0])
def test_symmetric_scale_is_rounded_amax_over_qmax(case) -> None:
    _, scheme, _ = case
    w = random_weight(N, K, seed=4)
    q = scheme.quantize(w)
    elem = scheme.weight
    qmax = float(elem.max_value) if elem.is_int else elem.max_finite
    amax = _block_amax(w, scheme)
    raw = amax / qmax
    assert (((q.scales.to(torch.float64) - raw).abs()) <= raw * _scale_eps(scheme.scale_dtype) * (1 + 1e-9)).all()


def _block_amax(w: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """amax over each scale block, by slicing (independent of the library's padding trick)."""
    n, k = w.shape
    a, b = scheme.scale_shape(n, k)
    if scheme.granularity == "channel":
        bn, bk = 1, k
    elif scheme.granularity == "group":
        bn, bk = 1, scheme.group_size
    elif scheme.granularity == "block":
        bn, bk = scheme.block_size
    else:
        bn, bk = n, k
    out = torch.empty(a, b, dtype=torch.float64)
    for i in range(a):
        for j in range(b):
            out[i, j] = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].abs().max()
    return out


def test_partial_last_group_uses_only_real_columns() -> None:
    w = random_weight(N, K, seed=5, outliers=False)
    w[:, 256:] *= 0.01  # the partial last group (44 columns) is tiny: padding with zeros/others would show
    q = QuantScheme("int4", group_size=128, scale_dtype="float32").quantize(w)
    assert q.scales.shape == (N, 3)
    expect = w[:, 256:].abs().amax(-1).to(torch.float64) / 7
    torch.testing.assert_close(q.scales[:, 2].to(torch.float64), expect, rtol=2 ** -24, atol=0)


def test_int4_symmetric_range_and_top_code() -> None:
    w = torch.tensor([[-7.0, -3.5, 0.0, 1.0, 7.0, -0.5, 0.5, 2.5]])
    q = QuantScheme("int4", scale_dtype="float32").quantize(w)
    assert q.scales.item() == 1.0
    assert q.element_values().tolist() == [[-7, -4, 0, 1, 7, 0, 0, 2]]  # RNE: -3.5 -> -4, 2.5 -> 2
    q1 = QuantScheme("int1", scale_dtype="float32").quantize(torch.tensor([[-2.0, 1.0, -0.4]]))
    assert q1.dequantize().tolist() == [[-2.0, 0.0, 0.0]]  # int1 = {-1, 0}: only negatives survive


def test_zero_point_int_and_float() -> None:
    w = random_weight(N, K, seed=6) + 0.3  # off-center so the zero point matters
    qi = QuantScheme("uint4", group_size=128, zero_point="int", scale_dtype="float32").quantize(w)
    z = qi.zero_points
    assert torch.equal(z, torch.round(z)) and z.min() >= 0 and z.max() <= 15
    wg = w[:, :128]
    lo, hi = wg.amin(-1).clamp(max=0).double(), wg.amax(-1).clamp(min=0).double()
    s = ((hi - lo) / 15).float()
    torch.testing.assert_close(qi.scales[:, 0], s, rtol=0, atol=0)
    assert torch.equal(qi.zero_points[:, 0], torch.round(-lo / s.double()).float())
    qf = QuantScheme("uint4", group_size=128, zero_point="float", scale_dtype="float32").quantize(w)
    assert not torch.equal(qf.zero_points, torch.round(qf.zero_points))
    torch.testing.assert_close(qf.zero_points[:, 0], (-lo / s.double()).float(), rtol=0, atol=0)
    # An exact zero weight dequantizes to exactly zero with an integer zero point.
    w0 = w.clone()
    w0[:, ::7] = 0.0
    assert (QuantScheme("uint4", group_size=128, zero_point="int").quantize(w0).dequantize()[:, ::7] == 0).all()


def test_zero_point_dtype_rounds_the_zero_point() -> None:
    w = random_weight(N, K, seed=7)
    q = QuantScheme("uint4", group_size=128, zero_point="float", zero_point_dtype="bfloat16").quantize(w)
    zp = q.zero_points
    assert torch.equal(zp, zp.to(torch.bfloat16).to(torch.float32))


def test_zero_amax_and_tiny_scales() -> None:
    w = torch.zeros(4, 64)
    w[1, :32] = 1e-30  # rounds to 0 in bf16? no: bf16 has float32's range; e4m3 does underflow
    for scheme in (QuantScheme("int4", group_size=32), QuantScheme("uint4", group_size=32, zero_point="int"),
                   QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0"),
                   QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True),
                   QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3"),
                   QuantScheme("int8", granularity="tensor", scale_dtype="float16")):
        q = scheme.quantize(w)
        assert torch.isfinite(q.scales).all() and (q.scales > 0).all(), scheme.summary()
        dq = q.dequantize()
        assert torch.isfinite(dq).all() and (dq[0] == 0).all() and (dq[2:] == 0).all(), scheme.summary()
    q = QuantScheme("int4", group_size=32).quantize(torch.zeros(2, 64))
    assert (q.scales == 1).all() and (q.dequantize() == 0).all()
    # A scale below e4m3's smallest subnormal becomes that subnormal instead of 0.
    q = QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3").quantize(torch.full((1, 16), 1e-6))
    assert q.scales.item() == 2.0 ** -9


def test_scale_saturates_at_scale_format_max() -> None:
    q = QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3").quantize(torch.full((1, 16), 1e5))
    assert q.scales.item() == 448.0 and q.dequantize().max().item() == 448.0 * 6


# --- MX (e8m0) rules --------------------------------------------------------------------------------------------
def _mx_block(amax: float) -> torch.Tensor:
    w = torch.linspace(-1, 1, 32) * amax * 0.5
    w[3] = amax
    return w.reshape(1, 32)


@pytest.mark.parametrize("amax, rule, scale, top", [
    (7.0, "floor", 1.0, 6.0), (7.0, "rceil", 2.0, 8.0), (7.0, "even", 2.0, 8.0),  # docs/FORMATS.md 2.1 example
    (7.9, "floor", 1.0, 6.0), (7.9, "rceil", 2.0, 8.0), (7.9, "even", 2.0, 8.0),
    (6.5, "floor", 1.0, 6.0), (6.5, "rceil", 2.0, 6.0), (6.5, "even", 1.0, 6.0),  # 6.5 < 1.75 * 4: EVEN stays
    (6.0, "rceil", 1.0, 6.0), (6.0, "floor", 1.0, 6.0), (5.0, "rceil", 1.0, 4.0), (5.0, "even", 1.0, 4.0),
    (3.5, "floor", 0.5, 3.0), (3.5, "rceil", 1.0, 4.0), (3.5, "even", 1.0, 4.0),  # 3.5 = 1.75 * 2 rounds up
    (0.75, "rceil", 0.125, 0.75), (0.75, "floor", 0.125, 0.75), (0.75, "even", 0.125, 0.75),
])
def test_mx_scale_rules_fp4(amax: float, rule: str, scale: float, top: float) -> None:
    q = QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", scale_rule=rule).quantize(_mx_block(amax))
    assert q.scales.item() == scale
    assert q.dequantize()[0, 3].item() == top


def test_mx_rules_fp8_and_extremes() -> None:
    mk = lambda rule: QuantScheme("float8e4m3", group_size=32, scale_dtype="float8e8m0", scale_rule=rule)
    assert mk("rceil").quantize(_mx_block(448.0)).scales.item() == 1.0
    assert mk("rceil").quantize(_mx_block(449.0)).scales.item() == 2.0
    assert mk("floor").quantize(_mx_block(449.0)).scales.item() == 2.0 ** (8 - 8)
    # EVEN for e4m3 rounds the significand up from 1.9375: 480 = 1.875 * 2^8 stays (clips), 496 = 1.9375 * 2^8 not.
    assert mk("even").quantize(_mx_block(480.0)).scales.item() == 1.0
    assert mk("even").quantize(_mx_block(496.0)).scales.item() == 2.0
    big = mk("rceil").quantize(torch.full((1, 32), 1e45, dtype=torch.float64))
    assert big.scales.item() == 2.0 ** 127  # clamped exponent, no NaN scale
    tiny = QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0").quantize(torch.full((1, 32), 1e-40))
    assert tiny.scales.item() == 2.0 ** -127


def _rceil_reference(amax: float, qmax: float) -> float:
    """ceil(log2(amax / qmax)) from math.frexp (exact), clamped to e8m0."""
    if amax == 0:
        return 1.0
    m, e = math.frexp(amax / qmax)
    return 2.0 ** max(-127, min(127, e - 1 if m == 0.5 else e))


def test_mx_rceil_matches_formula_on_random_blocks() -> None:
    w = random_weight(N, K, seed=8) * 3
    q = QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0").quantize(w)
    amax = _block_amax(w, q.scheme)
    ref = torch.tensor([[_rceil_reference(float(a), 6.0) for a in row] for row in amax])
    assert torch.equal(q.scales.to(torch.float64), ref)
    full, _ = _divisor_and_zero(q)
    assert ((w.double() / full).abs() <= 6.0).all()  # RCEIL never clips


# --- NVFP4 and FP8 block ------------------------------------------------------------------------------------------
def _e4m3(x: np.ndarray) -> np.ndarray:
    return np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def _e2m1_codes(x: np.ndarray) -> np.ndarray:
    return np.clip(x, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF


def test_nvfp4_two_level_matches_modelopt_formula() -> None:
    w = random_weight(N, K, seed=9)
    q = QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True).quantize(w)
    w64 = w.double().numpy()
    s2 = np.float32(np.abs(w64).max() / (6 * 448))
    assert q.global_scale.shape == () and q.global_scale.item() == float(s2)
    amax_b = _block_amax(w, q.scheme).numpy()
    s_b = _e4m3(amax_b / (6 * np.float64(s2)))
    assert np.array_equal(q.scales.numpy().astype(np.float64), s_b)
    full = np.repeat(s_b, 16, axis=1)[:, :K] * np.float64(s2)
    assert np.array_equal(q.codes.numpy(), _e2m1_codes(w64 / full))
    assert q.scales.max().item() <= 448.0


def test_fp8_block_partial_edge_blocks() -> None:
    w = random_weight(200, 300, seed=10)
    q = QuantScheme("float8e4m3", block_size=(128, 128), scale_dtype="float32").quantize(w)
    assert q.scales.shape == (2, 3)
    for i, (r0, r1) in enumerate([(0, 128), (128, 200)]):
        for j, (c0, c1) in enumerate([(0, 128), (128, 256), (256, 300)]):
            amax = w[r0:r1, c0:c1].abs().max().double()
            assert q.scales[i, j].item() == float((amax / 448).float())
    codes = q.codes.numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    full = q.scheme.expand_scales(q.scales.double(), 200, 300).numpy()
    assert np.array_equal(codes, _e4m3(w.double().numpy() / full))


# --- MoE ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["w4a16-int4-g128", "w4a16-int4-g128-zp", "w4a4-nvfp4", "w8a8-fp8-tensor",
                                  "w8a8-fp8-block128", "w4a16-mxfp4"])
def test_moe_experts_are_independent(name: str) -> None:
    scheme = preset(name)
    w = torch.stack([random_weight(N, K, seed=20 + e) * (e + 1) for e in range(3)])
    q = scheme.quantize(w)
    assert q.codes.shape == (3, N, K) and q.num_experts == 3
    assert tuple(q.scales.shape) == (3,) + scheme.scale_shape(N, K)
    if scheme.global_scale:
        assert q.global_scale.shape == (3,)
    dq = q.dequantize()
    for e in range(3):
        qe = scheme.quantize(w[e])
        assert torch.equal(q.codes[e], qe.codes) and torch.equal(q.scales[e], qe.scales)
        if qe.zero_points is not None:
            assert torch.equal(q.zero_points[e], qe.zero_points)
        if qe.global_scale is not None:
            assert q.global_scale[e].item() == qe.global_scale.item()
        assert torch.equal(dq[e], qe.dequantize())


def test_quantize_weight_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="quantize_weight"):
        quantize_weight(preset("w4a16-int4-g128"), torch.zeros(4, dtype=torch.float32))
    with pytest.raises(ValueError, match="quantize_weight"):
        quantize_weight(preset("w4a16-int4-g128"), torch.zeros(4, 8, dtype=torch.int32))


# --- activations -------------------------------------------------------------------------------------------
def _x(m: int = 6, k: int = K, seed: int = 30) -> torch.Tensor:
    x = random_weight(m, k, seed=seed)
    x[1] *= 50.0
    x[2] = 0.0  # an all-zero token
    return x


def test_act_fp8_per_token_vllm_convention() -> None:
    x = _x()
    qa = ActivationScheme("float8e4m3").quantize(x)
    assert isinstance(qa, QuantizedActivation) and qa.scales.shape == (6, 1) and qa.codes.dtype == torch.uint8
    amax = x.abs().amax(-1, keepdim=True).double()
    expect = torch.maximum(amax / 448, torch.tensor(1 / (448 * 512), dtype=torch.float64)).float()
    assert torch.equal(qa.scales, expect)
    codes = _e4m3(x.double().numpy() / qa.scales.double().numpy())
    assert np.array_equal(qa.codes.numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64), codes)
    assert qa.dequantize().dtype == torch.float32
    assert relative_error(qa.dequantize(), x) < 0.04


def test_act_int8_per_token() -> None:
    x = _x()
    qa = ActivationScheme("int8").quantize(x)
    s = qa.scales.double()
    nz = x.abs().amax(-1) > 0
    torch.testing.assert_close(s[nz, 0], (x.abs().amax(-1).double() / 127)[nz].float().double(), rtol=0, atol=0)
    vals = qa.scheme.dtype.decode(qa.codes).double()
    assert torch.equal(vals, torch.round(x.double() / s).clamp(-128, 127))
    assert vals.abs().max() == 127
    assert (qa.dequantize()[2] == 0).all()


def test_act_fp8_group_128_partial() -> None:
    x = _x()
    a = ActivationScheme("float8e4m3", granularity="group", group_size=128)
    qa = a.quantize(x)
    assert qa.scales.shape == (6, 3)
    expect = max(float(x[0, 256:].abs().max()) / 448, 1 / (448 * 512))
    assert qa.scales[0, 2].item() == float(np.float32(expect))
    assert relative_error(qa.dequantize(), x) < 0.04


@pytest.mark.parametrize("rule", ["rceil", "floor", "even"])
def test_act_mx_group_32(rule: str) -> None:
    x = _x()
    a = ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0",
                         scale_rule=rule)
    qa = a.quantize(x)
    assert qa.scales.shape == (6, 10)
    s = qa.scales.double()
    assert torch.equal(s, torch.exp2(torch.round(torch.log2(s))))  # powers of two
    if rule == "rceil":
        ref = [[_rceil_reference(float(x[m, 32 * j:32 * j + 32].abs().max()), 448.0) for j in range(10)]
               for m in range(6)]
        assert torch.equal(s, torch.tensor(ref, dtype=torch.float64))
    assert relative_error(qa.dequantize(), x) < 0.05


def test_act_nvfp4_two_level() -> None:
    x = _x()
    a = ActivationScheme("float4e2m1", granularity="group", group_size=16, scale_dtype="float8e4m3",
                         global_scale=True)
    qa = a.quantize(x)
    x64 = x.double().numpy()
    s2 = np.float32(np.abs(x64).max() / (6 * 448))
    assert qa.global_scale.item() == float(s2)
    amax_b = np.stack([np.abs(x64[:, 16 * j:16 * j + 16]).max(-1) for j in range(19)], axis=1)
    s_b = _e4m3(amax_b / (6 * np.float64(s2)))
    s_b = np.where(amax_b == 0, 1.0, s_b)
    assert np.array_equal(qa.scales.numpy().astype(np.float64), s_b)
    full = np.repeat(s_b, 16, axis=1)[:, :K] * np.float64(s2)
    assert np.array_equal(qa.codes.numpy(), _e2m1_codes(x64 / full))
    assert relative_error(qa.dequantize(), x) < 0.15


def test_act_per_tensor_and_leading_dims() -> None:
    x = _x().reshape(2, 3, K)
    qa = ActivationScheme("float8e4m3", granularity="tensor").quantize(x)
    assert qa.codes.shape == (2, 3, K) and qa.scales.shape == (1, 1, 1)
    assert qa.scales.item() == float(np.float32(float(x.abs().max()) / 448))
    qt = ActivationScheme("int8", granularity="token").quantize(x)
    assert qt.scales.shape == (2, 3, 1) and qt.dequantize().shape == x.shape


def test_act_static_scales() -> None:
    x = _x() * 10
    a = ActivationScheme("float8e4m3", granularity="tensor")
    qa = quantize_activation(a, x, static_scale=torch.tensor(0.5))
    assert qa.scales.item() == 0.5
    assert qa.dequantize().abs().max().item() == 224.0  # x[1] saturates at 448 * 0.5
    nv = ActivationScheme("float4e2m1", granularity="group", group_size=16, scale_dtype="float8e4m3",
                          global_scale=True)
    qn = quantize_activation(nv, x, static_scale=torch.tensor(0.01))
    assert qn.global_scale.item() == pytest.approx(0.01)
    with pytest.raises(ValueError, match="static_scale"):
        quantize_activation(ActivationScheme("float8e4m3"), x, static_scale=torch.tensor(1.0))


# --- presets ------------------------------------------------------------------------------------------------
REQUIRED_PRESETS = ["w4a16-int4-g128", "w4a16-int4-g128-zp", "w3a16-int3-g128", "w8a16-int8-channel",
                    "w8a8-fp8-channel", "w8a8-fp8-block128", "w8a8-int8-channel", "w4a16-mxfp4",
                    "w4a8-mxfp4-fp8", "w4a4-nvfp4"]


def test_required_presets_exist() -> None:
    assert set(REQUIRED_PRESETS) <= set(list_presets())
    assert preset("w4a16-int4-g128") == QuantScheme("int4", group_size=128, scale_dtype="bfloat16")
    nv = preset("w4a4-nvfp4")
    assert nv.global_scale and nv.activation.global_scale and nv.activation.group_size == 16
    assert preset("w8a8-fp8-block128").block_size == (128, 128)
    assert preset("w4a8-mxfp4-fp8").activation.granularity == "token"


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_quantizes(name: str) -> None:
    scheme = preset(name)
    w = random_weight(64, 256, seed=40)
    q = scheme.quantize(w)
    bound = {2: 0.6, 3: 0.46, 4: 0.3, 8: 0.035}[scheme.weight.bits]
    assert relative_error(q.dequantize(), w) < bound
    if scheme.activation is not None:
        x = random_weight(5, 256, seed=41)
        # int4 per token: 15 levels over a whole row (heavy-tailed rows: as coarse as the 4-bit weights)
        a_bound = 0.3 if scheme.activation.dtype.name == "int4" else 0.12
        assert relative_error(scheme.activation.quantize(x).dequantize(), x) < a_bound
    assert QuantScheme.from_dict(scheme.to_dict()) == scheme


def test_unknown_preset_lists_names() -> None:
    with pytest.raises(ValueError, match="w4a16-int4-g128") as err:
        preset("w4a16-int5")
    assert "w4a16-int5" in str(err.value)


# --- config validation ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    (dict(weight="int4", granularity="row"), "QuantScheme.granularity"),
    (dict(weight="int4", granularity="group"), "QuantScheme.group_size"),
    (dict(weight="int4", group_size=0), "QuantScheme.group_size"),
    (dict(weight="int4", granularity="channel", group_size=128), "QuantScheme.group_size"),
    (dict(weight="int4", block_size=(0, 128)), "QuantScheme.block_size"),
    (dict(weight="int4", block_size="big"), "QuantScheme.block_size"),
    (dict(weight="int4", group_size=128, block_size=(128, 128)), "QuantScheme.block_size"),
    (dict(weight="bfloat16"), "QuantScheme.weight"),
    (dict(weight="int44"), "QuantScheme.weight"),
    (dict(weight="int4", scale_dtype="int8"), "QuantScheme.scale_dtype"),
    (dict(weight="int4", scale_dtype="float9e4m4"), "QuantScheme.scale_dtype"),
    (dict(weight="int4", zero_point="yes"), "QuantScheme.zero_point"),
    (dict(weight="int4", zero_point="int"), "QuantScheme.zero_point"),
    (dict(weight="uint4", zero_point="int", granularity="tensor"), "QuantScheme.zero_point"),
    (dict(weight="int4", zero_point_dtype="float16"), "QuantScheme.zero_point_dtype"),
    (dict(weight="uint4", zero_point="float", zero_point_dtype="nope"), "QuantScheme.zero_point_dtype"),
    (dict(weight="float4e2m1", group_size=32, scale_dtype="float8e8m0", scale_rule="round"),
     "QuantScheme.scale_rule"),
])
def test_quant_scheme_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        QuantScheme(**kwargs)


def test_quant_scheme_activation_type_error() -> None:
    with pytest.raises(TypeError, match="QuantScheme.activation"):
        QuantScheme("int4", activation="float8e4m3")  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs, field", [
    (dict(dtype="float16"), "ActivationScheme.dtype"),
    (dict(dtype="fp9"), "ActivationScheme.dtype"),
    (dict(dtype="float8e4m3", granularity="row"), "ActivationScheme.granularity"),
    (dict(dtype="float8e4m3", granularity="group"), "ActivationScheme.group_size"),
    (dict(dtype="float8e4m3", granularity="token", group_size=128), "ActivationScheme.group_size"),
    (dict(dtype="float8e4m3", scale_dtype="int8"), "ActivationScheme.scale_dtype"),
    (dict(dtype="float8e4m3", scale_rule="up"), "ActivationScheme.scale_rule"),
])
def test_activation_scheme_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        ActivationScheme(**kwargs)


def test_quantized_weight_validation() -> None:
    scheme = preset("w4a16-int4-g128")
    with pytest.raises(ValueError, match="scales"):
        QuantizedWeight(scheme, torch.zeros(4, 256, dtype=torch.uint8), torch.ones(4, 3))
    with pytest.raises(ValueError, match="codes"):
        QuantizedWeight(scheme, torch.zeros(4, 256), torch.ones(4, 2))
    with pytest.raises(ValueError, match="zero_points"):
        QuantizedWeight(preset("w4a16-int4-g128-zp"), torch.zeros(4, 256, dtype=torch.uint8), torch.ones(4, 2))


def test_scheme_dict_round_trip_and_hash() -> None:
    s = QuantScheme("uint4", group_size=64, zero_point="float", zero_point_dtype="float16",
                    activation=ActivationScheme("int8"))
    assert QuantScheme.from_dict(s.to_dict()) == s and hash(QuantScheme.from_dict(s.to_dict())) == hash(s)
    assert s.key() == QuantScheme.from_dict(s.to_dict()).key()
    assert dtype("uint4") == s.weight

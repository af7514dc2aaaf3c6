"""Activations quantized and run as 16-bit values: `fake_quantize_activation` (bit-identical to the scheme's
quantize(x).dequantize(dtype)) and QuantLinear(dequantize_activations=...), which feeds those values to the 16-bit
kernels: by default for fp8 activations in groups shorter than 128 on sm_90a in bf16 layers (MXFP8: exact values,
so the 16-bit GEMM computes the quantized GEMM's products; fp32 scales: values rounded to bf16); on request for any
scheme without a global scale, on any target.

The layer's reference is reference_gemm on the quantized-then-dequantized activations (float64) times the
dequantized weight; what remains is fp32 accumulation and the output rounding (plus, for fp32-scaled schemes forced
onto the route, each value's rounding to the layer's dtype: 2^-9 relative in bf16, random in sign), so the
tolerances are test_linear_w8a8's. Outputs are poisoned (NaN) before every launch."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm
from humming_gen.schemes.quantize import quantize_activation as reference_quantize

from test_linear_w8a8 import ELEMENT_TOL, TOLERANCE  # the output-type tolerances (that module's docstring)

pytestmark = pytest.mark.gpu

MXFP8 = hg.ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0")
ACTIVATIONS = {
    "mxfp8": MXFP8,
    "mxfp8-even": hg.ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0",
                                      scale_rule="even"),
    "fp8-g32": hg.ActivationScheme("float8e4m3", granularity="group", group_size=32),
    "fp8-g100": hg.ActivationScheme("float8e4m3", granularity="group", group_size=100),  # a thread per group
    "e5m2-g128": hg.ActivationScheme("float8e5m2", granularity="group", group_size=128),
    "fp8-token": hg.ActivationScheme("float8e4m3"),
    "int8-token": hg.ActivationScheme("int8"),
    "fp8-tensor": hg.ActivationScheme("float8e4m3", granularity="tensor"),
    "e8m0-tensor": hg.ActivationScheme("float8e4m3", granularity="tensor", scale_dtype="float8e8m0"),
    "e5m2-mx-floor": hg.ActivationScheme("float8e5m2", granularity="group", group_size=32, scale_dtype="float8e8m0",
                                         scale_rule="floor"),
    "int4-g32-bf16": hg.ActivationScheme("int4", granularity="group", group_size=32, scale_dtype="bfloat16"),
}


def _x(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g)
    x[:, :: max(1, k // 7)] *= 40.0  # outliers: groups of one row at different scales
    x[0, : min(64, k)] = 0.0  # a zero group (scale 1 / 2^0)
    if m > 1:
        x[1] *= 1e-4
    return x.to(dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.view(torch.int16) == b.view(torch.int16)) | (a.isnan() & b.isnan())


@pytest.mark.parametrize("name", list(ACTIVATIONS))
@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["to-bf16", "to-fp16"])
def test_fake_quantize_is_the_reference_dequantized(name, in_dtype, out_dtype) -> None:
    act = ACTIVATIONS[name]
    # 3004: element loads of 16-bit x (6008 bytes a row), 16-byte ones of fp32; 37: element loads of every dtype
    for seed, (m, k) in enumerate(((5, 4096), (300, 1024), (3, 3004), (2, 37))):
        x = _x(m, k, in_dtype, seed)
        if seed == 1:  # inf beside huge finite values (an e8m0 floor-rule block scale of an inf amax is small), NaN
            x[2, :4] = torch.tensor([float("inf"), 3e38 if in_dtype != torch.float16 else 6e4, -1e37 if
                                     in_dtype != torch.float16 else -3e4, 1.0])
            x[3, 5] = float("nan")
        static = torch.tensor([0.3], device="cuda") if act.granularity == "tensor" and seed % 2 else None
        got = hg.fake_quantize_activation(x, act, static, dtype=out_dtype)
        ref = reference_quantize(act, x, static)
        want = ref.dequantize(out_dtype)
        if act.dtype.bits == 8:  # the codes of quantize_activation, on the same input
            codes = hg.quantize_activation(x, act, static).to_reference().codes
            assert torch.equal(codes, ref.codes), f"{name} {m}x{k}: codes differ"
        assert got.shape == x.shape and got.dtype == out_dtype
        bad = ~_same_bits(got, want)
        assert not bad.any(), (f"{name} {m}x{k} static={static is not None}: {int(bad.sum())} values differ, first "
                               f"at {bad.nonzero()[0].tolist()}: {got[bad][:4].tolist()} vs {want[bad][:4].tolist()}")


def test_fake_quantize_takes_strided_rows_and_leading_dims() -> None:
    base = _x(24, 1056, torch.bfloat16, 9)
    x = base[:, :1024].reshape(2, 12, 1024)[:, ::2]  # rows 2112 bytes apart, not contiguous
    got = hg.fake_quantize_activation(x, MXFP8)
    want = MXFP8.quantize(x.contiguous()).dequantize(torch.bfloat16)
    assert got.shape == (2, 6, 1024) and _same_bits(got, want).all()


def _check(layer: hg.QuantLinear, qw, m: int, bias=None, what: str = "") -> None:
    x = _x(m, qw.k, layer.dtype, m)
    out = torch.full((m, qw.n), float("nan"), device="cuda", dtype=layer.out_dtype)
    layer(x, out=out)
    import attrs

    ref = reference_gemm(x.double(), attrs.evolve(qw, scheme=layer.scheme), bias=bias)
    y = out.double()
    assert torch.isfinite(y).all(), f"{what} m={m}: non-finite outputs"
    err = ((y - ref).norm() / ref.norm()).item()
    assert err < TOLERANCE[layer.dtype], f"{what} m={m}: relative error {err:.3g}"
    worst = ((y - ref).abs().max() / ref.abs().max()).item()
    assert worst < ELEMENT_TOL[layer.dtype], f"{what} m={m}: largest element error {worst:.3g} of max |ref|"


MXFP4_MXFP8 = hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", activation=MXFP8)


@pytest.mark.parametrize("scheme", ["w8a8-mxfp8", MXFP4_MXFP8], ids=["mxfp8", "mxfp4-x-mxfp8"])
@pytest.mark.parametrize("n,k", [(1024, 2048), (4000, 3008), (576, 7168)])
def test_mxfp8_layers_run_their_values_on_16_bit_kernels(scheme, n: int, k: int) -> None:
    """The default on sm_90a: the layer's output is the MXFP8 x weight product (reference with quantized x), and
    the 8-bit kernels (dequantize_activations=False) agree with the same reference."""
    torch.manual_seed(n + k)
    scheme = scheme if isinstance(scheme, hg.QuantScheme) else hg.scheme(scheme)
    qw = scheme.quantize(torch.randn(n, k, device="cuda") * 0.05)
    bias = torch.randn(n, device="cuda").bfloat16() if n == 4000 else None
    layer = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=torch.bfloat16)
    on_wgmma = layer.target.has("wgmma")
    assert (layer.value_scheme == scheme.activation) == on_wgmma, "the default route: sm_90a only"
    assert layer.scheme.activation == scheme.activation
    if on_wgmma:
        assert layer.compute_dtype == "bfloat16" and layer.layer_config.scheme.activation is None
    for m in (1, 3, 16, 64, 127, 1000, 4096):
        _check(layer, qw, m, bias, f"{scheme.activation} default")
    eight_bit = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=torch.bfloat16, dequantize_activations=False)
    assert eight_bit.value_scheme is None and eight_bit.compute_dtype == "float8e4m3"
    for m in (16, 1000):
        _check(eight_bit, qw, m, bias, f"{scheme.activation} 8-bit kernels")


@pytest.mark.parametrize("act_name,dtype", [("fp8-g32", torch.bfloat16), ("fp8-g32", torch.float16),
                                            ("mxfp8", torch.float16), ("int8-token", torch.float16),
                                            ("fp8-tensor", torch.bfloat16)])
def test_requested_route_for_other_schemes(act_name: str, dtype: torch.dtype) -> None:
    """dequantize_activations=True: fp32-scaled groups (values rounded to the layer's dtype), fp16 layers, per-token
    int8 and a static per-tensor scale; x as strided 3-d rows."""
    act = ACTIVATIONS[act_name]
    torch.manual_seed(len(act_name))
    scheme = hg.QuantScheme("int4", group_size=128, activation=act)
    qw = scheme.quantize(torch.randn(1536, 2048, device="cuda") * 0.05)
    if act.granularity == "tensor":
        qw.input_scale = torch.tensor([0.05], device="cuda")
    layer = hg.QuantLinear.from_quantized(qw, dtype=dtype, dequantize_activations=True)
    assert layer.value_scheme == act and layer.compute_dtype == ("bfloat16" if dtype == torch.bfloat16 else "float16")
    for m in (1, 64, 700):
        _check(layer, qw, m, None, f"{act_name} requested")
    x = _x(40, 2112, dtype, 3)[:, :2048].reshape(2, 20, 2048)
    ref = layer(x.reshape(40, 2048).contiguous()).reshape(2, 20, -1)
    assert torch.equal(layer(x), ref), "strided 3-d x: the same rows, the same bits"

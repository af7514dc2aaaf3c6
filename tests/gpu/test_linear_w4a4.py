"""QuantLinear with int4 weights x int4 activations (standard pipeline, mma.sync m16n8k64 s4 on every bucket) against
the float64 reference.

The reference is reference_gemm: x quantized by the scheme's int4 ActivationScheme in float64 (bit-identical to the
codes humming_gen.quantize_activation packs two per byte), dequantized, times the dequantized weight, plus bias.
The kernel's s32 partial sums are exact over a scale group / warp k slice, so what remains is fp32 scaling and
accumulation order and the output rounding: test_linear_w8a8._check's bounds (relative Frobenius error and every
element against the largest reference value), the reference quantizing x as the layer does. Outputs are
poisoned (NaN) before every launch. The layers are built with strict=True, so the s4 kernels run wherever the GPU
has int4 mma.sync, also where ptxas emulates it (sm_90a on: s8 IMMA), which by default falls back to int8
activations (test_w4a4_default_falls_back_where_int4_is_emulated); where the GPU has no int4 mma.sync at all the
layer runs int8 activations (compute_dtype says which), and the reference then quantizes x as the layer does.
"""

from __future__ import annotations

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm
from test_linear_w8a8 import TOLERANCE, _check

pytestmark = pytest.mark.gpu

M_VALUES = (1, 3, 16, 64, 127, 1000)
SHAPES = ((1024, 2048), (4000, 3072), (576, 7168))  # (N, K)
A = hg.ActivationScheme


def _scheme(weight: str, act: A) -> hg.QuantScheme:
    if weight == "channel":
        return hg.QuantScheme("int4", granularity="channel", scale_dtype="float32", activation=act)
    return hg.QuantScheme("int4", group_size=int(weight[1:]), scale_dtype="bfloat16", activation=act)


def _assert_int4(layer: hg.QuantLinear) -> None:
    if layer.target.has("mma_int4"):
        assert layer.compute_dtype == "int4", layer.fallback_reasons
        assert {k.plan.tuning.mma for _, k in layer._buckets} == {"m16n8k64"}
    else:
        assert layer.compute_dtype == "int8"


def _cases():
    for n, k in SHAPES:
        for dtype in (torch.bfloat16, torch.float16):
            bias = dtype == torch.bfloat16
            dt = "bf16" if dtype == torch.bfloat16 else "fp16"
            yield pytest.param(n, k, dtype, bias, id=f"w4a4-int4-g128-n{n}-k{k}-{dt}{'-bias' if bias else ''}")


@pytest.mark.parametrize("n,k,dtype,has_bias", list(_cases()))
def test_w4a4_linear(n: int, k: int, dtype: torch.dtype, has_bias: bool) -> None:
    torch.manual_seed(n + k)
    w = torch.randn(n, k, device="cuda") * 0.05
    bias = torch.randn(n, device="cuda").to(dtype) if has_bias else None
    qw = hg.scheme("w4a4-int4-g128").quantize(w)
    layer = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype, strict=True)
    _assert_int4(layer)
    for m in M_VALUES:
        _check(layer, qw, bias, dtype, m, "w4a4-int4-g128")


ACTIVATIONS = {"token": A("int4"), "g64": A("int4", granularity="group", group_size=64),
               "g128": A("int4", granularity="group", group_size=128), "tensor": A("int4", granularity="tensor")}


@pytest.mark.parametrize("weight", ["channel", "g64", "g128"])
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_w4a4_scale_granularities(weight: str, act: str) -> None:
    """Per-channel / group-64 / group-128 weights x per-token / group-64 / group-128 / per-tensor activations:
    partial sums promoted with both group scales (every 64 k at the finest), the rest in the epilogue."""
    torch.manual_seed(3)
    n, k = 4000, 3072
    qw = _scheme(weight, ACTIVATIONS[act]).quantize(torch.randn(n, k, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw, dtype=torch.bfloat16, strict=True)
    _assert_int4(layer)
    for m in (1, 16, 127, 1000):
        _check(layer, qw, None, torch.bfloat16, m, f"w4a4 {weight} x {act}")


def test_w4a4_from_float_3d_input_and_fp32_out() -> None:
    torch.manual_seed(4)
    n, k = 576, 7168
    w = torch.randn(n, k, device="cuda") * 0.05
    layer = hg.QuantLinear.from_float(w, "w4a4-int4-channel", dtype=torch.bfloat16, out_dtype=torch.float32,
                                      strict=True)
    _assert_int4(layer)
    x = torch.randn(2, 5, k, device="cuda").bfloat16()
    y = layer(x)
    qw = attrs.evolve(hg.scheme("w4a4-int4-channel").quantize(w), scheme=layer.scheme)
    ref = reference_gemm(x.reshape(-1, k).double(), qw).reshape(2, 5, n)
    assert ((y.double() - ref).norm() / ref.norm()).item() < TOLERANCE[torch.bfloat16]


def test_w4a4_default_falls_back_where_int4_is_emulated() -> None:
    """By default a GPU whose int4 mma.sync ptxas emulates (Target.emulated_mma) runs int8 activations per token with
    the int4 weights unchanged (the W4A8 kernels); elsewhere the s4 kernels run."""
    torch.manual_seed(6)
    n, k = 4000, 3072
    qw = hg.scheme("w4a4-int4-g128").quantize(torch.randn(n, k, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw, dtype=torch.bfloat16)
    emulated = ("int4", "int4") in layer.target.emulated_mma
    assert layer.compute_dtype == ("int8" if emulated or not layer.target.has("mma_int4") else "int4")
    for m in (1, 127, 1000):
        _check(layer, qw, None, torch.bfloat16, m, "w4a4-int4-g128 default")

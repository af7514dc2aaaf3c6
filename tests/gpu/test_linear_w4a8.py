"""QuantLinear with weights of at most 4 bits and 8-bit activations (the warp-specialized pipeline, wgmma k32, for every
M on sm_90a, and the standard pipeline, mma.sync m16n8k32, on the same weights; weights widened from nibbles in
registers) against the float64 reference.

The method of test_linear_w8a8.py: reference_gemm quantizes x with the scheme's ActivationScheme in float64
(bit-identical to humming_gen.quantize_activation), dequantizes it and multiplies by the dequantized weight (plus
bias); outputs are poisoned (NaN) before every launch; an outlier row makes per-token scales differ by an order of
magnitude. The widening is exact (int4 x 16 as int8; int4, uint4, e2m1 as e4m3) and so is the 1/16 folded into the
fp32 scales, so what remains is the accumulation order, fp32 scaling and the output rounding: the tolerances are
W8A8's, those of the output type.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from test_linear_w8a8 import ELEMENT_TOL, M_VALUES, TOLERANCE, _check, assert_pipelines, standard_layer
from humming_gen.reference import reference_gemm

pytestmark = pytest.mark.gpu

SHAPES = ((1024, 2048), (4000, 3072), (576, 7168))  # (N, K); group 128 and 32 divide every K
SCHEMES = ("w4a8-int4-g128-int8", "w4a8-int4-channel-int8", "w4a8-int4-g128-fp8", "w4a8-mxfp4-fp8")


def _cases():
    for scheme in SCHEMES:
        for n, k in SHAPES:
            for dtype in (torch.bfloat16, torch.float16):
                bias = dtype == torch.bfloat16
                dt = "bf16" if dtype == torch.bfloat16 else "fp16"
                yield pytest.param(scheme, n, k, dtype, bias, id=f"{scheme}-n{n}-k{k}-{dt}{'-bias' if bias else ''}")


@pytest.mark.parametrize("scheme,n,k,dtype,has_bias", list(_cases()))
def test_w4a8_linear(scheme: str, n: int, k: int, dtype: torch.dtype, has_bias: bool) -> None:
    torch.manual_seed(n + k)
    w = torch.randn(n, k, device="cuda") * 0.05
    bias = torch.randn(n, device="cuda").to(dtype) if has_bias else None
    qw = hg.scheme(scheme).quantize(w)
    layer = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype)
    assert all("nibbles_to_a8" in kern.source for kern in layer.kernels)
    assert_pipelines(layer)
    for m in M_VALUES:
        _check(layer, qw, bias, dtype, m, scheme)
    standard = standard_layer(layer, qw, bias, dtype)
    for m in (1, 7, 16, 64):
        _check(standard, qw, bias, dtype, m, f"{scheme} standard pipeline")


INT3_INT8 = hg.QuantScheme("int3", group_size=64, scale_dtype="float32",
                           activation=hg.ActivationScheme("int8", granularity="token"))
UINT4_FP8 = hg.QuantScheme("uint4", granularity="channel", scale_dtype="float32",
                           activation=hg.ActivationScheme("float8e4m3", granularity="token"))
INT4_E5M2 = hg.QuantScheme("int4", group_size=128, scale_dtype="bfloat16",
                           activation=hg.ActivationScheme("float8e5m2", granularity="token"))
INT4_FP8_GROUPS = hg.QuantScheme("int4", group_size=32, scale_dtype="float32",
                                 activation=hg.ActivationScheme("float8e4m3", granularity="group", group_size=128))


@pytest.mark.parametrize("scheme,out_dtype", [(INT3_INT8, torch.bfloat16), (UINT4_FP8, torch.bfloat16),
                                              (INT4_E5M2, torch.float32), (INT4_FP8_GROUPS, torch.bfloat16)],
                         ids=["int3-g64-x-int8-token", "uint4-channel-x-e4m3-token", "int4-g128-x-e5m2-token-out-fp32",
                              "int4-g32-x-e4m3-g128"])
def test_w4a8_narrow_unsigned_e5m2_and_group_activations(scheme, out_dtype) -> None:
    """int3 sign-extended to nibbles (int8 activations), uint4 through the two-table e4m3 lookup, e5m2 activations
    against e4m3-widened int4 with an fp32 output, and group-32 weight scales with group-128 activation scales
    (promotion every 32 k with both scales)."""
    torch.manual_seed(8)
    n, k = 4000, 3072
    qw = scheme.quantize(torch.randn(n, k, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw, dtype=torch.bfloat16, out_dtype=out_dtype)
    for m in (1, 33, 1000):
        x = torch.randn(m, k, device="cuda").bfloat16()
        x[0, :7] *= 30
        out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
        layer(x, out=out)
        ref = reference_gemm(x.double(), qw)
        y = out.double()
        assert torch.isfinite(y).all(), f"m={m}: non-finite outputs"
        err = ((y - ref).norm() / ref.norm()).item()
        assert err < TOLERANCE[torch.bfloat16], f"m={m}: relative error {err:.3g}"
        worst = ((y - ref).abs().max() / ref.abs().max()).item()
        assert worst < ELEMENT_TOL[torch.bfloat16], f"m={m}: largest element error {worst:.3g} of max |ref|"

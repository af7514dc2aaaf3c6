"""QuantLinear(quantize_in_gemm=True): the buckets of M <= 16 run standard-pipeline kernels that read the 16-bit
x and quantize it per token in their loader (TuningConfig.a_load='quantize'). Their codes and scales are meant to
be those of humming_gen.quantize_activation bit for bit and their tiles are the unfused kernels', so the output must
equal the unfused layer's bitwise (same codes, same scales, same accumulation order); it is also checked against
the float64 reference with test_linear_w8a8's tolerances. Outputs are poisoned (NaN) before every launch.
"""

from __future__ import annotations

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm

pytestmark = pytest.mark.gpu

SHAPES = ((1024, 2048), (4000, 3000), (576, 7168), (8192, 8192))  # (N, K); K % 8 == 0 (the fused loader's rule)
SCHEMES = ("w8a8-fp8-channel", "w8a8-int8-channel")
TOLERANCE = {torch.bfloat16: 8e-3, torch.float16: 3e-3}  # as tests/gpu/test_linear_w8a8.py
ELEMENT_TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2}


W4A8 = ("w4a8-mxfp4-fp8", "w4a8-int4-g128-int8")  # nibble weights; K a multiple of their group (128)
W4A8_SHAPES = ((1024, 2048), (576, 7168), (8192, 8192))


def _cases():
    for scheme in SCHEMES + W4A8:
        for n, k in (W4A8_SHAPES if scheme in W4A8 else SHAPES):
            for dtype in (torch.bfloat16, torch.float16):
                for bias in (False, True):
                    dt = "bf16" if dtype == torch.bfloat16 else "fp16"
                    yield pytest.param(scheme, n, k, dtype, bias,
                                       id=f"{scheme}-n{n}-k{k}-{dt}{'-bias' if bias else ''}")


def _unfused(fused: hg.QuantLinear, qw, **kw) -> hg.QuantLinear:
    """The fused layer's own tiles with the plain cp.async loader (quantize_activation + the same kernels otherwise):
    bitwise comparable (sm_90a's default plan runs the warp-specialized kernels at small M, another summation)."""
    from humming_gen.pipelines.base import TuningPlan

    plan = TuningPlan(tuple((m, attrs.evolve(t, a_load="cp_async")) for m, t in fused.tunings.buckets))
    return hg.QuantLinear.from_quantized(qw, tunings=plan, **kw)


def _poisoned(layer: hg.QuantLinear, m: int) -> torch.Tensor:
    return torch.full((m, layer.out_features), float("nan"), device="cuda", dtype=layer.out_dtype)


@pytest.mark.parametrize("scheme,n,k,dtype,has_bias", list(_cases()))
def test_fused_equals_unfused_and_reference(scheme: str, n: int, k: int, dtype: torch.dtype, has_bias: bool) -> None:
    torch.manual_seed(n + k + has_bias)
    w = torch.randn(n, k, device="cuda") * 0.05
    bias = torch.randn(n, device="cuda").to(dtype) if has_bias else None
    qw = hg.scheme(scheme).quantize(w)
    fused = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype, quantize_in_gemm=True)
    plain = _unfused(fused, qw, bias=bias, dtype=dtype)
    assert any(fused.quantizes_in_gemm) and not any(plain.quantizes_in_gemm)
    for m in range(1, 17):
        assert fused.quantizes_in_gemm[[i for i, (m_max, _) in enumerate(fused._buckets)
                                         if m_max is None or m <= m_max][0]], m
        x = torch.randn(m, k, device="cuda").to(dtype)
        x[0, : min(7, k)] *= 30  # an outlier row: per-token scales differ by an order of magnitude
        if m > 2:
            x[2] = 0  # a zero row: codes 0
        y, y0 = _poisoned(fused, m), _poisoned(plain, m)
        fused(x, out=y)
        plain(x, out=y0)
        assert torch.isfinite(y).all(), f"m={m}: non-finite outputs (rows or columns left unwritten)"
        if not torch.equal(y, y0):
            diff = (y.float() - y0.float()).abs()
            bad = diff.nonzero()
            raise AssertionError(f"m={m}: fused != unfused at {bad.shape[0]} elements (first {bad[:4].tolist()}), "
                                 f"largest difference {diff.max().item():.3g}")
        ref = reference_gemm(x.double(), qw, bias=bias)
        err = ((y.double() - ref).norm() / ref.norm()).item()
        assert err < TOLERANCE[dtype], f"m={m}: relative error {err:.3g}"
        worst = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        assert worst < ELEMENT_TOL[dtype], f"m={m}: largest element error {worst:.3g} of max |ref|"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fused_static_tensor_scale(dtype: torch.dtype) -> None:
    """A checkpoint's static per-tensor input_scale: the loader divides by it (|x| beyond 4 saturates)."""
    torch.manual_seed(5)
    n, k = 1024, 2048
    qw = hg.scheme("w8a8-fp8-tensor").quantize(torch.randn(n, k, device="cuda") * 0.05)
    qw.input_scale = torch.tensor([4.0 / 448], device="cuda")
    fused = hg.QuantLinear.from_quantized(qw, dtype=dtype, quantize_in_gemm=True)
    plain = _unfused(fused, qw, dtype=dtype)
    assert any(fused.quantizes_in_gemm)
    for m in (1, 5, 16):
        x = torch.randn(m, k, device="cuda").to(dtype)
        x[0, :7] *= 30
        y, y0 = _poisoned(fused, m), _poisoned(plain, m)
        fused(x, out=y)
        plain(x, out=y0)
        assert torch.equal(y, y0), m
        ref = reference_gemm(x.double(), qw)
        assert ((y.double() - ref).norm() / ref.norm()).item() < TOLERANCE[dtype], m


def test_fused_strided_and_3d_input() -> None:
    """A row-strided view and (batch, seq, K) inputs: read in place where aligned, else copied (_activation_rows)."""
    torch.manual_seed(3)
    qw = hg.scheme("w8a8-fp8-channel").quantize(torch.randn(512, 1024, device="cuda") * 0.05)
    fused = hg.QuantLinear.from_quantized(qw, dtype=torch.bfloat16, quantize_in_gemm=True)
    plain = _unfused(fused, qw, dtype=torch.bfloat16)
    buf = torch.randn(2, 5, 1104, device="cuda").bfloat16()
    for x in (buf[..., :1024], buf[..., 8:1032], buf[:1, :3, 40:1064]):
        assert torch.equal(fused(x), plain(x))


def test_fused_bucket_takes_no_activation_scales(monkeypatch) -> None:
    """The fused launch is one kernel: no activation-quantization kernel (its codes and scales would be an
    allocation), where the unfused bucket launches one (through QuantLinear's bound RowQuantizer)."""
    from humming_gen.activation.kernel import QuantizeKernel

    qw = hg.scheme("w8a8-int8-channel").quantize(torch.randn(1024, 2048, device="cuda") * 0.05)
    fused = hg.QuantLinear.from_quantized(qw, dtype=torch.bfloat16, quantize_in_gemm=True)
    calls = []
    original = QuantizeKernel.launch
    monkeypatch.setattr(QuantizeKernel, "launch", lambda self, *a: calls.append(1) or original(self, *a))
    fused(torch.randn(4, 2048, device="cuda").bfloat16())
    assert not calls
    fused(torch.randn(64, 2048, device="cuda").bfloat16())
    assert calls  # M = 64: the unfused bucket

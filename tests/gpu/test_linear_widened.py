"""QuantLinear on the warp-specialized kernels whose producer warpgroup's warps 1-3 widen each stage's weights into
shared memory (TuningConfig.b_operand='widened', heuristics.widened_weight_tunings), which the consumers' wgmmas read
through descriptors, against the float64 reference, outputs poisoned before every launch:

- weights of at most 4 bits x 8-bit activations (nibbles widened to 8-bit codes in a BLayoutSw128 panel), every
  bucket from M = 1, the tokens on wgmma's N or on its M, with test_linear_w8a8's tolerances and checks (an outlier
  row, relative Frobenius and largest-element bounds). The weights of the MXFP4 cases carry a power of two per (row,
  group), so folded deltas read for the wrong row or k step show; the fallback case plants one group 2^-12 below
  its row, so its group scales are promoted instead of folded.
- 16-bit activations (weights dequantized into 16-bit panels): the warp-specialized buckets from M = 17 on, the
  formats of test_linear_warp_specialized with its tolerances, N not a multiple of the 256-row tile."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.pipelines.warp_specialized.heuristics import widened_weight_tunings

from humming_gen.reference import reference_gemm
from test_linear_w4a8_fold import _weight
from test_linear_w8a8 import _check
from test_linear_warp_specialized import FORMATS, TOLERANCE

pytestmark = pytest.mark.gpu

M_VALUES = (1, 3, 16, 64, 127, 1000, 4096)
SHAPES = ((4096, 4096), (4000, 3072), (576, 7168))  # (N, K): K whole 128-k panels (the bulk-copied codes)


def widened_layer(qw, bias, dtype, tokens_m: bool = False, out_dtype=None) -> hg.QuantLinear:
    """Every bucket widened into shared memory; `tokens_m`: every bucket with the tokens on wgmma's M."""
    base = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype)
    plan = widened_weight_tunings(base.layer_config, base.target, tokens_m_from=1 if tokens_m else None)
    layer = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype, tunings=plan, out_dtype=out_dtype)
    for m_max, kern in layer._buckets:
        assert kern.plan.tuning.b_operand == "widened", (m_max, kern.name)
        assert kern.plan.kernel_name.endswith("_wd_tm" if tokens_m else "_wd"), (m_max, kern.name)
    return layer


def _cases():
    for scheme, fold in (("w4a8-mxfp4-fp8", True), ("w4a8-mxfp4-fp8", False), ("w4a8-int4-channel-int8", False),
                         ("w4a8-int4-g128-fp8", False), ("w4a8-int4-g128-int8", False)):
        for n, k in SHAPES:
            for dtype in (torch.bfloat16, torch.float16):
                dt = "bf16" if dtype == torch.bfloat16 else "fp16"
                tag = "-fold" if fold else "-promoted" if scheme == "w4a8-mxfp4-fp8" else ""
                yield pytest.param(scheme, fold, n, k, dtype, id=f"{scheme}{tag}-n{n}-k{k}-{dt}")


needs_sm90a = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="wgmma with shared-memory weights: sm_90a")


@needs_sm90a
@pytest.mark.parametrize("scheme,fold,n,k,dtype", list(_cases()))
def test_w4a8_widened_weights(scheme: str, fold: bool, n: int, k: int, dtype: torch.dtype) -> None:
    torch.manual_seed(n + k + 3)
    w = _weight(n, k, seed=n + k, fold=fold) if scheme == "w4a8-mxfp4-fp8" else torch.randn(n, k) * 0.05
    qw = hg.scheme(scheme).quantize(w.cuda())
    bias = torch.randn(n, device="cuda").to(dtype) if dtype == torch.bfloat16 else None
    layer = widened_layer(qw, bias, dtype)
    assert layer.fold_scales == fold
    for m in M_VALUES:
        _check(layer, qw, None if bias is None else bias.double(), dtype, m, f"{scheme} widened")


@needs_sm90a
@pytest.mark.parametrize("scheme", ["w4a8-mxfp4-fp8", "w4a8-int4-channel-int8"])
@pytest.mark.parametrize("n,k", [(4000, 3072), (576, 7168)])
def test_w4a8_widened_tokens_on_m(scheme: str, n: int, k: int) -> None:
    """128-token tiles with the tokens as wgmma's A operand (folded MXFP4: per-token scales two rows a thread, the
    rows' 2^r with the output; int8 x int8 one set of s32 sums), fp32 outputs on one of the shapes."""
    qw = hg.scheme(scheme).quantize(_weight(n, k, seed=n + k, fold=True).cuda())
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    out_dtype = torch.float32 if n == 576 else None
    layer = widened_layer(qw, bias, torch.bfloat16, tokens_m=True, out_dtype=out_dtype)
    for m in M_VALUES:
        _check(layer, qw, bias.double(), torch.bfloat16, m, f"{scheme} widened, tokens on M")


WS_M_VALUES = (17, 64, 127, 1000, 4096, 5000)  # 5000: the open-ended bucket's 160 / 176-token tiles


@needs_sm90a
@pytest.mark.parametrize("cid,kwargs,dtype", [f for f in FORMATS if f[0] not in ("int4-g48",)],
                         ids=[f[0] for f in FORMATS if f[0] not in ("int4-g48",)])
@pytest.mark.parametrize("n,k", [(4000, 3072), (1536, 2048)])
def test_16bit_widened_weights(cid: str, kwargs: dict, dtype: torch.dtype, n: int, k: int) -> None:
    """(int4-g48 left out: groups that are not a multiple of 16 run the standard pipeline.)"""
    torch.manual_seed(n * 7 + k + 1)
    qw = hg.QuantScheme(**kwargs).quantize(torch.randn(n, k, device="cuda") * 0.05)
    bias = (torch.randn(n, device="cuda") * 0.1).to(dtype)
    base = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype)
    plan = widened_weight_tunings(base.layer_config, base.target)
    layer = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype, tunings=plan)
    for m in WS_M_VALUES:
        kernel = layer.kernel_for(m)
        assert kernel.plan.tuning.b_operand == "widened" and kernel.name.endswith("_wd"), (m, kernel.name)
        x = torch.randn(m, k, device="cuda").to(dtype)
        out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")  # poison
        layer(x, out=out)
        ref = reference_gemm(x.double(), qw, bias=bias.double())
        assert torch.isfinite(out).all(), f"{cid} m={m}: non-finite output (poison left or overflow)"
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < TOLERANCE[dtype], f"{cid} m={m}: relative error {err:.3g}"

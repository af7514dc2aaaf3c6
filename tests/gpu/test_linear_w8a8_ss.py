"""QuantLinear with 8-bit weights x 8-bit activations on the warp-specialized kernels that read the weights from
shared memory (TuningConfig.b_operand='shared': WgmmaSS8, weights packed in BLayoutSw128), every bucket from M = 1
(heuristics.shared_weight_tunings), with the tokens on wgmma's N (swap-AB) or on its M (tokens_on='m'), against the
float64 reference with test_linear_w8a8's tolerances and checks (outputs poisoned, an outlier row, relative
Frobenius and largest-element bounds)."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.pipelines.warp_specialized.heuristics import shared_weight_tunings

from test_linear_w8a8 import SHAPES, _check

pytestmark = pytest.mark.gpu

SCHEMES = ("w8a8-int8-channel", "w8a8-fp8-channel", "w8a8-fp8-block128", "w8a8-mxfp8")
M_VALUES = (1, 3, 16, 33, 64, 127, 1000, 4096)


def _cases():
    for scheme in SCHEMES:
        for n, k in SHAPES:
            if scheme != "w8a8-int8-channel" and scheme != "w8a8-fp8-channel" and k % 128:
                k = k // 128 * 128 + 128  # activation groups need K % group == 0 (LayerConfig): 3072
            for dtype in (torch.bfloat16, torch.float16):
                bias = dtype == torch.bfloat16
                dt = "bf16" if dtype == torch.bfloat16 else "fp16"
                yield pytest.param(scheme, n, k, dtype, bias, id=f"{scheme}-n{n}-k{k}-{dt}{'-bias' if bias else ''}")


def shared_weight_layer(qw, bias, dtype, tokens_m: bool = False, out_dtype=None, block_n: int = 256) -> hg.QuantLinear:
    """Every bucket on shared weights; `tokens_m`: every bucket with the tokens on wgmma's M, tiles of `block_n`
    weight rows."""
    base = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, bias=bias, dtype=dtype)
    plan = shared_weight_tunings(base.layer_config, base.target, tokens_m_from=1 if tokens_m else None,
                                 tokens_m_block_n=block_n)
    layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, bias=bias, dtype=dtype, tunings=plan,
                                          out_dtype=out_dtype)
    suffix = "_ss_tm" if tokens_m else "_ss"
    for m_max, kern in layer._buckets:
        assert kern.plan.tuning.b_operand == "shared" and kern.plan.kernel_name.endswith(suffix), (m_max, kern.name)
        assert not tokens_m or kern.plan.tuning.block_n == block_n, (m_max, kern.name)
    return layer


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="wgmma with shared-memory weights: sm_90a")
@pytest.mark.parametrize("scheme,n,k,dtype,has_bias", list(_cases()))
def test_w8a8_shared_weights(scheme: str, n: int, k: int, dtype: torch.dtype, has_bias: bool) -> None:
    torch.manual_seed(n + k + 1)
    w = torch.randn(n, k, device="cuda") * 0.05
    qw = hg.scheme(scheme).quantize(w)
    bias = torch.randn(n, device="cuda").to(dtype) if has_bias else None
    layer = shared_weight_layer(qw, bias, dtype)
    for m in M_VALUES:
        _check(layer, qw, None if bias is None else bias.double(), dtype, m, f"{scheme} shared weights")


TOKENS_M_SCHEMES = ("w8a8-int8-channel", "w8a8-fp8-channel", "w8a8-fp8-block128", "w8a8-fp8-tensor")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="wgmma with shared-memory weights: sm_90a")
@pytest.mark.parametrize("scheme", TOKENS_M_SCHEMES)
@pytest.mark.parametrize("n,k", [(4000, 3072), (576, 7168), (1000, 1024)])
@pytest.mark.parametrize("block_n,halves", [(128, True), (128, False), (256, False)],
                         ids=["n128-halves", "n128-one-set", "n256"])
def test_w8a8_tokens_on_m(scheme: str, n: int, k: int, block_n: int, halves: bool, monkeypatch) -> None:
    """Tiles of 128 tokens as wgmma's A operand: rows past M (every M below is a partial tile but 4096), N not a
    multiple of the tile (576 = 2 x 256 + 64 rows, the last 256-row tile with one layout block), bias and both
    16-bit dtypes; 128-row tiles promoted in overlapped halves or one set (compose_a8.TOKENS_M_OVERLAP)."""
    from humming_gen.pipelines.warp_specialized import compose_a8

    monkeypatch.setattr(compose_a8, "TOKENS_M_OVERLAP", halves)
    torch.manual_seed(n + k + 2)
    qw = hg.scheme(scheme).quantize(torch.randn(n, k, device="cuda") * 0.05)
    for dtype in (torch.bfloat16, torch.float16):
        bias = torch.randn(n, device="cuda").to(dtype) if dtype == torch.bfloat16 else None
        layer = shared_weight_layer(qw, bias, dtype, tokens_m=True, block_n=block_n)
        for m in M_VALUES:
            _check(layer, qw, None if bias is None else bias.double(), dtype, m, f"{scheme} tokens on M")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="wgmma with shared-memory weights: sm_90a")
def test_w8a8_tokens_on_m_fp32_output_and_odd_ldc() -> None:
    """fp32 outputs (float2 pair stores), and a row stride that is odd (each value stored alone)."""
    torch.manual_seed(11)
    n, k = 1000, 2048
    qw = hg.scheme("w8a8-fp8-block128").quantize(torch.randn(n, k, device="cuda") * 0.05)
    layer = shared_weight_layer(qw, None, torch.bfloat16, tokens_m=True, out_dtype=torch.float32)
    for m in (1, 200):
        _check(layer, qw, None, torch.bfloat16, m, "tokens on M, fp32 out")
    layer = shared_weight_layer(qw, None, torch.bfloat16, tokens_m=True)
    x = torch.randn(300, k, device="cuda").bfloat16()
    wide = torch.full((300, n + 1), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = wide[:, :n]  # row stride n + 1: odd
    layer(x, out=out)
    ref = layer(x)
    assert torch.equal(out, ref) and torch.isnan(wide[:, n]).all()

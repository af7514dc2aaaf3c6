"""QuantLinear with 8-bit weights x 8-bit activations on the warp-specialized kernels that read the weights from
shared memory (TuningConfig.b_operand='shared': WgmmaSS8, weights packed in BLayoutSw128), every bucket from M = 1
(heuristics.shared_weight_tunings), against the float64 reference with test_linear_w8a8's tolerances and checks
(outputs poisoned, an outlier row, relative Frobenius and largest-element bounds)."""

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


def shared_weight_layer(qw, bias, dtype) -> hg.QuantLinear:
    base = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype)
    layer = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype,
                                          tunings=shared_weight_tunings(base.layer_config, base.target))
    for m_max, kern in layer._buckets:
        assert kern.plan.tuning.b_operand == "shared" and kern.plan.kernel_name.endswith("_ss"), (m_max, kern.name)
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

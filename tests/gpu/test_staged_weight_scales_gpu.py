"""The standard pipeline's 8-bit-activation kernels with their weight group scales read either way: staged through
shared memory (pipelines.standard.compose_a8.STAGE_WEIGHT_SCALES, the default, `_wss`) or from global memory at each
promotion (the switch off; still the path of group k sides that neither divide block_k nor are multiples of it).
CPU tests: tests/cpu/test_staged_weight_scales.py. On the GPU against the float64 references: dense layers on
every bucket of the standard pipeline (split-K ones included; odd N and K, fp16 with a bias), and QuantMoE's routed
GEMMs on the standard pipeline (MXFP4 group-32 and DeepSeek-style 128 x 128 block scales, ragged routing).
Tolerances and checks are those of the default kernels' tests."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.pipelines.standard import compose_a8
from test_linear_w8a8 import _check, standard_layer
from test_quant_moe import _routing
from test_quant_moe_a8 import build_layer, check_routed_gemms

pytestmark = pytest.mark.gpu

SCHEMES = ("w4a8-mxfp4-fp8", "w8a8-fp8-block128", "w4a8-int4-g128-int8")


@pytest.fixture(autouse=True, params=[True, False], ids=["staged", "global"])
def staged(monkeypatch, request) -> bool:
    monkeypatch.setattr(compose_a8, "STAGE_WEIGHT_SCALES", request.param)
    return request.param


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16-bias"])
@pytest.mark.parametrize("n,k", [(1024, 2048), (4000, 3072)])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_staged_weight_scales_dense(scheme: str, n: int, k: int, dtype: torch.dtype, staged: bool) -> None:
    torch.manual_seed(n + k)
    qw = hg.scheme(scheme).quantize(torch.randn(n, k, device="cuda") * 0.05)
    bias = torch.randn(n, device="cuda").to(dtype) if dtype == torch.float16 else None
    layer = standard_layer(hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype), qw, bias, dtype)
    names = {kern.plan.kernel_name for _, kern in layer._buckets}
    assert all(name.endswith("_wss") == staged for name in names), names
    for m in (1, 7, 16, 64, 127, 1000):
        _check(layer, qw, bias, dtype, m, f"{scheme} staged")


@pytest.mark.parametrize("preset", ["w4a8-mxfp4-fp8", "w8a8-fp8-block128"])
def test_staged_weight_scales_moe(preset: str, staged: bool) -> None:
    moe, q13, q2, b13, b2 = build_layer(preset, 19, seed=7, pipeline="standard", biases=True, fused=False)
    assert all(g.kernel.plan.kernel_name.endswith("_wss") == staged for pair in moe._launchers for g in pair)
    check_routed_gemms(moe, q13, q2, b13, b2, (1, 7, 128, 1000), _routing, f"{preset} staged")


@pytest.mark.parametrize("layout", ["grouped_masked", "grouped_contiguous"])
def test_staged_weight_scales_grouped(layout: str) -> None:
    """The grouped kernels (for_expert rebases p.b_scale before the stage loader reads it) through the unstaged
    test's checks; QuantMoE(pipeline="standard") keeps them on the standard pipeline."""
    from test_quant_moe_a8 import test_a8_grouped_moe_gemm

    test_a8_grouped_moe_gemm("w4a8-mxfp4-fp8", layout)

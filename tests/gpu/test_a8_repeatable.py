"""Races in the 8-bit warp-specialized kernels show first as outputs that differ from run to run: the same layer on
the same input, launched several times at a large M (every SM busy, tiles queued behind each other), must give
bitwise-equal outputs, and they must match the float64 reference (test_linear_w8a8's tolerances).

The kernels of 2026-12-04's race (a consumer released a stage before its loads of the staged scales came back:
tests/cpu/test_stage_release.py) gave a different output in each of six runs at 4000 x 3072, M = 4096, with the
tokens on wgmma's M in 128-row tiles (40-70 of 1024 tiles off by up to 3 % of max |ref|)."""

from __future__ import annotations

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm
from test_linear_w8a8 import TOLERANCE, _check

pytestmark = pytest.mark.gpu

RUNS = 6
M = 4096


def _tokens_m_n128(qw, dtype):
    """fp8 block128 with the tokens on wgmma's M in 128-row tiles at every M (the configuration that raced)."""
    from humming_gen.pipelines.warp_specialized.heuristics import shared_weight_tunings

    base = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=dtype)
    plan = shared_weight_tunings(base.layer_config, base.target, tokens_m_from=1, tokens_m_block_n=128)
    return hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=dtype, tunings=plan)


CASES = [("w8a8-fp8-block128", _tokens_m_n128), ("w8a8-fp8-block128", None), ("w8a8-mxfp8", None),
         ("w4a8-mxfp4-fp8", None), ("w8a8-fp8-channel", None), ("w8a8-int8-channel", None)]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="warp-specialized kernels: sm_90a")
@pytest.mark.parametrize("scheme,make", CASES, ids=["w8a8-fp8-block128-tokens-m-n128", "w8a8-fp8-block128",
                                                     "w8a8-mxfp8", "w4a8-mxfp4-fp8", "w8a8-fp8-channel",
                                                     "w8a8-int8-channel"])
def test_outputs_are_the_same_in_every_run(scheme: str, make) -> None:
    torch.manual_seed(7)
    n, k, dtype = 4000, 3072, torch.float16
    qw = hg.scheme(scheme).quantize(torch.randn(n, k, device="cuda") * 0.05)
    layer = make(qw, dtype) if make else hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=dtype)
    plan = layer.kernel_for(M).plan
    assert plan.pipeline == "warp_specialized" and "_ws_q" in plan.kernel_name, plan.kernel_name
    if make is _tokens_m_n128:
        assert plan.kernel_name.endswith("_ss_tm") and plan.tuning.block_n == 128, plan.kernel_name
    x = torch.randn(M, k, device="cuda").to(dtype)
    outs = []
    for _ in range(RUNS):
        out = torch.full((M, n), float("nan"), device="cuda", dtype=dtype)
        layer(x, out=out)
        outs.append(out)
    differ = [i for i, o in enumerate(outs) if not torch.equal(o, outs[0])]
    assert not differ, f"{scheme}: runs {differ} differ from run 0 in " \
                       f"{[(o != outs[0]).sum().item() for o in outs[1:]]} elements"
    ref = reference_gemm(x.double(), attrs.evolve(qw, scheme=layer.scheme))
    y = outs[0].double()
    assert torch.isfinite(y).all()
    assert ((y - ref).norm() / ref.norm()).item() < TOLERANCE[dtype]
    _check(layer, qw, None, dtype, M, f"{scheme} repeatable")  # (a fresh input, the outlier row, both bounds)

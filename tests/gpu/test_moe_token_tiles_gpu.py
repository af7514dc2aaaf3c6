"""The warp-specialized MoE GEMMs on token tiles between the heuristics' 128 and the 16-bit kernels' 176 (144 and 160:
multiples of 16, the 8-bit producer's rows per pass; NVRTC without spills: tests/cpu/test_moe_gemm_ws.py), forced
onto the open-ended bucket, on the GPU through the default tiles' own checks: the routed GEMMs' exact rows and
values (16-bit and 8-bit activations, ragged routing, dropped slots) into poisoned outputs."""

from __future__ import annotations

import pytest

import test_quant_moe_a8 as a8  # (modules, not their test functions: those would be collected here again)
import test_quant_moe_a8_ws as ws8
import test_quant_moe_ws as ws16
from humming_gen.pipelines.warp_specialized import heuristics

pytestmark = pytest.mark.gpu


@pytest.fixture(params=[144, 160], ids=lambda t: f"tile{t}")
def tile(monkeypatch, request) -> int:
    monkeypatch.setattr(heuristics, "MOE_BUCKETS", ((8, 8), (16, 16), (64, 64), (None, request.param)))
    return request.param


@pytest.mark.parametrize("case", ws16.CASES[:3], ids=[c[0] for c in ws16.CASES[:3]])
def test_16_bit_routed_gemms_on_the_tile(case, tile: int) -> None:
    moe = ws16._layer(case, seed=3, fused=False)[0]
    top_k, e = case[6], case[3]
    assert moe.block_m(200 * e // top_k, top_k) == tile
    ws16.test_warp_specialized_gemms_write_exactly_the_routed_rows(case, 200)


@pytest.mark.parametrize("preset", ["w8a8-fp8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8"])
def test_8_bit_routed_gemms_on_the_tile(preset: str, tile: int) -> None:
    moe, q13, q2, b13, b2 = ws8._layer(preset, 19, seed=7, pipeline="warp_specialized", biases=True, fused=False)
    tiles = a8.check_routed_gemms(moe, q13, q2, b13, b2, (1000, 2000), ws8._ragged_routing, f"{preset} tile {tile}")
    assert tiles == {tile}, tiles

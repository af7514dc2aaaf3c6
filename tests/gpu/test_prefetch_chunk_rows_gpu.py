"""The indexed warp-specialized MoE kernels with their staged stores reading each chunk's rows and router weights one
chunk ahead (pipelines.warp_specialized.compose.PREFETCH_CHUNK_ROWS, the default) or in program order (the switch
off, kept for measurements), host test of the store:
tests/cpu/test_staged_store_host.py), on the GPU through the default kernels' own tests: the routed GEMMs' exact
rows and values, 16-bit and 8-bit activations, and whole layers against the float64 reference."""

from __future__ import annotations

import pytest

import test_quant_moe_a8_ws as ws8  # (modules, not their test functions: those would be collected here again)
import test_quant_moe_ws as ws16
from humming_gen.pipelines.warp_specialized import compose as ws_compose

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True, params=[True, False], ids=["ahead", "in-order"])
def prefetch(monkeypatch, request):
    monkeypatch.setattr(ws_compose, "PREFETCH_CHUNK_ROWS", request.param)
    # the switch reaches the kernels these tests build (compose reads it per plan; the kernel cache keys on source)
    from humming_gen.codegen import compose
    from humming_gen.config import ComputeConfig, LayerConfig
    from humming_gen.kernel import generate
    from humming_gen.pipelines.warp_specialized.heuristics import moe_tuning_for
    from humming_gen.targets import get_target

    layer = LayerConfig(n=512, k=256, scheme="w4a16-int4-g128", num_experts=8)
    tuning = moe_tuning_for(layer, get_target("sm_90a"), 128)
    src = generate(compose(layer, ComputeConfig(gemm="indexed", topk_weight=True), tuning, get_target("sm_90a")))
    assert ("rows_next" in src) == request.param


@pytest.mark.parametrize("rows", [25, 200], ids=lambda r: f"rows{r}-per-expert")  # token tiles 64, 128
@pytest.mark.parametrize("case", ws16.CASES[:3], ids=[c[0] for c in ws16.CASES[:3]])
def test_prefetched_rows_16_bit_routed_gemms(case, rows) -> None:
    ws16.test_warp_specialized_gemms_write_exactly_the_routed_rows(case, rows)


@pytest.mark.parametrize("case", ws16.CASES[:2], ids=[c[0] for c in ws16.CASES[:2]])
def test_prefetched_rows_16_bit_layer(case) -> None:
    ws16.test_quant_moe_with_warp_specialized_buckets_matches_reference(case, fused=True)


@pytest.mark.parametrize("preset", ["w8a8-fp8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8"])
def test_prefetched_rows_8_bit_routed_gemms(preset: str) -> None:
    ws8.test_a8_ws_gemms_write_exactly_the_routed_rows(preset)

"""The standard pipeline's small-tile MoE buckets (pipelines.standard.heuristics.moe_small_tile): which buckets take
three or four CTAs per SM, that the split-K bucket and other weight widths keep their tunings, that indexed and
grouped GEMMs agree, that no bucket leaves the layout's warp k slice, and that the kernels compile without spills
under the 3- and 4-CTA register caps."""

from __future__ import annotations

import pytest

from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.codegen import compose
from humming_gen.heuristics import choose_tunings, grouped_moe_tuning, moe_tunings
from humming_gen.heuristics.choose import moe_standard_plans
from humming_gen.kernel import build_many
from humming_gen.pipelines.standard.heuristics import MOE_SMALL_TILES, moe_small_tile_fields
from humming_gen.targets import get_target

SM90 = get_target("sm_90a")
QWEN3 = ((2 * 768, 2048), (2048, 768))  # (n, k) of gate-up and down, E = 128


def _layers(scheme: str, shapes=QWEN3, experts: int = 128) -> list[LayerConfig]:
    return [LayerConfig(n=n, k=k, scheme=scheme, num_experts=experts) for n, k in shapes]


def _standard(layers: list[LayerConfig]):
    return [choose_tunings(layer, SM90, pipeline="standard") for layer in layers]


MOST_ROWS = max(MOE_SMALL_TILES)


def _small(t) -> bool:
    """Whether t is the small-tile tuning of its m block."""
    fields = moe_small_tile_fields(t.block_m)
    return fields is not None and all(getattr(t, name) == value for name, value in fields.items() if name != "stages")


@pytest.mark.parametrize("scheme", ["w4a16-int4-g128", "w4a16-mxfp4", "w4a8-mxfp4-fp8"])
def test_small_m_blocks_of_4_bit_weights_take_small_tiles(scheme: str) -> None:
    layers = _layers(scheme)
    plans = moe_standard_plans(_standard(layers), layers, SM90)
    for plan in plans:
        (bound, split), rest = plan.buckets[0], plan.buckets[1:]
        assert bound < 1 and not _small(split), plan  # the split bucket (one GEMM may not split) keeps its own
        small = [t for _, t in rest if t.block_m <= MOST_ROWS]
        assert small and all(_small(t) for t in small), plan
        assert all(not _small(t) for _, t in rest if t.block_m > MOST_ROWS), plan
    # the layer's own plans (warp-specialized from 32 rows on) keep the standard buckets below it
    own = moe_tunings(_standard(layers), layers, [ComputeConfig(gemm="indexed")] * 2, SM90)
    assert all(_small(t) for plan in own for m, t in plan.buckets[1:] if t.block_m <= MOST_ROWS)


@pytest.mark.parametrize("scheme", ["w8a16-int8-channel", "w3a16-int3-g128", "w8a8-fp8-channel"])
def test_other_weight_widths_keep_the_dense_buckets(scheme: str) -> None:
    layers = _layers(scheme)
    plans = moe_standard_plans(_standard(layers), layers, SM90, split_k=1)
    dense = _standard(layers)
    for plan, own in zip(plans, dense):
        assert [t.ctas_per_sm for _, t in plan.buckets] == [t.ctas_per_sm for _, t in own.buckets]
        assert [t.block_k for _, t in plan.buckets] == [t.block_k for _, t in own.buckets]


@pytest.mark.parametrize("warp_k", [32, 64, 128])
def test_small_tiles_keep_the_warp_k_slice(warp_k: int) -> None:
    """Every bucket of a GEMM keeps its layout's k slice per warp (one packed weight), also where the standard plans
    were chosen for another layout (choose_tunings' warp_k override): such buckets keep their own tunings."""
    layers = _layers("w4a16-int4-g128")
    standard = [choose_tunings(layer, SM90, pipeline="standard", warp_k=warp_k) for layer in layers]
    for plan in moe_standard_plans(standard, layers, SM90, split_k=1):
        assert {t.block_k // t.warps_k for _, t in plan.buckets} == {warp_k}, plan
        assert any(_small(t) for _, t in plan.buckets) == (warp_k == 64), plan


def test_grouped_gemms_take_the_indexed_buckets_tile() -> None:
    layers = _layers("w4a16-int4-g128")
    standard = _standard(layers)
    indexed = moe_standard_plans(standard, layers, SM90, split_k=1)
    for layer, plan, own in zip(layers, standard, indexed):
        for rows in (1, 4, 8, 12, 16):
            t = grouped_moe_tuning(plan, layer, ComputeConfig(gemm="grouped_contiguous"), SM90, rows)
            assert _small(t) and t == own.for_m(rows), (rows, t)


@pytest.mark.parametrize("target", ["sm_90a", "sm_89", "sm_80", "sm_120a"])
@pytest.mark.parametrize("activation", ["silu_mul", "swiglu_oai"])
@pytest.mark.parametrize("scheme", ["w4a16-int4-g128", "w4a16-mxfp4", "w4a8-mxfp4-fp8", "w4a8-int4-g128-int8"])
def test_small_tile_kernels_compile_without_spills(scheme: str, activation: str, target: str) -> None:
    """Every small m block's kernels (GEMM1 with a fused gated epilogue, GEMM2 with router weights, grouped) within
    their CTAs' register share, on each target whose shared memory holds the CTAs (fp8 activations from sm_89)."""
    tgt = get_target(target)
    if target == "sm_80" and scheme == "w4a8-mxfp4-fp8":
        pytest.skip("fp8 activations: sm_89 on")
    layers = _layers(scheme)
    standard = [choose_tunings(layer, tgt, pipeline="standard") for layer in layers]
    plans = moe_standard_plans(standard, layers, tgt, split_k=1)
    computes = [ComputeConfig(gemm="indexed", epilogue_activation=activation),
                ComputeConfig(gemm="indexed", topk_weight=True)]
    built = []
    for rows in MOE_SMALL_TILES:
        for layer, compute, plan in zip(layers, computes, plans):
            t = plan.for_m(rows)
            assert t.block_m == rows and (_small(t) or target != "sm_90a"), t
            built.append(compose(layer, compute, t, tgt))
        built.append(compose(layers[1], ComputeConfig(gemm="grouped_contiguous"), plans[1].for_m(rows), tgt))
    for plan, kernel in zip(built, build_many(built)):  # ptxas warnings fail the compile
        r = kernel.compiled.resources
        cap = 65536 // (plan.tuning.ctas_per_sm * plan.threads)
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0 and r["registers"] <= cap, (kernel.name, r)


def test_short_k_rings_hold_every_k_tile_in_flight() -> None:
    """A ring one stage deeper than the k tiles a CTA walks, so the prologue fetches them all (slice_stages): the
    DeepSeek-V3 down GEMM (K = 256, block_k 128: two k tiles) in 8-row m blocks runs 3 stages, the gate-up GEMM
    (K = 7168) the table's 4."""
    layers = _layers("w4a16-int4-g128", shapes=((512, 7168), (7168, 256)), experts=256)
    gate_up, down = (dict(plan.buckets)[8] for plan in moe_standard_plans(_standard(layers), layers, SM90, split_k=1))
    assert (down.block_k, down.ctas_per_sm, down.stages) == (128, 4, 3), down
    assert (gate_up.block_k, gate_up.ctas_per_sm, gate_up.stages) == (128, 4, 4), gate_up

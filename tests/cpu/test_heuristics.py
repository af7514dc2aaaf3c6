"""Heuristic tunings by invariants, not exact tiles: for several layers on every target the standard pipeline
serves, the M buckets are contiguous and cover every M, each bucket's tuning composes (legal, fits shared
memory), all buckets share one weight layout, and split-K never exceeds the k tiles."""

from __future__ import annotations

import math

import pytest

from codegen_cases import COMPOSE_TARGETS
from humming_gen.codegen.compose import ComposeError, compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.layer.weights import layout_key
from humming_gen.schemes import QuantScheme
from humming_gen.targets import get_target

LAYERS = {
    "int4-g128-8192x8192": LayerConfig(8192, 8192, "w4a16-int4-g128"),
    "int4-g128-4096x4096-fp16-bias": LayerConfig(4096, 4096, "w4a16-int4-g128", dtype="float16", has_bias=True),
    "uint4-zp-g128-4000x3000": LayerConfig(4000, 3000, "w4a16-int4-g128-zp"),
    "int8-channel-640x7168": LayerConfig(640, 7168, "w8a16-int8-channel"),
    "fp8-block128-7168x2048": LayerConfig(7168, 2048, QuantScheme("float8e4m3", block_size=(128, 128),
                                                                 scale_dtype="float32")),
    "nvfp4-g16-14336x4096": LayerConfig(14336, 4096, QuantScheme("float4e2m1", group_size=16,
                                                                 scale_dtype="float8e4m3", global_scale=True)),
    "mxfp4-g32-fp16-2880x2880": LayerConfig(2880, 2880, "w4a16-mxfp4", dtype="float16"),
    "int3-g128-small-256x200": LayerConfig(256, 200, "w3a16-int3-g128"),
    "uint2-zp-g64-tiny-16x64": LayerConfig(16, 64, "w2a16-int2-g64-zp"),
    # many group rows per stage: the shared-memory sizing must be compose's own (100 KB parts)
    "int8-g32-8192x8192": LayerConfig(8192, 8192, QuantScheme("int8", group_size=32)),
    "uint8-zp-g64-8192x8192": LayerConfig(8192, 8192, QuantScheme("uint8", group_size=64, zero_point="int")),
    "uint4-zp-g16-8192x8192": LayerConfig(8192, 8192, QuantScheme("uint4", group_size=16, zero_point="int")),
    "uint4-fzp-g1-4096x4096": LayerConfig(4096, 4096, QuantScheme("uint4", group_size=1, zero_point="float")),
    # groups that are not multiples of 16: a stage holds every row its k range touches (38 for g7, block_k 256)
    "uint4-zp-g7-4096x4096": LayerConfig(4096, 4096, QuantScheme("uint4", group_size=7, zero_point="float")),
    "fp8-block128x24-1001x1000": LayerConfig(1001, 1000, QuantScheme("float8e4m3", block_size=(128, 24),
                                                                     scale_dtype="float32")),
}
PROBE_M = (1, 2, 7, 8, 9, 16, 17, 31, 32, 33, 64, 65, 255, 256, 257, 1000, 4096, 65536, 10**7)


def _params():
    return [pytest.param(name, target, id=f"{name}-{target}") for name in LAYERS for target in COMPOSE_TARGETS]


@pytest.mark.parametrize("name, target", _params())
def test_buckets_contiguous_and_cover_all_m(name: str, target: str) -> None:
    tp = choose_tunings(LAYERS[name], get_target(target))
    bounds = [m_max for m_max, _ in tp.buckets]
    assert bounds[-1] is None, "the last bucket must be open-ended"
    assert all(b is not None for b in bounds[:-1])
    assert bounds[:-1] == sorted(set(bounds[:-1])) and bounds[0] >= 1, bounds  # strictly increasing from 1
    for m in PROBE_M:
        expected = next(t for m_max, t in tp.buckets if m_max is None or m <= m_max)
        assert tp.for_m(m) == expected
    for (lo_max, lo_t), (hi_max, hi_t) in zip(tp.buckets, tp.buckets[1:]):
        assert tp.for_m(lo_max) == lo_t and tp.for_m(lo_max + 1) == hi_t  # no gap at the boundary


@pytest.mark.parametrize("name, target", _params())
def test_every_bucket_composes_and_shares_the_weight_layout(name: str, target: str) -> None:
    layer, tgt = LAYERS[name], get_target(target)
    tp = choose_tunings(layer, tgt)
    keys = set()
    for m_max, tuning in tp.buckets:
        try:
            plan = compose(layer, ComputeConfig(), tuning, tgt)
        except ComposeError as e:
            pytest.fail(f"bucket M <= {m_max} does not compose on {target}: {e}")
        assert plan.shared_bytes <= tgt.smem_per_block_optin
        assert plan.threads <= 1024 and plan.threads % 32 == 0
        assert plan.threads * tuning.ctas_per_sm <= tgt.max_threads_per_sm
        assert tuning.ctas_per_sm * (plan.shared_bytes + 1024) <= tgt.smem_per_sm  # 1 KB per CTA: the driver's
        assert not plan.layout.b_layout.check()
        keys.add(layout_key(plan))
    assert len(keys) == 1, f"buckets need {len(keys)} different weight layouts: {keys}"


@pytest.mark.parametrize("name, target", _params())
def test_split_k_within_k_tiles(name: str, target: str) -> None:
    layer = LAYERS[name]
    for m_max, tuning in choose_tunings(layer, get_target(target)).buckets:
        k_tiles = math.ceil(layer.k / tuning.block_k)
        assert 1 <= tuning.split_k <= k_tiles, (m_max, tuning.split_k, k_tiles)
        if m_max is None:
            assert tuning.split_k == 1  # large M fills the GPU with m tiles


@pytest.mark.parametrize("target", COMPOSE_TARGETS)
def test_small_m_fills_the_gpu(target: str) -> None:
    """M=1 with N=K=8192: n tiles x split-K reach most SMs (the reason for split-K)."""
    tgt = get_target(target)
    layer = LAYERS["int4-g128-8192x8192"]
    plan = compose(layer, ComputeConfig(), choose_tunings(layer, tgt).for_m(1), tgt)
    gx, gy, gz = plan.grid(1)
    assert gx * gy * gz >= 0.75 * tgt.sm_count


def test_sm75_buckets_do_not_compose() -> None:
    layer = LayerConfig(4096, 4096, "w4a16-int4-g128", dtype="float16")
    tgt = get_target("sm_75")
    for _, tuning in choose_tunings(layer, tgt).buckets:
        with pytest.raises(ComposeError, match="cp_async"):
            compose(layer, ComputeConfig(), tuning, tgt)


def test_compose_refuses_ctas_per_sm_that_do_not_fit() -> None:
    """A tuning asking for more CTAs per SM than the SM's shared memory holds is refused, with the figures."""
    import attrs

    layer, tgt = LAYERS["int4-g128-8192x8192"], get_target("sm_90a")
    tuning = choose_tunings(layer, tgt).for_m(4096)
    plan = compose(layer, ComputeConfig(), tuning, tgt)
    too_many = tgt.smem_per_sm // (plan.shared_bytes + 1024) + 1
    with pytest.raises(ComposeError, match=f"ctas_per_sm={too_many}.*per SM"):
        compose(layer, ComputeConfig(), attrs.evolve(tuning, ctas_per_sm=too_many), tgt)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_warp_specialized_split_k_fills_one_wave(name: str) -> None:
    """A warp-specialized bucket with split-K has at most one wave of units at its largest M (a second wave costs
    more than shorter slices), and the split is not cut short where k tiles remain to split."""
    from humming_gen.pipelines.warp_specialized.heuristics import MAX_SPLIT, MIN_SLICE_K_TILES

    layer, target = LAYERS[name], get_target("sm_90a")
    for m_max, tuning in choose_tunings(layer, target).buckets:
        if tuning.pipeline != "warp_specialized" or tuning.split_k == 1:
            continue
        plan = compose(layer, ComputeConfig(), tuning, target)
        units = plan.launch.units(m_max)
        assert units <= target.sm_count, (m_max, tuning.summary(), units)
        k_tiles = math.ceil(layer.k / tuning.block_k)
        room = units + plan.launch.units(m_max) // tuning.split_k <= target.sm_count
        assert not room or tuning.split_k in (k_tiles // MIN_SLICE_K_TILES, MAX_SPLIT), (m_max, tuning.summary())


def test_choose_tunings_takes_a_target_name():
    """README: choose_tunings(layer_config, target, pipeline="standard"); a name is looked up like compile's."""
    layer = LayerConfig(n=4096, k=4096, scheme=QuantScheme("int4", group_size=128))
    assert choose_tunings(layer, "sm_90a", pipeline="standard") == choose_tunings(
        layer, get_target("sm_90a"), pipeline="standard")
    with pytest.raises(ValueError, match="unknown target"):
        choose_tunings(layer, "sm_99")

"""The warp-specialized pipeline on the CPU: what its heuristics choose, that barrier counts and register budgets
match the roles, that its kernels compile for sm_90a without spills or wgmma serialization, and that it shares
the standard pipeline's packed weight."""

from __future__ import annotations

import re

import attrs
import pytest

from humming_gen.codegen.compose import ComposeError, compose
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.heuristics.choose import SKINNY_N, WS_FROM_M
from humming_gen.kernel import build_many, generate
from humming_gen.layer.weights import layout_key
from humming_gen.pipelines.warp_specialized.compose import STATIC_SMEM
from humming_gen.runtime.compile import fatal_warnings
from humming_gen.schemes import QuantScheme
from humming_gen.targets import get_target

SM90 = get_target("sm_90a")
FORMATS = {
    "int4-g128": dict(weight="int4", group_size=128),
    "int3-g128": dict(weight="int3", group_size=128),
    "int8-channel": dict(weight="int8"),
    "uint4-g64-zp": dict(weight="uint4", group_size=64, zero_point="int"),
    "uint4-g128-fzp": dict(weight="uint4", group_size=128, zero_point="float"),
    "mxfp4": dict(weight="float4e2m1", group_size=32, scale_dtype="float8e8m0"),
    "nvfp4": dict(weight="float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True),
    "fp8-block": dict(weight="float8e4m3", block_size=(128, 128), scale_dtype="float32"),
}


def _layer(fmt: str = "int4-g128", n: int = 8192, k: int = 8192, **kw) -> LayerConfig:
    return LayerConfig(n=n, k=k, scheme=QuantScheme(**FORMATS[fmt]), **kw)


def _constants(src: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"constexpr int (k\w+) = (-?\d+);", src)}


def test_heuristics_split_the_buckets_between_pipelines() -> None:
    for layer, start in ((_layer(), WS_FROM_M), (_layer(n=SKINNY_N + 1), WS_FROM_M), (_layer(n=SKINNY_N), 16),
                         (_layer(n=576, k=7168), 16)):
        for m_max, tuning in choose_tunings(layer, SM90).buckets:
            expected = "standard" if m_max is not None and m_max < start else "warp_specialized"
            assert tuning.pipeline == expected, (layer.n, m_max, tuning.summary())
    for target in ("sm_80", "sm_89", "sm_100a", "sm_120a"):
        assert {t.pipeline for _, t in choose_tunings(_layer(), get_target(target)).buckets} == {"standard"}
    arbitrary = LayerConfig(n=4096, k=4096, scheme=QuantScheme("int4", group_size=100))
    assert {t.pipeline for _, t in choose_tunings(arbitrary, SM90).buckets} == {"standard"}
    with pytest.raises(ValueError, match="not a multiple of 16"):
        choose_tunings(arbitrary, SM90, pipeline="warp_specialized")


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_one_packed_weight_serves_both_pipelines(fmt: str) -> None:
    layer = _layer(fmt, n=4000, k=3000, has_bias=True)
    plans = [compose(layer, ComputeConfig(), t, SM90) for t in choose_tunings(layer, SM90).tunings()]
    assert {p.pipeline for p in plans} == {"standard", "warp_specialized"}
    assert len({layout_key(p) for p in plans}) == 1


@pytest.mark.parametrize("a_load", ["tma", "cp_async"])
@pytest.mark.parametrize("m", [64, 128, 256, 1024, 8192])
def test_barrier_counts_and_registers_match_the_roles(m: int, a_load: str) -> None:
    """A wrong mbarrier count hangs the kernel: the full barrier expects the one expect_tx plus, where the producer
    threads cp.async the activations, each one's arrival; the empty barrier every consumer thread; the register
    budgets fit the file."""
    tuning = choose_tunings(_layer(), SM90).for_m(m)
    assert tuning.a_load == "tma", "dense 16-bit activations come by TMA (heuristics.TMA_ACTIVATIONS)"
    plan = compose(_layer(), ComputeConfig(), attrs.evolve(tuning, a_load=a_load), SM90)
    src = generate(plan, "nvrtc")
    c = {name: value for name, value, _ in plan.constants}
    assert _constants(src)["kThreads"] == c["kThreads"]
    assert c["kThreads"] == plan.threads == c["kProducerThreads"] + 128 * c["kConsumerWarpgroups"]
    assert c["kConsumerWarps"] == 4 * c["kConsumerWarpgroups"] == c["kWarpsMN"]
    full_count = "1" if a_load == "tma" else "cfg::kProducerThreads + 1"
    assert f"mbarrier_init(ring.full_bars + 8 * s, {full_count})" in src
    assert "mbarrier_init(ring.empty_bars + 8 * s, cfg::kConsumerThreads)" in src
    assert c["kConsumerThreads"] == 128 * c["kConsumerWarpgroups"]
    # the arrivals those counts expect: one expect_tx (thread 0) and, with cp.async, one arrival per producer thread
    # per stage (with TMA, thread 0 issues the activation copies on the same barrier); every consumer thread
    # releases, unconditionally
    produce = src[src.index("void produce("):src.index("void consume(")]
    assert produce.count("mbarrier_arrive_expect_tx(") == 1 and "if (threadIdx.x == 0)" in produce
    assert produce.count("cp_async_arrive_noinc(full)") == (0 if a_load == "tma" else 1)
    if a_load == "tma":
        assert "weight_stage_bytes(tc.n0) + kAStageTxBytes" in produce
        assert "if (threadIdx.x == 0) load_a_stage(ring.stage(stage), p.a_map, tc.m0, kt, full);" in produce
        assert "const __grid_constant__ Params p" in src and "cp_async_16(" not in src
    consume = src[src.index("void consume("):]
    release = consume[consume.index("auto release"):consume.index("};", consume.index("auto release"))]
    assert release.strip().endswith("{ mbarrier_arrive(ring.empty_bars + 8 * s);") and "if" not in release
    _assert_register_budgets(c, 128 * c["kConsumerWarpgroups"])
    assert plan.shared_bytes + STATIC_SMEM <= SM90.smem_per_block_optin


def _assert_register_budgets(c: dict, consumer_threads: int) -> None:
    """setmaxnreg.inc waits until registers the CTA released cover it: the budgets must fit what the launch
    allocated (the per-thread cap of __launch_bounds__(kThreads, 1) times kThreads), not the register file, or the
    consumers wait forever (a producer budget of 48 beside 232 hung the 8-bit kernels on the H200)."""
    launched = 65536 // c["kThreads"] // 8 * 8 * c["kThreads"]
    regs = c["kProducerRegisters"] * c["kProducerThreads"] + c["kConsumerRegisters"] * consumer_threads
    assert regs <= launched, (regs, launched)
    assert c["kProducerRegisters"] % 8 == 0 and c["kConsumerRegisters"] % 8 == 0
    assert 24 <= c["kProducerRegisters"] and c["kConsumerRegisters"] <= 256


@pytest.mark.parametrize("fmt", ["w8a8-fp8-channel", "w8a8-fp8-block128", "w4a8-int4-g128-int8"])
def test_a8_register_budgets_fit_the_launch(fmt: str) -> None:
    layer = LayerConfig(8192, 8192, fmt)
    for _, t in choose_tunings(layer, SM90, stored=False).buckets:
        c = {name: value for name, value, _ in compose(layer, ComputeConfig(), t, SM90).constants}
        _assert_register_budgets(c, c["kConsumerThreads"])


def test_kernels_compile_without_spills_or_wgmma_serialization() -> None:
    """Every warp-specialized bucket of the formats above, compiled for sm_90a with NVRTC: no spills, no stack,
    no warning that ptxas serializes wgmma, static shared memory within the plan's allowance."""
    plans = []
    for fmt in FORMATS:
        layer = _layer(fmt, has_bias=fmt == "int4-g128")
        plans += [compose(layer, ComputeConfig(), t, SM90) for t in choose_tunings(layer, SM90).tunings()
                  if t.pipeline == "warp_specialized"]
    plans.append(compose(_layer(dtype="float16", out_dtype="float32"), ComputeConfig(),
                         choose_tunings(_layer(dtype="float16"), SM90).for_m(256), SM90))
    for kernel in build_many(plans, compiler="nvrtc"):
        r = kernel.resources
        assert r.get("spill_store_bytes", 0) == 0 and r.get("stack_bytes", 0) == 0, (kernel.name, r)
        assert r.get("shared_bytes", 0) <= STATIC_SMEM, (kernel.name, r)
        assert not fatal_warnings(kernel.compiled.log), kernel.name


def test_refusals_name_the_reason() -> None:
    tuning = choose_tunings(_layer(), SM90).for_m(1024)
    with pytest.raises(ComposeError, match="lacks 'wgmma'"):
        compose(_layer(), ComputeConfig(), tuning, get_target("sm_89"))
    too_deep = TuningConfig(**{**tuning.to_dict(), "stages": 8})
    with pytest.raises(ComposeError, match="shared memory .* exceeds"):
        compose(_layer(), ComputeConfig(), too_deep, SM90)
    a8 = LayerConfig(4096, 4096, "w8a8-fp8-channel")  # a 16-bit tuning for 8-bit activations: each field named
    with pytest.raises(ComposeError, match="128-row layout block") as e:
        compose(a8, ComputeConfig(), tuning, SM90)
    assert "split_k" in str(e.value) or tuning.split_k == 1
    a8_tuning = choose_tunings(a8, SM90).for_m(1024)
    assert a8_tuning.pipeline == "warp_specialized" and a8_tuning.block_n == 128
    for field, value, needle in (("block_m", 200, "above 192 tokens only for int8"),
                                 ("split_k", 100, "exceeds the"),
                                 ("block_k", 64, "128 or 256"), ("block_k", 256, "one 128-k panel per stage")):
        with pytest.raises(ComposeError, match=needle):
            compose(a8, ComputeConfig(), TuningConfig(**{**a8_tuning.to_dict(), field: value}), SM90)
    rows = TuningConfig(**{**a8_tuning.to_dict(), "a_load": "cp_async", "block_k": 256})  # (panels: one per stage)
    with pytest.raises(ComposeError, match="shared memory .* exceeds"):
        compose(a8, ComputeConfig(), rows, SM90)
    with pytest.raises(ComposeError, match="lacks 'wgmma'"):
        compose(a8, ComputeConfig(), a8_tuning, get_target("sm_89"))
    with pytest.raises(ComposeError, match="an MoE layer needs compute.gemm='indexed'"):  # (MoE: test_moe_*_ws.py)
        compose(LayerConfig(4096, 4096, "w8a8-fp8-channel", num_experts=4), ComputeConfig(), a8_tuning, SM90)


def test_a8_banded_raster_compiles_and_covers_every_tile() -> None:
    """raster='m_band': unit_coord(unit, m) walks bands of BAND_M m tiles; the formula (mirrored here) visits every
    (n tile, m tile) once for any M, the last band short."""

    from humming_gen.config.tuning import BAND_M
    from humming_gen.kernel import build

    layer = LayerConfig(8192, 8192, "w8a8-fp8-channel")
    t = attrs.evolve(choose_tunings(layer, SM90).for_m(4096), raster="m_band")
    kernel = build(compose(layer, ComputeConfig(), t, SM90))
    assert "unit_coord(unit, p.m)" in kernel.source and kernel.resources.get("spill_store_bytes", 0) == 0
    n_tiles = 64
    for m_tiles in (1, 3, 8, 13, 32):
        seen = []
        for unit in range(n_tiles * m_tiles):
            band, in_band = divmod(unit, BAND_M * n_tiles)
            rows = min(BAND_M, m_tiles - band * BAND_M)
            seen.append((in_band // rows, band * BAND_M + in_band % rows))
        assert sorted(seen) == [(n, m) for n in range(n_tiles) for m in range(m_tiles)]
    with pytest.raises(ComposeError, match="raster"):
        compose(layer, ComputeConfig(), attrs.evolve(t, raster="m_major"), SM90)
    with pytest.raises(ComposeError, match="bands are walked without split-K"):
        compose(layer, ComputeConfig(), attrs.evolve(t, split_k=2), SM90)


def test_a8_split_k_source_and_scratch() -> None:
    """Split-K for 8-bit activations: every slice publishes its fragments and sums its share (the 16-bit hand-off),
    one n tile per warp; the workspace holds split x block_m x 128 floats per tile."""
    from humming_gen.kernel import build

    layer = LayerConfig(4096, 4096, "w8a8-fp8-channel", has_bias=True)
    t = choose_tunings(layer, SM90).for_m(64)
    assert t.pipeline == "warp_specialized" and t.split_k > 1
    kernel = build(compose(layer, ComputeConfig(), t, SM90))
    src = kernel.source
    assert "split_k_publish(acc, workspace" in src and "store_fragment(v, p, n_base, tc.m0, 0, f)" in src
    assert "consumer_sync()" in src and "store_output(acc" not in src
    assert kernel.resources.get("spill_store_bytes", 0) == 0
    scratch = kernel.plan.scratch(64)
    assert scratch["workspace"].numel == 32 * t.split_k * 64 * 128 and scratch["counters"].numel == 32

"""Indexed MoE GEMMs of the warp-specialized pipeline (sm_90a) on the CPU: NVRTC compilation without spills, the
generated source (gather through the routing, per-expert rebasing, row scatter, the routed total read on the
device), the schedule and the row gather compiled for the host against moe_align's routing, refusals, and which
pipeline QuantMoE's buckets take (heuristics.moe_tunings) on sm_90a and sm_89."""

from __future__ import annotations

import attrs
import pytest
import torch

import humming_gen as hg
import humming_gen.kernel
from humming_gen.codegen import ComposeError, compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings, moe_tunings
from humming_gen.heuristics.choose import moe_standard_plans
from humming_gen.kernel import build_many
from humming_gen.layer.moe import QuantMoE
from humming_gen.pipelines.common import missing_symbols
from humming_gen.pipelines.warp_specialized.heuristics import MOE_BUCKETS, choose_moe_tunings, moe_tuning_for
from humming_gen.targets import get_target
from moe_host import CXX, check_schedule_and_gather, ws_moe_plans
from symbols import declaration_mismatches

SM90 = get_target("sm_90a")
WEIGHTED = ComputeConfig(gemm="indexed", topk_weight=True)
SCHEMES = {"int4-g128": "w4a16-int4-g128", "mxfp4": "w4a16-mxfp4", "int8-channel": "w8a16-int8-channel",
           "uint4-g128-zp": "w4a16-int4-g128-zp"}


def _layer(scheme: str, n: int = 1024, k: int = 2048, bias: bool = True, **kwargs) -> LayerConfig:
    return LayerConfig(n=n, k=k, scheme=SCHEMES.get(scheme, scheme), num_experts=8, has_bias=bias, **kwargs)


def _plans(layer: LayerConfig, compute: ComputeConfig = WEIGHTED, block_ms=None):
    return ws_moe_plans(layer, compute, block_ms)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_ws_moe_kernels_compile_without_spills(scheme: str) -> None:
    plans = _plans(_layer(scheme), block_ms=None if scheme == "int4-g128" else (32, 128))
    plans += _plans(_layer(scheme, dtype="float16", bias=False), ComputeConfig(gemm="indexed"), block_ms=(128,))
    for kernel in build_many(plans):
        r = kernel.compiled.resources
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)
        assert kernel.plan.pipeline == "warp_specialized" and kernel.name.endswith(("_ws_moe_topkw", "_ws_moe"))


@pytest.mark.parametrize("activation", ["silu_mul", "swiglu_oai"])
def test_ws_gated_epilogue_compiles_and_writes_half_the_columns(activation: str) -> None:
    plans = _plans(_layer("int4-g128"), ComputeConfig(gemm="indexed", epilogue_activation=activation),
                   block_ms=(8, 64, 128))
    for kernel in build_many(plans):
        assert kernel.compiled.resources["spill_store_bytes"] == 0, kernel.name
    src = hg.kernel.generate(plans[-1], "nvrtc")
    # stored directly, not staged (a 16-bit routed GEMM1: compose.staged_store)
    assert "out_row[(n_base + nt * 16) / 2 + g] = from_float(gated_activation(gate, up));" in src
    assert "gate = acc[nt][mt][j] + bias_gate[nt], up = acc[nt][mt][2 + j] + bias_up[nt];" in src
    assert "stmatrix" not in src and "kStagingBytes" not in src
    assert plans[-1].kernel_name.endswith("_ws_moe_" + activation)


def test_ws_moe_source_gathers_rebases_and_scatters() -> None:
    plan = _plans(_layer("uint4-g128-zp"), block_ms=(128,))[0]
    src = hg.kernel.generate(plan, "nvrtc")
    # the routed total and each unit's expert come from the routing on the device, after the wait for the previous
    # kernel (PDL), which every thread makes once, before reading them
    body = src[src.index("__launch_bounds__(cfg::kThreads, 1)"):]
    assert body.index("wait_for_previous_grid();") < body.index("unit_count(p)")
    assert src.count("wait_for_previous_grid();") == 1 and "waited" not in src
    assert "const int routed = *static_cast<const int*>(p.num_tokens_post_pad);" in src
    assert "static_cast<const int*>(p.expert_ids)[block]" in src
    assert src.count("if (tc.expert < 0) continue;") == 2  # producer and consumers skip the same units
    # the producer rebases the stacked weights, scales and zero points, and gathers rows through sorted_ids
    for field in ("b", "b_scale", "b_zero", "bias"):
        assert f"p.{field} = static_cast<const char*>(p.{field}) + static_cast<long long>(expert) * cfg::" in src
    assert "load_weight_stage(ring.stage(stage), weights, tc.n0, kt, full);" in src
    assert "gather_rows(a_src, p, tc.m0);" in src and "__shfl_sync(0xffffffffu, src[i / kAChunksPerRow]" in src
    assert "src[j] = assignment < p.m ? assignment / p.top_k : -1;" in src
    # the consumers scatter each row to its assignment's row of c with the expert's bias and the router weight
    assert "store_output(acc, for_expert(p, tc.expert), tc.n0 + w * 64 + kTile0 * 16, tc.m0, ring.smem + " in src
    assert "sorted_ids[m_base + (mt0 + kChunkTiles + mc) * 8 + 2 * t + j]" in src  # a chunk ahead
    assert "if (out_rows[i] >= p.m) continue;" in src
    assert "weights_next[mc][j] = live ? static_cast<const float*>(p.topk_weights)[rows_next[mc][j]] : 0.0f;" in src
    consts = {name: value for name, value, _ in plan.constants}
    assert consts["kExpertBBytes"] == consts["kNPad"] * consts["kKPad"] * 4 // 8
    # the same Params fields (so Launcher.moe binds it) and the same packed weight as the standard MoE kernels
    standard = compose(plan.layer, WEIGHTED, attrs.evolve(choose_tunings(plan.layer, SM90, pipeline="standard")
                                                          .for_m(1), split_k=1), SM90)
    assert [a.name for a in plan.args] == [a.name for a in standard.args] and plan.layout == standard.layout
    # the persistent grid covers the worst-case routing of m assignments, at most one CTA per SM
    bm, tiles = plan.tuning.block_m, consts["kNTiles"]
    assert plan.launch.units(100) == tiles * -(-(100 + 8 * (bm - 1)) // bm)
    assert plan.grid(100) == (min(plan.launch.units(100), SM90.sm_count), 1, 1) and plan.grid(10**6)[0] == 132
    unweighted = hg.kernel.generate(_plans(_layer("int4-g128", bias=False), ComputeConfig(gemm="indexed"),
                                           block_ms=(32,))[0], "nvrtc")
    assert "topk_weights" not in unweighted and "kExpertBiasBytes" not in unweighted


def test_ws_moe_symbol_declarations_match_the_source() -> None:
    plans = (_plans(_layer("uint4-g128-zp"), block_ms=(16, 128))
             + _plans(_layer("mxfp4"), ComputeConfig(gemm="indexed", epilogue_activation="gelu_mul"), block_ms=(64,)))
    for plan in plans:
        assert missing_symbols(plan.components) == []
        assert declaration_mismatches(plan) == {}


def test_ws_compose_refuses_what_moe_kernels_do_not_do() -> None:
    layer = _layer("int4-g128")
    tuning = choose_moe_tunings(layer, SM90).for_m(1000)
    with pytest.raises(ComposeError, match="MoE kernels take split_k=1"):
        compose(layer, WEIGHTED, attrs.evolve(tuning, split_k=2), SM90)
    for gemm in ("grouped_masked", "grouped_contiguous"):  # (grouped kernels: test_moe_grouped_ws.py)
        with pytest.raises(ComposeError, match="the router weights are applied by the caller's combine step"):
            compose(layer, ComputeConfig(gemm=gemm, topk_weight=True), tuning, SM90)
    with pytest.raises(ComposeError, match="gathered MoE rows come 16 per producer pass"):
        compose(layer, WEIGHTED, attrs.evolve(tuning, block_k=64, block_m=8), SM90)
    with pytest.raises(ComposeError, match="not a multiple of 16"):
        compose(attrs.evolve(layer, n=1000), ComputeConfig(gemm="indexed", epilogue_activation="silu_mul"), tuning,
                SM90)
    with pytest.raises(ComposeError, match="needs compute.gemm='indexed'"):
        compose(layer, ComputeConfig(), tuning, SM90)
    with pytest.raises(ComposeError, match="lacks 'wgmma'"):
        compose(layer, WEIGHTED, tuning, get_target("sm_89"))


def _moe_layers(scheme: str, fused: bool = False):
    layers = [_layer(scheme, n=512, k=1024), _layer(scheme, n=1024, k=256)]
    computes = [ComputeConfig(gemm="indexed", epilogue_activation="silu_mul" if fused else None), WEIGHTED]
    return layers, computes


def test_moe_tunings_take_warp_specialized_buckets_from_17_rows_per_expert_on_sm_90a() -> None:
    layers, computes = _moe_layers("int4-g128")
    for target in ("sm_90a", "sm_89"):
        standard = [choose_tunings(layer, target, pipeline="standard") for layer in layers]
        plans = moe_tunings(standard, layers, computes, target)
        tiles = [[(m, t.block_m) for m, t in plan.buckets] for plan in plans]
        assert tiles[0] == tiles[1]  # one routing per batch serves both GEMMs
        pipelines = [t.pipeline for _, t in plans[0].buckets]
        own = moe_standard_plans(standard, layers, get_target(target))  # split_k=1, a first split-K bucket
        if target == "sm_89":
            assert plans == own and set(pipelines) == {"standard"}
            continue
        # first the standard pipeline's split-K bucket below one row per expert (tests/cpu/test_moe_split_k.py)
        assert plans[0].buckets[0] == own[0].buckets[0] and plans[0].buckets[0][0] <= 1
        assert [m for m, _ in plans[0].buckets[1:]] == [8, 16, 64, None]
        assert pipelines == ["standard"] * 3 + ["warp_specialized"] * 2
        assert [bm for _, bm in tiles[0]] == [8, 8, 16, 64, 128]
        assert all(t.split_k == 1 for plan in plans for _, t in plan.buckets if t.pipeline == "warp_specialized")
        forced = moe_tunings(standard, layers, computes, target, pipeline="warp_specialized")
        assert [(m, t.block_m) for m, t in forced[0].buckets] == list(MOE_BUCKETS)
        assert moe_tunings(standard, layers, computes, target, pipeline="standard") == own
    # where the warp-specialized pipeline cannot serve a GEMM, every bucket stays standard (or, forced, it is refused)
    # (8-bit activations: tests/cpu/test_moe_gemm_a8_ws.py)
    for scheme in (hg.QuantScheme("int4", group_size=40),):
        layers = [attrs.evolve(layer, scheme=scheme) for layer in _moe_layers("int4-g128")[0]]
        standard = [choose_tunings(layer, SM90, pipeline="standard") for layer in layers]
        assert moe_tunings(standard, layers, computes, SM90) == moe_standard_plans(standard, layers, SM90)
        with pytest.raises(ValueError, match="cannot serve these MoE GEMMs"):
            moe_tunings(standard, layers, computes, SM90, pipeline="warp_specialized")
    with pytest.raises(ValueError, match="pipeline='mma'"):
        moe_tunings(standard, layers, computes, SM90, pipeline="mma")


def test_quant_moe_pipelines_per_bucket_on_sm_90a_and_sm_89() -> None:
    torch.manual_seed(3)
    w13, w2 = torch.randn(8, 2 * 128, 256) * 0.05, torch.randn(8, 256, 128) * 0.05
    b13, b2 = torch.randn(8, 256), torch.randn(8, 256)
    moe = QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_90a", device="cpu", bias13=b13, bias2=b2,
                              activation="swiglu_oai", gate_up_layout="interleaved", fused_activation=True)
    kinds = [(g1.kernel.plan.pipeline, g2.kernel.plan.pipeline) for g1, g2 in moe._launchers]
    assert kinds == [("standard", "standard")] * 2 + [("warp_specialized", "warp_specialized")] * 2
    assert moe.block_ms == [8, 16, 64, 128]
    assert moe.block_m(1, 8) == 8 and moe.block_m(16, 8) == 16 and moe.block_m(17, 8) == 64  # rows per expert
    assert moe.block_m(64, 8) == 64 and moe.block_m(65, 8) == 128
    assert moe.block_m(4096, 8) == 128
    assert all(g1.kernel.plan.compute.epilogue_activation == "swiglu_oai" for g1, _ in moe._launchers)
    for g1, g2 in moe._kernels:
        for kernel in (g1, g2):
            r = kernel.resources
            assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)
    # one packed copy per GEMM serves both pipelines' kernels
    assert len({g1.plan.layout for g1, _ in moe._kernels}) == 1 and len({g2.plan.layout for _, g2 in moe._kernels}) == 1
    # grouped layouts take the pipeline of an indexed bucket of as many rows per expert
    assert moe.grouped_launcher("w2", "grouped_contiguous", 100).kernel.plan.pipeline == "warp_specialized"
    assert moe.grouped_launcher("w2", "grouped_contiguous", 16).kernel.plan.pipeline == "standard"
    assert moe.launcher_for("w2", 4096, 128).kernel.plan.pipeline == "warp_specialized"
    old = QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_89", device="cpu", bias13=b13, bias2=b2)
    assert {g.kernel.plan.pipeline for pair in old._launchers for g in pair} == {"standard"}
    forced = QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_90a", device="cpu", pipeline="warp_specialized")
    assert {g.kernel.plan.pipeline for pair in forced._launchers for g in pair} == {"warp_specialized"}
    assert forced.block_ms == [8, 16, 64, 128]
    with pytest.raises(ValueError, match="lacks 'wgmma'"):
        QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_89", device="cpu", pipeline="warp_specialized")


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("block_m", [8, 32, 128])
def test_ws_moe_schedule_and_row_gather_on_the_host(block_m: int, tmp_path) -> None:
    """The schedule and the producer's gather (templates rendered for a real plan, compiled for the host) against
    moe_align's routing: the units cover every (routed m block, n tile) once with its expert, and every 16-byte
    chunk of the activation tile is copied once, from row sorted_ids[m0 + r] / top_k (zero-filled for padding)."""
    plan = _plans(_layer("int4-g128", n=640, k=200), block_ms=(block_m,))[0]
    check_schedule_and_gather(plan, tmp_path, seed=block_m)


def test_routed_gemm1_stores_directly_and_gemm2_through_the_staging() -> None:
    """16-bit activations: an indexed GEMM without router weights (GEMM1, gated or not) keeps the direct store,
    measured faster at large M; the down GEMM (router weights) and the grouped GEMMs stage their tiles
    (compose.staged_store)."""
    layer = _layer("int4-g128")
    for compute, staged in ((ComputeConfig(gemm="indexed"), False),
                            (ComputeConfig(gemm="indexed", epilogue_activation="silu_mul"), False),
                            (WEIGHTED, True), (ComputeConfig(gemm="grouped_contiguous"), True)):
        for plan in _plans(layer, compute, block_ms=(64, 128)):
            src = hg.kernel.generate(plan, "nvrtc")
            assert ("stmatrix_x" in src) == staged and ("kStagingBytes" in src) == staged, (compute, plan.kernel_name)


@pytest.mark.parametrize("scheme", ["w4a16-int4-g128", "w4a8-mxfp4-fp8", "w8a8-fp8-block128"])
def test_prefetched_chunk_rows_compile_without_spills(scheme: str, monkeypatch) -> None:
    """compose.PREFETCH_CHUNK_ROWS (on by default): the routed staged stores of DeepSeek-V3's per-rank down GEMM
    (router weights; 8-bit activations' token scales too) read the next chunk's rows before the chunk's stores,
    within the consumers' registers; off, the source is the one without. (Their values:
    tests/cpu/test_staged_store_host.py.)"""
    from humming_gen.pipelines.warp_specialized import compose as ws_compose

    layer = LayerConfig(n=7168, k=256, scheme=scheme, num_experts=256)
    tunings = [t for _, t in choose_moe_tunings(layer, SM90).buckets if t.block_m >= 64]
    plans = [compose(layer, WEIGHTED, t, SM90) for t in tunings]
    monkeypatch.setattr(ws_compose, "PREFETCH_CHUNK_ROWS", False)
    plain = [compose(layer, WEIGHTED, t, SM90) for t in tunings]
    for before, plan in zip(plain, plans):
        src = hg.kernel.generate(plan, "nvrtc")
        assert "rows_next" in src and "rows_next" not in hg.kernel.generate(before, "nvrtc"), plan.kernel_name
        assert declaration_mismatches(plan) == {}
    for kernel in build_many(plans):
        r = kernel.resources
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)


@pytest.mark.parametrize("scheme,activation", [("w8a8-fp8-tensor", None), ("w8a8-fp8-block128", "silu_mul"),
                                               ("w8a8-fp8-channel", None)])
def test_prefetched_chunk_rows_of_unweighted_routed_gemm1(scheme: str, activation, monkeypatch) -> None:
    """compose.PREFETCH_CHUNK_ROWS on a routed GEMM1 of 8-bit activations (staged; no router weights; token scales,
    a tensor scale or none): only the lookups it reads, no unused ones (NVRTC warnings 550-D / 177-D)."""
    from humming_gen.pipelines.warp_specialized import compose as ws_compose

    monkeypatch.setattr(ws_compose, "PREFETCH_CHUNK_ROWS", True)
    layer = LayerConfig(n=512, k=7168, scheme=scheme, num_experts=256)
    compute = ComputeConfig(gemm="indexed", epilogue_activation=activation)
    plans = [compose(layer, compute, t, SM90) for _, t in choose_moe_tunings(layer, SM90).buckets if t.block_m >= 64]
    for plan in plans:
        assert "out_rows_next" in hg.kernel.generate(plan, "nvrtc"), plan.kernel_name
        assert declaration_mismatches(plan) == {}
    for kernel in build_many(plans):
        r = kernel.resources
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)
        assert "warning" not in kernel.compiled.log, (kernel.name, kernel.compiled.log)


@pytest.mark.parametrize("scheme", ["w4a16-int4-g128", "w4a8-mxfp4-fp8", "w8a8-fp8-block128", "w8a8-fp8-channel"])
def test_wider_token_tiles_compile_without_spills(scheme: str) -> None:
    """Token tiles of 144 and 160 (tests/gpu/test_moe_token_tiles_gpu.py) on DeepSeek-V3's per-rank GEMMs: the
    consumers' accumulators and the routed stores' lookups fit their registers (8-bit: the 192-token tile spills
    beside fp8 channel / block scales)."""
    plans = []
    for n, k, compute in ((512, 7168, ComputeConfig(gemm="indexed")), (7168, 256, WEIGHTED)):
        layer = LayerConfig(n=n, k=k, scheme=scheme, num_experts=256)
        plans += [compose(layer, compute, moe_tuning_for(layer, SM90, bm), SM90) for bm in (144, 160)]
    for kernel in build_many(plans):
        r = kernel.resources
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)
        assert kernel.plan.tuning.block_m in (144, 160)

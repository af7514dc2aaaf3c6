"""Indexed MoE GEMMs with 8-bit activations on the warp-specialized pipeline (sm_90a) on the CPU: NVRTC compilation
without spills for each scheme, the gated and router-weight epilogues, the generated gather of activation codes
(producer) and of their per-token / per-group scales through the routing (fp32 group scales staged by the producer,
e8m0 ones read by the consumers), the shuffled activation-row lookup emulated from the source, the schedule and code gather compiled for the host, the stacked expert strides,
refusals, and which pipeline QuantMoE's buckets take (heuristics.moe_tunings)."""

from __future__ import annotations

import random
import re

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import ComposeError, compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings, moe_tunings
from humming_gen.heuristics.choose import moe_standard_plans
from humming_gen.kernel import build_many, generate
from humming_gen.layer.moe import QuantMoE, prepare_moe_weight
from humming_gen.pipelines.common import missing_symbols
from humming_gen.pipelines.warp_specialized.heuristics import MOE_BUCKETS, choose_moe_tunings
from humming_gen.targets import get_target
from moe_cases import w8a8
from moe_host import CXX, check_schedule_and_gather, expert_stride_mismatches, ws_moe_plans
from symbols import declaration_mismatches

SM90 = get_target("sm_90a")
WEIGHTED = ComputeConfig(gemm="indexed", topk_weight=True)
# the four schemes of the brief, W4A8 int4 x int8, and per-tensor fp8 (a static or dynamic scale per tensor)
SCHEMES = ("w8a8-fp8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8", "w8a8-int8-channel", "w4a8-int4-g128-int8",
           "w8a8-fp8-tensor")


def _layer(scheme: str, n: int = 1024, k: int = 2048, bias: bool = True, experts: int = 8) -> LayerConfig:
    return LayerConfig(n=n, k=k, scheme=scheme, num_experts=experts, has_bias=bias)


def _plans(layer: LayerConfig, compute: ComputeConfig = WEIGHTED, block_ms=None):
    return ws_moe_plans(layer, compute, block_ms)


def _source(scheme: str, compute: ComputeConfig = WEIGHTED, block_m: int = 128, **kwargs) -> str:
    return generate(_plans(_layer(scheme, **kwargs), compute, block_ms=(block_m,))[0], "nvrtc")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a8_ws_moe_kernels_compile_without_spills(scheme: str) -> None:
    """Every MoE bucket's kernel (token tiles 8 .. 128) with router weight and bias, and the largest tile without."""
    plans = _plans(_layer(scheme)) + _plans(_layer(scheme, bias=False), ComputeConfig(gemm="indexed"), (128,))
    assert [p.tuning.block_m for p in plans] == [bm for _, bm in MOE_BUCKETS] + [128]
    for kernel in build_many(plans):
        r = kernel.compiled.resources
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)
        assert kernel.plan.pipeline == "warp_specialized" and kernel.plan.tuning.mma == "wgmma"
        assert kernel.name.endswith(("_moe_topkw", "_moe")) and "_ws_q" in kernel.name


@pytest.mark.parametrize("activation", ["silu_mul", "gelu_mul", "swiglu_oai"])
@pytest.mark.parametrize("scheme", ["w8a8-fp8-channel", "w4a8-mxfp4-fp8", "w8a8-int8-channel"])
def test_a8_ws_gated_epilogue_compiles_and_scales_gate_and_up_by_the_token(scheme: str, activation: str) -> None:
    compute = ComputeConfig(gemm="indexed", epilogue_activation=activation)
    plans = _plans(_layer(scheme), compute, block_ms=(8, 128))
    for kernel in build_many(plans):
        assert kernel.compiled.resources["spill_store_bytes"] == 0, kernel.name
    src = generate(plans[-1], "nvrtc")
    gate_up = src[src.index("const u32 v = pack(gated_activation("):].split(";")[0]
    # gate and up of both token columns, times the token's scale (and the column scale first, where there is one)
    assert gate_up.count("token_scales[mc][0] + bias_") == 2 and gate_up.count("token_scales[mc][1] + bias_") == 2
    assert "stmatrix_x1_trans(staging + slot(mc * 8 + lane % 8, nt), v);" in src and "kCols = cfg::kN / 2;" in src
    assert plans[-1].kernel_name.endswith("_moe_" + activation)


def test_a8_ws_moe_source_gathers_codes_and_token_scales_through_the_routing() -> None:
    src = _source("w8a8-fp8-channel")
    # the routed total and each unit's expert come from the routing, after the one wait for the previous kernel
    body = src[src.index("__launch_bounds__(cfg::kThreads, 1)"):]
    assert body.index("wait_for_previous_grid();") < body.index("unit_count(p)")
    assert src.count("wait_for_previous_grid();") == 1 and "waited" not in src
    assert src.count("if (tc.expert < 0) continue;") == 2  # producer and consumers skip the same units
    # the producer rebases the stacked weights and gathers rows of codes, 16 codes per chunk, through sorted_ids
    for field in ("b", "out_scale", "bias"):
        assert f"p.{field} = static_cast<const char*>(p.{field}) + static_cast<long long>(expert) * cfg::" in src
    assert "gather_rows(a_src, p, tc.m0);" in src and "src[j] = assignment < p.m ? assignment / p.top_k : -1;" in src
    assert ("load_a_stage(ring.stage(stage), static_cast<const unsigned char*>(p.a), p.lda, a_src, "
            "kt * cfg::kBlockK);") in src
    assert "const int gk = k0 + chunk * 16;" in src and "valid ? bytes : 0" in src
    # each row's token scale is its activation row's (assignment / top_k), in the epilogue with the router weight
    assert "store_output(acc, for_expert(p, tc.expert), n_base, tc.m0, ring.smem + " in src
    assert ("token_scales_next[mc][j] = live ? a_scale[assignment_token(rows_next[mc][j], p.top_k, top_k_magic)] "
            ": 0.0f;") in src
    # the first chunk's rows, router weights and token scales before the chunks; each next chunk's after this chunk's
    # staging and before its stores to c (compose.PREFETCH_CHUNK_ROWS)
    store = src.split("void store_output(")[1]
    assert (store.index("rows_next[mc][j] = 0 + mc < cfg::kWarpMTiles ? sorted_ids[")
            < store.index("weights_next[mc][j] = live ? static_cast<const float*>(p.topk_weights)[rows_next[mc][j]]")
            < store.index("stmatrix_x2_trans(") < store.index("rows_next[mc][j] = mt0 + kChunkTiles + mc <")
            < store.index("*reinterpret_cast<uint4*>(dst) = v;"))
    assert "(acc[nt][mt][3] * scales[nt][1] * token_scales[mc][1] + biases[nt][1]) * weights[mc][1]" in src
    # each staged row's row of c
    assert "out_rows_next[i] = staged ? sorted_ids[m_base + (mt0 + kChunkTiles) * 8 + staged_row] : p.m;" in src
    assert "a_scale[m]" not in src and "a_rows" not in src
    plan = _plans(_layer("w8a8-fp8-channel"), block_ms=(128,))[0]
    # the same Params fields (so Launcher.moe binds it) and packed weight as the standard pipeline's A8 MoE kernels
    standard = compose(plan.layer, WEIGHTED, attrs.evolve(choose_tunings(plan.layer, SM90, pipeline="standard")
                                                          .for_m(1), split_k=1), SM90)
    assert [a.name for a in plan.args] == [a.name for a in standard.args] and plan.layout == standard.layout
    # the persistent grid covers the worst-case routing of m assignments, at most one CTA per SM
    tiles = dict((name, value) for name, value, _ in plan.constants)["kNTiles"]
    assert plan.launch.units(100) == tiles * -(-(100 + 8 * 127) // 128) and plan.grid(10**6)[0] == SM90.sm_count
    per_tensor = _source("w8a8-fp8-tensor", bias=False)
    assert "const float a_scale = *static_cast<const float*>(p.a_scale);" in per_tensor
    assert "(acc[nt][mt][1] * scales[nt][0] * a_scale) * weights[mc][1]" in per_tensor


def test_a8_ws_moe_source_reads_group_scales_of_each_tokens_row(monkeypatch) -> None:
    """Per-group activation scales (DeepSeek's 1 x 128): the producer looks up each token's row through the routing
    once per unit and stages the row's scales with every stage, beside the expert's weight block scale; the
    consumers read both from shared memory at every promotion; none in the epilogue. e8m0 (MX) scales read at
    promotion (STAGE_E8M0_SCALES off, or K no whole stages) are global reads through the consumers' row lookup."""
    from humming_gen.pipelines.warp_specialized import compose_a8

    src = _source("w8a8-fp8-block128")
    assert "rows[j] = assignment < p.m ? assignment / p.top_k : -1;" in src
    assert "activation_scale_rows(a_scale_rows, p, tc.m0);" in src
    assert ("load_activation_scales_stage(ring.stage(stage), static_cast<const float*>(p.a_scale), a_scale_rows, "
            "kt);") in src
    assert ("static_cast<const float*>(p.b_scale) + (long long)group * cfg::kNPad + n0, cfg::kWeightScaleBytes, "
            "full);") in src
    assert "load_weight_stage(ring.stage(stage), weights, tc.n0, kt, full);" in src  # the expert's b_scale
    assert "p.b_scale = static_cast<const char*>(p.b_scale) + static_cast<long long>(expert) * cfg::" in src
    assert "token_scale" not in src and "m < p.m" not in src and "a_rows" not in src and "__ldg" not in src
    monkeypatch.setattr(compose_a8, "STAGE_E8M0_SCALES", False)
    mx = _source("w8a8-mxfp8", block_m=32)  # e8m0 activation groups of 32
    assert "const u32 e = row >= 0 ? a_scales[static_cast<long long>(row) * cfg::kActivationGroups + a_group]" in mx


def _c_to_python(expr: str) -> str:
    return expr.replace("/", "//").replace("threadIdx.x % 32", "lane").replace("threadIdx.x % 4", "t")


@pytest.mark.parametrize("scheme,block_m", [("w8a8-mxfp8", 32), ("w8a8-mxfp8", 8)])
def test_activation_row_lookup_and_shuffles_pair_each_token_with_its_row(monkeypatch, scheme: str,
                                                                         block_m: int) -> None:
    """e8m0 activation scales read from global memory at promotion (STAGE_E8M0_SCALES off, as where K is not whole
    stages): the consumers' lookup (lane, register) of each token's activation row and the shuffle of a promotion,
    both taken from the generated source and evaluated for every lane: token column (j, t, h) = 8j + 2t + h of the
    tile gets the row looked up for that token, and every token of the tile is looked up."""
    from humming_gen.pipelines.warp_specialized import compose_a8

    monkeypatch.setattr(compose_a8, "STAGE_E8M0_SCALES", False)
    src = _source(scheme, block_m=block_m)
    consts = {m.group(1): int(m.group(2)) for m in re.finditer(r"constexpr int (\w+) = (\d+);", src)}
    regs, m_tiles = consts["kActivationRowRegs"], consts["kWarpMTiles"]
    token_of = re.search(r"const int r = (.+?);\n", src).group(1)  # the token lane `lane` looks up in register i
    reg, lane_expr = re.search(r"__shfl_sync\(0xffffffffu, a_rows\[(.+?)\], (.+?)\);", src).groups()
    looked_up = {}  # (lane, register) -> token
    for lane in range(32):
        for i in range(regs):
            token = eval(_c_to_python(token_of), {"i": i, "lane": lane})
            if token < block_m:
                looked_up[(lane, i)] = token
    assert sorted(looked_up.values()) == list(range(block_m))
    for j in range(m_tiles):
        for t in range(4):
            for h in range(2):
                env = {"j": j, "t": t, "h": h}
                source = (eval(_c_to_python(lane_expr), env), eval(_c_to_python(reg), env))
                assert looked_up.get(source) == 8 * j + 2 * t + h, (j, t, h, source)


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("block_m", [8, 32, 128])
def test_a8_ws_moe_schedule_and_code_gather_on_the_host(block_m: int, tmp_path) -> None:
    """The schedule and the producer's gather of 8-bit code rows (an 8-token tile takes 256-k stages: 8 rows of 16
    chunks per pass) against moe_align's routing; K = 200 ends in a partly copied chunk."""
    plan = _plans(_layer("w8a8-fp8-channel", n=640, k=200), block_ms=(block_m,))[0]
    assert plan.tuning.block_k == (256 if block_m == 8 else 128)
    check_schedule_and_gather(plan, tmp_path, seed=block_m)


@pytest.mark.parametrize("scheme", ["w8a8-fp8-block128", "w4a8-mxfp4-fp8", "w8a8-int8-channel"])
def test_stacked_expert_strides_are_the_kernel_constants(scheme: str) -> None:
    torch.manual_seed(0)
    plan = _plans(_layer(scheme, n=256, k=512, experts=3), block_ms=(32,))[0]
    stacked = prepare_moe_weight(plan, hg.scheme(scheme).quantize(torch.randn(3, 256, 512) * 0.05), "cpu")
    assert expert_stride_mismatches(plan, stacked) == {}
    assert {name: value for name, value, _ in plan.constants}["kExpertBiasBytes"] == 256 * 2


def test_a8_ws_symbol_declarations_match_the_source() -> None:
    plans = (_plans(_layer("w8a8-fp8-block128"), block_ms=(8, 128))
             + _plans(_layer("w4a8-mxfp4-fp8"), ComputeConfig(gemm="indexed", epilogue_activation="swiglu_oai"),
                      block_ms=(64,))
             + _plans(_layer("w8a8-mxfp8", bias=False), block_ms=(32,)))
    for plan in plans:
        assert missing_symbols(plan.components) == []
        assert declaration_mismatches(plan) == {}


def test_a8_ws_compose_refuses_what_moe_kernels_do_not_do() -> None:
    layer = _layer("w8a8-fp8-block128")
    tuning = choose_moe_tunings(layer, SM90).for_m(1000)
    with pytest.raises(ComposeError, match="MoE kernels take split_k=1"):
        compose(layer, WEIGHTED, attrs.evolve(tuning, split_k=2), SM90)
    for gemm in ("grouped_masked", "grouped_contiguous"):  # (grouped kernels: test_moe_grouped_ws.py)
        with pytest.raises(ComposeError, match="the router weights are applied by the caller's combine step"):
            compose(layer, ComputeConfig(gemm=gemm, topk_weight=True), tuning, SM90)
    with pytest.raises(ComposeError, match="gathered MoE rows come 16 per producer pass with block_k=128"):
        compose(layer, WEIGHTED, attrs.evolve(tuning, block_m=8), SM90)
    with pytest.raises(ComposeError, match="MoE units walk each m block's n tiles"):
        compose(layer, WEIGHTED, attrs.evolve(tuning, raster="m_band"), SM90)
    with pytest.raises(ComposeError, match="not a multiple of 16"):
        compose(_layer("w8a8-fp8-channel", n=1000), ComputeConfig(gemm="indexed", epilogue_activation="silu_mul"),
                tuning, SM90)
    with pytest.raises(ComposeError, match="needs compute.gemm='indexed'"):
        compose(layer, ComputeConfig(), tuning, SM90)
    with pytest.raises(ComposeError, match="lacks 'wgmma'"):
        compose(layer, WEIGHTED, tuning, get_target("sm_89"))


def _moe_layers(scheme: str) -> tuple[list[LayerConfig], list[ComputeConfig]]:
    """DeepSeek's per-rank GEMMs, scaled down: gate/up (N = 2I, K = H) and down (N = H, K = I)."""
    return [_layer(scheme, n=512, k=1024), _layer(scheme, n=1024, k=256)], [ComputeConfig(gemm="indexed"), WEIGHTED]


@pytest.mark.parametrize("scheme", SCHEMES[:4])
def test_moe_tunings_take_a8_warp_specialized_buckets_from_17_rows_per_expert_on_sm_90a(scheme: str) -> None:
    """W4A8: the standard pipeline's split-K and small buckets below 17 rows per expert, then warp-specialized; W8A8:
    every bucket warp-specialized."""
    layers, computes = _moe_layers(scheme)
    for target in ("sm_90a", "sm_89"):
        standard = [choose_tunings(layer, target, pipeline="standard") for layer in layers]
        plans = moe_tunings(standard, layers, computes, target)
        tiles = [[(m, t.block_m) for m, t in plan.buckets] for plan in plans]
        assert tiles[0] == tiles[1]  # one routing per batch serves both GEMMs
        own = moe_standard_plans(standard, layers, get_target(target))  # split_k=1, a first split-K bucket
        if target == "sm_89":
            assert plans == own
            with pytest.raises(ValueError, match="cannot serve these MoE GEMMs"):
                moe_tunings(standard, layers, computes, target, pipeline="warp_specialized")
            continue
        forced = moe_tunings(standard, layers, computes, target, pipeline="warp_specialized")
        assert [(m, t.block_m) for m, t in forced[0].buckets] == list(MOE_BUCKETS)
        assert [t.block_k for _, t in forced[0].buckets] == [256, 128, 128, 128]
        assert all(t.split_k == 1 and t.raster == "n_major" for plan in forced for _, t in plan.buckets)
        if w8a8(scheme):
            assert plans == forced
            continue
        # first the standard pipeline's split-K bucket below one row per expert (tests/cpu/test_moe_split_k.py)
        assert plans[0].buckets[0] == own[0].buckets[0] and plans[0].buckets[0][0] <= 1
        assert [m for m, _ in plans[0].buckets[1:]] == [8, 16, 64, None]
        assert [t.pipeline for _, t in plans[0].buckets] == ["standard"] * 3 + ["warp_specialized"] * 2
        assert [bm for _, bm in tiles[0][1:]] == [standard[0].for_m(8).block_m, standard[0].for_m(16).block_m, 64,
                                                  128]
    mx = moe_tunings(standard, *_moe_layers("w8a8-mxfp8"), SM90, pipeline="warp_specialized")
    assert [t.block_m for _, t in mx[0].buckets] == [8, 16, 32, 32]  # promoted every 32 k: 64 tokens spill


@pytest.mark.parametrize("scheme", SCHEMES[:4])
def test_quant_moe_a8_pipelines_per_bucket_on_sm_90a(scheme: str) -> None:
    torch.manual_seed(3)
    w13, w2 = torch.randn(8, 2 * 128, 256) * 0.05, torch.randn(8, 256, 128) * 0.05
    b13, b2 = torch.randn(8, 256), torch.randn(8, 256)
    moe = QuantMoE.from_float(w13, w2, scheme, target="sm_90a", device="cpu", bias13=b13, bias2=b2,
                              activation="swiglu_oai", gate_up_layout="interleaved")
    # fused by default, except block scales, which cannot follow the gate/up tile order
    fused = scheme != "w8a8-fp8-block128"
    assert moe.fused_activation is fused
    assert moe.activation_schemes == (hg.scheme(scheme).activation,) * 2
    kinds = [(g1.kernel.plan.pipeline, g2.kernel.plan.pipeline) for g1, g2 in moe._launchers]
    own = 0 if w8a8(scheme) else 2  # buckets on the standard pipeline
    assert kinds == [("standard", "standard")] * own + [("warp_specialized", "warp_specialized")] * (4 - own)
    assert moe.block_m(16, 8) == 16 and moe.block_m(17, 8) == 64 and moe.block_m(4096, 8) == 128  # rows per expert
    assert all(g1.kernel.plan.compute.epilogue_activation == ("swiglu_oai" if fused else None)
               for g1, _ in moe._launchers)
    for g1, g2 in moe._kernels:
        for kernel in (g1, g2):
            r = kernel.resources
            assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)
    # one packed copy per GEMM serves both pipelines' kernels
    assert len({g1.plan.layout for g1, _ in moe._kernels}) == 1 and len({g2.plan.layout for _, g2 in moe._kernels}) == 1
    assert moe.launcher_for("w2", 4096, 128).kernel.plan.pipeline == "warp_specialized"
    # grouped layouts: warp-specialized, folded where the GEMM folds (tests/cpu/test_moe_fold.py)
    grouped = moe.grouped_launcher("w2", "grouped_contiguous", 100).kernel
    assert grouped.plan.pipeline == "warp_specialized" and grouped.name.endswith("_fold") == moe.fold_scales[1]
    forced = QuantMoE.from_float(w13, w2, scheme, target="sm_90a", device="cpu", pipeline="warp_specialized")
    assert {g.kernel.plan.pipeline for pair in forced._launchers for g in pair} == {"warp_specialized"}
    assert forced.block_ms == [8, 16, 64, 128]
    standard = QuantMoE.from_float(w13, w2, scheme, target="sm_90a", device="cpu", pipeline="standard")
    assert {g.kernel.plan.tuning.mma for pair in standard._launchers for g in pair} == {"m16n8k32"}
    with pytest.raises(ValueError, match="lacks 'wgmma'"):
        QuantMoE.from_float(w13, w2, scheme, target="sm_89", device="cpu", pipeline="warp_specialized", strict=True)


def test_gemms_share_token_tiles_when_one_falls_back_to_16_bit_activations() -> None:
    """MXFP8 caps its 8-bit MoE tiles at 32 tokens (group-32 activation scales); a down GEMM whose K (I = 80) is no
    multiple of 32 runs 16-bit activations, whose own tiles are larger: both take the smaller tile per bucket, since
    one moe_align routing serves both GEMMs."""
    torch.manual_seed(2)
    w13, w2 = torch.randn(4, 160, 256) * 0.05, torch.randn(4, 256, 80) * 0.05
    moe = QuantMoE.from_float(w13, w2, "w8a8-mxfp8", target="sm_90a", device="cpu")
    assert moe.compute_dtypes == ("float8e4m3", "bfloat16")
    assert moe.block_ms == [8, 16, 32, 32]
    for g1, g2 in moe._launchers:
        assert g1.kernel.plan.tuning.block_m == g2.kernel.plan.tuning.block_m


def _token_of(n: int, top_k: int) -> int:
    """The routed epilogue's row / top_k (epilogue/assignment_token), in 32-bit unsigned arithmetic."""
    magic = (0xFFFFFFFF // top_k + 1) & 0xFFFFFFFF
    q = (n * magic) >> 32  # __umulhi
    return n if top_k == 1 else q - (1 if (q * top_k) & 0xFFFFFFFF > n else 0)


def test_token_of_is_the_exact_quotient() -> None:
    """The routed epilogue finds each assignment row's token (its activation scale's row) by a multiply-high and one
    correction instead of a division: exact for every row below 2^31 and every top_k, as the source computes it."""
    src = _source("w8a8-fp8-channel")
    assert "return 0xFFFFFFFFu / top_k + 1u;" in src and "q = __umulhi(n, magic);" in src
    assert "return top_k == 1u ? n : q - (q * top_k > n ? 1u : 0u);" in src
    assert "a_scale[assignment_token(rows_next[mc][j], p.top_k, top_k_magic)]" in src
    rng = random.Random(0)
    for top_k in list(range(1, 65)) + [100, 255, 256, 257, 1000, 4095, 65535, 2**20 + 7]:
        edges = [0, 1, top_k - 1, top_k, top_k + 1, 2**31 - 1, 2**31 - top_k, 2**24, 2**24 + 1]
        edges += [q * top_k + r for q in (2**31 // top_k - 1, 2**31 // top_k // 2) for r in (0, top_k - 1)]
        for n in edges + [rng.randrange(2**31) for _ in range(200)]:
            if 0 <= n < 2**31:
                assert _token_of(n, top_k) == n // top_k, (n, top_k)


@pytest.mark.parametrize("block_m", [8, 32, 128])
def test_staged_e8m0_activation_scales_in_moe_kernels(monkeypatch, block_m: int) -> None:
    """STAGE_E8M0_SCALES (the default): MXFP8's e8m0 group scales come with the stage through the routing's rows (4-byte
    cp.asyncs of a token's groups) instead of the consumers' global loads and row lookups; NVRTC without spills for
    the 8-token tile (256-k stages: 8 bytes a token) and the larger ones, indexed and grouped."""
    from humming_gen.pipelines.warp_specialized import compose_a8

    monkeypatch.setattr(compose_a8, "STAGE_E8M0_SCALES", True)
    plans = (_plans(_layer("w8a8-mxfp8"), block_ms=(block_m,))
             + _plans(_layer("w8a8-mxfp8", bias=False), ComputeConfig(gemm="grouped_contiguous"), (block_m,)))
    for plan in plans:
        src = generate(plan, "nvrtc")
        assert "const unsigned char* a_bytes = ring.stage_ptr(stage)" in src, plan.kernel_name
        assert "static_cast<const unsigned char*>(p.a_scale), a_scale_rows, kt);" in src
        assert "a_rows[" not in src and "a_scales[static_cast<long long>" not in src  # no global scale reads
    for kernel in build_many(plans):
        r = kernel.compiled.resources
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)
        assert kernel.a_scale_alignment == 4


def test_w8a8_rule_keeps_split_k_and_reads_both_gemms_for_grouped_tiles() -> None:
    """ws_moe_from_rows: a W8A8 layer asked for split_k=n keeps the standard pipeline's split buckets below 17 rows
    per expert (else the request would be dropped without a word); a layer whose GEMM2 runs 16-bit activations (a
    compute-type fallback) keeps both GEMMs' small buckets standard, and its grouped GEMM1 follows (moe_layers)."""
    from humming_gen.heuristics import grouped_moe_tuning

    s = hg.scheme("w8a8-fp8-block128")
    layers = [_layer("w8a8-fp8-block128", n=512, k=512), _layer("w8a8-fp8-block128", n=512, k=256)]
    standard = [choose_tunings(layer, SM90, pipeline="standard") for layer in layers]
    split = moe_tunings(standard, layers, [ComputeConfig(gemm="indexed"), WEIGHTED], SM90, split_k=2)
    assert [t.pipeline for _, t in split[0].buckets][:2] == ["standard"] * 2
    assert any(t.split_k > 1 for _, t in split[0].buckets)
    mixed = [layers[0], attrs.evolve(layers[1], scheme=attrs.evolve(s, activation=None))]
    grouped = ComputeConfig(gemm="grouped_contiguous")
    assert grouped_moe_tuning(standard[0], mixed[0], grouped, SM90, 8).pipeline == "warp_specialized"
    assert grouped_moe_tuning(standard[0], mixed[0], grouped, SM90, 8, moe_layers=mixed).pipeline == "standard"

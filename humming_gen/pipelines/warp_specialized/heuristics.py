"""Tunings of the warp-specialized pipeline per M bucket (sm_90a).

Every bucket reads the shared weight layout (so a layer keeps one packed weight), uses two consumer warpgroups
and 256-row tiles; buckets differ in the token tile (16 to 128, 176 for the open-ended one), split-K and stages.
With 8-bit activations (tuning_for_a8) tiles are 128 rows and up to 192 tokens; MoE GEMMs (16-bit or 8-bit
activations) have their own buckets (choose_moe_tunings). humming_gen.heuristics.choose decides from which bucket
on the layer takes them.
"""

from __future__ import annotations

import math

import attrs

from humming_gen.config import LayerConfig, TuningConfig
from humming_gen.pipelines.base import TuningPlan
from humming_gen.pipelines.warp_specialized import compose_a8
from humming_gen.pipelines.warp_specialized.compose import (BLOCK_N, LAYOUT_BLOCK_N, gathered_rows_per_pass,
                                                            shared_memory, widened_max_block_m)
from humming_gen.schemes.quantize import PANEL_K
from humming_gen.targets import Target

MAX_STAGES = 8
BLOCK_K = 128  # two 64-k chunks per stage: half the stage hand-offs of 64, and 8 k16 steps to overlap
# (largest M of the bucket); the last is open-ended. Smaller buckets belong to the standard pipeline.
# Measured on the H200 (bench/ws_sweep.py, W4A16 8192 x 8192, graph us per layer):
# - M = 64: 64 tokens, split-K 4 (27.0) beats split 3 (31.8), 8 (40.4) and block_k 64 (29.9).
# - M = 128: 128 tokens, split 4 (40.3) beats 64 tokens split 2 (43.3) or 4 (52.2).
# - M = 256: 128 tokens, split 2 (62.1) beats split 1 (98.5), 96 tokens (105.1), 64 tokens split 4 (102.1).
# - M = 1024 .. 4096: 128 tokens (207 / 875) beat 160 (248 / 917) and 176 (267 / 889).
# - M = 8192: 176 tokens (1760) beat 128 (1832): the longest wgmma amortizes each dequantized weight most.
# Buckets to 4096 double, so the split-K chosen for a bucket's largest M still fills the SMs at its smallest.
# Split-K (every slice sums a share of the tile, epilogue/split_k_reduce_parallel) fills the SMs at most once: a
# second wave of units costs more than shorter slices (bench/split_sweep.py, H200, W4A16, graph us per layer):
# - 2880 x 2880 M = 64, 12 tiles: split 11 (132 units) 10.2 against 5 (60) 12.1; M = 128 with 64-token tiles:
#   split 6 (144 units, two waves) 19.4 against split 3 (72) 15.7.
# - 576 x 7168 M = 128: 64-token tiles split 22 (132 units) 9.9 against 128-token tiles split 22 (66) 12.6; where the
#   wider tile fills as many SMs (8192 x 8192 M = 128: 37.8 against 45.9) it wins.
BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, None)
LARGE_M_BLOCK = 176  # token tile of the open-ended bucket
# ... except where the dequantization holds more registers per tile (fp32 group or block scales, float zero points):
# NVRTC 13.0 (the H200's) spilled 4-12 bytes there at 176 tokens (uint4 g128 float zero points, fp8 128 x 128 blocks),
# 13.5 did not; 160 fit both. With TMA activations the tile barely matters at M = 8192 (W4A16 8192 x 8192, 128 / 160 /
# 176 tokens: 1615.5 / 1624.4 / 1608.7 us).
LARGE_M_BLOCK_HEAVY_GROUPS = 160
MAX_SPLIT = 32
MIN_SLICE_K_TILES = 2  # k tiles per split-K slice at least
# Dense 16-bit activations and grouped MoE windows come by TMA (a tensor map per call, one copy per 64-k panel from
# the producer's first thread) instead of 128 producer threads' cp.async. bench/ws_ablation.py (H200, W4A16 8192 x 8192, graph us) with the
# cp.async copies removed from the source: M = 1024 / 4096 / 8192 191.8 / 833.2 / 1737.3 -> 170.3 / 676.5 / 1441.5.
TMA_ACTIVATIONS = True
# Measured slower and removed (2026-12-03, H200, bench/tma_ab.py, W4A16 int4 g128, graph us, both orders, faster kept):
# indexed MoE rows gathered by TMA, one box of one row x 64 k per row and panel from the producer's first warp (the
# 128-byte swizzle follows the shared-memory address, so the results were right: GPU suite passed); an SM's TMA unit
# took about 48 ns per 128-byte box (DeepSeek: 7.3 M boxes over 132 SMs), so at M = 4096 the gate-up GEMMs ran 4x slower
# than the cp.async gather (DeepSeek-V3 per rank 613.6 -> 2675.5, Qwen3-30B-A3B 465.4 -> 1834.9; whole layers 1192.8 ->
# 3267.7 and 831.1 -> 2167.2). And with TMA activations, the producer threads that issue nothing leaving at once instead
# of polling the ring: 8192 x 8192 M = 1024 / 4096 / 8192 179.8 / 794.9 / 1638.6 (polling) against 196.6 / 823.9 /
# 1643.0 (leaving).


def _large_m_block(layer: LayerConfig) -> int:
    """The open-ended bucket's token tile: LARGE_M_BLOCK, or LARGE_M_BLOCK_HEAVY_GROUPS where the consumers hold fp32
    group / block scales or float zero points (never wider than LARGE_M_BLOCK, which measurements lower)."""
    s = layer.scheme
    heavy = s.zero_point == "float" or (s.granularity in ("group", "block") and s.scale_dtype.name == "float32")
    return min(LARGE_M_BLOCK, LARGE_M_BLOCK_HEAVY_GROUPS) if heavy else LARGE_M_BLOCK


def _split(tiles: int, k_tiles: int, sm_count: int) -> int:
    """The most k slices whose units still fit one wave of the SMs (1 where the tiles nearly fill them)."""
    if tiles >= 0.75 * sm_count:
        return 1
    return max(1, min(sm_count // tiles, k_tiles // MIN_SLICE_K_TILES, MAX_SPLIT))


def tuning_for(layer: LayerConfig, target: Target, m_max: int | None) -> TuningConfig:
    """The tuning of one bucket: a token tile of the bucket's M up to 128 (176 for the open-ended bucket), or 64
    where that fills clearly more SMs in one wave, split-K up to one wave of units, and as many stages as shared
    memory holds."""
    warpgroups = 2
    n_tiles = math.ceil(math.ceil(layer.n / LAYOUT_BLOCK_N) * LAYOUT_BLOCK_N / BLOCK_N)
    k_tiles = math.ceil(layer.k / BLOCK_K)
    if m_max is None:
        block_m, split = _large_m_block(layer), 1
    else:
        options = []  # (units, block_m, split), the widest token tile first
        for bm in sorted({min(128, math.ceil(m_max / 8) * 8), min(64, math.ceil(m_max / 8) * 8)}, reverse=True):
            tiles = n_tiles * math.ceil(m_max / bm)
            split = _split(tiles, k_tiles, target.sm_count)
            options.append((tiles * split, bm, split))
        units, block_m, split = options[0]
        # the narrower tile where its units still fit one wave and fill clearly more SMs (two waves of half
        # tiles take as long as one of whole ones: 2880 x 2880 M = 1024, 41.8 us with 128 tokens, 56.1 with 64)
        if len(options) > 1 and 1.25 * min(units, target.sm_count) < options[1][0] <= target.sm_count:
            _, block_m, split = options[1]
    fields = dict(pipeline="warp_specialized", mma="wgmma", block_m=block_m, block_n=BLOCK_N, block_k=BLOCK_K,
                  warps_m=1, warps_n=4 * warpgroups, warps_k=1, a_load=_a_load(layer),
                  b_load="tma", scale_load="tma", split_k=split)
    return deepest(layer, target, fields)


def _a_load(layer: LayerConfig) -> str:
    """Dense activations by TMA (TMA_ACTIVATIONS); indexed MoE rows are gathered by cp.async (grouped windows: TMA,
    moe_tuning_for)."""
    return "tma" if TMA_ACTIVATIONS and layer.num_experts == 1 else "cp_async"


def deepest(layer: LayerConfig, target: Target, fields: dict, reserved: int = 0) -> TuningConfig:
    """The tuning with as many stages as shared memory holds (at least 2), by the ring of the layer's activations,
    beside `reserved` bytes of static shared memory (a grouped MoE schedule's expert prefix)."""
    plan = compose_a8.shared_memory if layer.scheme.activation is not None else shared_memory
    stages = 2
    for s in range(2, MAX_STAGES + 1):
        if plan(layer, TuningConfig(**fields, stages=s)).fits(target, reserved):
            stages = s
    return TuningConfig(**fields, stages=stages)


def restaged(layer: LayerConfig, target: Target, tuning: TuningConfig, **changes) -> TuningConfig:
    """`tuning` with `changes` (say another token tile), as many stages as shared memory then holds (deepest)."""
    fields = {f: v for f, v in attrs.evolve(tuning, **changes).to_dict().items() if f != "stages"}
    return deepest(layer, target, fields)


# MoE (indexed GEMMs, QuantMoE): buckets of expected rows per expert (M * top_k / E) and their token tile, which is
# also the block moe_align pads each expert's rows to, so both GEMMs of a layer take the same tiles. An expert whose
# rows fill few tiles wastes the padding of its last one whatever the tile, so the tile is the bucket's bound:
# about as many padded rows as half-size tiles, each weight dequantized for twice the tokens. The open-ended bucket
# keeps 128 tokens (the dense sweep's best from M = 1024 to 4096; 176 pads an expert's last tile by more). No
# split-K: the experts' m blocks fill the SMs. humming_gen.heuristics.choose.moe_tunings picks the buckets this
# pipeline takes (from 17 rows per expert on). Measured exception (bench/moe_tile_sweep.py, H200, whole QuantMoE
# forward in us, 32 rows per expert on average): 64-token tiles from 17 rows on, no 32-row bucket, since with random
# routing about half the experts pass their mean and a 32-token tile reads their weights twice (Qwen3-30B-A3B
# M = 512: W4A16 307.3 -> 272.3, W4A8 335.2 -> 321.6; DeepSeek-V3 per rank M = 1024: W4A16 730.5 -> 667.8, W4A8
# 953.8 -> 892.6); at 64 rows 64- and 128-token tiles tie (458.3 / 457.1, 531.8 / 529.3), at 128 and 256 rows 128
# wins. Wider tiles pad less (at 128 rows per expert, random routing puts half the experts past one 128-token tile:
# 1.48 tiles an expert, 1.07 of 144 tokens, 1.00 of 160) but hold fewer stages; measured 2026-12-02 (whole layer,
# us, tiles 128 / 144 / 160): Qwen3 W4A16 at 128 rows 545.2 / 506.5 / 538.6, 256 rows 866.8 / 845.3 / 959.5, 512
# rows 1537.8 / 1647.7 / 1765.8; Qwen3 fp8 block128 at 128 rows 651.3 / 623.8 / 621.5, 256 rows 1089.7 / 1097.8 /
# 1126.5; Qwen3 W4A8 at 128 rows 534.7 / 532.7 / 526.9, 256 rows 843.5 / 938.8 / 987.1; DeepSeek-V3 W4A16 at 128
# rows 1363.6 / 1473.0 / 1421.2, 256 rows 2311.3 / 2573.4 / 2742.5. A few percent at 128 rows on Qwen3, losses
# elsewhere: 128 stays (tests/gpu/test_moe_token_tiles_gpu.py checks the wider tiles' values).
MOE_BUCKETS = ((8, 8), (16, 16), (64, 64), (None, 128))


def moe_tuning_for(layer: LayerConfig, target: Target, block_m: int, reserved: int = 0,
                   grouped: bool = False) -> TuningConfig:
    """The tuning of an MoE GEMM with `block_m` tokens per tile (indexed; `grouped` ones reserve their schedule's
    expert prefix, `reserved` bytes of static shared memory, and read their row windows by TMA where
    TMA_ACTIVATIONS: rows past a window feed only tokens the store skips)."""
    if layer.scheme.activation is not None:
        return moe_tuning_for_a8(layer, target, block_m, reserved)
    fields = dict(pipeline="warp_specialized", mma="wgmma", block_m=block_m, block_n=BLOCK_N, block_k=BLOCK_K,
                  warps_m=1, warps_n=8, warps_k=1, a_load="tma" if grouped and TMA_ACTIVATIONS else "cp_async",
                  b_load="tma", scale_load="tma", split_k=1)
    return deepest(layer, target, fields, reserved)


def choose_moe_tunings(layer: LayerConfig, target: Target) -> TuningPlan:
    """One tuning per bucket of expected rows per expert (MOE_BUCKETS) for an indexed MoE GEMM (16-bit or 8-bit
    activations)."""
    return TuningPlan(tuple((m_max, moe_tuning_for(layer, target, block_m)) for m_max, block_m in MOE_BUCKETS))


# 8-bit activations (compose_a8): 128-row tiles; every bucket on sm_90a (humming_gen.heuristics.choose), token tiles of
# the bucket's M up to 128 (64 where 128-token tiles would leave a quarter of the SMs idle; 192 from the 4096 bucket
# where no activation groups are promoted and those tiles fill the SMs), split-K to one wave (half a wave where the
# CTAs stream 8-bit weights with channel scales, up to 64 tokens: _streams_weights).
A8_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, None)
A8_BLOCK_K = 128  # one 128-byte swizzle panel of codes per token and stage; fp8 partial sums promoted per stage


# Measured on the H200 (bench/a8_sweep.py, 8192 x 8192, graph us per layer with the activation quantization):
# - 128-token tiles beat 64 (fp8 channel M = 4096: 754-812 against 854; int8 715-728 against 789).
# - the m_band raster helps block scales (fp8 block128 M = 4096: 1227 against 1319; M = 1024: 315 against 340),
#   not channel scales (fp8 M = 4096: 812 against 754; int8 728 against 715).
# - the buckets from M = 4096 on take 192-token tiles where no activation groups are promoted (their scales beside
#   96 partial sums and 96 accumulators spill): a 128 x 192 tile reads 20 % fewer bytes per multiply-add from L2
#   (M = 4096, overlapped promotion: fp8 channel 500.5 against 565.3 at 128 tokens; W4A8 MXFP4 550.8 against 631.8).
# - activation codes in the panels layout, a stage's tile by one bulk copy (a_load='tma', where K % 128 == 0), beat
#   cp.async of 16-byte chunks by the producer's 128 threads (fp8 channel M = 4096: 656.5 -> 515.9; int8 580.3 ->
#   439.7; M = 8192 1355.8 -> 1097.4, 1124.0 -> 919.1: session 11's probe, one process), and with them the m_band
#   raster helps channel scales too (fp8 M = 4096 515.9 -> 506.1, M = 8192 1097.4 -> 1041.5; int8 439.7 -> 432.9,
#   919.1 -> 875.9).
# Small buckets take a token tile of their M and split-K up to one wave of units, as the 16-bit buckets do (the
# standard pipeline's fp8 mma.sync runs as F2FP + HMMA on sm_90a: W8A8 fp8 8192 x 8192 at M = 64 took 49 us).
A8_LARGE_BLOCK_M = 192
A8_LARGE_FROM_BUCKET = 4096  # the smallest bucket bound that takes A8_LARGE_BLOCK_M (the open-ended one too)


def tuning_for_a8(layer: LayerConfig, target: Target, m_max: int | None) -> TuningConfig:
    from humming_gen.pipelines.standard.compose_a8 import activation_group_k

    n_tiles = math.ceil(layer.n / compose_a8.BLOCK_N)
    k_tiles = math.ceil(layer.k / A8_BLOCK_K)
    block_m = 128 if m_max is None else min(128, math.ceil(m_max / 8) * 8)
    # 192-token tiles in a bounded bucket only where they fill the SMs without split-K (narrow layers keep the
    # 64 / 128 rule below: 192-token split-K tiles are unmeasured and GPU-untested)
    large = m_max is None or (m_max >= A8_LARGE_FROM_BUCKET
                              and n_tiles * math.ceil(m_max / A8_LARGE_BLOCK_M) >= 0.75 * target.sm_count)
    if large and activation_group_k(layer) is None:
        block_m = A8_LARGE_BLOCK_M
    elif m_max is not None and m_max > 64 and n_tiles * math.ceil(m_max / 128) < 0.75 * target.sm_count:
        block_m = 64
    if (compose_a8.promote_k(layer, A8_BLOCK_K) < A8_BLOCK_K and activation_group_k(layer) is not None
            and not (compose_a8.staged_scale_bytes(layer, A8_BLOCK_K) and compose_a8.OVERLAP_PROMOTION)):
        # activation scales read from global memory at each of a stage's promotions (e8m0 where K is no whole
        # stages): 128 tokens' worth spill. Staged with the codes they fit 128 tokens in overlapped halves (the
        # H200, MXFP4 weights, M = 4096, 3072 x 4096, 64 / 128 tokens: fp8 group-32 392.4 / 329.1 us, MXFP8 staged
        # 429.9 / 355.0; MXFP8 read at promotion spills at 128, 1869.7 against 733.2)
        block_m = min(block_m, 64)
    streams = m_max is not None and m_max <= 64 and _streams_weights(layer)
    split = 1 if m_max is None else _split(n_tiles * math.ceil(m_max / block_m), k_tiles,
                                           target.sm_count // (2 if streams else 1))
    # activation codes in the panels layout, a stage's tile by one bulk copy, where K is whole panels (dense layers:
    # MoE GEMMs gather rows)
    a_load = "tma" if layer.k % PANEL_K == 0 and layer.num_experts == 1 else "cp_async"
    fields = dict(pipeline="warp_specialized", mma="wgmma", block_m=block_m, block_n=compose_a8.BLOCK_N,
                  block_k=A8_BLOCK_K, warps_m=1, warps_n=4 * compose_a8.WARPGROUPS, warps_k=1, a_load=a_load,
                  b_load="tma", scale_load="tma", split_k=split,
                  raster="m_band" if split == 1 and _banded(layer, block_m, a_load) else "n_major")
    return deepest(layer, target, fields)


def _streams_weights(layer: LayerConfig) -> bool:
    """8-bit weights with channel or tensor scales: nothing widened or promoted per weight group, so the CTAs of a
    bucket up to 64 tokens stream weights and half the SMs' worth of units suffice; split-K slices for the rest cost
    more than they bring (H200, 8192 x 8192, graph us with the quantization, 64 units of one k slice / 128 of two:
    fp8 channel M = 1 22.9 / 25.4, M = 16 23.7 / 27.9, M = 32 24.8 / 33.1, M = 64 27.7 / 35.7; int8 22.9 / 25.7,
    23.5 / 27.8, 24.3 / 33.2, 25.3 / 34.8). W4A8 MXFP4 and fp8 block128, whose CTAs widen or promote, keep two
    slices (two / one: W4A8 M = 1 21.2 / 28.6, block128 M = 64 28.5 / 31.1; bench/a8_sweep.py small)."""
    from humming_gen.pipelines.standard.compose_a8 import activation_group_k, nibble_order

    return (nibble_order(layer) is None and compose_a8.promoted_weight_group_k(layer) is None
            and activation_group_k(layer) is None)


def _banded(layer: LayerConfig, block_m: int, a_load: str) -> bool:
    """The m_band raster (measured above) for promoted weight groups, and for tiles of panels; except 192-token
    panels tiles with promoted weight groups (W4A8 int4 g128), whose consumers spill 8 bytes under the band's
    coordinates (ptxas 13.0; the cp.async version does not)."""
    groups = compose_a8.promoted_weight_group_k(layer) is not None
    if a_load == "tma":
        return not (groups and block_m > 128)
    return groups


def weight_multicast(tuning: TuningConfig) -> TuningConfig:
    """`tuning` with two-CTA clusters along M sharing each weight stage by multicast (8-bit dense kernels; opt-in: on
    the H200 at N = K = 8192 it measured no faster, so no heuristic picks it): unit pairs walk whole tiles n-major."""
    return attrs.evolve(tuning, cluster_m=2, b_load="tma_multicast", raster="n_major", split_k=1)


def activation_multicast(tuning: TuningConfig) -> TuningConfig:
    """`tuning` with two-CTA clusters along N sharing each activation stage by multicast (dense 8-bit kernels reading
    panels, an even number of n tiles; opt-in, unmeasured): unit pairs take one m tile of two n tiles, each CTA
    copying half the tile's rows into both, which halves the activation bytes read from L2 per CTA."""
    return attrs.evolve(tuning, cluster_n=2, a_load="tma_multicast", split_k=1)


# Weight rows of a tokens-on-M tile: wgmma m64n256 (or two n128 parts where partial sums are promoted) reads
# 64 + 256 bytes of shared memory per k for 64 x 256 products, the 128-row tile's m64n64 halves 64 + 64 per 64 x 64;
# 128-row tiles where 256 would leave SMs idle (as tuning_for_a8's fill rule).
TOKENS_M_BLOCK_N = 256


def shared_weight_tunings(layer: LayerConfig, target: Target, tokens_m_from: int | None = None,
                          tokens_m_block_n: int | None = None) -> TuningPlan:
    """The heuristics' plan for a dense 8-bit-weight x 8-bit-activation layer (warp-specialized at every M on
    sm_90a) with the weights read from shared memory (b_operand='shared', WgmmaSS8): every bucket, since a layer keeps
    one packed copy (BLayoutSw128); the stages stay, the weight stage is the same bytes. Buckets from
    `tokens_m_from` rows on (and the open-ended one) put the tokens on wgmma's M (tokens_m_tuning; `tokens_m_block_n`
    weight rows a tile, or its choice). The default plan where shared_weights_default says so (numbers there)."""
    buckets = []
    for m_max in A8_BUCKETS:
        tuning = attrs.evolve(tuning_for_a8(layer, target, m_max), b_operand="shared")
        if tokens_m_from is not None and (m_max is None or m_max >= tokens_m_from):
            tuning = tokens_m_tuning(layer, target, tuning, m_max, tokens_m_block_n)
        buckets.append((m_max, tuning))
    return TuningPlan(tuple(buckets))


def tokens_m_tuning(layer: LayerConfig, target: Target, tuning: TuningConfig, m_max: int | None,
                    block_n: int | None = None) -> TuningConfig:
    """`tuning` (b_operand='shared') of the bucket up to `m_max` rows with the tokens on wgmma's M (tokens_on='m'):
    128-token tiles, 64 a consumer warpgroup, `block_n` weight rows (one or two layout blocks; by default
    TOKENS_M_BLOCK_N where the bucket's tiles fill three quarters of the SMs, else one block), 128-k stages, whole
    along K, and as many stages as then fit."""
    if block_n is None:
        fills = m_max is None or math.ceil(layer.n / TOKENS_M_BLOCK_N) * math.ceil(m_max / 128) >= 0.75 * target.sm_count
        block_n = TOKENS_M_BLOCK_N if fills else compose_a8.BLOCK_N
    return restaged(layer, target, tuning, tokens_on="m", block_m=128, block_n=block_n, block_k=A8_BLOCK_K,
                    split_k=1, raster="m_band" if _banded(layer, 128, tuning.a_load) else "n_major")


# 16-bit widened panels take block_n x block_k x 2 bytes a stage: 64-k stages keep three in shared memory beside
# 176-token activation tiles (two 128-k stages do not fit from about 96 tokens; compose refuses other block_k)
WIDENED_BLOCK_K_16 = 64


def widened_weight_tunings(layer: LayerConfig, target: Target, widened_from: int = 1,
                           tokens_m_from: int | None = None) -> TuningPlan:
    """The plan of a layer whose warp-specialized buckets from `widened_from` rows on (and the open-ended one) have
    the producer warpgroup's warps 1-3 widen each stage's weights into shared memory (b_operand='widened'): weights
    of at most 4 bits x 8-bit activations widened to 8-bit codes (compose_a8.widened_reasons; dense; from
    `tokens_m_from` rows on with the tokens on wgmma's M, one 128-row layout block a tile), or any weights x 16-bit
    activations dequantized to 16-bit panels (compose.widened_reasons: dense layers and grouped MoE windows, whose
    activations come by TMA; WIDENED_BLOCK_K_16 stages). The other buckets keep the heuristics' register kernels;
    all read one packed copy. Opt-in, and measured slower on the H200 (bench/widened_bench.py, 8192², M = 4096:
    W4A16 int4 g128 726.2 us default, 1139.5 widened; W4A8 MXFP4 542.7 / 808.5): three widening warps are the
    critical path (docs/DEVELOPING.md). ValueError where no bucket can widen."""
    if layer.scheme.activation is None:
        return _widened_16bit(layer, target, widened_from)
    from humming_gen.config import ComputeConfig

    widened = attrs.evolve(tuning_for_a8(layer, target, None), b_operand="widened")
    reasons = compose_a8.widened_reasons(layer, ComputeConfig(gemm="dense" if layer.num_experts == 1 else "indexed"),
                                         widened)
    if tokens_m_from is not None:
        reasons += compose_a8.tokens_m_reasons(layer, tokens_m_tuning(layer, target, widened, None, compose_a8.BLOCK_N))
    if reasons:
        raise ValueError(f"{layer.summary()}: weights widened into shared memory need: " + "; ".join(reasons))
    buckets = []
    for m_max in A8_BUCKETS:
        tuning = tuning_for_a8(layer, target, m_max)
        if m_max is None or m_max >= widened_from:
            tuning = restaged(layer, target, tuning, b_operand="widened")
            if tokens_m_from is not None and (m_max is None or m_max >= tokens_m_from):
                tuning = tokens_m_tuning(layer, target, tuning, m_max, compose_a8.BLOCK_N)
        buckets.append((m_max, tuning))
    return TuningPlan(tuple(buckets))


def _widened_16bit(layer: LayerConfig, target: Target, widened_from: int) -> TuningPlan:
    from humming_gen.heuristics import choose_tunings as heuristics_plan

    buckets, widened = [], 0
    for m_max, tuning in heuristics_plan(layer, target, stored=False).buckets:
        if (tuning.pipeline == "warp_specialized" and tuning.a_load == "tma"
                and (m_max is None or m_max >= widened_from)):
            tuning = attrs.evolve(tuning, b_operand="widened", block_k=WIDENED_BLOCK_K_16)
            tuning = restaged(layer, target, tuning, block_m=min(tuning.block_m, widened_max_block_m(layer, tuning)))
            widened += 1
        buckets.append((m_max, tuning))
    if not widened:
        raise ValueError(f"{layer.summary()}: no warp-specialized bucket from {widened_from} rows reads its "
                         f"activations by TMA, which weights dequantized into shared memory need")
    return TuningPlan(tuple(buckets))


def moe_tuning_for_a8(layer: LayerConfig, target: Target, block_m: int, reserved: int = 0) -> TuningConfig:
    """The tuning of an indexed MoE GEMM with 8-bit activations and `block_m` tokens per tile: the dense 8-bit
    kernels' 128-row tiles and 128-k stages, except that an 8-token tile takes 256-k stages (the producer gathers
    16 rows of 128 codes per pass, 8 of 256). Tokens per tile as the 16-bit MoE buckets (MOE_BUCKETS), capped at 32
    where activation group scales are promoted several times a stage (MXFP8's groups of 32: the dense buckets' 64
    tokens spill beside the lookups of each token's activation row, where the e8m0 scales are read at promotion;
    staged ones, STAGE_E8M0_SCALES, compile without spills up to 128 tokens, unmeasured, so the cap stays)."""
    from humming_gen.pipelines.standard.compose_a8 import activation_group_k

    block_k = next(k for k in (A8_BLOCK_K, 2 * A8_BLOCK_K) if block_m % gathered_rows_per_pass(k, 1) == 0)
    if compose_a8.promote_k(layer, block_k) < block_k and activation_group_k(layer) is not None:
        block_m = min(block_m, 32)
    fields = dict(pipeline="warp_specialized", mma="wgmma", block_m=block_m, block_n=compose_a8.BLOCK_N,
                  block_k=block_k, warps_m=1, warps_n=4 * compose_a8.WARPGROUPS, warps_k=1, a_load="cp_async",
                  b_load="tma", scale_load="tma", split_k=1)
    return deepest(layer, target, fields, reserved)


def shared_weights_default(layer: LayerConfig) -> bool:
    """Dense 8-bit weights x 8-bit activations with channel / tensor weight scales or blocks of at least 128 rows
    read the weights from shared memory (shared_weight_tunings), and the block-scaled ones put the tokens on wgmma's
    M from the TOKENS_M_FROM bucket on. H200, N = K = 8192, graph us with the quantization (bench/ss_bench.py, both
    orders, 2026-12-03), register weights -> shared (-> tokens on M):

    | M | 1 | 16 | 64 | 128 | 256 | 512 | 1024 | 2048 | 4096 | 8192 |
    |---|---|---|---|---|---|---|---|---|---|---|
    | fp8 channel | 22.4 -> 22.2 | 24.8 -> 23.4 | 26.4 -> 25.7 | 33.0 -> 32.4 | 42.5 -> 41.3 | 71.4 -> 69.3 | 133.0 -> 128.8 | 267.7 -> 262.8 | 546.9 -> 502.1 | 1077.6 -> 1022.6 |
    | int8 channel | 22.6 -> 22.3 | 23.3 -> 23.2 | 24.7 -> 24.4 | 30.5 -> 29.4 | 40.0 -> 37.1 | 66.0 -> 60.3 | 120.2 -> 125.3 | 234.1 -> 231.7 | 450.2 -> 446.1 | 883.4 -> 875.7 |
    | fp8 block128 | 22.8 -> 22.7 | 24.9 -> 25.2 | 28.1 -> 28.5 | 33.9 -> 38.9 | 50.6 -> 48.3 | 95.7 -> 75.6 | 182.6 -> 145.2 | 368.4 -> 288.5 | 775.2 -> 585.5 | 1558.1 -> 1272.3 |

    (shared-weight tiles under 128 tokens then measured faster with one set of partial sums, now the default:
    compose_a8.SHARED_OVERLAP_FROM_BLOCK_M; block128 at M = 128 31.7, fp8 channel 29.9). Weights of at most 4 bits widen in registers, and per-row group scales (MXFP8) were not measured: registers."""
    from humming_gen.pipelines.standard.compose_a8 import nibble_order

    return (layer.scheme.activation is not None and layer.num_experts == 1 and nibble_order(layer) is None
            and (compose_a8.promoted_weight_group_k(layer) is None or compose_a8.tile_weight_scale(layer)))


TOKENS_M_FROM = 256  # the smallest bucket bound of block-scaled shared-weight layers' tokens-on-M tiles


def choose_tunings(layer: LayerConfig, target: Target, register_weights: bool = False) -> TuningPlan:
    """`register_weights`: the plan of register weights (BLayout8) even where shared_weights_default (a layer that
    also runs the standard pipeline's kernels on the same packed copy: quantize_in_gemm)."""
    if layer.scheme.activation is not None:
        if not register_weights and shared_weights_default(layer):
            blocks = compose_a8.promoted_weight_group_k(layer) is not None
            return shared_weight_tunings(layer, target, tokens_m_from=TOKENS_M_FROM if blocks else None)
        return TuningPlan(tuple((m_max, tuning_for_a8(layer, target, m_max)) for m_max in A8_BUCKETS))
    return TuningPlan(tuple((m_max, tuning_for(layer, target, m_max)) for m_max in BUCKETS))

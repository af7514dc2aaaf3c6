"""Tunings of the standard pipeline per M bucket.

All buckets of a layer share the weight layout (block_n, warps_n and the warp's k slice), so one packed copy
of the weights serves every M; the buckets differ in block_m, warps_m, warps_k (hence block_k), stages, CTAs per SM
and split-K. Figures come from the target (SM count, shared memory), not from tests on `sm >= 90`.
"""

from __future__ import annotations

import math
from fractions import Fraction

import attrs

from humming_gen.config import LayerConfig, TuningConfig
from humming_gen.pipelines.base import TuningPlan
from humming_gen.pipelines.common import SHARED_LAYOUT, arbitrary_group_size
from humming_gen.pipelines.standard.compose import SMEM_PER_CTA_RESERVED, shared_memory
from humming_gen.pipelines.standard.compose_a8 import byte_layer, mma_of, s4_native, scheme_reasons
from humming_gen.targets import Target

# (largest M of the bucket, block_m, warps_m, warps_k, max stages, CTAs per SM); the last bucket is open-ended.
# Measured on the H200 (bench/bench_dense.py --sweep, W4A16 8192x8192, graph us per layer):
# - M <= 8: two CTAs per SM of 3 stages with split-K covering both (14.5-14.7) beat one CTA of 4 stages with
#   half the split (14.7-18.4, erratic): one CTA's prologue and split-K hand-off hide behind the other's loop.
# - M <= 16: one CTA of 4 stages (17.2) beats two (17.4-18.0).
# - M <= 64: two m blocks of 32 rows, no split (38.4), beat one 64-row block split in two (44.4; 8 warps 40.2).
# - larger M: a 64-row warp tile (warps_m=2) beats four 32-row warps that each dequantize the same weights.
BUCKETS = ((8, 8, 1, 4, 3, 2), (16, 16, 1, 4, 4, 1), (32, 32, 1, 4, 4, 1), (64, 32, 1, 4, 4, 1),
           (256, 64, 1, 2, 4, 1), (None, 128, 2, 1, 4, 1))
# 8-bit activations: a warp holds fp32 accumulators and the stage's partial sums of its tile, so warp tiles stay at
# 32 rows (a 64-row warp tile spills: 255 registers and up to 192 B of stack on sm_90a, ptxas).
A8_BUCKETS = BUCKETS[:4] + ((256, 64, 2, 2, 4, 1), (None, 128, 4, 1, 4, 1))


def _fits(layer: LayerConfig, target: Target, fields: dict, stages: int, ctas: int) -> bool:
    """Whether `ctas` CTAs of this tuning with a `stages`-deep ring fit an SM (compose's own sizing)."""
    return _tuning_fits(layer, target, TuningConfig(**{**fields, "stages": stages, "ctas_per_sm": ctas}))


def _tuning_fits(layer: LayerConfig, target: Target, tuning: TuningConfig) -> bool:
    smem = shared_memory(layer, tuning).total
    return (smem <= target.smem_per_block_optin
            and tuning.ctas_per_sm * (smem + SMEM_PER_CTA_RESERVED) <= target.smem_per_sm)


def slice_stages(layer: LayerConfig, block_k: int, split_k: int) -> int:
    """The most stages worth a ring: one more than the k tiles one k slice walks, so the prologue puts every k tile
    in flight at once (the main loop refills a stage only after waiting for the oldest: a ring of exactly the k
    tiles fetches the last one a whole memory latency late). Deeper rings only take shared memory, which keeps other
    CTAs off the SM. H200, DeepSeek down GEMM (K = 256), graph us: one k tile (block_k 256) at M = 1
    (bench/moe_split_probe.py): W4A16 2 CTAs of 3 stages 8.0, of 2 stages 6.4; fp8 block128 1 CTA of 4 stages 14.0,
    of 2 stages 10.4; fp8 channel 20.4 and 13.6. Two k tiles (block_k 128, 4 CTAs; bench/moe_small_tiles.py,
    2026-12-02), W4A16 int4 g128 at M = 16 / 128: 2 stages 42.6 / 110.8, 4 stages 36.6 / 95.8."""
    return math.ceil(math.ceil(layer.k / block_k) / split_k) + 1


def _split_k(layer: LayerConfig, target: Target, tiles: int, block_k: int, ctas_per_sm: int) -> int:
    """Enough k slices for the grid to fill every CTA slot about once (never more than the k tiles)."""
    k_tiles = math.ceil(layer.k / block_k)
    slots = target.sm_count * ctas_per_sm
    if tiles >= slots * 0.75:
        return 1
    split = max(1, round(slots / tiles))
    return max(1, min(split, k_tiles // 2 if k_tiles >= 2 else 1, 16))


def choose_tunings(layer: LayerConfig, target: Target, **overrides) -> TuningPlan:
    """One TuningConfig per M bucket for `layer` on `target`. `overrides` replace TuningConfig fields in
    every bucket (for experiments and autotuning)."""
    layout = {**SHARED_LAYOUT, **{k: overrides.pop(k) for k in list(overrides) if k in SHARED_LAYOUT}}
    # int4 activations: the kernels tile the packed bytes of both operands (compose_a8.byte_layer), so do the splits
    geometry = byte_layer(layer) if s4_native(layer) and not scheme_reasons(layer) else layer
    block_n, warps_n, warp_k = layout["block_n"], layout["warps_n"], layout["warp_k"]
    n_blocks = math.ceil(layer.n / block_n)
    bits = layer.scheme.weight.bits
    buckets = []
    for m_max, block_m, warps_m, warps_k, max_stages, ctas in (A8_BUCKETS if layer.scheme.activation else BUCKETS):
        def tile() -> dict:
            return dict(block_m=block_m, block_n=block_n, block_k=warp_k * warps_k, warps_m=warps_m,
                        warps_n=warps_n, warps_k=warps_k)

        # two stages must fit one CTA: fewer k warps, then fewer rows (many group rows per stage: small groups
        # with zero points on 100 KB parts)
        while not _fits(layer, target, tile(), 2, 1):
            if warps_k > 1:
                warps_k //= 2
            elif block_m // warps_m > 8:
                block_m //= 2
            elif warps_m > 1:
                warps_m, block_m = warps_m // 2, block_m // 2
            else:
                break  # compose names what does not fit
        if ctas > 1 and (bits not in (1, 2, 4) or arbitrary_group_size(layer.scheme) is not None
                         or not _fits(layer, target, tile(), max_stages, ctas)):
            # one CTA of 4 stages where the SM cannot hold two full rings (sm_86's 100 KB), where codes span
            # several bit planes (their extraction wants more than the 128 registers two CTAs leave a thread;
            # H200 W3A16 M=1: 18.2-18.3 us with one CTA, 18.7-19.3 with two), for 8-bit codes (W8A16 M=1:
            # 21.7-21.9 with one, 22.8-22.9 with two) and for group sizes off the k step (g7: 22.8 / 23.8)
            ctas, max_stages = 1, 4
        stages = max([s for s in range(2, max_stages + 1) if _fits(layer, target, tile(), s, ctas)], default=2)
        block_k = warp_k * warps_k
        m_blocks = 1 if m_max is None or m_max <= block_m else math.ceil(m_max / block_m)
        split = (_split_k(geometry, target, n_blocks * m_blocks, block_k, ctas) if m_max is not None and m_max <= 64
                 else 1)
        stages = min(stages, slice_stages(geometry, block_k, 1))  # (MoE buckets drop the split: K's own k tiles)
        fields = dict(tile(), stages=stages, split_k=split, ctas_per_sm=ctas)
        if layer.scheme.activation is not None:
            fields["mma"] = mma_of(layer)
        fields.update(overrides)
        buckets.append((m_max, TuningConfig(**fields)))
    return TuningPlan(tuple(buckets))


# MoE split-K (issue 11).
# A batch of A = M * top_k assignments with A <= E (at most one row per expert on average) has, in the worst-case
# routing (every assignment its own expert), A m blocks, and an indexed GEMM of n_tiles n tiles launches A * n_tiles
# CTAs, each streaming its expert's block_n weight rows over all of K. DeepSeek-V3 per rank (TP8) gate-up, N = 512,
# K = 7168, M = 1: 8 x 4 = 32 CTAs, 32 of the H200's 132 SMs busy. The split bucket holds the batches that leave
# most SMs idle in one of the GEMMs: A <= A_s = the largest over the GEMMs of floor(MOE_SPLIT_BUSY * SMs / n_tiles),
# at most E (so rows per expert <= 1; the bucket's bound is A_s / E rows per expert). Each GEMM then splits K so that
# A_s x n_tiles x split_k fills its CTA slots (SMs x CTAs per SM) about once, by the dense rule (_split_k: none where
# A_s x n_tiles already fills 3/4 of them, at least 2 k tiles per slice, at most 16 slices); batches below the bound
# fill less. DeepSeek-V3 TP8 W4A16 on sm_90a: A_s = 16 (M <= 2 at top-8), gate-up split 4 (M = 1: 128 CTAs, M = 2:
# 256 of 264 slots), down (N = 7168: 56 n tiles, K = 256: one k tile) unsplit.
MOE_SPLIT_BUSY = 0.5
# The split bucket runs two CTAs of 3 stages per SM (_split_bucket_ctas), so the rule above fills 2 x 132 slots. H200,
# DeepSeek gate-up GEMM (E = 64 of these shapes, 4 layers rotated, bench/moe_split_probe.py, us per GEMM without the
# activation quantization), (split, CTAs per SM, stages) at M = 1 / 2:
#   fp8 block128: (2, 1, 4) 22.0 / 25.6, (4, 1, 4) 17.2 / 28.8, (4, 2, 3) 17.2 / 21.6, (7, 2, 3) 16.0 / 25.2
#   fp8 channel:  (2, 1, 4) 17.6 / 22.8, (4, 2, 3) 17.6 / 22.0
#   W4A8 MXFP4:   (4, 2, 3) 17.6 / 18.8, (7, 2, 3) 14.8 / 22.4;  W4A16 int4 g128: (4, 2, 3) 13.2 / 16.0
MOE_SPLIT_STAGES = 3


def _split_bucket_ctas(layer: LayerConfig, target: Target, tuning: TuningConfig) -> TuningConfig:
    """Two CTAs per SM of MOE_SPLIT_STAGES stages for the split bucket where they fit, for 8-bit codes (their single
    CTA was measured on a dense GEMV, whose 64 n tiles fill the SMs); codes over several bit planes and group sizes
    off the k step keep theirs (chosen for registers, unmeasured here)."""
    if (tuning.ctas_per_sm > 1 or layer.scheme.weight.bits != 8
            or arbitrary_group_size(layer.scheme) is not None):
        return tuning
    two = attrs.evolve(tuning, ctas_per_sm=2, stages=MOE_SPLIT_STAGES)
    return two if _tuning_fits(layer, target, two) else tuning


def moe_split_bucket(layers: list[LayerConfig], tunings: list[TuningConfig],
                     target: Target) -> tuple[Fraction, list[TuningConfig]] | None:
    """The split-K bucket of an MoE layer's indexed GEMMs (`layers`, each with `tunings`, its smallest-M standard
    tuning): (its bound in rows per expert, each GEMM's tuning with its split_k), or None where no GEMM would split
    (rule above)."""
    experts = layers[0].num_experts
    n_tiles = [math.ceil(layer.n / t.block_n) for layer, t in zip(layers, tunings)]
    bound = min(experts, max(int(MOE_SPLIT_BUSY * target.sm_count) // n for n in n_tiles))
    if bound < 1:
        return None
    split = []
    for layer, t, n in zip(layers, tunings, n_tiles):
        t = _split_bucket_ctas(layer, target, t)
        k = _split_k(layer, target, bound * n, t.block_k, t.ctas_per_sm)
        split.append(attrs.evolve(t, split_k=k, stages=min(t.stages, slice_stages(layer, t.block_k, k))))
    if all(t.split_k == 1 for t in split):
        return None
    return Fraction(bound, experts), split


# MoE buckets whose m blocks hold at most 16 rows (an expert's few rows of a batch) are latency-bound (Nsight
# Compute, Qwen3-30B-A3B at M = 128: DRAM 39-48 %, a fifth of the down GEMMs' stall samples at the stage barrier):
# they run 3-4 CTAs per SM of 2 k warps (block_k 128) instead of the dense bucket's 1-2 CTAs of 4 k warps, so more
# tiles interleave on an SM. H200 indexed GEMMs, graph us (bench/moe_small_tiles.py, 2026-12-02), the dense bucket's
# tuning -> this one:
#   Qwen3-30B-A3B (E = 128, top-8), 8-row blocks (4 CTAs of 4 stages) at M = 16 / 128: W4A16 int4 g128 gate-up 46.2 /
#   87.4 -> 42.4 / 79.6, down 30.3 / 59.4 -> 24.3 / 44.3; W4A8 mxfp4 x fp8 gate-up 62.5 / 115.7 -> 58.5 / 105.7, down
#   37.0 / 71.6 -> 32.9 / 59.1; 16-row blocks (3 CTAs of 6 stages) at M = 256: W4A16 gate-up 150.4 -> 105.2, down
#   78.8 -> 61.1, W4A8 202.1 -> 144.8, 136.0 -> 83.1 (4 CTAs: 100.2, 59.7, 150.3, 80.4, but at their 128 registers a
#   16-row W4A8 MXFP4 gate-up with the fused gated epilogue spills);
#   gpt-oss-120b (E = 128, top-4), 8-row blocks at M = 16 / 128: W4A16 MXFP4 gate-up 180.1 / 416.3 -> 158.6 / 365.0,
#   down 95.9 / 220.4 -> 86.4 / 194.3; W4A8 gate-up 190.8 / 423.2 -> 171.6 / 371.7, down 93.8 / 221.2 -> 88.3 / 198.4.
# Other variants (2 CTAs of 8 stages, block_k 64 at 4 CTAs) were within 4 % or slower. Measured for 4-bit weights;
# other widths keep the dense bucket's tuning.
MOE_SMALL_TILES = {8: dict(block_k=128, warps_k=2, ctas_per_sm=4, stages=4),  # most rows per m block -> tuning
                   16: dict(block_k=128, warps_k=2, ctas_per_sm=3, stages=6)}


def moe_small_tile_fields(block_m: int) -> dict | None:
    """MOE_SMALL_TILES' TuningConfig fields for m blocks of `block_m` rows, None past its largest."""
    return next((f for rows, f in sorted(MOE_SMALL_TILES.items()) if block_m <= rows), None)


def moe_small_tile(layer: LayerConfig, target: Target, tuning: TuningConfig) -> TuningConfig:
    """`tuning` (a standard-pipeline MoE bucket without split-K) as MOE_SMALL_TILES says for its m block, where the
    rule above takes it, the bucket's warps already take the table's k slice (the layout's: one packed weight) and
    its CTAs fit an SM with rings of at least 3 stages (2 where K is one k tile: slice_stages)."""
    fields = moe_small_tile_fields(tuning.block_m)
    if (fields is None or tuning.split_k != 1 or layer.scheme.weight.bits != 4
            or arbitrary_group_size(layer.scheme) is not None or tuning.warps_m != 1
            or tuning.block_k < fields["block_k"]
            or tuning.block_k // tuning.warps_k != fields["block_k"] // fields["warps_k"]):
        return tuning
    small = attrs.evolve(tuning, **fields)
    deepest = min(small.stages, slice_stages(layer, small.block_k, 1))
    # the deepest ring up to the table's that the CTAs' shared memory holds (group scales take a share), at least 3
    # (2 where K is one k tile: slice_stages)
    fitting = [s for s in range(min(3, deepest), deepest + 1)
               if _tuning_fits(layer, target, attrs.evolve(small, stages=s))]
    return attrs.evolve(small, stages=fitting[-1]) if fitting else tuning

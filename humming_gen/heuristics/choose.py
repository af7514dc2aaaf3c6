"""choose_tunings: the TuningPlan a layer compiles, from the heuristics of the pipelines that serve it.

Where the warp-specialized pipeline serves the layer (sm_90a, 16-bit activations, group sizes that are multiples
of 16), it takes its buckets from the one ending at ws_from_m(layer) tokens on (M >= 17; M >= 9 for layers of at
most SKINNY_N rows) and the standard pipeline keeps the buckets that end below it; both read one packed weight.
Elsewhere the standard pipeline takes every bucket.

MoE layers (QuantMoE's indexed GEMMs) bucket by expected rows per expert instead: moe_tunings.
"""

from __future__ import annotations

import math

import attrs

from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.config.tuning import MAX_SPLIT_K
from humming_gen.pipelines.base import TuningPlan
from humming_gen.pipelines.standard import STANDARD
from humming_gen.pipelines.standard.heuristics import moe_small_tile, moe_split_bucket
from humming_gen.pipelines.warp_specialized import WARP_SPECIALIZED
from humming_gen.pipelines.warp_specialized.compose import expert_prefix_bytes
from humming_gen.pipelines.warp_specialized.heuristics import MOE_BUCKETS, choose_moe_tunings, moe_tuning_for
from humming_gen.targets import Target, get_target

# The warp-specialized buckets start with the one ending at ws_from_m(layer) tokens; the standard pipeline keeps the
# buckets that end below it. Measured on the H200 (bench/split_sweep.py, W4A16, graph us per layer), standard
# against warp-specialized:
# - M = 32: 8192 x 8192 26.8 / 22.2, 4096 x 14336 25.2 / 20.3, 14336 x 4096 23.7 / 22.5, 4096 x 4096 13.3 / 9.5,
#   2880 x 2880 16.2 / 8.6, 576 x 7168 14.1 / 7.9.
# - M = 16: 8192 x 8192 19.0 / 20.4, 14336 x 4096 16.3 / 20.4, 4096 x 14336 18.1 / 19.0, 4096 x 4096 8.7 / 8.7,
#   but 2880 x 2880 10.3 / 7.8 and 576 x 7168 8.8 / 7.2: few weight rows leave the standard pipeline's split-K short
#   of the SMs, so layers of at most SKINNY_N rows take the warp-specialized pipeline from M = 9.
WS_FROM_M = 32
SKINNY_N = 3072


# 8-bit activations: the warp-specialized kernels (wgmma k32, split-K to one wave) for every M (buckets of 8 and 16
# tokens included: pipelines.warp_specialized.heuristics.A8_BUCKETS). The standard pipeline's mma.sync, whose fp8
# form ptxas lowers to F2FP + HMMA on sm_90a, was slower there (H200, N = K = 8192, graph us with the activation
# quantization, bench/ss_bench.py, standard / warp-specialized): M = 1 fp8 channel 28.3 / 26.8, fp8 block128
# 29.9 / 24.5, int8 29.6 / 26.9, W4A8 mxfp4 x fp8 24.3 / 22.8; M = 16 30.4 / 28.1, 31.5 / 25.0, 31.5 / 29.9,
# 31.5 / 25.5. Re-measured 2026-12-02 (bench/a8_small_sweep.py, best standard variant of 8 splits / CTAs / stages /
# k tiles against the warp-specialized bucket): M = 1 W4A8 23.0 / 21.8, fp8 channel 27.0 / 22.7, fp8 block128
# 26.1 / 22.5; M = 16 30.7 / 24.9, 29.0 / 24.7, 31.0 / 25.2.
WS_A8_FROM_M = 1


def ws_from_m(layer: LayerConfig) -> int:
    """The largest M of the first bucket the warp-specialized pipeline takes for this layer."""
    if layer.scheme.activation is not None:
        return WS_A8_FROM_M
    return 16 if layer.n <= SKINNY_N else WS_FROM_M


PIPELINE_CHOICES = (None, "standard", "warp_specialized")


def choose_tunings(layer: LayerConfig, target: Target | str, *, pipeline: str | None = None,
                   batch_invariant: bool = False, stored: bool = True, register_weights: bool = False,
                   **overrides) -> TuningPlan:
    """One TuningConfig per M bucket for `layer` on `target`: the built-in heuristics (`heuristic_tunings`), with
    the buckets `humming_gen.autotune` stored for this GPU and driver in their place (pipeline None, no
    overrides, `stored`; humming_gen/tuning/store.py), or one K summation order for every M with
    `batch_invariant` (humming_gen/heuristics/batch_invariant.py; pipeline None means standard). `register_weights`:
    8-bit warp-specialized kernels that read their weights from registers (the standard pipeline's packed layout)
    where the heuristics would read them from shared memory."""
    target = get_target(target)
    if batch_invariant:
        if overrides:
            raise ValueError(f"batch_invariant=True takes no TuningConfig overrides, got {sorted(overrides)}")
        from humming_gen.heuristics.batch_invariant import batch_invariant_tunings

        return batch_invariant_tunings(layer, target, pipeline)
    plan = heuristic_tunings(layer, target, pipeline=pipeline, register_weights=register_weights, **overrides)
    if stored and pipeline is None and not overrides:
        from humming_gen.tuning.store import with_stored

        plan = with_stored(layer, target, plan)
    return plan


def heuristic_tunings(layer: LayerConfig, target: Target, *, pipeline: str | None = None,
                      register_weights: bool = False, **overrides) -> TuningPlan:
    """One TuningConfig per M bucket for `layer` on `target`, from the built-in heuristics.

    pipeline: None (the measured choice per bucket), "standard" or "warp_specialized" (every bucket it can
    take; the standard pipeline keeps the buckets below ws_from_m(layer)). `overrides` replace TuningConfig fields in
    every standard-pipeline bucket (for experiments and autotuning) and imply pipeline="standard"."""
    if pipeline not in PIPELINE_CHOICES:
        raise ValueError(f"pipeline={pipeline!r}; allowed: {PIPELINE_CHOICES}")
    standard = STANDARD.choose_tunings(layer, target, **overrides)
    if pipeline == "standard" or overrides:
        return standard
    reasons = WARP_SPECIALIZED.supports(layer, ComputeConfig(), target)
    if reasons:
        if pipeline == "warp_specialized":
            raise ValueError("the warp-specialized pipeline cannot serve this layer:\n  - " + "\n  - ".join(reasons))
        return standard
    start = ws_from_m(layer)
    small = [(m, t) for m, t in standard.buckets if m is not None and m < start]
    ws = [(m, t) for m, t in WARP_SPECIALIZED.choose_tunings(layer, target, register_weights).buckets
          if m is None or m >= start]
    return TuningPlan(tuple(small + ws))


# MoE (QuantMoE's indexed GEMMs): buckets of expected rows per expert, R = M * top_k / E. An m block of an expert is
# a dense GEMM of up to block_m rows, so the warp-specialized pipeline takes the buckets from the one ending at
# WS_MOE_FROM_ROWS on: the dense threshold of layers wider than SKINNY_N (M >= 17). The skinny layers' earlier start
# does not carry over: it comes from the standard pipeline's split-K falling short of the SMs, while from a row per
# expert on an MoE GEMM's experts fill them with m blocks. Below that, a bucket of fewer rows per expert (a fraction,
# A_s / E) splits K in the standard pipeline's indexed GEMMs: pipelines.standard.heuristics.moe_split_bucket.
WS_MOE_FROM_ROWS = 32


def ws_moe_from_rows(layers: list[LayerConfig]) -> int:
    """The rows per expert from which the warp-specialized pipeline takes an MoE layer's buckets (where it serves
    every GEMM): all of them for 8-bit weights with 8-bit activations, whose stages it bulk-copies (the standard
    pipeline's cp.async rings of 8-bit weights fit one CTA of 4 stages per SM at block_k 256); else
    WS_MOE_FROM_ROWS. H200, indexed GEMMs, graph us at M = 1 / 16 / 128 (bench/moe_bench.py --pipeline,
    2026-12-02), standard -> warp-specialized: DeepSeek-V3 per rank (E = 256, top-8) fp8 block128 gate-up 18.2 /
    105.8 / 271.7 -> 16.5 / 84.1 / 214.2, down 11.2 / 66.1 / 173.4 -> 9.8 / 49.8 / 129.4; Qwen3-30B-A3B (E = 128,
    top-8) down fp8 channel 12.2 / 69.3 / 136.1 -> 9.6 / 39.6 / 66.1, int8 channel 12.9 / 68.8 / 133.8 -> 10.0 /
    40.8 / 66.1, fp8 block128 9.1 / 64.4 / 123.7 -> 8.3 / 37.2 / 62.7 (gate-up 11-35 % faster). 4-bit weights
    stay standard below WS_MOE_FROM_ROWS (DeepSeek W4A16 int4 gate-up 11.8 / 52.1 / 124.4 -> 43.7 / 86.7 / 168.4),
    with 8-bit activations too (W4A8 mxfp4 x fp8, 2026-12-04, standard -> warp-specialized, indexed GEMMs at M = 1 /
    16 / 128: Qwen3 gate-up 13.7 / 56.6 / 100.5 -> 12.4 / 60.1 / 110.9, down 7.8 / 31.0 / 55.5 -> 7.7 / 35.8 / 66.8;
    gpt-oss-120b gate-up 23.8 / 135.9 / 339.3 -> 24.1 / 151.7 / 384.2; DeepSeek gate-up 13.7 / 67.4 / 158.7 -> 23.4 /
    64.9 / 161.9; whole layers 1-19 % slower at every M, e.g. Qwen3 M = 128 166.9 -> 194.0)."""
    if all(layer.scheme.weight.bits == 8 and layer.scheme.activation is not None for layer in layers):
        return 0
    return WS_MOE_FROM_ROWS


def moe_tunings(standard: list[TuningPlan], layers: list[LayerConfig], computes: list[ComputeConfig],
                target: Target | str, *, pipeline: str | None = None, split_k: int | None = None) -> list[TuningPlan]:
    """The TuningPlans of an MoE layer's indexed GEMMs (buckets of expected rows per expert), one per layer:
    `standard` (each GEMM's standard-pipeline plan, as moe_standard_plans makes it: the split-K bucket first) in the
    buckets below ws_moe_from_rows (WS_MOE_FROM_ROWS; none for W8A8 unless split_k > 1 asks for split standard
    buckets) and the warp-specialized MoE buckets (pipelines.warp_specialized.heuristics.MOE_BUCKETS) from it on,
    where that pipeline serves every GEMM (sm_90a; 16-bit activations with group sizes that are multiples of 16,
    or int8 x int8 / fp8 x fp8 8-bit activations); else `standard`. Every GEMM gets the same bucket bounds and
    token tiles from the same pipeline, so one moe_align routing serves them all.

    pipeline: None (that choice), "standard" (every bucket from `standard`) or "warp_specialized" (every bucket, none
    split; ValueError naming why where the pipeline cannot serve a GEMM).
    split_k: None (the heuristic's split-K bucket), 1 (no split anywhere) or n > 1 (every standard-pipeline bucket
    splits K n ways, at most a GEMM's k tiles; the warp-specialized MoE kernels never split): moe_standard_plans."""
    if pipeline not in PIPELINE_CHOICES:
        raise ValueError(f"pipeline={pipeline!r}; allowed: {PIPELINE_CHOICES}")
    if pipeline == "warp_specialized" and split_k not in (None, 1):
        raise ValueError(f"split_k={split_k} with pipeline='warp_specialized': the warp-specialized MoE kernels do not "
                         f"split K (split_k splits the standard pipeline's buckets; pass None or 1)")
    target = get_target(target)
    if pipeline != "warp_specialized":
        standard = moe_standard_plans(standard, layers, target, split_k)
    if pipeline == "standard":
        return list(standard)
    reasons = [f"GEMM n={layer.n} k={layer.k}: {r}" for layer, compute in zip(layers, computes)
               for r in WARP_SPECIALIZED.supports(layer, compute, target)]
    if reasons:
        if pipeline == "warp_specialized":
            raise ValueError("the warp-specialized pipeline cannot serve these MoE GEMMs:\n  - "
                             + "\n  - ".join(reasons))
        return list(standard)
    ws = _shared_token_tiles([choose_moe_tunings(layer, target) for layer in layers], layers, target)
    if pipeline == "warp_specialized":
        return ws
    start = WS_MOE_FROM_ROWS if split_k not in (None, 1) else ws_moe_from_rows(layers)
    return [TuningPlan(tuple([(m, t) for m, t in std.buckets if m is not None and m < start]
                             + [(m, t) for m, t in plan.buckets if m is None or m >= start]))
            for std, plan in zip(standard, ws)]


def moe_standard_plans(standard: list[TuningPlan], layers: list[LayerConfig], target: Target,
                       split_k: int | None = None) -> list[TuningPlan]:
    """Each GEMM's standard-pipeline plan (`standard`, the dense heuristics' buckets read as rows per expert) for an
    MoE layer: no split-K in its buckets (from a row per expert on, the experts' m blocks fill the SMs), and before
    them the split-K bucket of moe_split_bucket where the layer has one (split_k None); buckets of small m blocks take
    moe_small_tile's CTAs. split_k=1: no split bucket; n > 1: every bucket split n ways (at most each GEMM's k tiles;
    for tests and measurements)."""
    if split_k is not None and (not isinstance(split_k, int) or isinstance(split_k, bool)
                                or not 1 <= split_k <= MAX_SPLIT_K):
        raise ValueError(f"split_k={split_k!r}; allowed: None (the heuristic's split-K bucket), 1 (no split-K) or "
                         f"an int up to {MAX_SPLIT_K} (every standard-pipeline MoE bucket splits K that many ways)")
    if split_k is not None and split_k > 1:
        return [TuningPlan(tuple((m, attrs.evolve(t, split_k=min(split_k, math.ceil(layer.k / t.block_k))))
                                 for m, t in plan.buckets)) for plan, layer in zip(standard, layers)]
    plans = [TuningPlan(tuple((m, attrs.evolve(t, split_k=1)) for m, t in plan.buckets)) for plan in standard]
    bucket = moe_split_bucket(layers, [plan.buckets[0][1] for plan in plans], target) if split_k is None else None
    plans = [TuningPlan(tuple((m, moe_small_tile(layer, target, t)) for m, t in plan.buckets))
             for plan, layer in zip(plans, layers)]
    if bucket is None:
        return plans
    bound, tunings = bucket
    return [TuningPlan(((bound, t),) + plan.buckets) for plan, t in zip(plans, tunings)]


def _shared_token_tiles(plans: list[TuningPlan], layers: list[LayerConfig], target: Target) -> list[TuningPlan]:
    """Every GEMM of a layer takes the smallest of their token tiles in each bucket: one moe_align routing, padded
    to one tile, serves them all (a GEMM whose own heuristics cap its tile, e.g. MXFP8's group-32 activation
    scales, beside one that runs 16-bit activations)."""
    smallest = [min(plan.buckets[i][1].block_m for plan in plans) for i in range(len(plans[0].buckets))]
    return [TuningPlan(tuple((m, t if t.block_m == bm else moe_tuning_for(layer, target, bm))
                             for (m, t), bm in zip(plan.buckets, smallest)))
            for plan, layer in zip(plans, layers)]


def grouped_moe_tuning(standard: TuningPlan, layer: LayerConfig, compute: ComputeConfig, target: Target | str,
                       rows_per_expert: int, *, pipeline: str | None = None,
                       moe_layers: list[LayerConfig] | None = None) -> TuningConfig:
    """The tuning of a grouped MoE GEMM (compute.gemm 'grouped_contiguous' or 'grouped_masked') for about
    `rows_per_expert` rows per expert, as moe_tunings chooses an indexed GEMM's bucket: the warp-specialized MoE
    bucket's tile (its ring beside the schedule's expert prefix) where that bucket ends at ws_moe_from_rows or later
    and the pipeline serves the GEMM, else `standard`'s bucket (the GEMM's standard-pipeline plan) without split-K.

    pipeline: None (that choice), "standard" or "warp_specialized" (ValueError naming why it cannot serve).
    moe_layers: the MoE layer's GEMMs (QuantMoE's), whose schemes set ws_moe_from_rows as for its indexed GEMMs;
    None: `layer` alone."""
    if pipeline not in PIPELINE_CHOICES:
        raise ValueError(f"pipeline={pipeline!r}; allowed: {PIPELINE_CHOICES}")
    target = get_target(target)
    rows = max(1, rows_per_expert)
    if pipeline != "standard":
        reasons = WARP_SPECIALIZED.supports(layer, compute, target)
        if reasons and pipeline == "warp_specialized":
            raise ValueError(f"the warp-specialized pipeline cannot serve this {compute.gemm} GEMM (n={layer.n} "
                             f"k={layer.k}):\n  - " + "\n  - ".join(reasons))
        bound, block_m = next((m, bm) for m, bm in MOE_BUCKETS if m is None or rows <= m)
        start = ws_moe_from_rows(moe_layers or [layer])
        if not reasons and (pipeline == "warp_specialized" or bound is None or bound >= start):
            return moe_tuning_for(layer, target, block_m, reserved=expert_prefix_bytes(layer, compute), grouped=True)
    return moe_small_tile(layer, target, attrs.evolve(standard.for_m(rows), split_k=1))


# QuantMoE's down GEMM reads GEMM1's rows in per-expert windows (down_gemm="grouped_contiguous": a row compaction,
# the grouped kernel, the weighted top-k sum) in the warp-specialized buckets that end above GROUPED_DOWN_FROM_ROWS
# rows per expert (the open-ended one), and, where the hidden size is at least GROUPED_DOWN_WIDE times the
# intermediate one, in those bound at GROUPED_DOWN_WIDE_FROM_ROWS or more: the compaction moves rows x I, while the
# indexed epilogue's per-row work (router weight, assignment lookups, scatter) is paid on rows x H outputs. Whole
# layer, H200, graph us, indexed -> grouped (bench/moe_bench.py --down-gemm, 2026-12-02), W4A16 int4 g128:
# DeepSeek-V3 per rank (H / I = 28) M = 1024 / 4096: 561.4 / 1344.9 -> 532.4 / 1191.0; Qwen3-30B-A3B (2.7) 340.1 /
# 862.4 -> 346.3 / 832.8; gpt-oss-120b (1) 983.3 / 2471.7 -> 998.6 / 2305.4. The small buckets lost: the standard
# pipeline's (DeepSeek W4A16 M = 16 / 128: 96.1 / 232.2 -> 110.5 / 255.5) and W8A8's warp-specialized ones below 32
# rows per expert (DeepSeek fp8 block128 M = 1 / 16 / 128, two runs: 42.7 / 154.6 / 372.1 and 43.5 / 155.5 / 373.4
# -> 49.5 / 165.3 / 374.6 and 49.4 / 164.8 / 376.1).
GROUPED_DOWN_FROM_ROWS = 64
GROUPED_DOWN_WIDE = 4
GROUPED_DOWN_WIDE_FROM_ROWS = 32


def moe_down_gemms(requested: str | None, down: LayerConfig, down_plan: TuningPlan,
                   fused_quantization: tuple[bool, ...], topk_reduce: str) -> tuple[str, ...]:
    """The down GEMM type of each bucket of a QuantMoE (`down`: its down GEMM, n = H, k = I; `down_plan`: its indexed
    buckets): `requested` everywhere ("indexed" or "grouped_contiguous"; ValueError naming the buckets where GEMM1
    writes GEMM2's quantized input in the indexed layout, fused_quantization), or None: grouped in the
    warp-specialized buckets that GROUPED_DOWN_FROM_ROWS / GROUPED_DOWN_WIDE / GROUPED_DOWN_WIDE_FROM_ROWS pick,
    with the deterministic top-k reduction and no fused quantization."""
    if requested == "grouped_contiguous" and topk_reduce == "atomic":
        raise ValueError("down_gemm='grouped_contiguous' writes unweighted rows for the deterministic top-k "
                         "reduction; topk_reduce='atomic' needs the indexed down GEMM (down_gemm='indexed' or None)")
    if requested == "indexed" or topk_reduce == "atomic":
        return ("indexed",) * len(down_plan.buckets)
    if requested == "grouped_contiguous":
        fused = [("open" if m is None else f"<= {m}") for (m, _), f in zip(down_plan.buckets, fused_quantization) if f]
        if fused:
            raise ValueError(f"down_gemm='grouped_contiguous': GEMM1 writes GEMM2's quantized input in the buckets of "
                             f"rows per expert {', '.join(fused)} (fused_quantization), in the indexed layout; pass "
                             f"fused_quantization=False")
        return ("grouped_contiguous",) * len(down_plan.buckets)
    wide = down.n >= GROUPED_DOWN_WIDE * down.k
    return tuple("grouped_contiguous" if t.pipeline == "warp_specialized" and not fused
                 and (m is None or m > GROUPED_DOWN_FROM_ROWS or (wide and m >= GROUPED_DOWN_WIDE_FROM_ROWS))
                 else "indexed"
                 for (m, t), fused in zip(down_plan.buckets, fused_quantization))

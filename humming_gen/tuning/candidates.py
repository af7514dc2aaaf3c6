"""Candidate tunings for autotuning: variants around the heuristics' tuning of each M bucket, from both pipelines.

The heuristics are measured on a few shapes; their neighbours (split-K, token tile, k warps, stages, CTAs per SM;
the other pipeline near the crossover) are where another shape or GPU is most likely to gain. Every candidate of a
layer reads the weight layout of the heuristic plan, since a QuantLinear keeps one packed weight for all buckets.
"""

from __future__ import annotations

import itertools
import math

import attrs

from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.pipelines.base import TuningPlan
from humming_gen.targets import Target

MAX_CANDIDATES = 10  # per bucket, the heuristic's tuning included: each one is a kernel to compile and time


def _evolved(base: TuningConfig, change: dict) -> TuningConfig | None:
    """`base` with `change`, or None where that is no valid TuningConfig (more than MAX_WARPS warps, warps that do
    not divide the tile): a variant of some layers only, skipped rather than failing the whole layer."""
    try:
        return attrs.evolve(base, **change)
    except ValueError:
        return None


def _standard_variants(layer: LayerConfig, target: Target, base: TuningConfig,
                       m_max: int | None) -> list[TuningConfig]:
    """Tunings around a standard-pipeline tuning, the likeliest first."""
    from humming_gen.pipelines.standard.heuristics import _fits

    k_tiles = math.ceil(layer.k / base.block_k)
    out: list[dict] = []
    for split in (base.split_k * 2, max(1, base.split_k // 2), 1, base.split_k * 4):
        if split <= max(1, k_tiles // 2):
            out.append(dict(split_k=split))
    warp_k = base.block_k // base.warps_k
    for warps_k in (1, 2, 4):
        if warps_k != base.warps_k:
            out.append(dict(warps_k=warps_k, block_k=warp_k * warps_k))
    rows = m_max if m_max is not None else 256
    for block_m, warps_m in ((base.block_m * 2, base.warps_m), (base.block_m // 2, base.warps_m),
                             (base.block_m * 2, base.warps_m * 2)):
        if 8 <= block_m <= 256 and block_m <= max(8, 2 * rows) and (block_m // warps_m) % 8 == 0:
            out.append(dict(block_m=block_m, warps_m=warps_m))
    out.append(dict(ctas_per_sm=2 if base.ctas_per_sm == 1 else 1))
    out.append(dict(stages=base.stages - 1) if base.stages > 2 else dict(stages=3))
    fitted = []
    for change in out:  # stages refitted to what shared memory holds for the new tile and CTAs per SM
        tuning = _evolved(base, change)
        if tuning is None:
            continue
        fields = {f: getattr(tuning, f) for f in ("block_m", "block_n", "block_k", "warps_m", "warps_n", "warps_k")}
        stages = tuning.stages
        while stages > 2 and not _fits(layer, target, fields, stages, tuning.ctas_per_sm):
            stages -= 1
        fitted.append(attrs.evolve(tuning, stages=stages))
    return fitted


def _warp_specialized_variants(layer: LayerConfig, target: Target, base: TuningConfig,
                               m_max: int | None) -> list[TuningConfig]:
    """Tunings around a warp-specialized tuning: split-K and token tile (stages refitted)."""
    from humming_gen.pipelines.warp_specialized.compose import shared_memory

    k_tiles = math.ceil(layer.k / base.block_k)
    out: list[dict] = []
    for split in (base.split_k * 2, max(1, base.split_k // 2), 1):
        if split <= max(1, k_tiles // 2):
            out.append(dict(split_k=split))
    rows = m_max if m_max is not None else 256
    for block_m in sorted({64, 128, min(128, math.ceil(rows / 8) * 8), 176 if m_max is None else 64}):
        if block_m != base.block_m:
            out.append(dict(block_m=block_m))
    fitted = []
    for change in out:
        tuning = _evolved(base, {**change, "stages": 2})
        if tuning is None:
            continue
        stages = max([s for s in range(2, 9) if shared_memory(layer, attrs.evolve(tuning, stages=s)).fits(target)],
                     default=2)
        fitted.append(attrs.evolve(tuning, stages=stages))
    return fitted


def candidate_tunings(layer: LayerConfig, target: Target, m_max: int | None, *,
                      heuristic: TuningPlan | None = None, limit: int = MAX_CANDIDATES) -> list[TuningConfig]:
    """Up to `limit` tunings for the bucket of `heuristic` (default: the built-in plan) ending at `m_max`; the first
    is the heuristics' own. All compose for `target` and read the heuristic plan's weight layout.

    ValueError when `m_max` is not one of the plan's buckets."""
    from humming_gen.codegen import compose
    from humming_gen.heuristics import heuristic_tunings
    from humming_gen.pipelines.standard import STANDARD
    from humming_gen.pipelines.warp_specialized import WARP_SPECIALIZED
    from humming_gen.pipelines.warp_specialized.heuristics import tuning_for

    plan = heuristic or heuristic_tunings(layer, target)
    bounds = [m for m, _ in plan.buckets]
    if m_max not in bounds:
        raise ValueError(f"m_max={m_max!r} is not a bucket of the plan; allowed: {bounds}")
    own = dict(plan.buckets)[m_max]
    compute = ComputeConfig()
    layout = compose(layer, compute, own, target).layout
    rows = m_max if m_max is not None else 4096
    standard = STANDARD.choose_tunings(layer, target).for_m(rows)
    bases = [standard]
    if not WARP_SPECIALIZED.supports(layer, compute, target) and rows >= 9:
        bases.append(tuning_for(layer, target, m_max))
    if own.pipeline != "standard":
        bases.reverse()
    per_base = [(_standard_variants if base.pipeline == "standard" else _warp_specialized_variants)(
        layer, target, base, m_max) for base in bases]
    # the bases, then their variants in turn, so that a limit leaves each pipeline its likeliest ones
    ordered = [own] + bases + [t for group in itertools.zip_longest(*per_base) for t in group if t is not None]
    out: list[TuningConfig] = []
    for tuning in dict.fromkeys(ordered):
        if len(out) == limit:
            break
        try:
            if compose(layer, compute, tuning, target).layout != layout:
                continue
        except ValueError:
            continue  # does not fit shared memory, registers or the layer
        out.append(tuning)
    return out


def bucket_of(plan: TuningPlan, m: int) -> int | None:
    """The m_max of the bucket that serves m rows."""
    for m_max, _ in plan.buckets:
        if m_max is None or m <= m_max:
            return m_max
    raise AssertionError("the last bucket is open-ended")

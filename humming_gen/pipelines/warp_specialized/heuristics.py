"""Tunings of the warp-specialized pipeline per M bucket (sm_90a).

Every bucket reads the standard layout (so a layer keeps one packed weight) and uses tiles of at most 64 tokens
(MAX_BLOCK_M): buckets differ in token tile, consumer warpgroups, split-K and stages.
"""

from __future__ import annotations

import math

from humming_gen.config import LayerConfig, TuningConfig
from humming_gen.pipelines.base import TuningPlan
from humming_gen.pipelines.warp_specialized.compose import BLOCK_N, LAYOUT_BLOCK_N, max_block_m, shared_memory
from humming_gen.targets import Target

MAX_STAGES = 8
BLOCK_K = 128  # two 64-k chunks per stage: half the stage hand-offs of 64, and 8 k16 steps to overlap
# (largest M of the bucket); the last is open-ended. Smaller buckets belong to the standard pipeline.
BUCKETS = (64, 128, 256, 512, None)


def tuning_for(layer: LayerConfig, target: Target, m_max: int | None) -> TuningConfig:
    """The tuning of one bucket: the largest token tile up to MAX_BLOCK_M, two consumer warpgroups where N has
    room for them, split-K until the units fill the SMs about once, and as many stages as shared memory holds."""
    warpgroups = 2
    block_m = min(max_block_m(warpgroups), math.ceil((m_max or 256) / 8) * 8)
    n_pad = math.ceil(layer.n / LAYOUT_BLOCK_N) * LAYOUT_BLOCK_N
    block_n = BLOCK_N
    tiles = math.ceil(n_pad / block_n) * (1 if m_max is None else math.ceil(m_max / block_m))
    k_tiles = math.ceil(layer.k / BLOCK_K)
    split = 1
    if m_max is not None and tiles < 0.75 * target.sm_count:
        split = max(1, min(round(target.sm_count / tiles), k_tiles // 4 or 1, 16))
    fields = dict(pipeline="warp_specialized", mma="wgmma", block_m=block_m, block_n=block_n, block_k=BLOCK_K,
                  warps_m=1, warps_n=4 * warpgroups, warps_k=1, a_load="cp_async", b_load="tma", scale_load="tma",
                  split_k=split)
    stages = 2
    for s in range(2, MAX_STAGES + 1):
        if shared_memory(layer, TuningConfig(**fields, stages=s)).fits(target):
            stages = s
    return TuningConfig(**fields, stages=stages)


def choose_tunings(layer: LayerConfig, target: Target) -> TuningPlan:
    return TuningPlan(tuple((m_max, tuning_for(layer, target, m_max)) for m_max in BUCKETS))

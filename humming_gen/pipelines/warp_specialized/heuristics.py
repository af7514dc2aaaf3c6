"""Tunings of the warp-specialized pipeline per M bucket (sm_90a).

Every bucket reads the shared weight layout (so a layer keeps one packed weight), uses two consumer warpgroups
and 256-row tiles; buckets differ in the token tile (64, 128 or 176), split-K and stages.
"""

from __future__ import annotations

import math

from humming_gen.config import LayerConfig, TuningConfig
from humming_gen.pipelines.base import TuningPlan
from humming_gen.pipelines.warp_specialized.compose import BLOCK_N, LAYOUT_BLOCK_N, shared_memory
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
# Buckets to 4096 double, so the split-K chosen for a bucket's largest M still fills the SMs at its smallest
# (576 x 7168 at M = 1024: 24 tiles; one split for 4096 rows left 85 us against cuBLAS's 16.6).
BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, None)
LARGE_M_BLOCK = 176  # token tile of the open-ended bucket


def tuning_for(layer: LayerConfig, target: Target, m_max: int | None) -> TuningConfig:
    """The tuning of one bucket: a token tile of the bucket's M up to 128 (176 for the open-ended bucket), split-K
    until the units fill the SMs about once, and as many stages as shared memory holds."""
    warpgroups = 2
    block_m = LARGE_M_BLOCK if m_max is None else min(128, math.ceil(m_max / 8) * 8)
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

"""Tunings of the standard pipeline per M bucket.

All buckets of a layer share the weight layout (block_n, warps_n and the warp's k slice), so one packed copy
of the weights serves every M; the buckets differ in block_m, warps_m, warps_k (hence block_k), stages and
split-K. Figures come from the target (SM count, shared memory), not from tests on `sm >= 90`.
"""

from __future__ import annotations

import math

import attrs

from humming_gen.codegen.compose import arbitrary_group_size, arbitrary_rows_per_stage
from humming_gen.config import LayerConfig, TuningConfig
from humming_gen.targets import Target

# (largest M of the bucket, block_m, warps_m, warps_k, max stages); the last bucket is open-ended.
# Measured on the H200 (bench/bench_dense.py --sweep, W4A16 8192x8192): 4 stages suffice at small M, and at
# large M a 64-row warp tile (warps_m=2) beats four 32-row warps that each dequantize the same weights.
BUCKETS = ((8, 8, 1, 4, 4), (16, 16, 1, 4, 4), (32, 32, 1, 4, 4), (64, 64, 1, 2, 4), (256, 64, 1, 2, 4),
           (None, 128, 2, 1, 4))
LAYOUT = {"block_n": 128, "warps_n": 2, "warp_k": 64}
SMEM_BUDGET_FRACTION = 0.9


@attrs.frozen
class TuningPlan:
    """Contiguous M buckets covering 1..inf, one TuningConfig each."""

    buckets: tuple[tuple[int | None, TuningConfig], ...]

    def for_m(self, m: int) -> TuningConfig:
        for m_max, tuning in self.buckets:
            if m_max is None or m <= m_max:
                return tuning
        raise AssertionError("the last bucket is open-ended")

    def tunings(self) -> list[TuningConfig]:
        return list(dict.fromkeys(t for _, t in self.buckets))


def _stage_bytes(layer: LayerConfig, block_m: int, block_n: int, block_k: int) -> int:
    bits = layer.scheme.weight.bits
    arbitrary = arbitrary_group_size(layer.scheme)
    # generous: scales and zero points for a couple of group rows; groups that are not a multiple of 16 need
    # every row a k tile touches (block_k / group_size and more)
    group_rows = 2 if arbitrary is None else arbitrary_rows_per_stage(arbitrary, block_k)
    return block_m * block_k * 2 + block_n * block_k * bits // 8 + 2 * group_rows * block_n * 2


def _split_k(layer: LayerConfig, target: Target, tiles: int, block_k: int) -> int:
    """Enough k slices for the grid to cover the SMs about once (never more than the k tiles)."""
    k_tiles = math.ceil(layer.k / block_k)
    if tiles >= target.sm_count * 0.75:
        return 1
    split = max(1, round(target.sm_count / tiles))
    return max(1, min(split, k_tiles // 2 if k_tiles >= 2 else 1, 16))


def choose_tunings(layer: LayerConfig, target: Target, **overrides) -> TuningPlan:
    """One TuningConfig per M bucket for `layer` on `target`. `overrides` replace TuningConfig fields in
    every bucket (for experiments and autotuning)."""
    layout = {**LAYOUT, **{k: overrides.pop(k) for k in list(overrides) if k in LAYOUT}}
    block_n, warps_n, warp_k = layout["block_n"], layout["warps_n"], layout["warp_k"]
    n_blocks = math.ceil(layer.n / block_n)
    budget = int(target.smem_per_block_optin * SMEM_BUDGET_FRACTION)
    buckets = []
    for m_max, block_m, warps_m, warps_k, max_stages in BUCKETS:
        # fewer k warps where two stages would not fit (many group rows per stage: small groups with zero points)
        while warps_k > 1 and 2 * _stage_bytes(layer, block_m, block_n, warp_k * warps_k) > target.smem_per_block_optin:
            warps_k //= 2
        block_k = warp_k * warps_k
        m_blocks = 1 if m_max is None or m_max <= block_m else math.ceil(m_max / block_m)
        stages = max(2, min(max_stages, budget // _stage_bytes(layer, block_m, block_n, block_k)))
        split = _split_k(layer, target, n_blocks * m_blocks, block_k) if m_max is not None and m_max <= 64 else 1
        fields = dict(block_m=block_m, block_n=block_n, block_k=block_k, warps_m=warps_m, warps_n=warps_n,
                      warps_k=warps_k, stages=stages, split_k=split)
        fields.update(overrides)
        buckets.append((m_max, TuningConfig(**fields)))
    return TuningPlan(tuple(buckets))

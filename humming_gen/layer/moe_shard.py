"""Tensor-parallel shards of a quantized MoE layer: each rank keeps I / world_size intermediate features of every
expert (w13's gate and up rows of those features, w2's matching input columns), so the ranks' outputs sum to the
layer's output (one all-reduce), as vLLM's tensor-parallel fused MoE splits experts.

The gate/up rows of one feature must stay on one rank: w13 = [gate; up] ("split") and [up; gate] ("up_first") are
split half by half, gpt-oss's interleaved rows as one contiguous range. Splits that would cut a group or a 2-D
scale block are refused by QuantizedWeight.shard, naming the sizes.
"""

from __future__ import annotations

from typing import NamedTuple

import attrs
import torch

from humming_gen.reference.moe import GATE_UP_LAYOUTS
from humming_gen.schemes import QuantizedWeight


class MoeShard(NamedTuple):
    """One rank's weights: q13 (E, 2 I / world, H) in the layout it came in, q2 (E, H, I / world), bias13 of those
    rows, bias2 on rank 0 only (the ranks' outputs are summed)."""

    q13: QuantizedWeight
    q2: QuantizedWeight
    bias13: torch.Tensor | None
    bias2: torch.Tensor | None


def _concat_rows(a: QuantizedWeight, b: QuantizedWeight) -> QuantizedWeight:
    """Rows of a, then rows of b (two shards of one weight: same scheme and per-tensor parameters)."""
    g = a.scheme.granularity

    def rows(x: torch.Tensor | None, y: torch.Tensor | None, dim: int) -> torch.Tensor | None:
        return None if x is None else torch.cat([x, y], dim=dim)

    scale_rows = g in ("channel", "group", "block")
    return attrs.evolve(a, codes=torch.cat([a.codes, b.codes], dim=-2),
                        scales=rows(a.scales, b.scales, -2) if scale_rows else a.scales,
                        zero_points=rows(a.zero_points, b.zero_points, -2) if scale_rows else a.zero_points,
                        channel_scale=rows(a.channel_scale, b.channel_scale, -1))


def shard_moe(q13: QuantizedWeight, q2: QuantizedWeight, rank: int, world_size: int, *,
              gate_up_layout: str = "split", bias13: torch.Tensor | None = None,
              bias2: torch.Tensor | None = None) -> MoeShard:
    """Rank `rank`'s part of an MoE layer with w13 (E, 2I, H) and w2 (E, H, I): build its QuantMoE from the shard
    with the same gate_up_layout and all-reduce (sum) the ranks' outputs."""
    if gate_up_layout not in GATE_UP_LAYOUTS:
        raise ValueError(f"gate_up_layout={gate_up_layout!r}; allowed: {GATE_UP_LAYOUTS}")
    if q13.codes.dim() != 3 or q2.codes.dim() != 3:
        raise ValueError(f"shard_moe takes (E, N, K) weights, got codes of shapes {tuple(q13.codes.shape)} and "
                         f"{tuple(q2.codes.shape)}")
    intermediate = q13.n // 2
    if q13.n % 2 or q2.k != intermediate:
        raise ValueError(f"w13 must be (E, 2I, H) and w2 (E, H, I): got {tuple(q13.codes.shape)} and "
                         f"{tuple(q2.codes.shape)}")
    if intermediate % world_size:
        raise ValueError(f"the intermediate size {intermediate} does not split into {world_size} equal shards")
    part = intermediate // world_size
    if gate_up_layout == "interleaved":  # rows 2f, 2f + 1 of the rank's features f: one contiguous range
        s13 = q13.shard(0, rank, world_size)
        rows13 = torch.arange(2 * part * rank, 2 * part * (rank + 1))
    else:  # each half ([gate; up] or [up; gate]) split alike, the rank's two parts kept in the same order
        first, second = q13.shard(0, 0, 2), q13.shard(0, 1, 2)
        s13 = _concat_rows(first.shard(0, rank, world_size), second.shard(0, rank, world_size))
        own = torch.arange(part * rank, part * (rank + 1))
        rows13 = torch.cat([own, intermediate + own])
    b13 = None if bias13 is None else bias13[:, rows13.to(bias13.device)].contiguous()
    b2 = None if bias2 is None or rank else bias2
    return MoeShard(s13, q2.shard(1, rank, world_size), b13, b2)

"""Row order of a gate/up weight for MoE GEMM1's fused gated activation.

The fused epilogue (StoreOutput.gated) expects every 16-row tile of w13 to hold the gate rows of 8 output features
followed by their up rows, so that one thread's fragment rows g and g + 8 are the gate and up of feature
8 * tile + g. `gate_up_tile_order` gives that order from a checkpoint's layout; `permute_rows` applies it to a
QuantizedWeight (codes, per-row scales and zero points, channel scales) and `torch` tensors (biases) index it.
"""

from __future__ import annotations

import attrs
import torch

from humming_gen.reference.moe import GATE_UP_LAYOUTS
from humming_gen.schemes import QuantizedWeight


def gate_up_tile_order(intermediate: int, layout: str = "split") -> torch.Tensor:
    """(2I,) source row of each row of the tile-interleaved w13 (I a multiple of 8)."""
    if layout not in GATE_UP_LAYOUTS:
        raise ValueError(f"gate_up_layout={layout!r}; allowed: {GATE_UP_LAYOUTS}")
    if intermediate % 8:
        raise ValueError(f"the intermediate size {intermediate} is not a multiple of 8 (8 features per tile)")
    f = torch.arange(intermediate)
    gate, up = {"split": (f, intermediate + f), "up_first": (intermediate + f, f),
                "interleaved": (2 * f, 2 * f + 1)}[layout]
    return torch.stack([gate.view(-1, 8), up.view(-1, 8)], dim=1).reshape(-1)


def permute_rows(qw: QuantizedWeight, order: torch.Tensor) -> QuantizedWeight:
    """The weight whose row r is row order[r] of `qw` (N is the second-to-last dimension of the codes). Block
    scales span several rows and cannot follow a row permutation: refused."""
    s = qw.scheme
    if s.granularity == "block":
        raise ValueError(f"rows of a {s.block_size} block-scaled weight cannot be reordered one by one (its scales "
                         f"cover {s.block_size[0]} rows)")
    order = order.to(qw.codes.device)

    def rows(t: torch.Tensor | None, dim: int) -> torch.Tensor | None:
        if t is None or t.dim() < -dim or t.shape[dim] != qw.n:
            return t  # per-tensor values: not per row
        return t.index_select(t.dim() + dim, order.to(t.device))

    return attrs.evolve(qw, codes=rows(qw.codes, -2), scales=rows(qw.scales, -2), zero_points=rows(qw.zero_points, -2),
                        channel_scale=rows(qw.channel_scale, -1))

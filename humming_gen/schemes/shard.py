"""Tensor-parallel shards of a QuantizedWeight: column-parallel (split N, dim=0) and row-parallel (split K, dim=1).

A shard is again a QuantizedWeight, so each rank builds its own QuantLinear from it. Shards are equal parts; a
boundary must fall between groups (and 2-D blocks), since a group's scale and zero point belong to all of its
elements. Per-tensor parameters (global scale, tensor scale, input scale) go to every shard; per-row parameters
(channel scales, fused-shard channel scales) follow N. An act-order weight (k_perm) keeps its permutation for a
column split; a row split takes the input channels [lo, hi) of the rank, which is possible only where every stored
group holds channels of one shard (GPTQ act-order orders channels across the whole K, so most of its weights split
along N only).
"""

from __future__ import annotations

import math

import torch

from humming_gen.schemes.scheme import QuantizedWeight


def _check_args(qw: QuantizedWeight, dim: int, rank: int, world_size: int) -> None:
    for name, value in (("dim", dim), ("rank", rank), ("world_size", world_size)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"shard: {name} must be an int, got {value!r}")
    if dim not in (0, 1):
        raise ValueError(f"shard: dim must be 0 (split N, column-parallel) or 1 (split K, row-parallel), got {dim}")
    if world_size < 1:
        raise ValueError(f"shard: world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"shard: rank must be in [0, {world_size - 1}] for world_size {world_size}, got {rank}")
    size, axis = (qw.n, "N") if dim == 0 else (qw.k, "K")
    if size % world_size:
        raise ValueError(f"shard: {axis} = {size} does not split into {world_size} equal shards")


def _side(qw: QuantizedWeight, dim: int) -> int | None:
    """Elements along the split axis that share one scale row (group or block side), None if the axis has none."""
    s = qw.scheme
    if s.granularity == "group":
        return s.group_size if dim == 1 else None
    if s.granularity == "block":
        return s.block_size[0] if dim == 0 else s.block_size[1]
    return None


def _scale_like(qw: QuantizedWeight, t: torch.Tensor | None, dim: int, rows: "slice | torch.Tensor"
                ) -> torch.Tensor | None:
    """The shard's part of a scale-shaped tensor (scales, zero points): `rows` of its N or K scale axis."""
    if t is None:
        return None
    g = qw.scheme.granularity
    if g == "tensor" or (g == "channel" and dim == 1):
        return t.clone()
    return (t[..., rows, :] if dim == 0 else t[..., rows]).clone()


def _check_boundary(qw: QuantizedWeight, dim: int, part: int, side: int) -> None:
    if part % side:
        axis, size = ("N", qw.n) if dim == 0 else ("K", qw.k)
        what = f"group_size {side}" if qw.scheme.granularity == "group" else f"block side {side} along {axis}"
        raise ValueError(f"shard: splitting {axis} = {size} into shards of {part} would cut a group: shard "
                         f"boundaries must be multiples of the {what} ({part} is not)")


def _column(qw: QuantizedWeight, lo: int, hi: int, side: int | None) -> QuantizedWeight:
    rows = slice(lo // side, math.ceil(hi / side)) if side else slice(lo, hi)
    return QuantizedWeight(
        qw.scheme, qw.codes[..., lo:hi, :].clone(), _scale_like(qw, qw.scales, 0, rows),
        _scale_like(qw, qw.zero_points, 0, rows), _clone(qw.global_scale), _clone(qw.k_perm),
        None if qw.channel_scale is None else qw.channel_scale[..., lo:hi].clone(), _clone(qw.input_scale))


def _row_act_order(qw: QuantizedWeight, rank: int, part: int, side: int | None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(stored columns, scale columns, permutation) of the rank's input channels for an act-order weight."""
    perm = qw.k_perm.long()
    owner = torch.div(perm, part, rounding_mode="floor")
    columns = torch.nonzero(owner == rank).flatten()
    groups = None
    if side is not None:
        group = torch.arange(qw.k, device=perm.device) // side
        count = math.ceil(qw.k / side)
        lowest = torch.full((count,), qw.k, device=perm.device).scatter_reduce(0, group, owner, "amin")
        highest = torch.full((count,), -1, device=perm.device).scatter_reduce(0, group, owner, "amax")
        mixed = torch.nonzero(lowest != highest).flatten()
        if mixed.numel():
            g = int(mixed[0])
            raise ValueError(f"shard: stored group {g} (stored columns {g * side}..{min((g + 1) * side, qw.k) - 1}) "
                             f"of this act-order weight holds input channels of shards {int(lowest[g])} to "
                             f"{int(highest[g])}; a row split (K = {qw.k} into shards of {part}) would cut it. Split "
                             f"along N (dim=0) or load the layer unsharded")
        groups = torch.nonzero(lowest == rank).flatten()
    local = perm[columns] - rank * part
    identity = torch.equal(local, torch.arange(part, device=local.device))
    return columns, groups, None if identity else local.to(qw.k_perm.dtype)


def _row(qw: QuantizedWeight, rank: int, part: int, side: int | None) -> QuantizedWeight:
    lo, hi = rank * part, (rank + 1) * part
    if qw.k_perm is None:
        columns, k_perm = slice(lo, hi), None
        scale_cols = slice(lo // side, math.ceil(hi / side)) if side else None
    else:
        columns, scale_cols, k_perm = _row_act_order(qw, rank, part, side)
    return QuantizedWeight(
        qw.scheme, qw.codes[..., columns].clone(), _scale_like(qw, qw.scales, 1, scale_cols),
        _scale_like(qw, qw.zero_points, 1, scale_cols), _clone(qw.global_scale), k_perm, _clone(qw.channel_scale),
        _clone(qw.input_scale))


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def shard_weight(qw: QuantizedWeight, dim: int, rank: int, world_size: int) -> QuantizedWeight:
    """Rank `rank`'s part of `qw` split into `world_size` equal parts along N (dim=0) or K (dim=1).

    Column-parallel (dim=0): rank r holds output features [r N/w, (r+1) N/w); outputs concatenate.
    Row-parallel (dim=1): rank r holds input channels [r K/w, (r+1) K/w) in the original (unpermuted) order and
    takes x[..., that range]; the ranks' outputs sum (add a bias once).
    Raises ValueError naming the sizes when the split would cut a group or 2-D block, or the axis does not
    divide; for act-order weights split along K, naming the first group whose channels span shards.
    """
    _check_args(qw, dim, rank, world_size)
    side = _side(qw, dim)
    if dim == 0:
        part = qw.n // world_size
        if side and world_size > 1:
            _check_boundary(qw, 0, part, side)
        return _column(qw, rank * part, (rank + 1) * part, side)
    part = qw.k // world_size
    if side and world_size > 1 and qw.k_perm is None:
        _check_boundary(qw, 1, part, side)
    return _row(qw, rank, part, side)

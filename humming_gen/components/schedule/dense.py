"""Dense tile schedules: one CTA per tile (standard) or a persistent grid (warp-specialized)."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component, option_field


@attrs.frozen
class DenseSchedule(Component):
    """One CTA per output tile over all of K."""

    template: ClassVar[str] = "schedule/dense.cuh.j2"
    family: ClassVar[str] = "schedule"
    provides: ClassVar[frozenset[str]] = frozenset({"TileCoord", "tile_coord"})


@attrs.frozen
class DenseSplitKSchedule(Component):
    """Output tiles x split_k slices of K, reduced in the epilogue."""

    template: ClassVar[str] = "schedule/dense_split_k.cuh.j2"
    family: ClassVar[str] = "schedule"
    provides: ClassVar[frozenset[str]] = frozenset({"TileCoord", "tile_coord"})
    split_k: int


@attrs.frozen
class MoeIndexedSchedule(Component):
    """MoE (indexed): one CTA per (n tile, routed m block) and, with split_k > 1, per k slice (gridDim.z), so a
    small batch's few m blocks still fill the SMs; the block's expert from moe_align's expert_ids. The slices hand
    off through SplitKReduce, as the dense split-K schedule's do."""

    template: ClassVar[str] = "schedule/moe_indexed.cuh.j2"
    family: ClassVar[str] = "schedule"
    provides: ClassVar[frozenset[str]] = frozenset({"TileCoord", "tile_coord"})
    needs: ClassVar[frozenset[str]] = frozenset({"Params"})
    split_k: int = option_field(1)


@attrs.frozen
class MoeGroupedSchedule(Component):
    """MoE (grouped): one CTA per (n tile, m block of an expert's row window); masked (E, max_m) or contiguous
    segments, the block's rows bounded by its window."""

    template: ClassVar[str] = "schedule/moe_grouped.cuh.j2"
    family: ClassVar[str] = "schedule"
    provides: ClassVar[frozenset[str]] = frozenset({"TileCoord", "tile_coord"})
    needs: ClassVar[frozenset[str]] = frozenset({"Params"})
    masked: bool


@attrs.frozen
class PersistentSchedule(Component):
    """A persistent grid walking (tile, k slice) units, n tiles fastest; with group_m > 1, in column-major bands
    of group_m m tiles, so the CTAs in flight share group_m activation tiles and a few weight tiles in L2 (weights
    too large for the L2 are then read once per band instead of once per m tile)."""

    template: ClassVar[str] = "schedule/persistent.cuh.j2"
    family: ClassVar[str] = "schedule"
    provides: ClassVar[frozenset[str]] = frozenset({"TileCoord", "unit_count", "unit_coord"})
    split_k: int
    group_m: int = option_field(1)
    cluster_m: int = option_field(1)  # 2: unit pairs (one n tile, two m tiles) for the two CTAs of a cluster
    cluster_n: int = option_field(1)  # 2: unit pairs (one m tile, two n tiles; kNTiles even), bands allowed

    def __attrs_post_init__(self) -> None:
        if self.group_m > 1 and self.split_k > 1:
            raise ValueError("PersistentSchedule: group_m bands are generated without split-K")
        if self.cluster_m not in (1, 2) or (self.cluster_m > 1 and (self.split_k > 1 or self.group_m > 1)):
            raise ValueError(f"PersistentSchedule: cluster_m={self.cluster_m} (1, or 2 without split-K or bands)")
        if self.cluster_n not in (1, 2) or (self.cluster_n > 1 and (self.split_k > 1 or self.cluster_m > 1)):
            raise ValueError(f"PersistentSchedule: cluster_n={self.cluster_n} (1, or 2 without split-K or cluster_m)")


@attrs.frozen
class MoeIndexedPersistentSchedule(Component):
    """MoE (indexed) on a persistent grid: units (routed m block, n tile), n tiles fastest, up to the routed total
    read on the device; a unit's expert from moe_align's expert_ids (warp-specialized)."""

    template: ClassVar[str] = "schedule/moe_indexed_persistent.cuh.j2"
    family: ClassVar[str] = "schedule"
    provides: ClassVar[frozenset[str]] = frozenset({"TileCoord", "unit_count", "unit_coord"})
    needs: ClassVar[frozenset[str]] = frozenset({"Params"})


@attrs.frozen
class MoeGroupedPersistentSchedule(Component):
    """MoE (grouped) on a persistent grid: units (m block of an expert's row window, n tile), n tiles fastest; each
    CTA counts the experts' m blocks from expert_layout into a prefix in shared memory (no host sync) and finds a
    unit's expert by binary search (warp-specialized)."""

    template: ClassVar[str] = "schedule/moe_grouped_persistent.cuh.j2"
    family: ClassVar[str] = "schedule"
    provides: ClassVar[frozenset[str]] = frozenset({"TileCoord", "ExpertRows", "kExpertsPerLane", "expert_rows",
                                                   "count_expert_blocks", "unit_count", "unit_coord"})
    needs: ClassVar[frozenset[str]] = frozenset({"Params"})
    masked: bool

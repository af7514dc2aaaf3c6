"""Shared -> register reads of the weight layout (humming_gen.schemes.packing) that every pipeline uses, whatever
brought the data into shared memory (cp.async, bulk copies)."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component, option_field


@attrs.frozen
class BChunkShared(Component):
    """A warp's 16-tile weight chunk, read with `bits` 16-byte loads per thread."""

    template: ClassVar[str] = "memory/b_chunk_shared.cuh.j2"
    family: ClassVar[str] = "memory"
    provides: ClassVar[frozenset[str]] = frozenset({"u32x4", "load_b_chunk"})
    needs: ClassVar[frozenset[str]] = frozenset({"kChunkWords"})
    bits: int


@attrs.frozen
class GroupParamsShared(Component):
    """A thread's (row g, row g + 8) group scales / zero terms from a stage's group rows."""

    template: ClassVar[str] = "memory/group_params_shared.cuh.j2"
    family: ClassVar[str] = "memory"
    dtype: str
    tensors: tuple[str, ...]
    float_scales: bool  # read scales as fp32 (group scale applied to fp32 partial sums)
    pair_loads: bool  # read (row g, row g + 8) pairs broadcast into 16-bit pairs (scales or zero points)
    # The group size is not a multiple of 16: load_group_pair_at finds a register pair's row from its k.
    arbitrary_groups: bool = option_field()
    odd_group_size: bool = option_field()  # the (k, k + 1) elements of a register pair may lie in different groups

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("prmt",) if self.pair_loads or self.odd_group_size else ()

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset(({"load_group_pair"} if self.pair_loads else set())
                         | ({"first_group_row", "load_group_pair_at"} if self.arbitrary_groups else set())
                         | ({"load_group_f32"} if self.float_scales else set()))

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset(self.ptx)


@attrs.frozen
class BTileShared8(Component):
    """One 8-bit weight tile's four A registers with one 16-byte load (schemes.packing.BLayout8)."""

    template: ClassVar[str] = "memory/b_tile_shared8.cuh.j2"
    family: ClassVar[str] = "memory"
    provides: ClassVar[frozenset[str]] = frozenset({"u32x4", "load_b_tile"})


@attrs.frozen
class GroupScalesGlobal(Component):
    """fp32 group scales of a warp's k slice for the promotion of 8-bit partial sums: weight groups (block
    scales) and / or activation groups, straight from global memory (one pair of loads per tile row or token)."""

    template: ClassVar[str] = "memory/group_scales_global.cuh.j2"
    family: ClassVar[str] = "memory"
    needs: ClassVar[frozenset[str]] = frozenset({"Params"})
    weight_groups: bool
    activation_groups: bool
    # MoE (indexed): a token column's activation scales are those of the row its assignment reads (the routing)
    gather: bool = option_field()
    activation_e8m0: bool = option_field()  # activation scales stored as e8m0 bytes (MX), else fp32

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        gather = {"activation_scale_rows"} if self.gather and self.activation_groups else set()
        e8m0 = {"e8m0_scale"} if self.activation_groups and self.activation_e8m0 else set()
        return frozenset(({"load_weight_group_scales"} if self.weight_groups else set())
                         | ({"load_activation_group_scales"} if self.activation_groups else set()) | gather | e8m0)


@attrs.frozen
class BTilePairShared4(Component):
    """Two 4-bit weight tiles' A registers with one 16-byte load, each word widened to two registers by the
    numeric nibbles_to_a8 (schemes.packing.BLayoutNibble8)."""

    template: ClassVar[str] = "memory/b_tile_pair_shared4.cuh.j2"
    family: ClassVar[str] = "memory"
    provides: ClassVar[frozenset[str]] = frozenset({"u32x4", "load_b_tile_pair"})
    needs: ClassVar[frozenset[str]] = frozenset({"nibbles_to_a8"})

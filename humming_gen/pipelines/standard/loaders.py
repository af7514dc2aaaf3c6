"""cp.async loaders of the standard pipeline: activation tile, packed weight tile, group parameters."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component, option_field


@attrs.frozen
class ATileCpAsync(Component):
    """Activation tile, XOR-swizzled in shared memory, read back with ldmatrix."""

    template: ClassVar[str] = "pipelines/standard/a_tile_cp_async.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async", "ldmatrix"})
    ptx: ClassVar[tuple[str, ...]] = ("smem_address", "cp_async", "ldmatrix")
    dtype: str
    block_k: int
    warp_m_tiles: int

    def extra_context(self) -> dict:
        return {"swizzle_mask": min(8, self.block_k // 8) - 1, "odd_m_tiles": self.warp_m_tiles % 2 == 1}


@attrs.frozen
class BTileCpAsync(Component):
    """Packed weight tile copied linearly."""

    template: ClassVar[str] = "pipelines/standard/b_tile_cp_async.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async"})
    ptx: ClassVar[tuple[str, ...]] = ("smem_address", "cp_async")
    bits: int
    tile_bytes: int


@attrs.frozen
class GroupParamsCpAsync(Component):
    """Per-group scales (and zero points) of a stage."""

    template: ClassVar[str] = "pipelines/standard/group_params_cp_async.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async"})
    ptx: ClassVar[tuple[str, ...]] = ("smem_address", "cp_async")
    dtype: str
    tensors: tuple[str, ...]
    # The group size is not a multiple of 16: a stage holds the rows its k range touches (clamped at the tensor's
    # last row).
    arbitrary_groups: bool = option_field()

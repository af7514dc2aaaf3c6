"""cp.async loaders of the standard pipeline: activation tile, packed weight tile, group parameters."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component, option_field


class _ActivationTile:
    """What both activation tiles (16-bit elements, 8-bit codes) define and read: one swizzled layout of 16-byte
    chunks, ldmatrix fragments, and for MoE the rows gathered through the routing."""

    block_k: int
    warp_m_tiles: int
    gather: bool
    element_bytes: ClassVar[int]

    @property
    def provides(self) -> frozenset[str]:
        gather = {"kAChunksPerThread", "gather_rows"} if self.gather else set()
        return frozenset({"kAChunksPerRow", "kAStageChunks", "kASwizzle", "a_smem_chunk", "load_a_stage",
                          "load_a_fragments"} | gather)

    @property
    def needs(self) -> frozenset[str]:
        return frozenset({"cp_async_16", "smem_address"} | ({"ldmatrix_x4"} if self.warp_m_tiles >= 2 else set())
                         | ({"ldmatrix_x2"} if self.warp_m_tiles % 2 else set())
                         | ({"Params"} if self.gather else set()))

    def extra_context(self) -> dict:
        chunk_elements = 16 // self.element_bytes
        return {"swizzle_mask": min(8, self.block_k // chunk_elements) - 1, "odd_m_tiles": self.warp_m_tiles % 2 == 1}


@attrs.frozen
class ATileCpAsync(_ActivationTile, Component):
    """Activation tile, XOR-swizzled in shared memory, read back with ldmatrix."""

    template: ClassVar[str] = "pipelines/standard/a_tile_cp_async.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async", "ldmatrix"})
    ptx: ClassVar[tuple[str, ...]] = ("smem_address", "cp_async", "ldmatrix")
    dtype: str
    block_k: int
    warp_m_tiles: int
    gather: bool = option_field()  # MoE: rows gathered through the routing's sorted assignments
    element_bytes: ClassVar[int] = 2


@attrs.frozen
class BTileCpAsync(Component):
    """Packed weight tile copied linearly."""

    template: ClassVar[str] = "pipelines/standard/b_tile_cp_async.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async"})
    ptx: ClassVar[tuple[str, ...]] = ("smem_address", "cp_async")
    provides: ClassVar[frozenset[str]] = frozenset({"kBTileChunks", "kBWarpSliceWords", "load_b_stage"})
    needs: ClassVar[frozenset[str]] = frozenset({"cp_async_16", "smem_address", "u32x4"})
    bits: int
    tile_bytes: int


@attrs.frozen
class GroupParamsCpAsync(Component):
    """Per-group scales (and zero points) of a stage."""

    template: ClassVar[str] = "pipelines/standard/group_params_cp_async.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async"})
    ptx: ClassVar[tuple[str, ...]] = ("smem_address", "cp_async")
    provides: ClassVar[frozenset[str]] = frozenset({"kGroupRowChunks", "load_group_stage"})
    needs: ClassVar[frozenset[str]] = frozenset({"cp_async_16", "smem_address"})
    dtype: str
    tensors: tuple[str, ...]
    # The group size is not a multiple of 16: a stage holds the rows its k range touches (clamped at the tensor's
    # last row).
    arbitrary_groups: bool = option_field()


@attrs.frozen
class ATile8CpAsync(_ActivationTile, Component):
    """8-bit activation codes, swizzled like ATileCpAsync; ldmatrix of byte pairs gives the m16n8k32 B operand.
    Byte-granular zero fill at K, since the quantize kernel leaves a row's padding unspecified."""

    template: ClassVar[str] = "pipelines/standard/a_tile8_cp_async.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async", "ldmatrix"})
    ptx: ClassVar[tuple[str, ...]] = ("smem_address", "cp_async", "ldmatrix")
    block_k: int
    warp_m_tiles: int
    gather: bool = option_field()  # MoE: rows gathered through the routing's sorted assignments (as ATileCpAsync)
    element_bytes: ClassVar[int] = 1


@attrs.frozen
class ATile8Quantize(_ActivationTile, Component):
    """16-bit activations quantized per token in the loader (TuningConfig.a_load='quantize'): token scales from a
    first pass over the CTA's rows (in shared memory, read by the epilogue through TokenScalesSmem), or a static
    per-tensor scale (p.a_scale[0]; the epilogue reads it there as for the codes of quantize_activation), then each
    stage's x tile fetched into registers ahead of the compute and encoded into ATile8CpAsync's code layout with
    the activation-quantization kernel's own element code (humming_gen.activation.components: VectorIO,
    BlockScaleRule, ElementCode), so the codes equal humming_gen.quantize_activation's bit for bit."""

    template: ClassVar[str] = "pipelines/standard/a_tile8_quantize.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"ldmatrix"})
    ptx: ClassVar[tuple[str, ...]] = ("smem_address", "ldmatrix", "cvt_scalar")  # to_float (CvtScalar) reads x
    dtype: str  # of x
    block_k: int
    warp_m_tiles: int
    # a static per-tensor scale (p.a_scale[0], a checkpoint's input_scale) instead of dynamic per-token scales
    static_scale: bool = False
    gather: ClassVar[bool] = False
    element_bytes: ClassVar[int] = 1  # the swizzle is that of the code tile

    @property
    def provides(self) -> frozenset[str]:
        scales = {"load_tensor_scale"} if self.static_scale else {"TokenScalesSmem", "quantize_token_scales"}
        return frozenset({"kAChunksPerRow", "kAStageChunks", "kASwizzle", "kAStageVectors", "kAVectorsPerThread",
                          "a_smem_chunk", "load_a_fragments", "AStageX", "fetch_a_stage", "store_a_stage"} | scales)

    @property
    def needs(self) -> frozenset[str]:
        # (and the activation-quantization components' symbols, which declare none: load_vector, amax_bits,
        # quantize_vector, warp_max_xor, block_scale, Words4, Vector, Codes, BlockScale)
        return frozenset({"smem_address", "to_float"}
                         | ({"ldmatrix_x4"} if self.warp_m_tiles >= 2 else set())
                         | ({"ldmatrix_x2"} if self.warp_m_tiles % 2 else set()))


@attrs.frozen
class WeightScalesCpAsync(Component):
    """fp32 weight group scales (8-bit activations' kernels) copied with each stage, [group][n] as stored, and read
    back per promotion from shared memory instead of from global memory (compose_a8.STAGE_WEIGHT_SCALES)."""

    template: ClassVar[str] = "pipelines/standard/weight_scales_cp_async.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async"})
    ptx: ClassVar[tuple[str, ...]] = ("smem_address", "cp_async")
    provides: ClassVar[frozenset[str]] = frozenset({"kWScaleRowChunks", "kWScaleChunks", "weight_scale_stage_row0",
                                                    "staged_weight_scale_row", "load_weight_scale_stage",
                                                    "load_staged_weight_group_scales"})
    needs: ClassVar[frozenset[str]] = frozenset({"cp_async_16", "smem_address"})

"""The standard pipeline skeleton: cp.async ring, ldmatrix, in-register dequantization, mma.sync."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component, option_field
from humming_gen.pipelines.common import offset_constant


@attrs.frozen
class StandardPipeline(Component):
    template: ClassVar[str] = "pipelines/standard/skeleton.cuh.j2"
    family: ClassVar[str] = "pipeline"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async", "ldmatrix"})
    kernel_name: str
    group_params: tuple[str, ...]
    hoist_group_params: bool  # a warp's k slice of a stage lies in one group: load its scales once per stage
    slice_scale: bool  # group scale applied to the stage's fp32 partial sums, not to every weight
    dequant_params: tuple[str, ...]  # group parameters dequant_pair reads per row: "scale", "zero"
    convert_in_extract: bool  # extract_code_pair already returns converted values (no convert_pair)
    warp_k_reduce: bool
    split_k: bool
    min_blocks: int
    pdl: bool
    arbitrary_groups: bool = option_field()  # group size not a multiple of 16: a register finds its group row
    # MoE (indexed): (Params field, constant of its bytes per expert) of each stacked weight tensor
    expert_tensors: tuple[tuple[str, str], ...] = option_field(())
    grouped: bool = option_field()  # MoE with per-expert row windows (grouped gemm types), not gathered rows
    # the store's column factors are loaded before the reductions (StoreOutput.preload_factors)
    preload_factors: bool = option_field()

    @property
    def moe(self) -> bool:
        return bool(self.expert_tensors)

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("grid_dependency",) if self.pdl else ()

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        needs = {"Params", "TileCoord", "tile_coord", "u32x4", "kBTileChunks", "kBWarpSliceWords", "load_b_stage",
                 "load_a_stage", "load_a_fragments", "load_b_chunk", "kChunkWords", "extract_code_pair",
                 "dequant_pair", "mma_m16n8k16", "cp_async_commit", "cp_async_wait", "store_output"}
        needs |= set() if self.convert_in_extract else {"convert_pair"}
        needs |= {"load_group_stage"} if self.group_params else set()
        needs |= {"first_group_row", "load_group_pair_at"} if self.arbitrary_groups else set()
        needs |= {"load_group_pair"} if self.dequant_params and not self.arbitrary_groups else set()
        needs |= {"load_group_f32"} if self.slice_scale else set()
        needs |= {"wait_for_previous_grid", "allow_next_grid"} if self.pdl else set()
        needs |= {"reduce_warps_k"} if self.warp_k_reduce else set()
        needs |= {"split_k_reduce"} if self.split_k else set()
        needs |= {"kAChunksPerThread", "gather_rows"} if self.moe and not self.grouped else set()
        needs |= {"ColumnFactors", "column_factors"} if self.preload_factors else set()
        return frozenset(needs)

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"for_expert"} if self.moe else set())

    def extra_context(self) -> dict:
        # with arbitrary groups a step's two k halves have their own group parameters, [0] and [1]
        return {"group_offsets": {t: offset_constant(t) for t in self.group_params},
                "param_half": "[r / 2]" if self.arbitrary_groups else "", "moe": self.moe}


@attrs.frozen
class WarpKReduce(Component):
    """Sum the warps that split a stage's k range."""

    template: ClassVar[str] = "pipelines/standard/warp_k_reduce.cuh.j2"
    family: ClassVar[str] = "epilogue"
    provides: ClassVar[frozenset[str]] = frozenset({"kAccPerThread", "reduce_warps_k"})
    warps_k: int



@attrs.frozen
class StandardA8Pipeline(Component):
    """The standard skeleton for 8-bit activations: 8-bit weight codes and activation codes go to mma.sync
    m16n8k32 as loaded (weights of at most 4 bits are widened to bytes in registers, two tiles per load); each
    warp's stage slice accumulates into partial sums that are promoted into fp32 accumulators every kPromoteK
    (the slice, or the scale group where it is shorter), times the group scales where the scheme has them."""

    template: ClassVar[str] = "pipelines/standard/skeleton_a8.cuh.j2"
    family: ClassVar[str] = "pipeline"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async", "ldmatrix"})
    kernel_name: str
    weight: str           # weight and activation formats (the header comment)
    activation: str
    integer: bool         # s32 partial sums (int8 operands); fp32 for fp8
    weight_groups: bool   # per-group (block) weight scales multiply the promoted partial sums
    activation_groups: bool  # per-group activation scales likewise
    warp_k_reduce: bool
    split_k: bool
    min_blocks: int
    pdl: bool
    nibbles: bool = option_field()  # weights of at most 4 bits: load_b_tile_pair widens a tile pair's nibbles
    # int4 weights x int4 activations, both packed two codes a byte: every k32 byte step (the 8-bit fragments of the
    # packed bytes) is one mma.sync m16n8k64 s4; kK, kBlockK, kWarpK, kPromoteK and the group sizes count bytes
    s4: bool = option_field()
    # MoE, as StandardPipeline: the stacked weight tensors rebased per expert; grouped row windows, else gathered rows
    expert_tensors: tuple[tuple[str, str], ...] = option_field(())
    grouped: bool = option_field()
    # a_load='quantize': x (16-bit) is read and quantized per token by the loader (ATile8Quantize): token scales
    # first, then each stage's x tile fetched into registers before the stage in flight is computed and encoded
    # into shared memory after it
    quantize_a: bool = option_field()
    static_a_scale: bool = option_field()  # ... with a static per-tensor scale (load_tensor_scale)
    # fp8 on f16 mmas (MmaSyncM16N8K32ViaF16): each k32 step widens the warp's activation fragments once
    f16_mma: bool = option_field()
    # the weight group scales come with each stage through shared memory (WeightScalesCpAsync), not from global
    # memory at each promotion (compose_a8.STAGE_WEIGHT_SCALES)
    staged_weight_scales: bool = option_field()

    @property
    def moe(self) -> bool:
        return bool(self.expert_tensors)

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("grid_dependency",) if self.pdl else ()

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        needs = {"Params", "TileCoord", "tile_coord", "u32x4", "kBTileChunks", "kBWarpSliceWords", "load_b_stage",
                 "load_a_fragments", "load_b_tile_pair" if self.nibbles else "load_b_tile",
                 "mma_m16n8k64" if self.s4 else "mma_m16n8k32", "cp_async_commit", "cp_async_wait", "store_output"}
        needs |= ({"AStageX", "fetch_a_stage", "store_a_stage",
                   "load_tensor_scale" if self.static_a_scale else "quantize_token_scales"} if self.quantize_a
                  else {"load_a_stage"})
        needs |= {"widen_activation_fragment"} if self.f16_mma else set()
        if self.weight_groups:
            needs |= ({"load_weight_scale_stage", "load_staged_weight_group_scales", "weight_scale_stage_row0",
                       "staged_weight_scale_row"} if self.staged_weight_scales
                      else {"load_weight_group_scales"})
        needs |= {"load_activation_group_scales"} if self.activation_groups else set()
        needs |= {"wait_for_previous_grid", "allow_next_grid"} if self.pdl else set()
        needs |= {"reduce_warps_k"} if self.warp_k_reduce else set()
        needs |= {"split_k_reduce"} if self.split_k else set()
        gathered = self.moe and not self.grouped
        needs |= {"kAChunksPerThread", "gather_rows"} if gathered else set()
        needs |= {"activation_scale_rows"} if gathered and self.activation_groups else set()
        return frozenset(needs)

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"for_expert"} if self.moe else set())

    def extra_context(self) -> dict:
        factors = ((" * w_scale[nt][i / 2]" if self.weight_groups else "")
                   + (" * a_scale[mt][i % 2]" if self.activation_groups else ""))
        partial = "static_cast<float>(acc_slice[nt][mt][i])" if self.integer else "acc_slice[nt][mt][i]"
        return {"acc_ctype": "int" if self.integer else "float", "promote_expr": partial + factors,
                "group_scales": self.weight_groups or self.activation_groups, "nibbles": self.nibbles, "moe": self.moe,
                "mma_fn": "mma_m16n8k64" if self.s4 else "mma_m16n8k32", "quantize_a": self.quantize_a,
                "static_a_scale": self.static_a_scale, "f16_mma": self.f16_mma,
                "activation_fragments": "a16" if self.f16_mma else "a_frag"}

"""Components of the warp-specialized pipeline: the producer's loaders and the kernel skeleton."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component
from humming_gen.pipelines.common import offset_constant


@attrs.frozen
class ATileSw128CpAsync(Component):
    """Activation tile by cp.async into wgmma's 128-byte-swizzled K-major layout, and its step descriptors."""

    template: ClassVar[str] = "pipelines/warp_specialized/a_tile_sw128.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async", "wgmma"})
    ptx: ClassVar[tuple[str, ...]] = ("cp_async_copy",)
    provides: ClassVar[frozenset[str]] = frozenset({"kAPanelBytes", "kAChunksPerRow", "kARowsPerPass", "load_a_stage",
                                                   "smem_descriptor", "a_step_descriptor"})
    needs: ClassVar[frozenset[str]] = frozenset({"cp_async_16"})
    dtype: str


@attrs.frozen
class WeightStageBulk(Component):
    """A stage's weight slices and group-parameter rows by bulk copies completing on the stage's full barrier."""

    template: ClassVar[str] = "pipelines/warp_specialized/weight_stage_bulk.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"tma"})
    ptx: ClassVar[tuple[str, ...]] = ("bulk_copy",)
    provides: ClassVar[frozenset[str]] = frozenset({"kLayoutBlocks", "valid_layout_blocks", "weight_stage_bytes",
                                                   "load_weight_stage"})
    needs: ClassVar[frozenset[str]] = frozenset({"Params", "bulk_copy"})
    group_params: tuple[str, ...]

    def extra_context(self) -> dict:
        return {"group_offsets": {t: offset_constant(t) for t in self.group_params}}


@attrs.frozen
class WarpSpecializedPipeline(Component):
    template: ClassVar[str] = "pipelines/warp_specialized/skeleton.cuh.j2"
    family: ClassVar[str] = "pipeline"
    requires: ClassVar[frozenset[str]] = frozenset({"wgmma", "setmaxnreg", "tma"})
    provides: ClassVar[frozenset[str]] = frozenset({"Ring", "stage", "stage_ptr", "produce", "consume"})
    kernel_name: str
    block_m: int
    consumer_warpgroups: int
    group_params: tuple[str, ...]
    hoist_group_params: bool  # a stage lies in one group: its group parameters are read once per stage
    dequant_params: tuple[str, ...]
    convert_in_extract: bool
    split_k: bool
    pdl: bool

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return (("smem_address", "mbarrier", "async_proxy_fence", "setmaxnreg")
                + (("grid_dependency",) if self.pdl else ()) + (("named_barrier",) if self.split_k else ()))

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        needs = {"Params", "TileCoord", "unit_count", "unit_coord", "smem_address", "mbarrier_init",
                 "fence_barrier_init", "mbarrier_wait", "mbarrier_arrive", "mbarrier_arrive_expect_tx",
                 "cp_async_arrive_noinc", "cp_async_drain", "fence_async_shared", "registers_decrease",
                 "registers_increase",
                 "weight_stage_bytes", "load_weight_stage", "load_a_stage", "a_step_descriptor", "load_b_chunk",
                 "kChunkWords", "extract_code_pair", "dequant_pair", "wgmma_fence", "wgmma_commit", "wgmma_wait",
                 "fence_accumulators", f"wgmma_m64n{self.block_m}k16"}
        needs |= set() if self.convert_in_extract else {"convert_pair"}
        needs |= {"load_group_pair"} if self.dequant_params else set()
        needs |= {"wait_for_previous_grid", "allow_next_grid"} if self.pdl else set()
        needs |= ({"split_k_publish", "split_k_share_begin", "split_k_sum", "split_k_depart", "store_fragment"}
                  if self.split_k else {"store_output"})
        return frozenset(needs)

    def extra_context(self) -> dict:
        return {"group_offsets": {t: offset_constant(t) for t in self.group_params}}

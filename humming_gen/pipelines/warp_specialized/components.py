"""Components of the warp-specialized pipeline: the producer's loaders and the kernel skeleton."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component, option_field
from humming_gen.pipelines.common import offset_constant


@attrs.frozen
class ATileSw128CpAsync(Component):
    """Activation tile by cp.async into wgmma's 128-byte-swizzled K-major layout, and its step descriptors."""

    template: ClassVar[str] = "pipelines/warp_specialized/a_tile_sw128.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async", "wgmma"})
    ptx: ClassVar[tuple[str, ...]] = ("cp_async_copy",)
    dtype: str
    bytes: int = option_field(2)  # per element: 16-bit activations, or 8-bit codes (humming_gen.quantize_activation)
    gather: bool = option_field()  # MoE (indexed): rows gathered through the routing's sorted assignments

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        gather = {"kARowsPerThread", "kAGatherRegs", "gather_rows"} if self.gather else set()
        return frozenset({"kAPanelBytes", "kAChunksPerRow", "kARowsPerPass", "load_a_stage", "smem_descriptor",
                          "a_step_descriptor"} | gather)

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"cp_async_16"} | ({"Params"} if self.gather else set()))


@attrs.frozen
class ATileTma(Component):
    """16-bit activation tile by TMA (a tensor map per call, one 2-D copy per 64-k panel with the 128-byte swizzle
    wgmma reads), and its step descriptors: a_load='tma' of the dense and grouped-MoE 16-bit kernels."""

    template: ClassVar[str] = "pipelines/warp_specialized/a_tile_tma.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"tma", "wgmma"})
    ptx: ClassVar[tuple[str, ...]] = ("tensor_copy",)
    provides: ClassVar[frozenset[str]] = frozenset({"kAPanelBytes", "kAPanels", "kAStageTxBytes", "load_a_stage",
                                                   "smem_descriptor", "a_step_descriptor"})
    needs: ClassVar[frozenset[str]] = frozenset({"tensor_copy_2d"})
    dtype: str

    def extra_context(self) -> dict:
        return {"bytes": 2}  # (the descriptors' k16 steps)


@attrs.frozen
class ATilePanelsBulk(Component):
    """Activation tile of 8-bit codes in the panels layout (quantize_activation(layout="panels")) by one bulk copy
    per stage, and its step descriptors: the dense 8-bit kernels' a_load='tma'."""

    template: ClassVar[str] = "pipelines/warp_specialized/a_tile_panels_bulk.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"tma", "wgmma"})
    provides: ClassVar[frozenset[str]] = frozenset({"kAPanelBytes", "a_stage_bytes", "load_a_stage",
                                                   "smem_descriptor", "a_step_descriptor"})
    dtype: str
    # two CTAs of a cluster along N (one m tile, two n tiles): each copies half of the tile's rows into both
    multicast: bool = option_field()

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("bulk_copy", "cluster") if self.multicast else ("bulk_copy",)

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"bulk_copy_multicast", "cluster_cta_rank"} if self.multicast else {"bulk_copy"})

    def extra_context(self) -> dict:
        return {"bytes": 1}  # (the descriptors' k32 steps)


@attrs.frozen
class ActivationScalesStage(Component):
    """fp32 activation group scales of a stage's tokens by 4-byte cp.async beside the stage's codes, so that the
    consumers' promotions read shared memory instead of global memory."""

    template: ClassVar[str] = "pipelines/warp_specialized/activation_scales_stage.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async"})
    ptx: ClassVar[tuple[str, ...]] = ("cp_async_word",)
    provides: ClassVar[frozenset[str]] = frozenset({"kScaleTokensPerThread", "activation_scale_rows",
                                                   "load_activation_scales_stage"})
    gather: bool = option_field()  # MoE (indexed): a token's scales are those of the row its assignment reads
    e8m0: bool = option_field()  # e8m0 bytes (MXFP8): a token's groups of a stage, [kBlockM][group slot]

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"cp_async_4"} | ({"Params"} if self.gather else set()))


@attrs.frozen
class WeightStageBulk(Component):
    """A stage's weight slices and group-parameter rows (or folded scales' exponent deltas) by bulk copies completing
    on the stage's full barrier."""

    template: ClassVar[str] = "pipelines/warp_specialized/weight_stage_bulk.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"tma"})
    provides: ClassVar[frozenset[str]] = frozenset({"kLayoutBlocks", "valid_layout_blocks", "weight_stage_bytes",
                                                   "load_weight_stage"})
    group_params: tuple[str, ...]
    exponents: bool = option_field()  # the stage's b_exponent words (components.numeric.exponent_fold)
    weight_scales: bool = option_field()  # the tile's fp32 group scales of the stage's groups (8-bit promotion)
    # weight blocks of at least 128 rows: each layout block's one scale per group, 16 bytes a block (tiles of one or
    # two layout blocks), instead of the tile's (one-block) rows
    block_scales: bool = option_field()
    # 2: the two CTAs of a cluster (one n tile, two m tiles) share each stage by multicast, half copied by each
    cluster_m: int = option_field(1)

    def __attrs_post_init__(self) -> None:
        if self.cluster_m not in (1, 2) or (self.cluster_m > 1 and self.group_params):
            raise ValueError(f"WeightStageBulk: cluster_m={self.cluster_m} (1 or 2, without group parameter rows)")

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("bulk_copy", "cluster") if self.cluster_m > 1 else ("bulk_copy",)

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"Params", "bulk_copy_multicast", "cluster_cta_rank"} if self.cluster_m > 1
                         else {"Params", "bulk_copy"})

    def extra_context(self) -> dict:
        return {"group_offsets": {t: offset_constant(t) for t in self.group_params}, "cluster": self.cluster_m > 1}


@attrs.frozen
class WeightWiden(Component):
    """A stage's nibbles widened to 8-bit codes in a BLayoutSw128 panel of the stage (b_operand='widened'): the
    producer warpgroup's warps 1-3 widen while its warp 0 copies, so the consumers' wgmmas read both operands from
    shared memory and nothing between them is widened on the consumers' issue slots."""

    template: ClassVar[str] = "pipelines/warp_specialized/weight_widen.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"wgmma"})
    provides: ClassVar[frozenset[str]] = frozenset({"kWidenUnits", "widen_unit"})
    weight: str
    order: str  # the nibbles' widening (BLayoutNibble8.order): "int8" or "e4m3"
    fold: bool = option_field()  # folded group scales: each row's exponent delta of the step added (exponent_fold)

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"E4m3Table", "fold_table", "nibbles_to_a8_folded"} if self.fold else {"nibbles_to_a8"})


@attrs.frozen
class WeightWidenDequant(Component):
    """A stage's packed weights dequantized to 16-bit panels of the stage (b_operand='widened' with 16-bit
    activations): the producer warpgroup's warps 1-3 run the register kernels' dequantization chain while its warp 0
    copies, so the consumers only issue wgmmas with both operands in shared memory."""

    template: ClassVar[str] = "pipelines/warp_specialized/weight_widen16.cuh.j2"
    family: ClassVar[str] = "memory"
    requires: ClassVar[frozenset[str]] = frozenset({"wgmma"})
    provides: ClassVar[frozenset[str]] = frozenset({"kWidenUnits", "widen_half", "widen_unit"})
    dtype: str
    group_params: tuple[str, ...]
    dequant_params: tuple[str, ...]
    convert_in_extract: bool
    hoist_group_params: bool  # a stage lies in one group: each n tile's parameters are read once per chunk

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        needs = {"load_b_chunk", "kChunkWords", "extract_code_pair", "dequant_pair"}
        needs |= set() if self.convert_in_extract else {"convert_pair"}
        needs |= {"load_group_pair"} if self.dequant_params else set()
        return frozenset(needs)

    def extra_context(self) -> dict:
        return {"group_offsets": {t: offset_constant(t) for t in self.group_params}}


#: The 8-bit consumers fence their loads of a stage before releasing it where they read staged scales
#: (WarpSpecializedA8Pipeline.release_after_loads); False only to time what the fence costs
#: (bench/release_fence_bench.py), the kernels then race.
RELEASE_FENCE = True
#: Where the consumers fence before a release, they release a stage once the next stage's first wgmmas are issued
#: (the fence then waits while the tensor cores work) instead of right after the stage's last promotion; False only to
#: time it (bench/release_fence_bench.py).
DEFERRED_RELEASE = True
#: Token tiles up to which the overlapped promotion loop reads a half's staged fp32 activation scales before the
#: wgmma wait that precedes its promotion (the FFMAs then do not wait on shared memory: fp8 group-32 x MXFP4, 3072 x
#: 4096, M = 4096, 333.1 -> 311.9 us on the H200); the 8 registers a half spill the larger tiles (176 and 192 tokens).
PRELOAD_SCALES_MAX_TOKENS = 128
#: The 8-bit consumers' proxy fence after a stage's wait where the activation codes came by bulk copy (async proxy,
#: as the wgmmas read them): not needed, and a MEMBAR.ALL.CTA per stage; True only to time it.
PROXY_FENCE_AFTER_BULK = False


def ring_barrier_bytes(widened: bool) -> int:
    """Bytes of a ring stage's mbarriers after the stages: full and empty, and widened where the producer
    warpgroup widens the weights (padded to 32, so the epilogue staging after them stays 16-byte aligned for stmatrix
    and vector loads whatever the stage count)."""
    return 32 if widened else 16


class RingSkeleton:
    """What both warp-specialized skeletons share through the ring, producer and kernel-entry partials
    (ring_producer, kernel_entry): the symbols those partials define and call, their PTX, and the template context
    they read. A skeleton component has the fields pdl, split_k, expert_tensors, grouped, staged_store, cluster_m,
    cluster_n and widened."""

    RING_NEEDS: ClassVar[frozenset[str]] = frozenset({
        "Params", "TileCoord", "unit_count", "unit_coord", "smem_address", "mbarrier_init", "fence_barrier_init",
        "mbarrier_wait", "mbarrier_arrive", "mbarrier_arrive_expect_tx", "cp_async_arrive_noinc", "cp_async_drain",
        "fence_async_shared", "registers_decrease", "registers_increase", "weight_stage_bytes", "load_weight_stage",
        "load_a_stage", "a_step_descriptor", "wgmma_fence", "wgmma_commit", "wgmma_wait"})

    @property
    def moe(self) -> bool:
        return bool(self.expert_tensors)

    @property
    def clustered(self) -> bool:
        """Two-CTA clusters: each CTA multicasts a share of every stage into both (weights along M, activations
        along N), so a consumer releases a stage on both CTAs' empty barriers."""
        return self.cluster_m * self.cluster_n > 1

    @property
    def gather(self) -> bool:
        return self.moe and not self.grouped

    #: The consumers read stages with ordinary shared loads that their release must not overtake (staged scales
    #: refilled by the producers' cp.async: ptx/loads_fence), so a release fences first.
    release_after_loads: ClassVar[bool] = False

    #: ... and holds a stage until the next stage's first wgmmas are issued (DEFERRED_RELEASE).
    deferred_release: ClassVar[bool] = False

    @property
    def ptx(self) -> tuple[str, ...]:
        return (("smem_address", "mbarrier", "async_proxy_fence", "setmaxnreg")
                + (("grid_dependency",) if self.pdl else ()) + (("named_barrier",) if self.split_k else ())
                + (("cluster",) if self.clustered else ()) + (("loads_fence",) if self.release_after_loads else ()))

    def ring_provides(self) -> set[str]:
        return ({"Ring", "stage", "stage_ptr", "produce", "consume"} | ({"for_expert"} if self.moe else set())
                | ({"release_stage"} if self.clustered or self.release_after_loads else set()))

    def ring_needs(self) -> set[str]:
        """The partials' calls, the epilogue's store (split-K slices or whole tiles) and the MoE units' helpers."""
        needs = set(self.RING_NEEDS)
        needs |= ({"split_k_publish", "split_k_share_begin", "split_k_sum", "split_k_depart", "store_fragment"}
                  if self.split_k else {"store_output"})
        needs |= {"wait_for_previous_grid", "allow_next_grid"} if self.pdl else set()
        needs |= {"kAGatherRegs", "gather_rows"} if self.gather else set()
        needs |= {"count_expert_blocks"} if self.grouped else set()
        needs |= {"fence_loads"} if self.release_after_loads else set()
        needs |= ({"cluster_sync", "mbarrier_arrive_remote", "peer_shared_address", "cluster_cta_rank"} if self.clustered
                  else set())
        return needs

    def ring_context(self, a_type: str, a_origin: str) -> dict:
        """(a_bulk, the activation tile by one bulk copy, and a_tma, by TMA through a tensor map, are False unless the
        skeleton sets them.)"""
        return {"a_bulk": False, "a_tma": False, "producer_cp_async": True, "widened": self.widened,
                "moe": self.moe, "grouped": bool(self.grouped), "gemm": self.grouped, "a_type": a_type,
                "a_origin": a_origin, "staged_store": self.staged_store, "cluster": self.clustered,
                "release_after_loads": self.release_after_loads,
                # a consumer's release of a stage: its own arrival, or (cluster) its warp's on both CTAs' barriers;
                # after its loads of the stage where release_after_loads; deferred_release: the previous stage
                # (held_stage) once this one's first wgmmas are issued, and the unit's last after its k loop
                "release_stage": ("release_stage(ring, stage)" if self.clustered or self.release_after_loads
                                  else "mbarrier_arrive(ring.empty_bars + 8 * stage)"),
                "deferred_release": self.deferred_release,
                "held_stage": "stage == 0 ? cfg::kStages - 1 : stage - 1",
                # store_output's last argument: this consumer warp's staging buffer
                "staging_arg": (f", ring.smem + cfg::kStages * (cfg::kStageBytes + "
                                f"{ring_barrier_bytes(self.widened)}) + (kWg * 4 + w) * cfg::kStagingBytes"
                                if self.staged_store else "")}


@attrs.frozen
class WarpSpecializedPipeline(RingSkeleton, Component):
    template: ClassVar[str] = "pipelines/warp_specialized/skeleton.cuh.j2"
    family: ClassVar[str] = "pipeline"
    requires: ClassVar[frozenset[str]] = frozenset({"wgmma", "setmaxnreg", "tma"})
    kernel_name: str
    block_m: int
    consumer_warpgroups: int
    group_params: tuple[str, ...]
    hoist_group_params: bool  # a stage lies in one group: its group parameters are read once per stage
    dequant_params: tuple[str, ...]
    convert_in_extract: bool
    split_k: bool
    pdl: bool
    # MoE: (Params field, constant of its bytes per expert) of each stacked weight tensor; the units are routed m
    # blocks (indexed: MoeIndexedPersistentSchedule), their rows gathered and scattered through the routing, or
    # m blocks of the experts' row windows (grouped: MoeGroupedPersistentSchedule)
    expert_tensors: tuple[tuple[str, str], ...] = option_field(())
    grouped: str = option_field("")  # "grouped_contiguous" or "grouped_masked" ("": indexed or dense)
    # the activation tile by TMA (ATileTma: the producer's first thread, no cp.async; Params as __grid_constant__)
    a_tma: bool = option_field()
    # whole tiles leave through the consumer warps' staging buffers (epilogue.output.StoreOutputStaged), after the
    # ring's barriers (kStagingBytes each)
    staged_store: bool = option_field()
    cluster_m: int = option_field(1)  # generated with 1 only (two-CTA clusters: the 8-bit skeleton)
    cluster_n: int = option_field(1)
    # the producer warpgroup's warps 1-3 dequantize each stage into 16-bit panels (WeightWidenDequant), arriving on
    # the stage's widened barrier; the consumers' wgmmas read them through descriptors (WgmmaSS)
    widened: bool = option_field()

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset(self.ring_provides() | ({"widen"} if self.widened else set()))

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        needs = self.ring_needs() | {"fence_accumulators", f"wgmma_m64n{self.block_m}k16"}
        if self.widened:
            needs |= {"widen_unit", "kWidenUnits", "smem_descriptor"}
        else:
            needs |= {"load_b_chunk", "kChunkWords", "extract_code_pair", "dequant_pair"}
            needs |= set() if self.convert_in_extract else {"convert_pair"}
            needs |= {"load_group_pair"} if self.dequant_params else set()
        if self.a_tma:  # (no generic-proxy writes to fence before wgmma reads the stage, but the widened panels)
            needs = ((needs - {"cp_async_arrive_noinc", "cp_async_drain"}
                      - (set() if self.widened else {"fence_async_shared"}))
                     | {"kAStageTxBytes", "prefetch_tensor_map"})
        return frozenset(needs)

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        base = RingSkeleton.ptx.fget(self)
        if not self.a_tma:
            return base
        # TMA only: no cp.async arrivals on the barriers, and no generic-proxy writes to fence but widened panels
        return tuple({"mbarrier": "mbarrier_tx"}.get(p, p) for p in base
                     if p != "async_proxy_fence" or self.widened)

    def extra_context(self) -> dict:
        return {"group_offsets": {t: offset_constant(t) for t in self.group_params}, "banded": False,
                "activation_scales": False,
                **self.ring_context("u16", "activations may come from the previous kernel"),
                "a_tma": self.a_tma, "producer_cp_async": not self.a_tma}


@attrs.frozen
class WarpSpecializedA8Pipeline(RingSkeleton, Component):
    """The warp-specialized skeleton for 8-bit activations: 128-row tiles, one 64-row warp slice per consumer
    warpgroup, 8-bit weight registers (nibbles widened) into wgmma k32, partial sums promoted into fp32
    accumulators every kPromoteK (fp8, group scales) or converted once per tile (int8 with channel scales)."""

    template: ClassVar[str] = "pipelines/warp_specialized/skeleton_a8.cuh.j2"
    family: ClassVar[str] = "pipeline"
    requires: ClassVar[frozenset[str]] = frozenset({"wgmma", "setmaxnreg", "tma"})
    kernel_name: str
    weight: str           # weight and activation formats (the header comment)
    activation: str
    block_m: int
    integer: bool         # s32 partial sums (int8 operands); fp32 for fp8
    weight_groups: bool   # per-group (block) weight scales multiply the promoted partial sums
    activation_groups: bool
    nibbles: bool         # weights of at most 4 bits: 8 bytes of nibbles per k32 step, widened by nibbles_to_a8
    pdl: bool
    banded: bool = option_field()  # the schedule walks bands of m tiles (unit_coord takes m)
    activation_e8m0: bool = option_field()  # activation group scales stored as e8m0 bytes (MX), else fp32
    split_k: bool = option_field()  # k slices of a tile reduced in the epilogue (epilogue/split_k_reduce_parallel)
    long_k: bool = option_field()  # int8 with K past 2^16: s32 partial sums promoted every stage (overflow)
    fold: bool = option_field()  # folded group scales: the widening adds the rows' exponent deltas (exponent_fold)
    # 128 x 128 (or taller) weight blocks: one weight scale per tile and group, folded into the activation scales
    tile_weight_scale: bool = option_field()
    # MoE, as WarpSpecializedPipeline.expert_tensors and .grouped: the units are routed m blocks whose rows (codes and
    # activation scales) are gathered and scattered through the routing, or m blocks of the experts' row windows
    expert_tensors: tuple[tuple[str, str], ...] = option_field(())
    grouped: str = option_field("")
    staged_store: bool = option_field()  # as WarpSpecializedPipeline.staged_store
    # 2: two-CTA clusters along M share each weight stage by multicast (WeightStageBulk.cluster_m), and each consumer
    # warp releases a stage on both CTAs' empty barriers
    cluster_m: int = option_field(1)
    # 2: two-CTA clusters along N share each stage's activation tile by multicast (ATilePanelsBulk.multicast), and
    # each consumer warp releases a stage on both CTAs' empty barriers
    cluster_n: int = option_field(1)
    # wgmma reads the weights from the stage through descriptors (WgmmaSS8, BLayoutSw128 panels), no fragments
    shared_weights: bool = option_field()
    # the activation codes come in the panels layout, a stage's tile by one bulk copy (ATilePanelsBulk)
    a_bulk: bool = option_field()
    # promoted partial sums in two token halves, each promoted while the other's wgmmas run (m64n{block_m / 2}k32;
    # a stage's last half is promoted with nothing in flight)
    overlap: bool = option_field()
    # e8m0 activation group scales staged with the codes as bytes (ActivationScalesStage.e8m0)
    staged_e8m0: bool = option_field()
    # the tokens are wgmma's A operand, 64 a consumer warpgroup, and the stage's weight panel B (TuningConfig.tokens_on
    # 'm', shared_weights): the consumer of consume_tokens_m, whose accumulators are token rows (StoreOutputRows);
    # overlapped halves are halves of the weight rows
    tokens_m: bool = option_field()
    block_n: int = option_field(128)
    # the weights come as nibbles and the producer warpgroup's warps 1-3 widen each stage into a BLayoutSw128 panel
    # (WeightWiden), arriving on the stage's widened barrier; the consumers read it as shared_weights (which is set)
    widened: bool = option_field()

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        # bulk-copied codes beside cp.async-staged scales: the drain without the 16-byte copy's wrapper
        base = tuple(p for p in RingSkeleton.ptx.fget(self) if p != "async_proxy_fence" or self.consumer_proxy_fence)
        return base + (("cp_async_drain",) if self.a_bulk and self.producer_cp_async else ())

    @property
    def consumer_proxy_fence(self) -> bool:
        """The consumers fence the async proxy after a stage's wait where wgmma reads what the generic proxy wrote:
        codes that came by cp.async, or a widened weight panel (bulk-copied codes need none; PROXY_FENCE_AFTER_BULK
        puts it back, for timing)."""
        return not self.a_bulk or self.widened or PROXY_FENCE_AFTER_BULK

    @property
    def staged_activation_scales(self) -> bool:
        """fp32 activation group scales come with the stage (ActivationScalesStage); e8m0 bytes, which no cp.async
        size copies, are read from global memory at each promotion."""
        return self.activation_groups and (not self.activation_e8m0 or self.staged_e8m0)

    @property
    def release_after_loads(self) -> bool:  # type: ignore[override]
        """Its consumers read staged weight or activation group scales from a stage with shared loads that the
        release must not overtake (RingSkeleton.release_after_loads); fragments, codes and folded exponent deltas
        feed the wgmmas, which retire before the release, so kernels with channel or tensor scales, folded MXFP4
        ones included, need no fence (tests/cpu/test_stage_release.py reads it in their SASS)."""
        return RELEASE_FENCE and (self.weight_groups or self.staged_activation_scales)

    @property
    def deferred_release(self) -> bool:  # type: ignore[override]
        """A fenced release waits for the thread's loads: deferred past the next stage's first wgmma issue, that wait
        overlaps tensor work instead of delaying the promotion. (Register weights in tiles of more than 128 tokens
        spill with it: W4A8 MXFP4 unfolded at 192 tokens, 100 bytes, NVRTC 13.0.)"""
        return self.release_after_loads and DEFERRED_RELEASE and (self.shared_weights or self.block_m <= 128)

    @property
    def producer_cp_async(self) -> bool:
        """The producer threads copy something by cp.async (codes, or staged activation scales), so each arrives on
        the full barrier; with bulk-copied codes and nothing staged, the first thread's expect_tx alone does."""
        return not self.a_bulk or self.staged_activation_scales

    @property
    def mma_n(self) -> int:
        """wgmma's N: the tile's tokens (weight rows with tokens_m), or half of them where the promotion overlaps
        the other half's wgmmas."""
        if self.tokens_m:  # promoted partial sums: 128-row parts one at a time, or 64-row halves overlapped
            return self.block_n if not self.promote_in_loop else 64 if self.overlap else 128
        return self.block_m // 2 if self.overlap else self.block_m

    @property
    def promote_in_loop(self) -> bool:
        """fp8 partial sums are promoted every kPromoteK (wgmma's fp8 accumulation is not full fp32); s32 ones only
        where group scales change along K, or K is long enough to overflow them."""
        return not self.integer or self.weight_groups or self.activation_groups or self.long_k

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        staged = {"stage_group_slot"} if self.weight_groups or self.staged_activation_scales else set()
        return frozenset(self.ring_provides() | staged | ({"widen"} if self.widened else set()))

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        needs = self.ring_needs() | {"fence_partials", f"wgmma_m64n{self.mma_n}k32"}
        needs -= set() if self.producer_cp_async else {"cp_async_arrive_noinc", "cp_async_drain"}
        needs -= set() if self.consumer_proxy_fence else {"fence_async_shared"}
        needs |= {"smem_descriptor"} if self.shared_weights else set()
        needs |= {"widen_unit", "kWidenUnits"} if self.widened else set()
        needs |= {"kLayoutBlocks"} if self.tokens_m else set()  # a stage's weight panel spans block_n / 128 blocks
        needs |= {"a_stage_bytes"} if self.a_bulk else set()
        if self.nibbles:
            needs |= {"E4m3Table", "fold_table", "nibbles_to_a8_folded"} if self.fold else {"nibbles_to_a8"}
        needs |= ({"kScaleTokensPerThread", "activation_scale_rows", "load_activation_scales_stage"}
                  if self.staged_activation_scales else set())
        return frozenset(needs)

    def extra_context(self) -> dict:
        folded = self.tile_weight_scale and self.staged_activation_scales  # the weight scale is in a_scale
        weight = ("" if not self.weight_groups or folded else " * w_scale" if self.tile_weight_scale
                  else " * w_scale[i / 2]")
        factors = weight + (" * a_scale[i % 2]" if self.activation_groups else "")
        partial = "static_cast<float>(part[j][i])" if self.integer else "part[j][i]"
        if self.tokens_m:  # a thread's two token rows: scales s[0], s[1] of each promotion (weight scale folded in)
            factors = " * s[i / 2]" if self.weight_groups or self.activation_groups else ""
        return {"promote_expr": partial + factors, "mma_n": self.mma_n, "promote_in_loop": self.promote_in_loop,
                "group_scales": self.weight_groups or self.activation_groups,
                "staged_scales": self.weight_groups or self.staged_activation_scales,
                "activation_scales": self.staged_activation_scales, "fold_weight_scale": folded,
                # MoE: the expert's weight tensors (and row window), and the activation row a token's e8m0 group
                # scales are read from (through the routing; grouped kernels read the unit's dense rows, the
                # skeleton's own branch)
                "params": ("for_expert(p, tc.expert, tc.row_end)" if self.grouped
                           else "for_expert(p, tc.expert)" if self.moe else "p"),
                "gather": self.gather, "a_scale_row": "row" if self.gather else "m",
                "a_scale_valid": "row >= 0" if self.gather else "m < p.m", "consumer_warpgroups": 2,
                "weight_operand": "weight_descriptor(stage, step)" if self.shared_weights else "frag[ks]",
                **self.ring_context("unsigned char", "activation codes and scales come from the previous kernel"),
                "a_bulk": self.a_bulk, "producer_cp_async": self.producer_cp_async, "overlap": self.overlap,
                # wgmma (async proxy) reads codes a generic-proxy cp.async wrote, or a widened panel
                "consumer_proxy_fence": self.consumer_proxy_fence,
                "staged_e8m0": self.staged_e8m0, "a_scale_type": "unsigned char" if self.staged_e8m0 else "float",
                # the overlapped halves read a promotion's staged scales (a half's activation scales, fp32 or e8m0
                # bytes decoded, and the group's weight scales) before its wgmma wait (8 registers a half; tiles
                # above 128 tokens would spill)
                "preload_scales": (self.overlap and (self.staged_activation_scales or self.weight_groups)
                                   and self.block_m <= PRELOAD_SCALES_MAX_TOKENS)}

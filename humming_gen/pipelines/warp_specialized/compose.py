"""compose() of the warp-specialized pipeline (sm_90a): a producer warpgroup (bulk copies of weights and group
rows, cp.async of activations) feeding 1-2 consumer warpgroups that dequantize in registers and run wgmma with
the weights as the register A operand, over a persistent grid; or (b_operand='widened') the producer warpgroup's
warps 1-3 dequantize each stage into 16-bit panels and the consumers' wgmmas read both operands from shared memory.

The weights keep the standard pipeline's layout (128-row blocks, two 64-row warp slices, 64-k chunks), so a layer
whose small-M buckets run the standard pipeline shares one packed copy with these kernels: warp w of each consumer
warpgroup reads slice w of the tile exactly as a standard warp would, and of its four 16-row tiles, consumer
warpgroup g takes tiles 2g and 2g + 1 (all four with one warpgroup) as the A fragments of its m64 wgmma
instructions (warp w of a warpgroup holds rows 16w..16w+15 of each).
"""

from __future__ import annotations

import math

import attrs

from humming_gen.components.base import Component
from humming_gen.components.epilogue.output import SplitKParallelReduce, StoreOutput, StoreOutputStaged
from humming_gen.components.epilogue.topk_atomic import fused_topk_store, output_dtype
from humming_gen.components.memory.shared_reads import BChunkShared, GroupParamsShared
from humming_gen.components.mma.atoms import WGMMA_M64NNK16_WARP
from humming_gen.components.mma.wgmma import WgmmaRS, WgmmaSS
from humming_gen.components.ptx.wrappers import wrappers_for
from humming_gen.components.schedule.dense import (MoeGroupedPersistentSchedule, MoeIndexedPersistentSchedule,
                                                  PersistentSchedule)
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.pipelines.base import KernelPlan, PersistentLaunch, compose_error
from humming_gen.pipelines.common import (SHARED_LAYOUT, arbitrary_group_size, common_reasons, constants_table,
                                          dense_args, dequant_chain, group_constants, group_offset_constants,
                                          group_plan, kernel_name, out_scale_of, missing_features, missing_symbols,
                                          padded_k, split_k_constants, split_k_reasons, weight_layout)
from humming_gen.pipelines.standard.moe import expert_bytes, expert_tensors, moe_name_suffix, moe_reasons
from humming_gen.pipelines.warp_specialized.components import (ATileSw128CpAsync, ATileTma,
                                                               WarpSpecializedPipeline, WeightStageBulk,
                                                               WeightWidenDequant, ring_barrier_bytes)
from humming_gen.schemes.packing import BLayout
from humming_gen.targets import Target

LAYOUT_BLOCK_N = SHARED_LAYOUT["block_n"]  # the layout both pipelines read (pipelines.common.SHARED_LAYOUT)
LAYOUT_WARP_N = SHARED_LAYOUT["block_n"] // SHARED_LAYOUT["warps_n"]
LAYOUT_WARP_K = SHARED_LAYOUT["warp_k"]
BLOCK_N = 4 * LAYOUT_WARP_N  # weight rows of a tile: warp w of each consumer warpgroup reads 64-row slice w
N_TILES_PER_SLICE = LAYOUT_WARP_N // 16  # 16-row n tiles of a slice, shared out among the consumer warpgroups
ACC_REGISTERS = 176  # fp32 accumulators per consumer thread: n tiles x block_m / 2 (176 tokens with two warpgroups)
PRODUCER_THREADS = 128
PRODUCER_REGISTERS = 40
# b_operand='widened': the producer warpgroup's warps 1-3 dequantize each stage into 16-bit panels (widen_unit), so
# its setmaxnreg budget holds their dequantization chain (a chunk's words: 4 per bit of the weight; zero points),
# and the consumers get what is left: weights of at most 4 bits without zero points, whose stage lies in one group,
# fit 64 registers at 64-k stages (NVRTC 13.0, no spills), the rest 96 (with 64, uint4 g128 with int zero points and
# int4 / MXFP4 with groups of 32 spilled 8 bytes beside 176-token tiles)
WIDEN_THREADS = 96
WIDEN_REGISTERS, WIDEN_REGISTERS_WIDE = 64, 96
REGISTER_FILE = 65536
SMEM_ALIGN = 1024  # 128-byte swizzled operands sit on 1024-byte boundaries
STATIC_SMEM = 128  # static shared memory beside the dynamic ring (the split-K hand-off's flag)
STAGING_BYTES = 2048  # per consumer warp: the token rows of its epilogue's chunk (StoreOutputStaged)
# Indexed MoE kernels' staged stores read each chunk's assignment rows and router weights (and 8-bit activations'
# token scales) one chunk ahead (StoreOutputStaged.prefetch_rows). In program order those loads otherwise come
# after the previous chunk's stores to c, which the compiler cannot tell them apart from: the SASS of the DeepSeek
# down GEMM's 128 x 256 W4A16 tile shows per chunk (4 per unit; 2 of 8 m tiles in 8-bit activations' 128 x 128
# tiles) its sorted_ids loads and then the router weights, which depend on them, after the stores. At K = 256 (two
# stages of main loop per unit) that latency is much of a unit; the indexed down GEMM at M = 4096 ran 537.6 us
# against the grouped one's 369.4. H200, graph us, in order -> one chunk ahead (bench/moe_bench.py, 2026-12-02):
# DeepSeek-V3 down M = 1024 / 4096 W4A16 217.8 / 531.5 -> 213.9 / 516.6, W4A8 262.0 / 716.5 -> 266.1 / 701.0, W8A8
# 225.1 / 627.0 -> 224.8 / 582.9; gate-up M = 4096 W4A16 649.8 -> 667.2, W4A8 494.0 -> 487.5, W8A8 561.2 -> 562.5;
# Qwen3-30B-A3B down M = 4096 W4A16 277.1 -> 272.5, W4A8 301.1 -> 295.3. A gain on the down GEMMs (short K), level
# on the gate-up ones; the rest of the indexed / grouped gap is elsewhere. Kernel names unchanged (the source is the
# cache key); False keeps program order (for measurements).
PREFETCH_CHUNK_ROWS = True
# Measured and not adopted (2026-12-02, H200, bench/moe_bench.py, W4A16 int4 g128, graph us per GEMM): token bands,
# a 16-bit MoE unit's wgmmas covering its rows rounded up to 32 or 64 tokens (one main loop per band count, wgmma
# N = 32 / 64 / 96 / 128) instead of the whole 128-token tile, since an expert's last m block is mostly padding
# (1.48 blocks of 128 per expert at 128 rows). Band 0 / 64 / 32: DeepSeek-V3 gate-up M = 4096 grouped 544.6 / 540.9
# / 524.8, indexed 665.3 / 632.3 / 616.6; Qwen3-30B-A3B gate-up M = 4096 grouped 372.7 / 385.4 / 386.1, indexed
# 489.4 / 463.5 / 466.9; the down GEMMs and M = 1024 within 6 % either way. The padded wgmmas are not what bounds
# these kernels (README, Speed: the gate-up consumers wait for the gathering producer, the down GEMM's epilogue
# dominates), and the copies of the main loop doubled NVRTC time and made ptxas serialize the wgmmas ("insufficient
# register resources") in single-k-tile and zero-point / bias kernels. Also level (a later run, down M = 4096
# indexed 517.6 / 514.6 / 513.9 with / without / with): the indexed producer reading a unit's sorted ids beside its
# expert id instead of after the expert check. Re-tried 2026-12-04 (wgmma N 16 / 32 / 64 below a 128-token tile,
# once the grouped DeepSeek gate-up ran at 89.5 % of the tensor pipe, ncu): ptxas again serialized the wgmmas of
# the single-k-tile (K = 128) kernels (C7511), so it was dropped before timing.
# MoE gemm types generated (16-bit and 8-bit activations): indexed (rows gathered and scattered through moe_align's
# routing, one expert per m block) and the grouped layouts (dense row windows per expert, no split-K).
GROUPED_GEMMS = ("grouped_contiguous", "grouped_masked")
MOE_GEMMS = ("indexed",) + GROUPED_GEMMS


@attrs.frozen
class SmemPlan:
    """One stage: [activation panels | weight slices | group rows], padded to 1024 bytes; then the barriers."""

    a: int
    b: int
    group: int    # one group-parameter tensor's rows
    tensors: int
    stages: int
    staging: int = 0  # the consumer warps' epilogue staging, after the barriers (staging_bytes)
    widened: int = 0  # b_operand='widened': the stage's dequantized 16-bit weight panels, 1024-aligned after the rest

    @property
    def panel_offset(self) -> int:
        """Where a stage's widened weight panels start (the 128-byte swizzle needs 1024-byte alignment)."""
        raw = self.a + self.b + self.group * self.tensors
        return -(-raw // SMEM_ALIGN) * SMEM_ALIGN

    @property
    def stage(self) -> int:
        return self.panel_offset + self.widened  # (panels are whole 1024-byte groups of 8 swizzled rows)

    @property
    def barriers(self) -> int:
        return ring_barrier_bytes(bool(self.widened))

    @property
    def total(self) -> int:  # + barriers + staging + alignment slack
        return self.stages * (self.stage + self.barriers) + self.staging + SMEM_ALIGN

    def fits(self, target: Target, reserved: int = 0) -> bool:
        """`reserved`: more static shared memory (a grouped MoE schedule's expert prefix, expert_prefix_bytes)."""
        return self.total + STATIC_SMEM + reserved <= target.smem_per_block_optin


STAGED_MAX_ACC = 128  # accumulator registers per thread up to which the staged store fits beside them


def staged_store(layer: LayerConfig, tuning: TuningConfig, routed_gemm1: bool = False) -> bool:
    """Whole tiles of 16-bit outputs leave through the warps' staging buffers (StoreOutputStaged), where the
    consumers hold at most STAGED_MAX_ACC accumulators (176 tokens x 2 n tiles spill beside the staging); split-K
    slices store their shares fragment by fragment. Not a routed GEMM1 (indexed, no router weight, with or without
    the fused activation) of 16-bit activations, measured slower staged at large M (H200, same run, direct -> staged:
    Qwen3-30B-A3B W4A16 gate-up at M = 4096 463 -> 507 us, DeepSeek-V3 per rank 651 -> 676; at M = 1024 175 -> 168),
    while their routed down GEMMs (318 -> 277, 721 -> 535), the grouped ones (436 -> 378) and W4A8's gate-up
    (500 -> 485) gained."""
    if tuning.tokens_on == "m":
        return False  # token-row accumulators: StoreOutputRows stores a thread's column pairs directly
    acc = N_TILES_PER_SLICE // consumer_warpgroups(tuning) * tuning.block_m // 2
    if layer.scheme.activation is not None:
        acc = tuning.block_m // 2  # one 16-row n tile per warp (compose_a8)
    elif routed_gemm1:
        return False
    return layer.out_dtype in ("bfloat16", "float16") and tuning.split_k == 1 and acc <= STAGED_MAX_ACC


def staging_bytes(layer: LayerConfig, tuning: TuningConfig, routed_gemm1: bool = False) -> int:
    """Shared memory of the consumer warps' staging buffers (STAGING_BYTES each), 0 without staged stores."""
    return tuning.warps_n * STAGING_BYTES if staged_store(layer, tuning, routed_gemm1) else 0


def expert_prefix_bytes(layer: LayerConfig, compute: ComputeConfig) -> int:
    """Static shared memory of a grouped MoE schedule: each expert's first m block and the total (int32, E + 1)."""
    return 4 * (layer.num_experts + 1) if compute.gemm in GROUPED_GEMMS else 0


def consumer_warpgroups(tuning: TuningConfig) -> int:
    return tuning.warps_n // 4


def max_block_m(warpgroups: int) -> int:
    """Most tokens per tile: each warpgroup holds N_TILES_PER_SLICE / warpgroups m64 accumulators of block_m / 2."""
    return ACC_REGISTERS * 2 * warpgroups // N_TILES_PER_SLICE


def shared_memory(layer: LayerConfig, tuning: TuningConfig, routed_gemm1: bool = False) -> SmemPlan:
    """routed_gemm1: an indexed GEMM without router weights (staged_store); the heuristics size rings without it."""
    t = tuning
    group = group_plan(layer, t.block_k)
    slices = (t.block_n // LAYOUT_BLOCK_N) * (t.block_k // LAYOUT_WARP_K)
    return SmemPlan(a=t.block_m * t.block_k * 2, b=slices * b_slice_bytes(layer),
                    group=group.rows_per_stage * t.block_n * 2 if group else 0,
                    tensors=len(group.tensors) if group else 0, stages=t.stages,
                    staging=staging_bytes(layer, t, routed_gemm1),
                    widened=t.block_n * t.block_k * 2 if t.b_operand == "widened" else 0)


def b_slice_bytes(layer: LayerConfig) -> int:
    """Bytes of one (128-row layout block, 64-k slice) of the packed weight."""
    return LAYOUT_BLOCK_N * LAYOUT_WARP_K * layer.scheme.weight.bits // 8


def producer_registers(layer: LayerConfig, tuning: TuningConfig) -> int:
    if tuning.b_operand != "widened":
        return PRODUCER_REGISTERS
    s = layer.scheme
    hoisted = s.granularity != "group" or s.group_size % tuning.block_k == 0  # parameters read once per n tile
    return WIDEN_REGISTERS if s.weight.bits <= 4 and s.zero_point is None and hoisted else WIDEN_REGISTERS_WIDE


def launch_registers(threads: int) -> int:
    """Registers each thread holds at launch (__launch_bounds__(threads, 1): ptxas gives the kernel the register
    file's share in whole 8s, 168 at 384 threads): setmaxnreg moves registers between the warpgroups of a CTA, so
    their budgets must sum to at most threads x this, not to the register file (a consumer's setmaxnreg.inc past it
    waits forever)."""
    return min(256, REGISTER_FILE // threads // 8 * 8)


def consumer_registers(warpgroups: int, producer: int = PRODUCER_REGISTERS) -> int:
    """Registers per consumer thread after the producer gives its share back (setmaxnreg: multiples of 8, <= 256)."""
    threads = PRODUCER_THREADS * (1 + warpgroups)
    free = threads * launch_registers(threads) - PRODUCER_THREADS * producer
    return min(256, free // (128 * warpgroups) // 8 * 8)


def layout_reasons(layer: LayerConfig) -> list[str]:
    """What of the layer the pipeline cannot serve whatever the tuning."""
    reasons = []
    g = arbitrary_group_size(layer.scheme)
    if g is not None:
        reasons.append(f"group size {g} along K is not a multiple of 16: such groups are served by the standard "
                       f"pipeline")
    return reasons


def ring_reasons(tuning: TuningConfig, weight_multicast: bool = False, a_bulk: bool = False) -> list[str]:
    """What the warp-specialized ring takes of a tuning, whatever the activations: wgmma, a producer that
    copies activations (cp.async, or TMA through a tensor map) and bulk-copies the rest, one CTA per SM, split-K
    rather than stream-K; no clusters, except (`weight_multicast`: the 8-bit skeleton) two CTAs along M sharing
    weight stages (cluster 2x1, b_load='tma_multicast') or along N sharing activation stages (1x2,
    a_load='tma_multicast'). `a_bulk` (the 8-bit skeleton): a_load='tma' too, codes in the panels layout by bulk copy
    (compose_a8.panels_reasons says where)."""
    t = tuning
    reasons = []
    if t.mma != "wgmma":
        reasons.append(f"tuning.mma={t.mma!r}: the warp-specialized pipeline uses 'wgmma'")
    if a_bulk and t.a_load not in ("cp_async", "tma", "tma_multicast"):
        reasons.append(f"tuning.a_load={t.a_load!r}: the producer loads activation codes with 'cp_async', 'tma' "
                       f"(one bulk copy of codes in the panels layout) or 'tma_multicast' (half of it into both CTAs "
                       f"of a cluster along N)")
    elif not a_bulk and t.a_load not in ("cp_async", "tma"):
        reasons.append(f"tuning.a_load={t.a_load!r}: the producer loads 16-bit activations with 'cp_async' or 'tma' "
                       f"(a tensor map encoded per call: dense kernels and grouped MoE windows)")
    b_load = "tma_multicast" if t.cluster_m > 1 else "tma"
    if t.b_load != b_load or t.scale_load != "tma":
        reasons.append(f"tuning.b_load={t.b_load!r}, scale_load={t.scale_load!r} with cluster_m={t.cluster_m}: the "
                       f"producer bulk-copies weights and group rows (b_load={b_load!r}, scale_load='tma')")
    if (t.cluster_m, t.cluster_n) not in ({(1, 1), (2, 1), (1, 2)} if weight_multicast else {(1, 1)}):
        allowed = ("1x1, 2x1 (two m tiles sharing weight stages) or 1x2 (two n tiles sharing activation stages)"
                   if weight_multicast else "1x1")
        reasons.append(f"tuning cluster={t.cluster_m}x{t.cluster_n}: clusters (multicast) are not generated for "
                       f"this warp-specialized kernel; allowed: {allowed}")
    if t.stream_k:
        reasons.append("tuning.stream_k: the warp-specialized pipeline uses split_k over its persistent grid")
    if t.ctas_per_sm != 1:
        reasons.append(f"tuning.ctas_per_sm={t.ctas_per_sm}: one CTA per SM (its warpgroups share the register file)")
    return reasons


def tuning_reasons(tuning: TuningConfig) -> list[str]:
    t = tuning
    reasons = ring_reasons(t)
    if t.block_n != BLOCK_N:
        reasons.append(f"tuning.block_n={t.block_n}: the warp-specialized tile has {BLOCK_N} weight rows (four 64-row "
                       f"slices of the weight layout)")
    if t.warps_n not in (4, 8) or t.warps_m != 1 or t.warps_k != 1:
        reasons.append(f"tuning warps={t.warps_m}x{t.warps_n}x{t.warps_k}: one or two consumer warpgroups, "
                       f"warps 1x4x1 or 1x8x1")
    elif t.block_m > max_block_m(consumer_warpgroups(t)):
        reasons.append(f"tuning.block_m={t.block_m}: at most {max_block_m(consumer_warpgroups(t))} tokens per tile "
                       f"with {consumer_warpgroups(t)} consumer warpgroup(s) (their m64 wgmma accumulators must fit "
                       f"{ACC_REGISTERS} registers of a consumer thread)")
    if t.block_k not in (64, 128):
        reasons.append(f"tuning.block_k={t.block_k}: 64 or 128 (one or two 64-k chunks of the weight layout; the "
                       f"producer's activation rows keep their swizzle up to 16 chunks per row)")
    if t.tokens_on != "n":
        reasons.append(f"tuning.tokens_on={t.tokens_on!r}: with 16-bit activations the tokens are wgmma's N (swap-AB)")
    if t.b_operand == "shared":
        reasons.append(f"tuning.b_operand={t.b_operand!r}: with 16-bit activations the weights are dequantized, "
                       f"into the register operand ('registers') or shared-memory panels ('widened'); 'shared' "
                       f"serves 8-bit weights x 8-bit activations")
    return reasons


WIDENED_SPARE_REGISTERS = 40  # a widened consumer's registers beside its accumulators (descriptors, addresses)


def widened_max_block_m(layer: LayerConfig, tuning: TuningConfig) -> int:
    """Most tokens of a widened tile: the consumers' accumulators (block_m registers with two warpgroups) and
    WIDENED_SPARE_REGISTERS within their setmaxnreg budget, which the widening's shrinks (176 tokens with a 64-register
    widening, 160 with 96: at 176 ptxas serialized the wgmmas, C7512)."""
    budget = consumer_registers(consumer_warpgroups(tuning), producer_registers(layer, tuning))
    per_token = N_TILES_PER_SLICE // consumer_warpgroups(tuning) // 2  # accumulator registers per token
    return (budget - WIDENED_SPARE_REGISTERS) // per_token // 16 * 16


def widened_reasons(layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig) -> list[str]:
    """What b_operand='widened' (the producer warpgroup's warps 1-3 dequantize each stage into 16-bit panels that
    wgmma reads) needs with 16-bit activations: a producer whose warp 0 alone copies, so activations by TMA (dense
    layers and grouped MoE windows; indexed MoE rows are gathered by all producer threads' cp.asyncs), and tiles
    whose accumulators fit the consumers' smaller budget (widened_max_block_m)."""
    reasons = []
    if tuning.block_k != 64:
        reasons.append(f"b_operand='widened' with block_k={tuning.block_k}: 64-k stages (a stage's 16-bit panels take "
                       f"block_n x block_k x 2 bytes: two 128-k stages do not fit shared memory from about 96 tokens)")
    if tuning.a_load != "tma" or compute.gemm == "indexed":
        reasons.append(f"b_operand='widened' with a_load={tuning.a_load!r}, gemm={compute.gemm!r}: the producer "
                       f"warpgroup's warp 0 alone copies, so the activations come by TMA (a_load='tma': dense layers "
                       f"and grouped MoE windows)")
    most, widening = widened_max_block_m(layer, tuning), producer_registers(layer, tuning)
    if tuning.block_m > most:
        budget = consumer_registers(consumer_warpgroups(tuning), widening)
        reasons.append(f"b_operand='widened' with block_m={tuning.block_m}: at most {most} tokens, whose "
                       f"accumulators fit the consumers' {budget} registers beside the widening warps' {widening}")
    return reasons


def gathered_rows_per_pass(block_k: int, element_bytes: int) -> int:
    """Rows of an MoE activation tile the producer gathers per pass: its threads over a row's 16-byte chunks."""
    return PRODUCER_THREADS * (16 // element_bytes) // block_k


def moe_persistent_schedule(compute: ComputeConfig) -> Component:
    """The persistent schedule of an MoE gemm type: the routing's m blocks, or m blocks of the experts' row windows."""
    if compute.gemm == "indexed":
        return MoeIndexedPersistentSchedule()
    return MoeGroupedPersistentSchedule(masked=compute.gemm == "grouped_masked")


def moe_tuning_reasons(tuning: TuningConfig, element_bytes: int = 2) -> list[str]:
    """What an indexed MoE kernel needs of the tuning beyond a dense one (split-K: pipelines.standard.moe), with
    activations of `element_bytes` (2, or 1 for 8-bit codes)."""
    rows_per_pass = gathered_rows_per_pass(tuning.block_k, element_bytes)
    if tuning.block_m % rows_per_pass:
        return [f"tuning.block_m={tuning.block_m}: gathered MoE rows come {rows_per_pass} per producer pass with "
                f"block_k={tuning.block_k}; use a multiple of {rows_per_pass}"]
    return []


def compose(layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig, target: Target) -> KernelPlan:
    """Choose and parametrise the components of one kernel; ComposeError lists everything that is off."""
    s = layer.scheme
    t = tuning
    moe = compute.gemm in MOE_GEMMS
    gather = compute.gemm == "indexed"  # rows through the routing; grouped types read row windows
    grouped = compute.gemm if compute.gemm in GROUPED_GEMMS else ""
    reasons = (common_reasons(layer, compute, target, moe_gemms=MOE_GEMMS) + layout_reasons(layer)
               + tuning_reasons(t) + moe_reasons(layer, compute, t))
    reasons += moe_tuning_reasons(t) if gather else []
    a_tma = t.a_load == "tma"
    if a_tma and gather:
        reasons.append("tuning.a_load='tma' with gemm='indexed': its rows are gathered through the routing with "
                       "'cp_async' (a tensor map serves dense activations and grouped row windows)")
    widened = t.b_operand == "widened"
    reasons += widened_reasons(layer, compute, t) if widened else []
    k_tiles = math.ceil(layer.k / t.block_k)
    reasons += split_k_reasons(layer, t)
    if reasons:
        raise compose_error(reasons)
    dtype = layer.dtype
    warpgroups = consumer_warpgroups(t)
    b_layout = BLayout(block_n=LAYOUT_BLOCK_N, warps_n=LAYOUT_BLOCK_N // LAYOUT_WARP_N, warp_k=LAYOUT_WARP_K,
                       bits=s.weight.bits)
    n_pad = math.ceil(layer.n / LAYOUT_BLOCK_N) * LAYOUT_BLOCK_N
    k_pad = padded_k(layer)
    group = group_plan(layer, t.block_k)
    hoist = bool(group and group.group_size % t.block_k == 0)

    numeric, apply, convert_in_extract = dequant_chain(layer, group, t.block_m // 8, slice_scale=False,
                                                       warp_k=LAYOUT_WARP_K)
    memory: list[Component] = [ATileTma(dtype=dtype) if a_tma else ATileSw128CpAsync(dtype=dtype, gather=gather),
                               BChunkShared(bits=s.weight.bits),
                               WeightStageBulk(group_params=group.tensors if group else ())]
    if group is not None:
        memory.append(GroupParamsShared(dtype=dtype, tensors=group.tensors, float_scales=False, pair_loads=True))
    if widened:
        memory.append(WeightWidenDequant(dtype=dtype, group_params=group.tensors if group else (),
                                         dequant_params=apply.params, convert_in_extract=convert_in_extract,
                                         hoist_group_params=hoist))
    mma: list[Component] = [(WgmmaSS if widened else WgmmaRS)(dtype=dtype, n=t.block_m)]
    schedule: list[Component] = [moe_persistent_schedule(compute) if moe else PersistentSchedule(split_k=t.split_k)]
    epilogue: list[Component] = []
    if t.split_k > 1:
        epilogue.append(SplitKParallelReduce(split_k=t.split_k, sync="consumer_sync()",
                                             leader=f"threadIdx.x == {PRODUCER_THREADS}"))
    # indexed MoE: each row to its assignment's row of c (times its router weight), or the gated activation of GEMM1:
    # the accumulators of a warp hold 16-row tiles in mma.sync's C order, so the standard epilogue serves both;
    # grouped MoE: the dense rows of the unit below its window's end (p.m, for_expert)
    routed_gemm1 = compute.gemm == "indexed" and not compute.topk_weight
    # (an atomic top-k reduction adds into the tokens' fp32 rows directly, unstaged: epilogue.topk_atomic)
    staged = staged_store(layer, t, routed_gemm1) and compute.topk_reduce is None
    epilogue.append(fused_topk_store(compute, (StoreOutputStaged if staged else StoreOutput)(
        dtype=dtype, out_dtype=layer.out_dtype, out_scale=out_scale_of(layer, group, LAYOUT_WARP_K),
        bias=layer.has_bias,
        atom=WGMMA_M64NNK16_WARP, fragment_store=t.split_k > 1, row_map=gather, topk_weight=compute.topk_weight,
        gated=compute.epilogue_activation or "", tile_rows=gather,
        **({"prefetch_rows": True} if staged and gather and PREFETCH_CHUNK_ROWS else {}))))
    # MoE: the stacked weight tensors rebased to a unit's expert, with their bytes per expert
    per_expert = expert_bytes(layer, group, n_pad, k_pad)
    experts = expert_tensors(dense_args(layer, group, False, LAYOUT_WARP_K), per_expert) if moe else ()
    pdl = target.has("pdl")
    # _wd: weights dequantized into shared-memory panels by the producer warpgroup
    name = kernel_name(layer, t, target, suffix="_ws" + moe_name_suffix(compute) + ("_wd" if widened else ""))
    pipeline = WarpSpecializedPipeline(kernel_name=name, block_m=t.block_m, consumer_warpgroups=warpgroups,
                                       group_params=group.tensors if group else (), hoist_group_params=hoist,
                                       dequant_params=apply.params, convert_in_extract=convert_in_extract,
                                       split_k=t.split_k > 1, pdl=pdl, expert_tensors=experts, grouped=grouped,
                                       staged_store=staged, a_tma=a_tma, widened=widened)
    body = numeric + memory + mma + schedule + epilogue + [pipeline]
    components = (tuple(wrappers_for(body, dtype, output_dtype(layer, compute), layer.has_bias, t.block_m // 8))
                  + tuple(body))
    reasons = missing_features(components, target) + missing_symbols(components)
    if reasons:
        raise compose_error(reasons)

    smem = shared_memory(layer, t, routed_gemm1)
    prefix = expert_prefix_bytes(layer, compute)
    if not smem.fits(target, prefix):
        raise compose_error([f"shared memory {smem.total} B (stages={t.stages} x {smem.stage} B) + "
                             f"{STATIC_SMEM + prefix} B static exceeds {target.name}'s "
                             f"{target.smem_per_block_optin} B per block"])
    threads = PRODUCER_THREADS * (1 + warpgroups)
    slice_bytes = b_slice_bytes(layer)
    constants = constants_table(layer, n_pad, k_pad) + [
        ("kBlockM", t.block_m, "tokens per tile (wgmma N)"), ("kBlockN", t.block_n, "weight rows per tile"),
        ("kBlockK", t.block_k, ""),
        ("kNTiles", math.ceil(n_pad / t.block_n), "tiles along N"), ("kKTiles", k_tiles, "k tiles of kBlockK"),
        ("kStages", t.stages, "ring depth"), ("kStepsPerStage", t.block_k // 16, "k16 wgmma steps per stage"),
        ("kThreads", threads, "one producer and the consumer warpgroups"),
        ("kProducerThreads", PRODUCER_THREADS, ""), ("kConsumerWarpgroups", warpgroups, ""),
        ("kConsumerWarps", 4 * warpgroups, ""), ("kConsumerThreads", 128 * warpgroups, ""),
        ("kWarpsMN", 4 * warpgroups, "consumer warps (the split-K hand-off's warp count)"),
        ("kProducerRegisters", producer_registers(layer, t), "setmaxnreg budgets"
         + (" (the producer warpgroup's warps 1-3 dequantize)" if widened else "")),
        ("kConsumerRegisters", consumer_registers(warpgroups, producer_registers(layer, t)), ""),
        ("kWarpNTiles", N_TILES_PER_SLICE // warpgroups,
         "n tiles of its slice per consumer warp = m64 wgmma instructions per warpgroup and step"),
        ("kWarpMTiles", t.block_m // 8, "8-token accumulator groups"),
        ("kBSliceBytes", slice_bytes, "one 128-row layout block x 64 k of packed weight"),
        ("kBWarpSliceWords", slice_bytes // 4 // 2, "one 64-row warp slice of it, in words"),
        ("kSlicesPerStage", t.block_k // LAYOUT_WARP_K, ""),
        ("kSlicesPerN", k_pad // LAYOUT_WARP_K, "64-k slices per layout block of the packed weight"),
        ("kSmemAlign", SMEM_ALIGN, ""),
    ]
    constants += split_k_constants(t) + group_constants(group, t.block_k)
    constants += [(constant, per_expert[name], f"bytes of one expert's {name}") for name, constant in experts]
    constants += [("kNumExperts", layer.num_experts, "")] if grouped else []
    constants += [("kAStageBytes", smem.a, ""), ("kStageBytes", smem.stage, "")]
    constants += [("kBPanelBytes", t.block_n * 128, "one 64-k panel of the stage's dequantized weights (all rows)"),
                  ("kBPanelOffset", smem.panel_offset, "a stage's dequantized weight panels, after its other parts"),
                  ("kWidenThreads", WIDEN_THREADS, "warps 1-3 of the producer warpgroup")] if widened else []
    constants += [("kStagingBytes", STAGING_BYTES, "a consumer warp's epilogue staging")] if staged else []
    constants += group_offset_constants(group, smem.a + smem.b, smem.group)
    launch = PersistentLaunch(n_tiles=math.ceil(n_pad / t.block_n), block_m=t.block_m, block_n=t.block_n,
                              split_k=t.split_k, slots=target.sm_count, experts=layer.num_experts if moe else 1,
                              moe_gemm=compute.gemm if moe else "")
    return KernelPlan(layer=layer, compute=compute, tuning=t, target=target, pipeline="warp_specialized",
                      kernel_name=name, components=components, constants=tuple(constants),
                      args=dense_args(layer, group, t.split_k > 1, LAYOUT_WARP_K, compute, a_map=a_tma),
                      layout=weight_layout(layer, b_layout, n_pad, group),
                      group=group, shared_bytes=smem.total, threads=threads, pdl=pdl, launch=launch)

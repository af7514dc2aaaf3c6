"""compose() of the standard pipeline: (LayerConfig, ComputeConfig, TuningConfig, Target) -> a KernelPlan of a
cp.async ring + ldmatrix + in-register dequantization + mma.sync kernel.

Every choice between strategies is made here, as readable tables; components only render what they are given.
"""

from __future__ import annotations

import math

import attrs

from humming_gen.components.base import Component
from humming_gen.components.epilogue.output import SplitKReduce, StoreOutput
from humming_gen.components.epilogue.topk_atomic import fused_topk_store, output_dtype
from humming_gen.components.memory.shared_reads import BChunkShared, GroupParamsShared
from humming_gen.components.mma.mma_sync import MmaSyncM16N8K16
from humming_gen.components.ptx.wrappers import wrappers_for
from humming_gen.components.schedule.dense import DenseSchedule, DenseSplitKSchedule
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.pipelines.base import KernelPlan, TiledLaunch, compose_error
from humming_gen.pipelines.common import (K_ALIGN, common_reasons, constants_table, dense_args, dequant_chain,
                                          group_constants, group_offset_constants, group_plan, out_scale_of,
                                          kernel_name, missing_features, missing_symbols, padded_k, split_k_constants,
                                          split_k_reasons, weight_layout)
from humming_gen.pipelines.standard import compose_a8
from humming_gen.pipelines.standard.moe import (MOE_GEMMS, expert_bytes, expert_tensors, moe_name_suffix, moe_reasons,
                                               moe_schedule)
from humming_gen.pipelines.standard.loaders import ATileCpAsync, BTileCpAsync, GroupParamsCpAsync
from humming_gen.pipelines.standard.skeleton import StandardPipeline, WarpKReduce
from humming_gen.schemes.packing import BLayout, BLayout8, BLayoutNibble8
from humming_gen.targets import Target

SLICE_SCALE_MAX_M_TILES = 2  # beyond this, scaling partial sums costs more than scaling weights
SMEM_PER_CTA_RESERVED = 1024  # shared memory the driver keeps per resident CTA
# Dense split-K kernels load the store's column scales / biases before the reductions (StoreOutput.preload_factors),
# off the last slice's serial tail (8 dependent loads after its workspace reads, SASS of W4A16 MXFP4 M = 1). H200,
# 8192^2, graph us (bench/carry_exponent.py, 2026-12-02), in the store -> preloaded: W4A16 MXFP4 M = 1 / 16
# 21.4 / 25.5 -> 18.9 / 22.4, NVFP4 21.4 / 25.2 -> 19.0 / 22.2. False keeps the loads in the store (for measurements).
PRELOAD_SPLIT_K_FACTORS = True


@attrs.frozen
class SmemPlan:
    """Shared-memory layout of one stage (each part 128-byte aligned) and the kernel's total."""

    a: int         # activation tile
    b: int         # packed weight tile
    group: int     # one group-parameter tensor's rows
    tensors: int   # group-parameter tensors (scales, zero points)
    rows: int      # group rows per stage
    stages: int
    reduce: int    # the k-warp reduction, which reuses the ring after the main loop

    @property
    def stage(self) -> int:
        return self.a + self.b + self.group * self.tensors

    @property
    def total(self) -> int:
        return max(self.stages * self.stage, self.reduce)

    def group_note(self) -> str:
        return f", {self.tensors} x {self.rows} group rows" if self.tensors else ""


def _align(x: int) -> int:
    return (x + 127) // 128 * 128


def b_layout_of(layer: LayerConfig, tuning: TuningConfig) -> "BLayout | BLayout8 | BLayoutNibble8":
    t = tuning
    if layer.scheme.activation is not None:  # 8-bit operands; weights of at most 4 bits stored as nibbles
        order = compose_a8.nibble_order(layer)
        if order is not None:
            return BLayoutNibble8(block_n=t.block_n, warps_n=t.warps_n, warp_k=t.block_k // t.warps_k, order=order)
        return BLayout8(block_n=t.block_n, warps_n=t.warps_n, warp_k=t.block_k // t.warps_k)
    return BLayout(block_n=t.block_n, warps_n=t.warps_n, warp_k=t.block_k // t.warps_k, bits=layer.scheme.weight.bits)


def shared_memory(layer: LayerConfig, tuning: TuningConfig) -> SmemPlan:
    """The shared memory a standard-pipeline kernel of these configs uses (compose and the heuristics agree)."""
    t = tuning
    warp_m, warp_n = t.block_m // t.warps_m, t.block_n // t.warps_n
    acc_floats = (warp_n // 16) * (warp_m // 8) * 4 * 32
    if layer.scheme.activation is not None:  # 8-bit codes; group scales from global memory, or staged weight ones
        rows = compose_a8.weight_scale_rows(layer, t.block_k)
        return SmemPlan(a=_align(t.block_m * t.block_k), b=_align(b_layout_of(layer, t).stage_bytes(t.warps_k)),
                        group=compose_a8.weight_scale_stage_bytes(layer, t), tensors=1 if rows else 0,
                        rows=rows or 0, stages=t.stages,
                        reduce=(t.warps_k - 1) * t.warps_m * t.warps_n * acc_floats * 4)
    group = group_plan(layer, t.block_k)
    return SmemPlan(a=_align(t.block_m * t.block_k * 2), b=_align(b_layout_of(layer, t).stage_bytes(t.warps_k)),
                    group=_align(group.rows_per_stage * t.block_n * 2) if group else 0,
                    tensors=len(group.tensors) if group else 0, rows=group.rows_per_stage if group else 0,
                    stages=t.stages, reduce=(t.warps_k - 1) * t.warps_m * t.warps_n * acc_floats * 4)


def shared_reasons(smem: SmemPlan, tuning: TuningConfig, target: Target) -> list[str]:
    """Why CTAs of this shared-memory plan and tuning do not fit the target's SMs."""
    t, shared = tuning, smem.total
    reasons = []
    if shared > target.smem_per_block_optin:
        reasons.append(f"shared memory {shared} B (stages={t.stages} x {smem.stage} B{smem.group_note()}) "
                       f"exceeds {target.name}'s {target.smem_per_block_optin} B per block")
    elif t.ctas_per_sm > 1 and t.ctas_per_sm * (shared + SMEM_PER_CTA_RESERVED) > target.smem_per_sm:
        reasons.append(f"tuning.ctas_per_sm={t.ctas_per_sm}: {t.ctas_per_sm} x ({shared} B + "
                       f"{SMEM_PER_CTA_RESERVED} B reserved) of shared memory exceed {target.name}'s "
                       f"{target.smem_per_sm} B per SM")
    if t.threads * t.ctas_per_sm > target.max_threads_per_sm:
        reasons.append(f"tuning.ctas_per_sm={t.ctas_per_sm} x {t.threads} threads exceed {target.name}'s "
                       f"{target.max_threads_per_sm} threads per SM")
    return reasons


def tuning_reasons(tuning: TuningConfig) -> list[str]:
    """TuningConfig fields this pipeline does not use with the values given."""
    t = tuning
    reasons = []
    if t.mma != "m16n8k16":
        reasons.append(f"tuning.mma={t.mma!r}: the standard pipeline uses 'm16n8k16'")
    if t.stream_k:
        reasons.append("tuning.stream_k: the standard pipeline uses split_k")
    if t.a_load != "cp_async" or t.b_load != "cp_async" or t.scale_load != "cp_async":
        reasons.append("the standard pipeline loads every tensor with cp_async")
    if t.cluster_m * t.cluster_n != 1:
        reasons.append("the standard pipeline launches no clusters (cluster_m = cluster_n = 1)")
    return reasons


def compose(layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig, target: Target) -> KernelPlan:
    """Choose and parametrise the components of one kernel; ComposeError lists everything that is off."""
    s = layer.scheme
    t = tuning
    if s.activation is not None:
        smem = shared_memory(layer, t)
        reasons = (common_reasons(layer, compute, target, quantized_activations=True, moe_gemms=MOE_GEMMS,
                                  quantized_output=True)
                   + moe_reasons(layer, compute, t) + shared_reasons(smem, t, target))
        return compose_a8.compose(layer, compute, t, target, reasons, b_layout_of(layer, t), smem.total, smem.stage,
                                  smem.a)
    reasons = common_reasons(layer, compute, target, moe_gemms=MOE_GEMMS) + tuning_reasons(t)
    moe = compute.gemm in MOE_GEMMS
    gather = compute.gemm == "indexed"  # rows through the routing; grouped types read row windows
    reasons += moe_reasons(layer, compute, t)
    dtype = layer.dtype
    warp_n, warp_k = t.block_n // t.warps_n, t.block_k // t.warps_k
    warp_m = t.block_m // t.warps_m
    if warp_m % 8:
        reasons.append(f"warp tile m = block_m/warps_m = {warp_m} is not a multiple of 8")
    b_layout = b_layout_of(layer, t)
    reasons += b_layout.check()
    if K_ALIGN % t.block_k:
        reasons.append(f"tuning.block_k={t.block_k} must divide {K_ALIGN} (the K padding shared by a layer's kernels)")
    n_pad = math.ceil(layer.n / t.block_n) * t.block_n
    k_pad = padded_k(layer)
    k_tiles = math.ceil(layer.k / t.block_k)
    reasons += split_k_reasons(layer, t)
    group = group_plan(layer, t.block_k)
    if reasons:
        raise compose_error(reasons)

    # --- components, by family ---------------------------------------------------------------
    # Where a warp's stage slice lies in one group and few m tiles share each weight, the group scale is applied
    # to the slice's fp32 partial sums (per row, once per stage) instead of to every dequantized weight.
    hoist = bool(group and not group.arbitrary and group.group_size % warp_k == 0)
    slice_scale = hoist and warp_m // 8 <= SLICE_SCALE_MAX_M_TILES and s.zero_point != "float"
    numeric, apply, convert_in_extract = dequant_chain(layer, group, warp_m // 8, slice_scale, warp_k)
    memory: list[Component] = [ATileCpAsync(dtype=dtype, block_k=t.block_k, warp_m_tiles=warp_m // 8, gather=gather),
                               BChunkShared(bits=s.weight.bits),
                               BTileCpAsync(bits=s.weight.bits, tile_bytes=b_layout.stage_bytes(t.warps_k))]
    if group is not None:
        # An odd group size can put a group boundary inside a register's (k, k + 1) pair: each element then reads
        # its own row, and the broadcasting pair load is not used.
        odd = group.arbitrary and group.group_size % 2 == 1
        memory += [GroupParamsCpAsync(dtype=dtype, tensors=group.tensors, arbitrary_groups=group.arbitrary),
                   GroupParamsShared(dtype=dtype, tensors=group.tensors, float_scales=slice_scale,
                                     pair_loads=(not slice_scale or s.zero_point is not None) and not odd,
                                     arbitrary_groups=group.arbitrary, odd_group_size=odd)]
    mma: list[Component] = [MmaSyncM16N8K16(dtype=dtype)]
    schedule: list[Component] = [moe_schedule(compute, t.split_k) if moe else
                                 DenseSplitKSchedule(split_k=t.split_k) if t.split_k > 1 else DenseSchedule()]
    epilogue: list[Component] = []
    if t.warps_k > 1:
        epilogue.append(WarpKReduce(warps_k=t.warps_k))
    if t.split_k > 1:
        epilogue.append(SplitKReduce(split_k=t.split_k))
    out_scale = out_scale_of(layer, group, warp_k)
    # dense split-K kernels load their column factors before the hand-off: off the last slice's serial tail
    preload = PRELOAD_SPLIT_K_FACTORS and t.split_k > 1 and not moe and (out_scale or layer.has_bias)
    # (an atomic top-k reduction: the same factors, added into the tokens' fp32 rows: epilogue.topk_atomic)
    epilogue.append(fused_topk_store(compute, StoreOutput(
        dtype=dtype, out_dtype=layer.out_dtype, out_scale=out_scale, bias=layer.has_bias, row_map=gather,
        topk_weight=compute.topk_weight, gated=compute.epilogue_activation or "", preload_factors=preload)))
    # MoE: the stacked weight tensors the kernel rebases to its block's expert, with their bytes per expert
    per_expert = expert_bytes(layer, group, n_pad, k_pad)
    experts = expert_tensors(dense_args(layer, group, False, warp_k), per_expert) if moe else ()
    pdl = target.has("pdl")
    name = kernel_name(layer, t, target, suffix=moe_name_suffix(compute))
    pipeline = StandardPipeline(kernel_name=name, group_params=group.tensors if group else (),
                                hoist_group_params=hoist, slice_scale=slice_scale, dequant_params=apply.params,
                                convert_in_extract=convert_in_extract,
                                warp_k_reduce=t.warps_k > 1, split_k=t.split_k > 1, min_blocks=t.ctas_per_sm,
                                pdl=pdl, arbitrary_groups=bool(group and group.arbitrary),
                                expert_tensors=experts, grouped=moe and not gather, preload_factors=preload)
    body = numeric + memory + mma + schedule + epilogue + [pipeline]
    components = (tuple(wrappers_for(body, dtype, output_dtype(layer, compute), layer.has_bias, warp_m // 8))
                  + tuple(body))
    reasons = missing_features(components, target) + missing_symbols(components)
    if reasons:
        raise compose_error(reasons)

    # --- shared memory ---------------------------------------------------------------------------
    smem = shared_memory(layer, t)
    a_bytes, b_bytes, group_bytes, stage_bytes = smem.a, smem.b, smem.group, smem.stage
    shared = smem.total
    reasons = shared_reasons(smem, t, target)
    if reasons:
        raise compose_error(reasons)

    constants = constants_table(layer, n_pad, k_pad) + [
        ("kBlockM", t.block_m, ""), ("kBlockN", t.block_n, ""), ("kBlockK", t.block_k, ""),
        ("kWarpsM", t.warps_m, ""), ("kWarpsN", t.warps_n, ""), ("kWarpsK", t.warps_k, ""),
        ("kWarpsMN", t.warps_m * t.warps_n, ""),
        ("kWarpM", warp_m, "warp tile"), ("kWarpN", warp_n, ""), ("kWarpK", warp_k, ""),
        ("kWarpMTiles", warp_m // 8, "m8 mma tiles per warp"), ("kWarpNTiles", warp_n // 16, "n16 mma tiles per warp"),
        ("kChunksPerWarp", b_layout.chunks_per_warp, "16-tile weight chunks per warp and stage"),
        ("kThreads", t.threads, ""), ("kStages", t.stages, "cp.async ring depth"),
        ("kKTiles", k_tiles, "k tiles of kBlockK covering K"),
        ("kBStride", k_pad // t.block_k * b_layout.stage_bytes(t.warps_k) // 16,
         "16-byte chunks per n block of the packed weight"),
    ]
    constants += split_k_constants(t) + group_constants(group, t.block_k)
    constants += [(constant, per_expert[name], f"bytes of one expert's {name}") for name, constant in experts]
    constants += [("kNumExperts", layer.num_experts, "")] if moe else []
    constants += [("kAStageBytes", a_bytes, ""), ("kStageBytes", stage_bytes, "")]
    constants += group_offset_constants(group, a_bytes + b_bytes, group_bytes)

    return KernelPlan(layer=layer, compute=compute, tuning=t, target=target, pipeline="standard", kernel_name=name,
                      components=components, constants=tuple(constants),
                      args=dense_args(layer, group, t.split_k > 1, warp_k, compute),
                      layout=weight_layout(layer, b_layout, n_pad, group), group=group, shared_bytes=shared,
                      threads=t.threads, pdl=pdl,
                      launch=TiledLaunch(n_tiles=n_pad // t.block_n, block_m=t.block_m, block_n=t.block_n,
                                         split_k=t.split_k, experts=layer.num_experts if moe else 1,
                                         moe_gemm=compute.gemm if moe else ""))


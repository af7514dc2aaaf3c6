"""compose(): (LayerConfig, ComputeConfig, TuningConfig, Target) -> a KernelPlan, the component graph of one
kernel plus everything the runtime needs (constants, argument layout, launch facts, weight layout).

Every choice between strategies is made here, as readable tables; components only render what they are given.
"""

from __future__ import annotations

import math

import attrs

from humming_gen.components.base import Component
from humming_gen.components.epilogue.output import SplitKReduce, StoreOutput, WarpKReduce
from humming_gen.components.memory.loaders import ATileCpAsync, BTileCpAsync, GroupParamsCpAsync
from humming_gen.components.mma.mma_sync import MmaSyncM16N8K16
from humming_gen.components.numeric.convert import kernel_codes_offset, select_converter
from humming_gen.components.numeric.extract import PlaneExtract, ThreeBitSharedShiftExtract
from humming_gen.components.numeric.scale_apply import (FloatZeroPointScale, IntZeroPoint, IntZeroPointScale,
                                                         SubtractOffset, SubtractOffsetScale)
from humming_gen.components.pipeline.standard import StandardPipeline, offset_constant
from humming_gen.components.ptx.wrappers import wrapper
from humming_gen.components.schedule.dense import DenseSchedule, DenseSplitKSchedule
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.schemes import QuantScheme
from humming_gen.schemes.packing import BLayout
from humming_gen.targets import Target

SECTION_ORDER = ("ptx", "numeric", "memory", "mma", "schedule", "epilogue", "pipeline")
PTX_ORDER = ("smem_address", "cp_async", "ldmatrix", "prmt", "and_or", "and_xor", "fma2", "cvt_scalar",
             "global_sync", "grid_dependency")


class ComposeError(ValueError):
    """The configs cannot be served by any pipeline on this target; the message lists every reason."""


@attrs.frozen
class GroupPlan:
    """How per-group parameters reach the kernel: group size along K in the kernel layout, rows per k tile.

    `arbitrary`: the group size is not a multiple of the mma k step (16), so groups do not line up with k tiles.
    Each stage then loads the group rows its k range touches, starting at row k0 // group_size, and every A
    fragment register finds its own row from its k (templates/memory/group_params_cp_async.cuh.j2).
    """

    group_size: int          # elements of K per kernel group row
    rows: int                # kernel group rows (K_pad / group_size, rounded up)
    rows_per_stage: int      # rows a stage loads
    tensors: tuple[str, ...]  # "b_scale", "b_zero"
    arbitrary: bool = False  # group_size is not a multiple of 16 (see above)


@attrs.frozen
class KernelPlan:
    layer: LayerConfig
    compute: ComputeConfig
    tuning: TuningConfig
    target: Target
    kernel_name: str
    components: tuple[Component, ...]
    constants: tuple[tuple[str, int, str], ...]
    param_fields: tuple[tuple[str, str, str], ...]
    b_layout: BLayout
    n_pad: int
    k_pad: int
    group: GroupPlan | None
    zero_point: str | None        # None | "int" | "float"
    converter_bias: float         # what the converter adds (magic number), for zero-point packing
    code_offset: int              # XOR applied to stored codes (signed -> offset binary)
    out_scale: bool
    shared_bytes: int
    threads: int
    pdl: bool

    def grid(self, m: int) -> tuple[int, int, int]:
        t = self.tuning
        return (self.n_pad // t.block_n, max(1, math.ceil(m / t.block_m)), t.split_k)

    def workspace_floats(self, m: int) -> int:
        """fp32 workspace for split-K partial tiles at this M (0 without split-K)."""
        t = self.tuning
        if t.split_k == 1:
            return 0
        gx, gy, _ = self.grid(m)
        return gx * gy * t.split_k * t.block_m * t.block_n

    def counter_count(self, m: int) -> int:
        gx, gy, _ = self.grid(m)
        return gx * gy if self.tuning.split_k > 1 else 0


SLICE_SCALE_MAX_M_TILES = 2  # beyond this, scaling partial sums costs more than scaling weights
SHARED_SHIFT_MAX_M_TILES = 2  # 3-bit shared-shift extraction up to this many m8 tiles per warp
K_ALIGN = 256  # K is padded to a multiple of this; every block_k divides it, so a layer's kernels share weights


def kernel_group_size(group_size: int) -> int:
    """Group size of the kernel layout: the scheme's, or a divisor of it that every block_k works with
    (scales are then repeated): 48 -> 16, 384 -> 128."""
    if group_size % K_ALIGN == 0 or K_ALIGN % group_size == 0:
        return group_size
    return math.gcd(group_size, K_ALIGN)


def arbitrary_group_size(scheme: QuantScheme) -> int | None:
    """The scheme's group size along K when no kernel group size that is a multiple of 16 serves it (8, 24, 40,
    100, 7, a block scale of K side 24), else None. Such groups keep their own size in the kernel layout."""
    if scheme.granularity == "group":
        g = scheme.group_size
    elif scheme.granularity == "block":
        g = scheme.block_size[1]
    else:
        return None
    return g if kernel_group_size(g) % 16 else None


def arbitrary_rows_per_stage(group_size: int, block_k: int) -> int:
    """Most group rows a k tile [k0, k0 + block_k) touches, k0 a multiple of block_k: k0 % group_size is a
    multiple of gcd(block_k, group_size), at most group_size - gcd, and the tile spans that many more elements."""
    return (block_k - 1 + group_size - math.gcd(block_k, group_size)) // group_size + 1


def _group_plan(layer: LayerConfig, tuning: TuningConfig, k_pad: int) -> GroupPlan | None:
    s = layer.scheme
    tensors = ("b_scale", "b_zero") if s.zero_point is not None else ("b_scale",)
    bk = tuning.block_k
    arbitrary = arbitrary_group_size(s)
    if arbitrary is not None:
        rows = math.ceil(k_pad / arbitrary)  # the last, (k_pad - 1) // group_size, holds the last padded k
        per_stage = min(rows, arbitrary_rows_per_stage(arbitrary, bk))
        return GroupPlan(group_size=arbitrary, rows=rows, rows_per_stage=per_stage, tensors=tensors, arbitrary=True)
    if s.granularity == "group":
        g = kernel_group_size(s.group_size)
    elif s.granularity == "block":
        g = kernel_group_size(s.block_size[1])
    elif s.granularity == "channel" and s.zero_point is not None:
        g = k_pad  # one group spanning K: zero points need the in-register path
    else:
        return None
    return GroupPlan(group_size=g, rows=math.ceil(k_pad / g), rows_per_stage=max(1, bk // g), tensors=tensors)


SMEM_PER_CTA_RESERVED = 1024  # shared memory the driver keeps per resident CTA


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


def shared_memory(layer: LayerConfig, tuning: TuningConfig) -> SmemPlan:
    """The shared memory a standard-pipeline kernel of these configs uses (compose and the heuristics agree)."""
    t = tuning

    def align(x: int) -> int:
        return (x + 127) // 128 * 128

    b_layout = BLayout(block_n=t.block_n, warps_n=t.warps_n, warp_k=t.block_k // t.warps_k,
                       bits=layer.scheme.weight.bits)
    group = _group_plan(layer, t, math.ceil(layer.k / K_ALIGN) * K_ALIGN)
    warp_m, warp_n = t.block_m // t.warps_m, t.block_n // t.warps_n
    acc_floats = (warp_n // 16) * (warp_m // 8) * 4 * 32
    return SmemPlan(a=align(t.block_m * t.block_k * 2), b=align(b_layout.stage_bytes(t.warps_k)),
                    group=align(group.rows_per_stage * t.block_n * 2) if group else 0,
                    tensors=len(group.tensors) if group else 0, rows=group.rows_per_stage if group else 0,
                    stages=t.stages, reduce=(t.warps_k - 1) * t.warps_m * t.warps_n * acc_floats * 4)


def _scale_apply(plan_group: GroupPlan | None, zero_point: str | None, converter, offset: int, dtype: str,
                 slice_scale: bool):
    bias = converter.bias
    if plan_group is None or (slice_scale and zero_point is None):
        return SubtractOffset(dtype=dtype, offset=bias + offset)
    if slice_scale:
        return IntZeroPoint(dtype=dtype)
    if zero_point is None:
        return SubtractOffsetScale(dtype=dtype, offset=bias + offset)
    if zero_point == "int":
        return IntZeroPointScale(dtype=dtype)
    return FloatZeroPointScale(dtype=dtype, offset=bias)


def kernel_name(layer: LayerConfig, tuning: TuningConfig, target: Target) -> str:
    s = layer.scheme
    gran = {"group": f"g{s.group_size}", "channel": "ch", "tensor": "t",
            "block": f"b{s.block_size[0] if s.block_size else 0}x{s.block_size[1] if s.block_size else 0}"
            }[s.granularity]
    zp = {"int": "zi", "float": "zf"}.get(s.zero_point or "", "")
    t = tuning
    out = "" if layer.out_dtype == layer.dtype else f"_o{layer.out_dtype}"
    extras = ("_gs" if s.global_scale else "") + ("_bias" if layer.has_bias else "")
    return (f"gemm_w{s.weight.name}{gran}{zp}s{s.scale_dtype.name}_a{layer.dtype}{out}{extras}_n{layer.n}k{layer.k}_"
            f"{target.name}_{t.block_m}x{t.block_n}x{t.block_k}s{t.stages}w{t.warps_m}x{t.warps_n}x{t.warps_k}"
            f"k{t.split_k}")


def compose(layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig, target: Target) -> KernelPlan:
    """Choose and parametrise the components of one kernel; ComposeError lists everything that is off."""
    reasons: list[str] = []
    s = layer.scheme
    t = tuning
    if t.pipeline != "standard":
        reasons.append(f"tuning.pipeline={t.pipeline!r} is not available yet; use 'standard'")
    if t.mma != "m16n8k16":
        reasons.append(f"tuning.mma={t.mma!r}: the standard pipeline uses 'm16n8k16'")
    if compute.gemm != "dense":
        reasons.append(f"compute.gemm={compute.gemm!r}: only 'dense' kernels are generated so far")
    if compute.accumulate != "float32":
        reasons.append(f"compute.accumulate={compute.accumulate!r}: only 'float32' is generated so far")
    if compute.epilogue_activation is not None or compute.topk_weight:
        reasons.append("fused epilogue activations / top-k weights are not generated yet")
    if s.activation is not None:
        reasons.append(f"quantized activations ({s.activation.dtype.name}) are not generated yet; "
                       f"use a scheme with activation=None (16-bit activations)")
    if t.stream_k:
        reasons.append("tuning.stream_k: the standard pipeline uses split_k")
    if t.a_load != "cp_async" or t.b_load != "cp_async" or t.scale_load != "cp_async":
        reasons.append("the standard pipeline loads every tensor with cp_async")
    if t.cluster_m * t.cluster_n != 1:
        reasons.append("the standard pipeline launches no clusters (cluster_m = cluster_n = 1)")
    dtype = layer.dtype
    try:
        converter = select_converter(s.weight, dtype)
    except ValueError as e:
        reasons.append(str(e))
        converter = None
    if target.has("ppu_variants"):
        reasons.append(f"target {target.name}: its mma back end (ppu.-prefixed mma / ldmatrix, N=16 tiles with "
                       f"N-before-M accumulator fragments) is not generated yet")
    if layer.dtype == "bfloat16" and not target.has("mma_bf16"):
        reasons.append(f"target {target.name} has no bf16 mma; use float16 activations")

    warp_n, warp_k = t.block_n // t.warps_n, t.block_k // t.warps_k
    warp_m = t.block_m // t.warps_m
    if warp_m % 8:
        reasons.append(f"warp tile m = block_m/warps_m = {warp_m} is not a multiple of 8")
    b_layout = BLayout(block_n=t.block_n, warps_n=t.warps_n, warp_k=warp_k, bits=s.weight.bits)
    reasons += b_layout.check()
    if K_ALIGN % t.block_k:
        reasons.append(f"tuning.block_k={t.block_k} must divide {K_ALIGN} (the K padding shared by a layer's kernels)")
    n_pad = math.ceil(layer.n / t.block_n) * t.block_n
    k_pad = math.ceil(layer.k / K_ALIGN) * K_ALIGN
    k_tiles = math.ceil(layer.k / t.block_k)
    if t.split_k > k_tiles:
        reasons.append(f"tuning.split_k={t.split_k} exceeds the {k_tiles} k tiles of K={layer.k} "
                       f"with block_k={t.block_k}")
    group = _group_plan(layer, t, k_pad)
    missing = target.features
    for comp_req in (StandardPipeline.requires, ATileCpAsync.requires):
        for f in comp_req:
            if f not in missing:
                reasons.append(f"target {target.name} lacks '{f}', which the standard pipeline needs")
    if reasons:
        raise ComposeError("cannot generate this kernel:\n  - " + "\n  - ".join(dict.fromkeys(reasons)))

    out_scale = s.granularity in ("channel", "tensor") and s.zero_point is None or s.global_scale
    offset = kernel_codes_offset(s.weight)
    name = kernel_name(layer, t, target)

    # --- components, by family ---------------------------------------------------------------
    # Where a warp's stage slice lies in one group and few m tiles share each weight, the group scale is applied
    # to the slice's fp32 partial sums (per row, once per stage) instead of to every dequantized weight.
    hoist = bool(group and not group.arbitrary and group.group_size % warp_k == 0)
    slice_scale = hoist and warp_m // 8 <= SLICE_SCALE_MAX_M_TILES and s.zero_point != "float"
    apply = _scale_apply(group, s.zero_point, converter, offset, dtype, slice_scale)
    # A conversion that is an OR of a magic number merges into the extraction's LOP3 and is not rendered.
    or_bits = getattr(converter, "or_bits", None)
    # A converter that masks the code bits itself takes the plane unmasked.
    mask_codes = not getattr(converter, "takes_unmasked", False)
    # 3-bit codes: one shift serves three registers (packing.plane_positions) where few m tiles share each weight;
    # with more, the dequantization is amortized and the shared shifts' live registers would spill.
    if or_bits and s.weight.bits == 3 and warp_m // 8 <= SHARED_SHIFT_MAX_M_TILES:
        extract: Component = ThreeBitSharedShiftExtract(or_bits=or_bits, dtype=dtype)
    else:
        extract = PlaneExtract(bits=s.weight.bits, or_bits=or_bits, mask_codes=mask_codes)
    numeric: list[Component] = [extract] + ([] if or_bits else [converter]) + [apply]
    memory: list[Component] = [ATileCpAsync(dtype=dtype, block_k=t.block_k, warp_m_tiles=warp_m // 8),
                               BTileCpAsync(bits=s.weight.bits, tile_bytes=b_layout.stage_bytes(t.warps_k))]
    if group is not None:
        # An odd group size can put a group boundary inside a register's (k, k + 1) pair: each element then reads
        # its own row, and the broadcasting pair load is not used.
        odd = group.arbitrary and group.group_size % 2 == 1
        memory.append(GroupParamsCpAsync(dtype=dtype, tensors=group.tensors, float_scales=slice_scale,
                                         pair_loads=(not slice_scale or s.zero_point is not None) and not odd,
                                         arbitrary_groups=group.arbitrary, odd_group_size=odd))
    mma: list[Component] = [MmaSyncM16N8K16(dtype=dtype)]
    schedule: list[Component] = [DenseSplitKSchedule(split_k=t.split_k) if t.split_k > 1 else DenseSchedule()]
    epilogue: list[Component] = []
    if t.warps_k > 1:
        epilogue.append(WarpKReduce(warps_k=t.warps_k))
    if t.split_k > 1:
        epilogue.append(SplitKReduce(split_k=t.split_k))
    epilogue.append(StoreOutput(dtype=dtype, out_dtype=layer.out_dtype, out_scale=bool(out_scale),
                                bias=layer.has_bias))
    pdl = target.has("pdl")
    pipeline = StandardPipeline(kernel_name=name, group_params=group.tensors if group else (),
                                hoist_group_params=hoist, slice_scale=slice_scale, dequant_params=apply.params,
                                convert_in_extract=or_bits is not None,
                                warp_k_reduce=t.warps_k > 1, split_k=t.split_k > 1, min_blocks=t.ctas_per_sm,
                                pdl=pdl, arbitrary_groups=bool(group and group.arbitrary))
    body = numeric + memory + mma + schedule + epilogue + [pipeline]
    used_ptx: set[str] = set()
    for c in body:
        used_ptx.update(getattr(c, "ptx", ()))
    ptx = [wrapper(p, dtype, layer.out_dtype, layer.has_bias, warp_m // 8) for p in PTX_ORDER if p in used_ptx]
    components = tuple(ptx + body)

    # --- shared memory ---------------------------------------------------------------------------
    smem = shared_memory(layer, t)
    a_bytes, b_bytes, group_bytes, stage_bytes = smem.a, smem.b, smem.group, smem.stage
    shared = smem.total
    if shared > target.smem_per_block_optin:
        raise ComposeError(f"cannot generate this kernel:\n  - shared memory {shared} B (stages={t.stages} x "
                           f"{stage_bytes} B{smem.group_note()}) exceeds {target.name}'s "
                           f"{target.smem_per_block_optin} B per block")
    if t.ctas_per_sm > 1 and t.ctas_per_sm * (shared + SMEM_PER_CTA_RESERVED) > target.smem_per_sm:
        raise ComposeError(f"cannot generate this kernel:\n  - tuning.ctas_per_sm={t.ctas_per_sm}: "
                           f"{t.ctas_per_sm} x ({shared} B + {SMEM_PER_CTA_RESERVED} B reserved) of shared memory "
                           f"exceed {target.name}'s {target.smem_per_sm} B per SM")
    if t.threads * t.ctas_per_sm > target.max_threads_per_sm:
        raise ComposeError(f"cannot generate this kernel:\n  - tuning.ctas_per_sm={t.ctas_per_sm} x {t.threads} "
                           f"threads exceed {target.name}'s {target.max_threads_per_sm} threads per SM")

    constants: list[tuple[str, int, str]] = [
        ("kN", layer.n, "output features"), ("kK", layer.k, "input features"),
        ("kKA", math.ceil(layer.k / 8) * 8, "activation columns (rows are padded to 16 bytes)"),
        ("kNPad", n_pad, "N padded to block_n"), ("kKPad", k_pad, "K padded to K_ALIGN (256)"),
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
    if t.split_k > 1:
        constants.append(("kSplitK", t.split_k, "k slices reduced in the epilogue"))
    if group is not None and group.arbitrary:
        constants += [
            ("kGroupRows", group.rows_per_stage, "group-parameter rows per stage (the most a k tile touches)"),
            ("kGroupSize", group.group_size, "k elements per group (not a multiple of the mma k step)"),
            ("kGroupTensorRows", group.rows, "group rows of the whole tensor: ceil(kKPad / kGroupSize)"),
        ]
    elif group is not None:
        constants += [
            ("kGroupRows", group.rows_per_stage, "group-parameter rows per stage"),
            ("kGroupSizeInStage", min(group.group_size, t.block_k), "k elements per group row inside a stage"),
            ("kGroupRowsPerKTile", group.rows_per_stage, ""),
            ("kKTilesPerGroup", max(1, group.group_size // t.block_k), ""),
        ]
    constants += [("kAStageBytes", a_bytes, ""), ("kStageBytes", stage_bytes, "")]
    if group is not None:
        for i, tensor in enumerate(group.tensors):
            cname = "k" + offset_constant(tensor) + "Offset"
            constants.append((cname, a_bytes + b_bytes + i * group_bytes, f"{tensor} rows in a stage"))

    fields: list[tuple[str, str, str]] = [("a", "const void*", f"activations (m, k) {dtype}, row stride lda"),
                                          ("b", "const void*", "packed weights (humming_gen.schemes.packing)")]
    if group is not None:
        fields.append(("b_scale", "const void*", f"group scales [group][n_pad] {dtype}"))
        if "b_zero" in group.tensors:
            fields.append(("b_zero", "const void*", f"negated zero terms [group][n_pad] {dtype}"))
    if out_scale:
        fields.append(("out_scale", "const void*", "per-column fp32 scale [n_pad]"))
    if layer.has_bias:
        fields.append(("bias", "const void*", f"bias [n] {dtype}"))
    fields.append(("c", "void*", f"output (m, n) {layer.out_dtype}, row stride ldc"))
    if t.split_k > 1:
        fields += [("workspace", "void*", "fp32 split-K partial tiles"),
                   ("counters", "void*", "int32 arrival counter per output tile, zero between launches")]
    fields += [("m", "int", "rows of a and c"), ("lda", "int", "row stride of a, elements"),
               ("ldc", "int", "row stride of c, elements")]

    return KernelPlan(layer=layer, compute=compute, tuning=t, target=target, kernel_name=name,
                      components=components, constants=tuple(constants), param_fields=tuple(fields),
                      b_layout=b_layout, n_pad=n_pad, k_pad=k_pad, group=group, zero_point=s.zero_point,
                      converter_bias=converter.bias, code_offset=offset, out_scale=bool(out_scale),
                      shared_bytes=shared, threads=t.threads, pdl=pdl)

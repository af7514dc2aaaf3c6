"""Choices every dense pipeline makes the same way: K padding and group rows, the dequantization chain
(extract -> convert -> scale apply), the weight layout, the kernel-argument spec and the kernel name."""

from __future__ import annotations

import math

import attrs

from humming_gen.components.base import Component
from humming_gen.components.numeric.convert import FloatPlaceConvert, kernel_codes_offset, select_converter
from humming_gen.components.numeric.extract import PlaneExtract, ThreeBitSharedShiftExtract
from humming_gen.components.numeric.scale_apply import (FloatZeroPointScale, IntZeroPoint, IntZeroPointScale,
                                                         SubtractOffset, SubtractOffsetScale)
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.pipelines.base import (ACTIVATION, ACTIVATION_MAP, BIAS, LDA, LDC, OUT_TOP_K, OUTPUT, ROUTING, ROWS,
                                        SCRATCH, TOP_K, WEIGHT, GroupPlan, KernelArg, WeightLayout)
from humming_gen.schemes import QuantScheme
from humming_gen.schemes.packing import BLayout
from humming_gen.targets import Target

K_ALIGN = 256  # K is padded to a multiple of this; every block_k divides it, so a layer's kernels share weights
# The weight layout every heuristic tuning of both pipelines reads (schemes.packing.BLayout: 128-row blocks, two
# 64-row warp slices, 64-k chunks), so a layer keeps one packed copy for all its M buckets.
SHARED_LAYOUT = {"block_n": 128, "warps_n": 2, "warp_k": 64}
SHARED_SHIFT_MAX_M_TILES = 2  # 3-bit shared-shift extraction up to this many m8 tiles per warp


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


def padded_k(layer: LayerConfig) -> int:
    return math.ceil(layer.k / K_ALIGN) * K_ALIGN


def group_plan(layer: LayerConfig, block_k: int) -> GroupPlan | None:
    """Group rows of the layer's kernel layout and how many a stage of `block_k` loads (None: no group params)."""
    s = layer.scheme
    k_pad = padded_k(layer)
    tensors = ("b_scale", "b_zero") if s.zero_point is not None else ("b_scale",)
    arbitrary = arbitrary_group_size(s)
    if arbitrary is not None:
        rows = math.ceil(k_pad / arbitrary)  # the last, (k_pad - 1) // group_size, holds the last padded k
        per_stage = min(rows, arbitrary_rows_per_stage(arbitrary, block_k))
        return GroupPlan(group_size=arbitrary, rows=rows, rows_per_stage=per_stage, tensors=tensors, arbitrary=True)
    if s.granularity == "group":
        g = kernel_group_size(s.group_size)
    elif s.granularity == "block":
        g = kernel_group_size(s.block_size[1])
    elif s.granularity == "channel" and s.zero_point is not None:
        g = k_pad  # one group spanning K: zero points need the in-register path
    else:
        return None
    return GroupPlan(group_size=g, rows=math.ceil(k_pad / g), rows_per_stage=max(1, block_k // g), tensors=tensors)


def has_out_scale(scheme: QuantScheme) -> bool:
    """Channel / tensor scales without zero points, and global scales, multiply the output columns."""
    return bool(scheme.granularity in ("channel", "tensor") and scheme.zero_point is None or scheme.global_scale)


# Group scales carry the float converter's power of two where they can (scale_exponent); False keeps the converter's
# own multiply everywhere (a switch for A/B measurements, bench/carry_exponent.py).
CARRY_CONVERTER_EXPONENT = True


def scale_exponent(layer: LayerConfig, group: GroupPlan | None, warp_k: int) -> int:
    """The exponent e of the power of two 2^e that the layer's stored group scales carry in place of its float
    converter's exact multiply (FloatPlaceConvert.exponent_shift): one packed fma fewer per dequantized register
    (MXFP4 / NVFP4 on bf16 activations: 2^126). 0 where the converter has none, the compute type is fp16, the
    activations are quantized, or the group scale does not multiply every weight: zero points, or groups a warp's
    k slice lies in (`warp_k`, the layout's; the standard pipeline may hoist those to fp32 partial sums, which a
    carried 2^126 would meet as products of 2^-126 times the weight). Decided by (layer, layout) alone, so every
    bucket of a layer agrees. prepare_weight keeps each row's scales in range with a power of two in out_scale."""
    s = layer.scheme
    if not CARRY_CONVERTER_EXPONENT or group is None or s.activation is not None or s.zero_point is not None:
        return 0
    if layer.dtype != "bfloat16":  # fp16's 5 exponent bits: a row whose largest scale needs r > 0 would push its
        return 0  # small products below fp16's exact range (rows spanning ~2^26), which the multiply keeps exact
    if not group.arbitrary and group.group_size % warp_k == 0:
        return 0
    converter = select_converter(s.weight, layer.dtype)
    return converter.exponent_shift if isinstance(converter, FloatPlaceConvert) else 0


def out_scale_of(layer: LayerConfig, group: GroupPlan | None, warp_k: int) -> bool:
    """Whether the kernel multiplies output columns by out_scale: the scheme's channel / tensor / global scales,
    or the rows' range factor of group scales that carry the converter's power of two (scale_exponent)."""
    return has_out_scale(layer.scheme) or scale_exponent(layer, group, warp_k) > 0


def common_reasons(layer: LayerConfig, compute: ComputeConfig, target: Target, *,
                   quantized_activations: bool = False, moe_gemms: tuple[str, ...] = (),
                   quantized_output: bool = False) -> list[str]:
    """What no dense pipeline generates yet, or the target cannot run whatever the pipeline.
    quantized_activations: the pipeline serves schemes with activation= (and checks them itself).
    moe_gemms: the MoE gemm types the pipeline serves (with the router-weight multiply).
    quantized_output: the pipeline's epilogue quantizes a gated GEMM1's output (compute.epilogue_quantization;
    it checks the scheme and tile itself)."""
    reasons = []
    s = layer.scheme
    if compute.gemm != "dense" and compute.gemm not in moe_gemms:
        served = ", ".join(repr(g) for g in ("dense",) + moe_gemms)
        reasons.append(f"compute.gemm={compute.gemm!r}: this pipeline generates {served} kernels")
    if compute.accumulate != "float32":
        reasons.append(f"compute.accumulate={compute.accumulate!r}: only 'float32' is generated so far")
    if compute.epilogue_activation is not None and "indexed" not in moe_gemms:
        reasons.append(f"compute.epilogue_activation={compute.epilogue_activation!r}: this pipeline fuses no gated "
                       f"activation (the standard pipeline does, for indexed MoE GEMMs)")
    if compute.epilogue_quantization is not None and not quantized_output:
        reasons.append("compute.epilogue_quantization: this pipeline's epilogue does not quantize its output (the "
                       "standard pipeline's does, for 8-bit activations)")
    if s.activation is not None and not quantized_activations:
        reasons.append(f"quantized activations ({s.activation.dtype.name}): this pipeline does not generate them; "
                       f"the standard pipeline does (8-bit activations), or use a scheme with activation=None")
    if s.activation is None:  # quantized activations meet the weight codes as they are, not converted
        try:
            select_converter(s.weight, layer.dtype)
        except ValueError as e:
            reasons.append(str(e))
    if target.has("ppu_variants"):
        reasons.append(f"target {target.name}: its mma back end (ppu.-prefixed mma / ldmatrix, N=16 tiles with "
                       f"N-before-M accumulator fragments) is not generated yet")
    return reasons


def dequant_chain(layer: LayerConfig, group: GroupPlan | None, warp_m_tiles: int, slice_scale: bool,
                  warp_k: int) -> tuple[list[Component], Component, bool]:
    """(numeric components, the scale-apply component, conversion merged into extraction) for the layer.

    A conversion that is an OR of a magic number merges into the extraction's LOP3 and is not rendered; a
    converter that masks the code bits itself takes the plane unmasked; 3-bit codes share one shift among three
    registers (packing.plane_positions) where few m tiles share each weight (with more, the dequantization is
    amortized and the shared shifts' live registers would spill)."""
    s = layer.scheme
    dtype = layer.dtype
    converter = select_converter(s.weight, dtype)
    if scale_exponent(layer, group, warp_k):  # the group scales carry the converter's power of two
        assert isinstance(converter, FloatPlaceConvert) and not slice_scale
        converter = attrs.evolve(converter, scale_carries_exponent=True)
    offset = kernel_codes_offset(s.weight)
    apply = scale_apply(group, s.zero_point, converter.bias, offset, dtype, slice_scale)
    or_bits = getattr(converter, "or_bits", None)
    mask_codes = not getattr(converter, "takes_unmasked", False)
    if or_bits and s.weight.bits == 3 and warp_m_tiles <= SHARED_SHIFT_MAX_M_TILES:
        extract: Component = ThreeBitSharedShiftExtract(or_bits=or_bits, dtype=dtype)
    else:
        extract = PlaneExtract(bits=s.weight.bits, or_bits=or_bits, mask_codes=mask_codes)
    return [extract] + ([] if or_bits else [converter]) + [apply], apply, or_bits is not None


def scale_apply(group: GroupPlan | None, zero_point: str | None, bias: float, offset: int, dtype: str,
                slice_scale: bool) -> Component:
    if group is None or (slice_scale and zero_point is None):
        return SubtractOffset(dtype=dtype, offset=bias + offset)
    if slice_scale:
        return IntZeroPoint(dtype=dtype)
    if zero_point is None:
        return SubtractOffsetScale(dtype=dtype, offset=bias + offset)
    if zero_point == "int":
        return IntZeroPointScale(dtype=dtype)
    return FloatZeroPointScale(dtype=dtype, offset=bias)


def weight_layout(layer: LayerConfig, b_layout: BLayout, n_pad: int, group: GroupPlan | None) -> WeightLayout:
    s = layer.scheme
    return WeightLayout(b_layout=b_layout, n_pad=n_pad, k_pad=padded_k(layer),
                        group_size=group.group_size if group else None, group_rows=group.rows if group else None,
                        out_scale=out_scale_of(layer, group, b_layout.warp_k),
                        code_offset=kernel_codes_offset(s.weight),
                        converter_bias=select_converter(s.weight, layer.dtype).bias, zero_point=s.zero_point,
                        dtype=layer.dtype, scale_exponent=scale_exponent(layer, group, b_layout.warp_k))


def dense_args(layer: LayerConfig, group: GroupPlan | None, split_k: bool, warp_k: int,
               compute: ComputeConfig | None = None, a_map: bool = False) -> tuple[KernelArg, ...]:
    """The Params fields of a dense (or, with an MoE `compute`, MoE) kernel, in struct order (`warp_k`: the weight
    layout's, for out_scale_of); `a_map`: the activations come by TMA, through a tensor map (the first field)."""
    dtype = layer.dtype
    args = [KernelArg("a_map", "TensorMap", ACTIVATION_MAP, f"TMA map of a: (m, k) {dtype}, 128-byte swizzle")
            ] if a_map else []
    args += [KernelArg("a", "const void*", ACTIVATION, f"activations (m, k) {dtype}, row stride lda"),
            KernelArg("b", "const void*", WEIGHT, "packed weights (humming_gen.schemes.packing)", tensor="b")]
    if group is not None:
        carried = scale_exponent(layer, group, warp_k)
        note = f" times 2^({carried} - r[n]), out_scale 2^r[n] (scale_exponent)" if carried else ""
        args.append(KernelArg("b_scale", "const void*", WEIGHT, f"group scales [group][n_pad] {dtype}{note}",
                              tensor="b_scale"))
        if "b_zero" in group.tensors:
            args.append(KernelArg("b_zero", "const void*", WEIGHT, f"negated zero terms [group][n_pad] {dtype}",
                                  tensor="b_zero"))
    if out_scale_of(layer, group, warp_k):
        args.append(KernelArg("out_scale", "const void*", WEIGHT, "per-column fp32 scale [n_pad]", tensor="out_scale"))
    if layer.has_bias:
        args.append(KernelArg("bias", "const void*", BIAS, f"bias [n] {dtype}"))
    args.append(KernelArg("c", "void*", OUTPUT, f"output (m, n) {layer.out_dtype}, row stride ldc"))
    if split_k:
        args += [KernelArg("workspace", "void*", SCRATCH, "fp32 split-K partial tiles", tensor="workspace"),
                 KernelArg("counters", "void*", SCRATCH, "int32 arrival counter per output tile, zero between launches",
                           tensor="counters")]
    moe = compute is not None and compute.gemm == "indexed"
    args += routing_args(compute) if compute is not None else []
    args += [KernelArg("m", "int", ROWS, "assignments (rows of c)" if moe else "rows of a and c"),
             KernelArg("lda", "int", LDA, "row stride of a, elements"),
             KernelArg("ldc", "int", LDC, "row stride of c, elements")]
    args += top_k_args(compute) if compute is not None else []
    return tuple(args)


def routing_args(compute: ComputeConfig) -> list[KernelArg]:
    """The routing fields of an MoE kernel's Params (after the output and scratch fields, before m)."""
    if compute.gemm in ("grouped_masked", "grouped_contiguous"):
        layout = ("int32 rows in use per expert (E)" if compute.gemm == "grouped_masked"
                  else "int32 first row of each expert's segment, and the end (E + 1)")
        return [KernelArg("expert_layout", "const void*", ROUTING, layout, tensor="expert_layout")]
    if compute.gemm != "indexed":
        return []
    args = [KernelArg("sorted_ids", "const void*", ROUTING, "int32 assignment per row of the m blocks (moe_align)",
                      tensor="sorted_ids"),
            KernelArg("expert_ids", "const void*", ROUTING, "int32 local expert per m block, -1 past the total",
                      tensor="expert_ids"),
            KernelArg("num_tokens_post_pad", "const void*", ROUTING, "int32 used rows of sorted_ids",
                      tensor="num_tokens_post_pad")]
    if compute.topk_weight:
        args.append(KernelArg("topk_weights", "const void*", ROUTING, "fp32 router weight per assignment",
                              tensor="topk_weights"))
    return args


def top_k_args(compute: ComputeConfig) -> list[KernelArg]:
    """The last Params fields of an indexed MoE kernel: assignments per row of a (and, atomic top-k reduction, per
    row of c)."""
    if compute.gemm != "indexed":
        return []
    args = [KernelArg("top_k", "int", TOP_K, "assignments per row of a (assignment i reads row i / top_k)")]
    if compute.topk_reduce == "atomic":
        args.append(KernelArg("out_top_k", "int", OUT_TOP_K, "assignments per row of c (assignment i adds into row "
                                                             "i / out_top_k)"))
    return args


def kernel_name(layer: LayerConfig, tuning: TuningConfig, target: Target, suffix: str = "") -> str:
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
            f"k{t.split_k}{suffix}")


def constants_table(layer: LayerConfig, n_pad: int, k_pad: int) -> list[tuple[str, int, str]]:
    """Problem constants every dense kernel may read."""
    return [("kN", layer.n, "output features"), ("kK", layer.k, "input features"),
            ("kKA", math.ceil(layer.k / 8) * 8, "activation columns (rows are padded to 16 bytes)"),
            ("kNPad", n_pad, "N padded to the weight layout's block_n"), ("kKPad", k_pad, "K padded to K_ALIGN (256)")]


# Provided by the source assembly itself (codegen.render): the Params struct and the cfg:: constants.
RENDERED_SYMBOLS = frozenset({"Params"})


def missing_symbols(components: "tuple[Component, ...]") -> list[str]:
    """Every device symbol a component needs that no component rendered before it provides (components come in
    section order, so a definition must precede its use)."""
    available = set(RENDERED_SYMBOLS)
    reasons = []
    for c in components:
        for symbol in sorted(c.needs - available):
            reasons.append(f"{type(c).__name__} needs `{symbol}`, which no component before it provides")
        available |= c.provides
    return reasons


def missing_features(components: "tuple[Component, ...]", target: Target) -> list[str]:
    """Every target feature a chosen component requires and the target lacks, named with the component."""
    missing = {f: type(c).__name__ for c in components for f in sorted(c.requires) if not target.has(f)}
    reasons = [f"target {target.name} lacks '{f}', which {who} needs" for f, who in missing.items()]
    if set(missing) == {"mma_bf16"}:
        reasons.append(f"target {target.name} has no bf16 mma; use float16 activations")
    return reasons


def offset_constant(tensor: str) -> str:
    """b_scale -> BScale (as in cfg::kBScaleOffset)."""
    return "".join(part.title() for part in tensor.split("_"))


def group_constants(group: GroupPlan | None, block_k: int) -> list[tuple[str, int, str]]:
    """How a stage's k range maps to group rows (the group-parameter loaders and readers)."""
    if group is None:
        return []
    if group.arbitrary:
        return [("kGroupRows", group.rows_per_stage, "group-parameter rows per stage (the most a k tile touches)"),
                ("kGroupSize", group.group_size, "k elements per group (not a multiple of the mma k step)"),
                ("kGroupTensorRows", group.rows, "group rows of the whole tensor: ceil(kKPad / kGroupSize)")]
    return [("kGroupRows", group.rows_per_stage, "group-parameter rows per stage"),
            ("kGroupSizeInStage", min(group.group_size, block_k), "k elements per group row inside a stage"),
            ("kGroupRowsPerKTile", group.rows_per_stage, ""),
            ("kKTilesPerGroup", max(1, group.group_size // block_k), "")]


def group_offset_constants(group: GroupPlan | None, first: int, row_bytes: int) -> list[tuple[str, int, str]]:
    """Byte offset of each group-parameter tensor's rows inside a stage, the first at `first`."""
    if group is None:
        return []
    return [("k" + offset_constant(tensor) + "Offset", first + i * row_bytes, f"{tensor} rows in a stage")
            for i, tensor in enumerate(group.tensors)]


def split_k_reasons(layer: LayerConfig, tuning: TuningConfig) -> list[str]:
    k_tiles = math.ceil(layer.k / tuning.block_k)
    if tuning.split_k > k_tiles:
        return [f"tuning.split_k={tuning.split_k} exceeds the {k_tiles} k tiles of K={layer.k} with "
                f"block_k={tuning.block_k}"]
    return []


def split_k_constants(tuning: TuningConfig) -> list[tuple[str, int, str]]:
    return [("kSplitK", tuning.split_k, "k slices reduced in the epilogue")] if tuning.split_k > 1 else []


def lacking(target: Target, features: frozenset[str], who: str) -> list[str]:
    """One reason per feature in `features` the target lacks (a pipeline's supports())."""
    return [f"target {target.name} lacks '{f}', which the {who} needs" for f in sorted(features)
            if not target.has(f)]

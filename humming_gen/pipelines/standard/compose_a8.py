"""compose() of the standard pipeline for schemes with 8-bit activations: 8-bit weight codes x 8-bit activation
codes on mma.sync m16n8k32 (s8 on sm_80+, e4m3 / e5m2 on sm_89+), no dequantization in the main loop. Weights of
at most 4 bits are stored as nibbles (BLayoutNibble8) and widened to the activation's kind in registers
(components.numeric.nibble8: int8 as 16 x code, or e4m3 by table lookup).

Scales: per-channel / tensor weight scales and per-token / tensor activation scales multiply the output in the
epilogue (acc * a_scale[m] * w_scale[n]); group scales (DeepSeek 128 x 128 weight blocks, 1 x 128 activation
groups, MXFP4's group-32 e8m0 scales) multiply each warp's partial sums when they are promoted into the fp32
accumulators, every kPromoteK = gcd(warp k slice, group sizes) k.

MoE (the gemm types of pipelines.standard.moe, as for 16-bit activations): per-expert weights, scales and biases
rebased per block; indexed kernels gather rows of the codes through the routing and read each token column's
activation scales (per token or per group) of the row its assignment reads, sorted_ids[m] / top_k; grouped kernels
read row windows of codes and scales; router-weight multiply and the fused gated epilogue as for 16-bit.

int4 weights x int4 activations (targets with mma_int4: sm_80 ... sm_120a) run on mma.sync m16n8k64 s4 in the same
skeleton: both operands are int4 codes packed two per byte along K (low nibble first; quantize_activation writes
them so), and the k64 s4 fragments of the codes are, byte for byte, the k32 8-bit fragments of the packed bytes
(components.mma.atoms.MMA_SYNC_M16N8K64_S4). So the kernel is the int8 x int8 kernel of the layer's byte view
(`byte_layer`: K / 2, group sizes / 2), with one k64 mma per k32 byte step; group sizes must be multiples of 64.
The weights are BLayoutS4 (BLayout8 of the packed bytes). Dense GEMMs only (MoE falls back to int8 activations).
"""

from __future__ import annotations

import math

import attrs

from humming_gen.components.base import Component
from humming_gen.components.epilogue.output import SplitKReduce, StoreOutput
from humming_gen.components.epilogue.topk_atomic import fused_topk_store, output_dtype
from humming_gen.components.epilogue.quantize_output import (output_args, output_quantization_reasons,
                                                             quantized_store, staged_tile_bytes)
from humming_gen.components.memory.shared_reads import BTilePairShared4, BTileShared8, GroupScalesGlobal
from humming_gen.components.mma.atoms import MMA_SYNC_M16N8K32_8BIT
from humming_gen.components.mma.mma_sync import (FP8_PTX, PTX_8BIT_TYPE, MmaSyncM16N8K32, MmaSyncM16N8K32ViaF16,
                                                 MmaSyncM16N8K64S4)
from humming_gen.components.numeric.nibble8 import INT8_CODE_SCALE, NibbleToE4m3, NibbleToInt8, nibble_reasons
from humming_gen.components.ptx.wrappers import wrappers_for
from humming_gen.components.schedule.dense import DenseSchedule, DenseSplitKSchedule
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.pipelines.base import (ACTIVATION, ACTIVATION_SCALE, BIAS, LDA, LDC, OUTPUT, ROWS, SCRATCH,
                                        WEIGHT, KernelArg, KernelPlan, TiledLaunch, WeightLayout, compose_error)
from humming_gen.pipelines.common import (K_ALIGN, constants_table, has_out_scale, kernel_name, missing_features,
                                          missing_symbols, padded_k, routing_args, split_k_constants, split_k_reasons,
                                          top_k_args)
from humming_gen.pipelines.standard.loaders import ATile8CpAsync, ATile8Quantize, BTileCpAsync, WeightScalesCpAsync
from humming_gen.pipelines.standard.moe import MOE_GEMMS, expert_tensors, moe_name_suffix, moe_schedule
from humming_gen.pipelines.standard.skeleton import StandardA8Pipeline, WarpKReduce
from humming_gen.schemes.packing import BLayout8, BLayoutNibble8, BLayoutS4
from humming_gen.targets import Target

MMA = "m16n8k32"  # TuningConfig.mma of these kernels
# fp8 x fp8 on sm_90a (the target with wgmma, whose mma.sync on fp8 is F2FP + HMMA) as explicit f16 mmas
# (MmaSyncM16N8K32ViaF16): the two halves chain through the accumulators instead of ptxas's k32 product from zero
# plus 4 FADDs per mma (its F2FPs are hoisted across tiles either way: same count). Hot loops on sm_90a, standard
# tunings, N = K = 8192: fp8 channel 281 -> 233 SASS instructions at M = 1 (-17 %), 531 -> 403 at 32 (-24 %);
# block128 310 -> 279 (-10 %); W4A8 mxfp4 460 -> 427 (-7 %); MXFP8 380 -> 361 (-5 %). H200, graph us, native -> f16
# (2026-12-02): MoE indexed GEMMs (bench/moe_small_tiles.py) Qwen3-30B-A3B W4A8 mxfp4 x fp8 gate-up M = 16 / 128
# 62.5 / 115.7 -> 61.0 / 111.7, down 37.0 / 71.6 -> 36.1 / 69.5; gpt-oss-120b gate-up 171.2 / 372.1 -> 160.0 / 368.7,
# down 87.8 / 198.3 -> 87.6 / 196.2; dense 8192^2 at M = 1 (standard buckets, bench/a8_small_sweep.py) fp8 channel
# 26.9 -> 26.7, block128 27.6 -> 27.1, W4A8 23.2 -> 23.0. False renders ptxas's own lowering (for measurements).
FP8_ON_F16_MMA = True
# The weight group scales come with each stage through shared memory (WeightScalesCpAsync: kWScaleRows fp32 rows of
# the CTA's columns beside the weight tile) instead of from global memory at every promotion (GroupScalesGlobal).
# The SASS of a W4A8 MXFP4 MoE small tile on sm_90a (8 x 128 x 128, 2 k warps) holds 16 LDG.E.CONSTANT in its hot
# loop: each 32-k promotion waits for an L2 round trip, where the 16-bit kernels read their group scales from the
# stage. H200, graph us, global -> staged (bench/moe_small_tiles.py, W4A8 MXFP4 indexed GEMMs on the standard
# pipeline, 2026-12-02): Qwen3-30B-A3B gate-up M = 16 / 128 60.1 / 106.5 -> 53.2 / 98.7, down 33.6 / 60.4 -> 30.0 /
# 54.7; DeepSeek-V3 gate-up 79.9 / 174.5 -> 65.5 / 155.8, down 48.4 / 125.7 -> 41.1 / 104.3; gpt-oss-120b gate-up
# 170.4 / 369.3 -> 142.5 / 329.7, down 87.6 / 196.3 -> 76.3 / 177.2. Kernel names end in `_wss`; False reads them
# from global memory (for measurements; group k sides that neither divide block_k nor are multiples of it always do).
STAGE_WEIGHT_SCALES = True
MMA_S4 = "m16n8k64"  # ... and of those with int4 activations


def s4_native(layer: LayerConfig) -> bool:
    """int4 activations: the kernels multiply int4 x int4 on mma.sync m16n8k64 s4 (scheme_reasons says which
    weights), both operands packed two codes a byte."""
    a = layer.scheme.activation
    return a is not None and a.dtype.name == "int4"


def mma_of(layer: LayerConfig) -> str:
    """TuningConfig.mma of this layer's kernels."""
    return MMA_S4 if s4_native(layer) else MMA


def byte_layer(layer: LayerConfig) -> LayerConfig:
    """The int8 x int8 layer an int4 x int4 kernel is tiled as: its operands' packed bytes (K / 2 columns, group
    and block k sides / 2). Only for layers scheme_reasons passes (K even, groups multiples of 64)."""
    s, a = layer.scheme, layer.scheme.activation
    scheme = attrs.evolve(
        s, weight="int8", group_size=s.group_size // 2 if s.granularity == "group" else s.group_size,
        block_size=(s.block_size[0], s.block_size[1] // 2) if s.granularity == "block" else s.block_size,
        activation=attrs.evolve(a, dtype="int8", group_size=a.group_size // 2 if a.granularity == "group" else None))
    return attrs.evolve(layer, k=layer.k // 2, scheme=scheme)


def weight_group_k(layer: LayerConfig) -> int | None:
    """K extent of one weight scale group (block scales: the block's k side), None for channel / tensor scales."""
    s = layer.scheme
    return s.group_size if s.granularity == "group" else s.block_size[1] if s.granularity == "block" else None


def weight_scale_rows(layer: LayerConfig, block_k: int) -> int | None:
    """The weight group rows one stage holds where the kernels stage them (STAGE_WEIGHT_SCALES; group k sides that
    divide block_k or are multiples of it, so a stage's rows start at k tile x block_k / group k; not int4 x int4),
    else None."""
    g = weight_group_k(layer)
    if not STAGE_WEIGHT_SCALES or g is None or s4_native(layer) or (block_k % g and g % block_k):
        return None
    return max(1, block_k // g)


def weight_scale_stage_bytes(layer: LayerConfig, tuning: TuningConfig) -> int:
    """Shared-memory bytes of a stage's weight group scales (128-byte aligned; 0 where they are not staged)."""
    rows = weight_scale_rows(layer, tuning.block_k)
    return (rows * tuning.block_n * 4 + 127) // 128 * 128 if rows else 0


def activation_group_k(layer: LayerConfig) -> int | None:
    a = layer.scheme.activation
    return a.group_size if a.granularity == "group" else None


def nibble_order(layer: LayerConfig) -> str | None:
    """How weights of at most 4 bits become 8-bit operands ("int8" / "e4m3", BLayoutNibble8.order); None for
    8-bit weights, which the mma reads as stored."""
    if layer.scheme.weight.bits > 4 or s4_native(layer):
        return None
    return "e4m3" if layer.scheme.activation.dtype.is_float else "int8"


def fp8_on_f16(layer: LayerConfig, target: Target) -> bool:
    """Whether the kernels run fp8 x fp8 as f16 mmas (FP8_ON_F16_MMA, on the target whose fp8 mma.sync is emulated)."""
    return (FP8_ON_F16_MMA and target.has("wgmma") and layer.scheme.activation.dtype.is_float
            and weight_operand(layer) in FP8_PTX)


def weight_operand(layer: LayerConfig) -> str:
    """The 8-bit format the mma reads the weights as."""
    if s4_native(layer):
        return "int4"
    order = nibble_order(layer)
    return {None: layer.scheme.weight.name, "int8": "int8", "e4m3": "float8e4m3"}[order]


def code_scale(layer: LayerConfig) -> float:
    """What the weight operand's value is multiplied by to give the code's value (folded into the fp32 scales)."""
    return INT8_CODE_SCALE if nibble_order(layer) == "int8" else 1.0


def promote_k(layer: LayerConfig, warp_k: int) -> int:
    """k between promotions of partial sums: the warp's k slice, or less so that each lies in one scale group."""
    return math.gcd(warp_k, *(g for g in (weight_group_k(layer), activation_group_k(layer)) if g is not None))


def scheme_reasons(layer: LayerConfig) -> list[str]:
    """What this path cannot serve of a scheme with quantized activations, whatever the tuning and target."""
    s, a = layer.scheme, layer.scheme.activation
    reasons = []
    if a.dtype.name == "int4":
        reasons += s4_reasons(layer)
    elif a.dtype.name not in PTX_8BIT_TYPE:
        reasons.append(f"activation format {a.dtype.name}: kernels with quantized activations are generated for "
                       f"8-bit activations ({', '.join(PTX_8BIT_TYPE)}) and int4 activations with int4 weights so far")
    elif s.weight.bits < 8:
        reasons += nibble_reasons(s.weight, a.dtype)
    elif s.weight.name not in PTX_8BIT_TYPE:
        reasons.append(f"weight format {s.weight.name} with quantized activations: 8-bit weights "
                       f"({', '.join(PTX_8BIT_TYPE)}) or weights of at most 4 bits are generated")
    elif s.weight.is_float != a.dtype.is_float:
        reasons.append(f"weight format {s.weight.name} x activation format {a.dtype.name}: the 8-bit mma multiplies "
                       f"two integer or two fp8 operands")
    if s.zero_point is not None:
        reasons.append("weight zero points with quantized activations are not generated")
    if a.global_scale:
        reasons.append("activation global scales (NVFP4-style) are not generated with 8-bit activations")
    if a.scale_dtype.name == "float8e8m0" and a.granularity != "group":
        reasons.append(f"activation scale_dtype=float8e8m0 with {a.granularity} scales: e8m0 activation scales are "
                       f"read per group (MX); use float32 scales per token / tensor")
    elif a.scale_dtype.name not in ("float32", "float8e8m0"):
        reasons.append(f"activation scale_dtype={a.scale_dtype.name}: kernels read float32 or e8m0 (MX group) "
                       f"activation scales")
    for what, g in (("weight", weight_group_k(layer)), ("activation", activation_group_k(layer))):
        if g is not None and g % 32:
            reasons.append(f"{what} scale groups of {g} along K: partial sums are promoted with their group's scale "
                           f"every k32 step at the finest, so the group must be a multiple of 32")
    return reasons


def s4_reasons(layer: LayerConfig) -> list[str]:
    """What the int4 x int4 kernels (mma.sync m16n8k64 s4) cannot serve of a scheme with int4 activations."""
    s = layer.scheme
    reasons = []
    if s.weight.name != "int4":
        reasons.append(f"weight format {s.weight.name} with int4 activations: the m16n8k64 s4 kernels multiply "
                       f"int4 weights (symmetric, two's complement); use int4 weights or 8-bit activations")
    if layer.k % 2:
        reasons.append(f"K = {layer.k} with int4 activations: codes are packed two per byte along K, so K must be even")
    for what, g in (("weight", weight_group_k(layer)), ("activation", activation_group_k(layer))):
        if g is not None and g % 64:
            reasons.append(f"{what} scale groups of {g} along K with int4 activations: s32 partial sums of m16n8k64 "
                           f"steps are promoted with their group's scale, so the group must be a multiple of 64")
    return reasons


def tuning_reasons(layer: LayerConfig, tuning: TuningConfig) -> list[str]:
    t = tuning
    reasons = []
    if t.mma != mma_of(layer):
        reasons.append(f"tuning.mma={t.mma!r}: kernels with {layer.scheme.activation.dtype.name} activations use "
                       f"{mma_of(layer)!r}")
    if t.stream_k:
        reasons.append("tuning.stream_k: the standard pipeline uses split_k")
    if t.a_load not in ("cp_async", "quantize") or t.b_load != "cp_async" or t.scale_load != "cp_async":
        reasons.append("the standard pipeline loads every tensor with cp_async (activations: or a_load='quantize')")
    if t.a_load == "quantize":
        reasons += quantize_a_reasons(layer, t)
    if t.cluster_m * t.cluster_n != 1:
        reasons.append("the standard pipeline launches no clusters (cluster_m = cluster_n = 1)")
    return reasons


QUANTIZE_A_MAX_BLOCK_M = 16  # a_load='quantize': a thread keeps one amax per tile row in registers
QUANTIZE_A_FORMATS = ("float8e4m3", "float8e5m2", "int8")


def quantize_a_reasons(layer: LayerConfig, tuning: TuningConfig, compute: ComputeConfig | None = None) -> list[str]:
    """What keeps a kernel from quantizing its 16-bit activations in the loader (TuningConfig.a_load='quantize')."""
    a = layer.scheme.activation
    reasons = []
    if a is None:
        return ["a_load='quantize' needs a scheme with quantized activations"]
    if a.dtype.name not in QUANTIZE_A_FORMATS:
        reasons.append(f"a_load='quantize' quantizes to {', '.join(QUANTIZE_A_FORMATS)}, got {a.dtype.name}")
    if a.granularity not in ("token", "tensor") or a.global_scale or a.scale_dtype.name != "float32":
        reasons.append(f"a_load='quantize' computes dynamic fp32 per-token scales or reads a static fp32 per-tensor "
                       f"scale, got {a.granularity} {a.scale_dtype.name} scales"
                       + (" with a global scale" if a.global_scale else ""))
    if layer.k % 8:
        reasons.append(f"a_load='quantize' reads x in 16-byte vectors: K must be a multiple of 8, got {layer.k}")
    if tuning.block_m > QUANTIZE_A_MAX_BLOCK_M:
        reasons.append(f"a_load='quantize' is for small M: block_m <= {QUANTIZE_A_MAX_BLOCK_M}, got {tuning.block_m}")
    if compute is not None and compute.gemm != "dense":
        reasons.append(f"a_load='quantize' serves dense GEMMs, got gemm={compute.gemm!r}")
    return reasons


def static_a_scale(layer: LayerConfig) -> bool:
    """A kernel with a_load='quantize' and per-tensor activation scales reads a static scale (p.a_scale[0], a
    checkpoint's input_scale): a dynamic one needs the amax of all rows, which no CTA sees alone."""
    return layer.scheme.activation.granularity == "tensor"


def quantize_a_plan(plan, layer: LayerConfig, target: Target, max_m: int = QUANTIZE_A_MAX_BLOCK_M,
                    static_scale: bool = False):
    """`plan` with a_load='quantize' in every bucket of M <= max_m that can take it (the others unchanged; a
    warp-specialized bucket there becomes the standard pipeline's where that one can): those kernels read x and
    quantize it themselves. Per-tensor activation scales only where the layer has a static one (`static_scale`)."""
    from humming_gen.pipelines.base import TuningPlan

    from humming_gen.pipelines.standard import STANDARD

    if static_a_scale(layer) and not static_scale:
        return plan
    standard = STANDARD.choose_tunings(layer, target)  # (sm_90a runs the warp-specialized kernels at every M)
    buckets = []
    for m_max, t in plan.buckets:
        if m_max is not None and m_max <= max_m and t.pipeline != "standard":
            alternative = standard.for_m(m_max)  # same weight layout (BLayout8) for both pipelines
            if alternative.mma == MMA and not quantize_a_reasons(layer, alternative):
                t = alternative  # (a bucket that cannot quantize in its loader keeps the faster wgmma kernel)
        if (m_max is not None and m_max <= max_m and t.pipeline == "standard" and t.mma == MMA
                and not quantize_a_reasons(layer, t)):
            t = attrs.evolve(t, a_load="quantize")
        buckets.append((m_max, t))
    return TuningPlan(buckets=tuple(buckets))


def activation_e8m0(layer: LayerConfig) -> bool:
    """The activation scales are e8m0 bytes (MX groups), read as powers of two. The kernels of both pipelines
    decode byte c as the fp32 bit pattern c << 23 (code 0 as 2^-127), so code 255, NaN in the OCP MX spec and in
    DType.decode, reads as +inf there; the activation quantizers never write it (exponents clamped to
    [-127, 127]). e8m0 weight scales are decoded on the host instead, where a 255 is NaN and QuantizedWeight
    refuses it."""
    return layer.scheme.activation.scale_dtype.name == "float8e8m0"


def activation_name(layer: LayerConfig) -> str:
    a = layer.scheme.activation
    gran = {"token": "tok", "tensor": "t", "group": f"g{a.group_size}"}[a.granularity]
    return f"{a.dtype.name}{gran}"


def quantize_a_components(layer: LayerConfig, target: Target) -> list[Component]:
    """The activation-quantization kernel's ptx helpers, scale rule, element code and vector loads for this layer's
    scheme (humming_gen.activation.kernel.components, without its kernel entry), so that the loader's codes and
    scales are those of humming_gen.quantize_activation. to_float comes from CvtScalar (the same conversion)."""
    from humming_gen.activation.components import (BlockScaleRule, ElementCode, Rounding, ScalarPtx, StaticScale,
                                                   VectorIO)
    from humming_gen.activation.kernel import QuantizeConfig, components

    cfg = QuantizeConfig(scheme=layer.scheme.activation, input_dtype=layer.dtype, target=target,
                         static=static_a_scale(layer))
    keep = (ScalarPtx, Rounding, BlockScaleRule, StaticScale, ElementCode, VectorIO)
    out = [c for c in components(cfg) if isinstance(c, keep)]
    return [attrs.evolve(c, input_dtype="") if isinstance(c, ScalarPtx) else c for c in out]


def args(layer: LayerConfig, split_k: bool, compute: ComputeConfig | None = None, fold: bool = False,
         quantize_a: bool = False, panels: bool = False) -> tuple[KernelArg, ...]:
    """The Params fields, in struct order (with an MoE `compute`, its routing fields too). `fold`: the kernel reads
    the folded group scales (exponent deltas, the row factor in out_scale) instead of the fp32 group scales.
    `panels`: the codes come in the panels layout (quantize_activation(layout="panels")), lda its panel stride."""
    s, a = layer.scheme, layer.scheme.activation
    gather = compute is not None and compute.gemm == "indexed"
    if s4_native(layer):
        a_text = "activation codes (m, k) int4, two per byte (low nibble first), row stride lda bytes"
        b_text = "int4 weight codes two per byte along k, in humming_gen.schemes.packing.BLayoutS4"
    else:
        a_text = f"activation codes (m, k) {a.dtype.name}, row stride lda bytes"
        b_text = ("8-bit weight codes (humming_gen.schemes.packing.BLayout8)" if nibble_order(layer) is None
                  else f"{s.weight.name} codes as nibbles (humming_gen.schemes.packing.BLayoutNibble8, order "
                       f"{nibble_order(layer)})")
    if quantize_a:
        a_text = f"16-bit activations x (m, k) {layer.dtype}, row stride lda elements (quantized in the kernel)"
    if panels:
        a_text = (f"activation codes {a.dtype.name} in 128-k panels of m rows (quantize_activation(layout="
                  f"'panels')), panel stride lda bytes")
    out = [KernelArg("a", "const void*", ACTIVATION, a_text), KernelArg("b", "const void*", WEIGHT, b_text, tensor="b")]
    if fold:
        out.append(KernelArg("b_exponent", "const void*", WEIGHT, "exponent deltas of the e4m3 weight operand "
                             "(humming_gen.components.numeric.exponent_fold)", tensor="b_exponent"))
    elif weight_group_k(layer) is not None:
        out.append(KernelArg("b_scale", "const void*", WEIGHT, "fp32 weight group scales [k group][n_pad]",
                             tensor="b_scale"))
    if fold:
        out.append(KernelArg("out_scale", "const void*", WEIGHT, "per-column fp32 scale [n_pad]: 2^r, the rows' "
                             "share of the folded group scales", tensor="out_scale"))
    elif has_out_scale(s):
        out.append(KernelArg("out_scale", "const void*", WEIGHT, "per-column fp32 scale [n_pad]", tensor="out_scale"))
    shape = {"token": "[m]", "group": "[m][k groups]", "tensor": "[1]"}[a.granularity]
    rows = " (rows of a)" if gather and a.granularity != "tensor" else ""
    kind = "e8m0 (byte)" if activation_e8m0(layer) else "fp32"
    if quantize_a and a.granularity == "tensor":
        out.append(KernelArg("a_scale", "const void*", ACTIVATION_SCALE, "fp32 static activation scale [1] (a "
                             "checkpoint's input_scale): x is divided by it"))
    elif not quantize_a:
        out.append(KernelArg("a_scale", "const void*", ACTIVATION_SCALE, f"{kind} activation scales {shape}{rows}"))
    if layer.has_bias:
        out.append(KernelArg("bias", "const void*", BIAS, f"bias [n] {layer.dtype}"))
    out.append(KernelArg("c", "void*", OUTPUT, f"output (m, n) {layer.out_dtype}, row stride ldc"))
    if split_k:
        out += [KernelArg("workspace", "void*", SCRATCH, "fp32 split-K partial tiles", tensor="workspace"),
                KernelArg("counters", "void*", SCRATCH, "int32 arrival counter per output tile, zero between launches",
                          tensor="counters")]
    out += routing_args(compute) if compute is not None else []
    out += [KernelArg("m", "int", ROWS, "assignments (rows of c)" if gather else "rows of a and c"),
            KernelArg("lda", "int", LDA, "row stride of a, elements" if quantize_a else
                      "panel stride of a, bytes (m * 128)" if panels else "row stride of a, bytes"),
            KernelArg("ldc", "int", LDC, "row stride of c, elements")]
    out += top_k_args(compute) if compute is not None else []
    return tuple(out)


def expert_bytes(layer: LayerConfig, n_pad: int) -> dict[str, int]:
    """Bytes of one expert's slice of each stacked tensor a kernel with 8-bit activations may read (the packed
    weight: a byte or a nibble per code; fp32 group and column scales; folded group scales' exponent deltas, a
    byte per row and k32 step; the bias), as layer.moe.prepare_moe_weight stacks them. Both pipelines read the
    same packed layout, so they rebase an expert alike."""
    k_pad = padded_k(layer)
    g = weight_group_k(layer)
    return {"b": n_pad * k_pad // (2 if nibble_order(layer) or s4_native(layer) else 1),
            "b_scale": (math.ceil(k_pad / g) if g else 0) * n_pad * 4, "b_exponent": n_pad * (k_pad // 32),
            "out_scale": n_pad * 4, "bias": layer.n * 2}


def weight_layout(layer: LayerConfig, b_layout: BLayout8 | BLayoutNibble8 | BLayoutS4, n_pad: int) -> WeightLayout:
    g = weight_group_k(layer)
    k_pad = 2 * padded_k(byte_layer(layer)) if s4_native(layer) else padded_k(layer)  # codes
    return WeightLayout(b_layout=b_layout, n_pad=n_pad, k_pad=k_pad, group_size=g,
                        group_rows=math.ceil(k_pad / g) if g else None, out_scale=has_out_scale(layer.scheme),
                        code_offset=0, converter_bias=0.0, zero_point=None, dtype="float32",
                        fold_scales=layer.fold_scales)


def compose(layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig, target: Target,
            reasons: list[str], b_layout: BLayout8 | BLayoutNibble8, shared: int, stage_bytes: int,
            a_bytes: int) -> KernelPlan:
    """The components of one kernel with 8-bit activations; `reasons` are the standard compose's so far, `shared`
    and `stage_bytes` its shared-memory figures (compose.shared_memory, of `b_layout`)."""
    s, a = layer.scheme, layer.scheme.activation
    t = tuning
    reasons = reasons + scheme_reasons(layer) + tuning_reasons(layer, t)
    s4 = s4_native(layer)
    if s4 and compute.gemm in MOE_GEMMS:
        reasons.append(f"gemm={compute.gemm!r} with int4 activations: MoE GEMMs are generated for 8-bit activations "
                       f"(QuantMoE falls back to int8)")
    if s4 and reasons:
        raise compose_error(reasons)
    quantize_a = t.a_load == "quantize"
    if quantize_a:
        reasons += [r for r in quantize_a_reasons(layer, t, compute) if r not in reasons]
    # int4 x int4: every tile, constant and group size below counts the operands' packed bytes (module docstring)
    kl = byte_layer(layer) if s4 else layer
    warp_m, warp_n, warp_k = t.block_m // t.warps_m, t.block_n // t.warps_n, t.block_k // t.warps_k
    order = nibble_order(layer)
    if warp_m % 8:
        reasons.append(f"warp tile m = block_m/warps_m = {warp_m} is not a multiple of 8")
    reasons += b_layout.check()
    if K_ALIGN % t.block_k:
        reasons.append(f"tuning.block_k={t.block_k} must divide {K_ALIGN} (the K padding shared by a layer's kernels)")
    reasons += split_k_reasons(kl, t)
    if compute.epilogue_quantization is not None:
        reasons += output_quantization_reasons(compute.epilogue_quantization, compute.epilogue_static_scale,
                                               layer.n, t.block_n)
    if reasons:
        raise compose_error(reasons)
    n_pad = math.ceil(layer.n / t.block_n) * t.block_n
    k_pad = padded_k(kl)
    wgroups, agroups = weight_group_k(layer) is not None, activation_group_k(layer) is not None
    staged_rows = weight_scale_rows(layer, t.block_k)  # weight group scales through the stages
    moe = compute.gemm in MOE_GEMMS
    gather = compute.gemm == "indexed"  # rows (and their activation scales) through the routing

    numeric: list[Component] = []
    if order == "int8":
        numeric.append(NibbleToInt8(weight=s.weight.name))
    elif order == "e4m3":
        numeric.append(NibbleToE4m3(weight=s.weight))
    if quantize_a:  # the activation-quantization kernel's own scale rule and element code (bit-identical codes)
        numeric = quantize_a_components(layer, target) + numeric
    static = quantize_a and static_a_scale(layer)
    a_tile = (ATile8Quantize(dtype=layer.dtype, block_k=t.block_k, warp_m_tiles=warp_m // 8, static_scale=static)
              if quantize_a else
              ATile8CpAsync(block_k=t.block_k, warp_m_tiles=warp_m // 8, gather=gather))
    memory: list[Component] = [a_tile,
                               BTileShared8() if order is None else BTilePairShared4(),
                               BTileCpAsync(bits=b_layout.bits, tile_bytes=b_layout.stage_bytes(t.warps_k))]
    if (wgroups and not staged_rows) or agroups:
        memory.append(GroupScalesGlobal(weight_groups=wgroups and not staged_rows, activation_groups=agroups,
                                        gather=gather and agroups, activation_e8m0=activation_e8m0(layer)))
    if staged_rows:
        memory.append(WeightScalesCpAsync())
    f16_mma = fp8_on_f16(layer, target)
    mma: list[Component] = [MmaSyncM16N8K64S4() if s4 else
                            MmaSyncM16N8K32ViaF16(weight=weight_operand(layer), activation=a.dtype.name) if f16_mma
                            else MmaSyncM16N8K32(weight=weight_operand(layer), activation=a.dtype.name)]
    schedule: list[Component] = [moe_schedule(compute, t.split_k) if moe else
                                 DenseSplitKSchedule(split_k=t.split_k) if t.split_k > 1 else DenseSchedule()]
    epilogue: list[Component] = []
    if t.warps_k > 1:
        epilogue.append(WarpKReduce(warps_k=t.warps_k))
    if t.split_k > 1:
        epilogue.append(SplitKReduce(split_k=t.split_k))
    store = StoreOutput(dtype=layer.dtype, out_dtype=layer.out_dtype, out_scale=has_out_scale(s),
                        bias=layer.has_bias, atom=MMA_SYNC_M16N8K32_8BIT,
                        token_scale="" if agroups else a.granularity, row_map=gather,
                        topk_weight=compute.topk_weight, gated=compute.epilogue_activation or "",
                        token_scale_smem=quantize_a and not static)
    # GEMM1's output quantized for GEMM2 in the epilogue (its rows staged in the idle ring)
    quantized = compute.epilogue_quantization is not None
    epilogue += (quantized_store(store, compute, target.name, t.warps_k) if quantized
                 else [fused_topk_store(compute, store)])
    shared = max(shared, staged_tile_bytes(t.block_m, t.block_n)) if quantized else shared
    # MoE: the stacked weight tensors the kernel rebases to its block's expert, with their bytes per expert
    per_expert = expert_bytes(layer, n_pad)
    experts = expert_tensors(args(layer, False), per_expert) if moe else ()
    pdl = target.has("pdl")
    name = kernel_name(layer, t, target, suffix=f"_q{activation_name(layer)}" + ("_f16mma" if f16_mma else "")
                       + moe_name_suffix(compute) + ("_xq" if quantize_a else "") + ("_wss" if staged_rows else ""))
    pipeline = StandardA8Pipeline(kernel_name=name, weight=s.weight.name, activation=a.dtype.name,
                                  integer=not a.dtype.is_float, weight_groups=wgroups, activation_groups=agroups,
                                  warp_k_reduce=t.warps_k > 1, split_k=t.split_k > 1, min_blocks=t.ctas_per_sm,
                                  pdl=pdl, nibbles=order is not None, expert_tensors=experts,
                                  grouped=moe and not gather, s4=s4, quantize_a=quantize_a,
                                  static_a_scale=static, f16_mma=f16_mma, staged_weight_scales=bool(staged_rows))
    body = numeric + memory + mma + schedule + epilogue + [pipeline]
    # (a_load='quantize': CvtScalar's to_float reads x too)
    components = (tuple(wrappers_for(body, layer.dtype, output_dtype(layer, compute), layer.has_bias or quantize_a,
                                     warp_m // 8)) + tuple(body))
    reasons = missing_features(components, target) + missing_symbols(components)
    if reasons:
        raise compose_error(reasons)

    k_tiles = math.ceil(kl.k / t.block_k)
    b_stride = k_pad // t.block_k * b_layout.stage_bytes(t.warps_k)  # bytes of one n block of the packed weight
    constants = constants_table(kl, n_pad, k_pad) + [
        ("kBlockM", t.block_m, ""), ("kBlockN", t.block_n, ""), ("kBlockK", t.block_k, ""),
        ("kWarpsM", t.warps_m, ""), ("kWarpsN", t.warps_n, ""), ("kWarpsK", t.warps_k, ""),
        ("kWarpsMN", t.warps_m * t.warps_n, ""),
        ("kWarpM", warp_m, "warp tile"), ("kWarpN", warp_n, ""), ("kWarpK", warp_k, ""),
        ("kPromoteK", promote_k(kl, warp_k), "k between promotions of partial sums into the accumulators"),
        ("kWarpMTiles", warp_m // 8, "m8 mma tiles per warp"), ("kWarpNTiles", warp_n // 16, "n16 mma tiles per warp"),
        ("kThreads", t.threads, ""), ("kStages", t.stages, "cp.async ring depth"),
        ("kKTiles", k_tiles, "k tiles of kBlockK covering K"),
        ("kBStride", b_stride // 16, "16-byte chunks per n block of the packed weight"),
    ]
    if wgroups:
        constants.append(("kWeightGroupK", weight_group_k(kl), "k bytes per weight scale group" if s4 else
                          "k elements per weight scale group"))
    if staged_rows:
        constants += [("kWScaleRows", staged_rows, "weight group rows per stage"),
                      ("kWScaleOffset", stage_bytes - weight_scale_stage_bytes(layer, t),
                       "bytes from a stage's start to its weight group scales")]
    if agroups:
        constants += [("kActivationGroupK", activation_group_k(kl), "k bytes per activation scale group" if s4 else
                       "k elements per activation scale group"),
                      ("kActivationGroups", math.ceil(kl.k / activation_group_k(kl)),
                       "activation scale groups per token")]
    constants += split_k_constants(t)
    constants += [(constant, per_expert[name], f"bytes of one expert's {name}") for name, constant in experts]
    constants += [("kNumExperts", layer.num_experts, "")] if moe else []
    if quantize_a:
        constants += [("kVector", 8, "x elements per 16-byte load (quantized in the loader)"),
                      ("kCodeWords", 2, "32-bit words of one vector's codes")]
    constants += [("kAStageBytes", a_bytes, ""), ("kStageBytes", stage_bytes, "")]
    return KernelPlan(layer=layer, compute=compute, tuning=t, target=target, pipeline="standard", kernel_name=name,
                      components=components, constants=tuple(constants),
                      args=(output_args(args(layer, t.split_k > 1, compute, quantize_a=quantize_a), compute)
                            if quantized else args(layer, t.split_k > 1, compute, quantize_a=quantize_a)),
                      layout=weight_layout(layer, BLayoutS4(block_n=b_layout.block_n, warps_n=b_layout.warps_n,
                                                            warp_k=b_layout.warp_k) if s4 else b_layout, n_pad),
                      group=None, shared_bytes=shared,
                      threads=t.threads, pdl=pdl,
                      launch=TiledLaunch(n_tiles=n_pad // t.block_n, block_m=t.block_m, block_n=t.block_n,
                                         split_k=t.split_k, experts=layer.num_experts if moe else 1,
                                         moe_gemm=compute.gemm if moe else ""))

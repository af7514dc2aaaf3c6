"""Activation-quantization kernels: `QuantizeConfig` (what to generate) -> components -> source -> compiled kernel.

One config gives one kernel. A dynamic per-tensor scale (granularity "tensor", or the NVFP4 global scale) takes two:
`stage="amax"` writes kPartials per-CTA amaxes, the quantize kernel reduces them (no atomics, no host sync).

Strategies (chosen here, in Python): per token and per tensor, one CTA per row (`quantize_rows`), or for per-token
scales of short rows one warp per row (`quantize_row_warps`, `row_warps=True`: a CTA per row of 256 elements left 7
of its 8 warps idle); per group, lanes of a warp share a group when the group is a power-of-two number of vectors of
at most a warp (`quantize_group_lanes`), else one thread per group (`quantize_group_threads`).
"""

from __future__ import annotations

import functools
import struct

import attrs

from humming_gen.activation.components import (BlockMax, BlockScaleRule, ElementCode, ElementValue, Rounding,
                                               ScalarPtx, Skeleton, StaticScale, VectorIO, hardware_convert,
                                               near_quotient)
import humming_gen.runtime as runtime
from humming_gen.codegen import standalone
from humming_gen.components.ptx.wrappers import GridDependency
from humming_gen.formats import FloatType, IntType
from humming_gen.schemes.scheme import ActivationScheme
from humming_gen.targets import Target

INPUT_DTYPES = ("bfloat16", "float16", "float32")
DEQUANTIZE_DTYPES = ("bfloat16", "float16")
STAGES = ("quantize", "amax")
THREADS = 256
#: Float codes of fp32-scaled elements from x times the scale's reciprocal where that product rounds as the quotient
#: does, a vector at a time (ElementCode.near; the exact division elsewhere, so the codes stay bit-identical): 12
#: instructions an element on the fast path instead of 24 (per-token fp8 SASS). The per-token kernel had 73 % of its
#: issue slots busy (H200, 4096 x 8192 bf16 -> fp8 panels: 49.2 us, 1.8 TB/s; ncu), yet the time moved less: graph us
#: of the quantization alone at 8192 columns and M = 4096 (bench/dense_kernel_times.py, --exact-division for False),
#: two machines: per token 63.0 -> 57.9 and 64.9 -> 60.8, 1 x 128 groups 68.0 -> 60.8 and 69.0 -> 66.0; M = 1024 and
#: below level. False divides every element (for measurements).
NEAR_QUOTIENT = True
#: e8m0 (power-of-two) scales: each element is x times the scale's reciprocal, which is the exact quotient, with no
#: rounds_as_quotient test and no exact-division path (False: those, as for fp32 scales; for measurements). H200,
#: MXFP8 rows, bf16 x cold (bench/quantize_times.py, --e8m0-division for False), graph us at M = 1024 / 4096:
#: K = 4096 10.3 / 36.6 -> 6.1 / 21.4, K = 8192 18.9 / 71.5 -> 11.0 / 41.4; bf16 values (--values) at K = 4096
#: 10.6 / 38.2 -> 6.5 / 23.9.
EXACT_E8M0_PRODUCT = True
PARTIALS = 256  # per-CTA amaxes of the tensor_amax kernel (its grid)
#: Vectors of a row each thread of quantize_rows loads at once and holds (raw) between the amax and the quantization
#: (16 registers at 16 bytes a vector: all of a bf16 row of 8192 at 256 threads); the rest of longer rows is read
#: twice. quantize_row_warps holds all of its rows (ROW_WARPS_MAX_VECTORS / 32 a lane). H200, graph us with cold
#: inputs (bench/quantize_times.py), fp8 per token, panels, M = 1024 / 4096: K = 8192 17.2 / 48.7 -> 15.2 / 45.5,
#: K = 16384 36.4 / 96.4 -> 31.7 / 89.8; K = 2048 (warp rows) 9.0 / 21.1 -> 7.7 / 17.7; int8 per token 8192 at 4096
#: 48.2 -> 43.4. 8 held: slower (49.4 at 8192, 97.3 at 16384: fewer CTAs resident). Loading 4 vectors at once per
#: thread in quantize_group_lanes was level at large M and twice as slow at small M (a quarter of the CTAs), not kept.
HELD_VECTORS = 4
ROW_WARPS_MAX_VECTORS = 256  # per-token rows of at most this many vectors take one warp each (8 vectors per lane)
assert ROW_WARPS_MAX_VECTORS % 32 == 0, "quantize_row_warps holds ROW_WARPS_MAX_VECTORS / 32 vectors a lane"
VERSION = "0.1.0"


def scheme_problems(scheme: ActivationScheme) -> list[str]:
    """Why the kernels cannot quantize with `scheme` (empty when they can)."""
    problems = []
    elem = scheme.dtype
    if isinstance(elem, IntType):
        if not elem.signed or elem.bits < 2:
            problems.append(f"element format {elem.name}: integer activations must be signed with >= 2 bits")
    elif not (isinstance(elem, FloatType) and elem.is_signed and elem.subnormals and elem.exponent_bits > 0):
        problems.append(f"element format {elem.name}: float activations must be signed, with exponent bits and "
                        f"subnormals")
    if elem.bits not in (4, 8):
        problems.append(f"element format {elem.name} has {elem.bits} bits; the kernels store 8-bit codes or 4-bit "
                        f"codes two per byte")
    if scheme.global_scale and scheme.granularity != "group":
        problems.append(f"a global scale needs granularity 'group', got {scheme.granularity!r}")
    if scheme.global_scale and scheme.scale_dtype.name == "float8e8m0":
        problems.append("a global scale with e8m0 block scales has no reference rule")
    if elem.bits == 4 and scheme.granularity == "group" and scheme.group_size % 2:
        problems.append(f"4-bit codes are stored two per byte, so a group must have an even size, got "
                        f"{scheme.group_size}")
    return problems


@attrs.frozen
class QuantizeConfig(standalone.StandaloneConfig):
    """What one activation-quantization kernel does.

    wide: 16-byte loads (the caller checked that K, the row stride and the pointer are multiples of 16 bytes);
    otherwise element loads. static: the per-tensor (or NVFP4 global) scale is read from a device pointer.
    hardware_convert: use the target's cvt pair conversion where the element format has one (tests turn it off
    to run the software rounding on the same device). row_warps: one warp per row, kRowsPerCta rows per CTA
    (per-token scales only) for rows of at most ROW_WARPS_MAX_VECTORS vectors: a lane holds all of its vectors of a
    row and reads no further (quantize_activation takes this kernel only for such rows).
    panels: 8-bit codes in the panel layout (quantize_activation(layout="panels")), which the warp-specialized
    8-bit GEMMs copy a stage of in one bulk copy; Params.ldq is then the panel stride, m * 128 bytes.
    dequantize: "bfloat16" / "float16": store each element's dequantized value (decode(code) * scale in fp32,
    rounded to nearest into that type, as torch converts the float64 product) instead of its code
    (fake_quantize_activation), for 16-bit GEMMs that run the scheme's values; Params.codes is then the (m, k)
    values, row stride ldq bytes. The scales are stored as usual.
    """

    scheme: ActivationScheme
    input_dtype: str
    target: Target
    static: bool = False
    wide: bool = True
    stage: str = "quantize"
    hardware_convert: bool = True
    row_warps: bool = False
    panels: bool = False
    dequantize: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.input_dtype not in INPUT_DTYPES:
            raise ValueError(f"QuantizeConfig.input_dtype: got {self.input_dtype!r}; allowed: {INPUT_DTYPES}")
        if self.stage not in STAGES:
            raise ValueError(f"QuantizeConfig.stage: got {self.stage!r}; allowed: {STAGES}")
        problems = scheme_problems(self.scheme)
        if self.static and not (self.scheme.granularity == "tensor" or self.scheme.global_scale):
            problems.append(f"a static scale needs granularity 'tensor' or a global scale, got granularity "
                            f"{self.scheme.granularity!r}")
        wide_vector = 4 if self.input_dtype == "float32" else 8
        if (self.wide and self.stage == "quantize" and self.scheme.granularity == "group"
                and self.scheme.group_size % wide_vector):
            problems.append(f"16-byte loads need a group size that is a multiple of {wide_vector} elements (a vector "
                            f"must not span two groups), got {self.scheme.group_size}; use wide=False")
        if self.row_warps and (self.scheme.granularity != "token" or self.stage != "quantize"):
            problems.append(f"row_warps (one warp per row) serves per-token scales, got granularity "
                            f"{self.scheme.granularity!r} stage {self.stage!r}")
        if self.panels and (self.bits != 8 or self.stage != "quantize"):
            problems.append(f"panels (the GEMMs' bulk-copied layout) holds 8-bit codes of the quantize stage, got "
                            f"{self.bits}-bit codes, stage {self.stage!r}")
        if self.dequantize is not None:
            if self.dequantize not in DEQUANTIZE_DTYPES:
                problems.append(f"dequantize: got {self.dequantize!r}; allowed: {DEQUANTIZE_DTYPES}")
            if self.panels or self.stage != "quantize" or self.scheme.global_scale:
                problems.append("dequantize (16-bit values) serves the quantize stage in rows, without a global scale")
            if self.dequantize == "bfloat16" and not self.target.has("mma_bf16"):
                problems.append(f"dequantize='bfloat16' needs bf16 conversions, which {self.target.name} lacks")
        if self.stage == "amax" and not self.needs_amax_pass:
            problems.append("stage 'amax' exists only for a dynamic per-tensor or global scale")
        if problems:
            raise ValueError("activation quantization: " + "; ".join(problems))

    # --- derived ----------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return self.scheme.dtype.bits

    @property
    def needs_amax_pass(self) -> bool:
        dynamic_tensor = self.scheme.granularity == "tensor" and not self.scheme.global_scale
        return not self.static and (dynamic_tensor or self.scheme.global_scale)

    @property
    def vector(self) -> int:
        """Elements per thread step: 16 bytes when wide, else one element (two for 4-bit codes, one byte)."""
        if self.wide:
            return 4 if self.input_dtype == "float32" else 8
        return 2 if self.bits == 4 else 1

    @property
    def group_lanes(self) -> int | None:
        """Lanes per group when a group is a power-of-two number (<= 32) of vectors, else None."""
        g = self.scheme.group_size
        if self.scheme.granularity != "group" or g % self.vector:
            return None
        lanes = g // self.vector
        return lanes if lanes <= 32 and lanes & (lanes - 1) == 0 else None

    @property
    def kind(self) -> str:
        if self.stage == "amax":
            return "tensor_amax"
        if self.row_warps:
            return "quantize_row_warps"
        if self.scheme.granularity != "group":
            return "quantize_rows"
        return "quantize_group_lanes" if self.group_lanes else "quantize_group_threads"

    @property
    def rows_per_cta(self) -> int:
        return THREADS // 32 if self.row_warps else 1

    @property
    def convert(self) -> str | None:
        found = hardware_convert(self.scheme.dtype)
        if not self.hardware_convert or found is None or not self.target.has(found[1]):
            return None
        return found[0]

    @property
    def pdl(self) -> bool:
        return self.target.has("pdl")

    @property
    def scale_bits(self) -> int:
        return self.scheme.scale_dtype.bits

    def to_dict(self) -> dict:
        out = {"scheme": self.scheme.to_dict(), "input_dtype": self.input_dtype, "target": self.target.name,
               "static": self.static, "wide": self.wide, "stage": self.stage, "hardware_convert": self.hardware_convert}
        for name in ("row_warps", "panels"):  # (listed only when set: the other kernels keep their keys)
            if getattr(self, name):
                out[name] = True
        if self.dequantize:
            out["dequantize"] = self.dequantize
        return out

    def summary(self) -> str:
        s = self.scheme
        gran = f"g{s.group_size}" if s.granularity == "group" else s.granularity
        parts = [f"activation_quantize stage={self.stage} {self.input_dtype} -> {s.dtype.name}",
                 f"scale={s.scale_dtype.name}/{gran}"]
        if s.scale_dtype.name == "float8e8m0":
            parts.append(f"rule={s.scale_rule}")
        if s.global_scale:
            parts.append("global_scale=" + ("static" if self.static else "dynamic"))
        elif s.granularity == "tensor":
            parts.append("static" if self.static else "dynamic")
        parts += [f"loads={'16B' if self.wide else 'element'}", f"convert={self.convert or 'software'}"]
        if self.row_warps:
            parts.append("rows=warp")
        if self.panels:
            parts.append("codes=panels")
        if self.dequantize:
            parts.append(f"stores={self.dequantize} values")
        return " ".join(parts)

    @property
    def kernel_name(self) -> str:
        s = self.scheme
        gran = f"g{s.group_size}" if s.granularity == "group" else s.granularity
        name = f"act_{self.stage}_{s.dtype.name}_{gran}{'_w' if self.row_warps else ''}{'_p' if self.panels else ''}" \
               f"{'_dq_' + self.dequantize if self.dequantize else ''}_" \
               f"{s.scale_dtype.name}_" \
               f"{self.input_dtype}_{self.target.name}"
        return self.named(name)


def components(cfg: QuantizeConfig) -> list:
    """The components of a config's kernel, in section order."""
    s = cfg.scheme
    e8m0 = s.scale_dtype.name == "float8e8m0"
    partials = cfg.needs_amax_pass and cfg.stage == "quantize"
    value_type = "double" if s.global_scale else "float"
    # (a static per-tensor scale is the checkpoint's fp32 value, not a power of two)
    exact_product = cfg.stage == "quantize" and e8m0 and not cfg.static and EXACT_E8M0_PRODUCT
    near = cfg.stage == "quantize" and NEAR_QUOTIENT and near_quotient(s.dtype, value_type) and not exact_product
    out: list = []
    if cfg.pdl:
        out.append(GridDependency())
    out.append(ScalarPtx(input_dtype=cfg.input_dtype, convert=cfg.convert if cfg.stage == "quantize" else None,
                         f64=e8m0 and cfg.stage == "quantize", f64_from_bits=e8m0 and s.scale_rule == "even"))
    if cfg.stage == "quantize":
        encoders = [] if cfg.convert else [s.dtype]
        decoders = []
        if not e8m0 and s.scale_dtype.name != "float32" and not (s.granularity == "tensor" and cfg.static):
            encoders.append(s.scale_dtype)
            decoders.append(s.scale_dtype)
        encoders = list(dict.fromkeys(encoders))
        floor = None
        if s.dtype.is_float and not e8m0 and not s.global_scale:
            from humming_gen.schemes.quantize import element_qmax

            floor = 1.0 / (element_qmax(s.dtype) * 512.0)
        divisor = None
        if s.global_scale and not cfg.static:
            from humming_gen.schemes.quantize import element_qmax

            top = s.scale_dtype.max_finite if s.scale_dtype.bits <= 8 else 1.0
            divisor = element_qmax(s.dtype) * top
        out.append(Rounding(encoders=tuple(encoders), decoders=tuple(decoders),
                            sign_of_difference=bool(decoders) or s.global_scale))
        if not (s.granularity == "tensor" and cfg.static):
            out.append(BlockScaleRule(element=s.dtype, scale_dtype=s.scale_dtype, scale_rule=s.scale_rule,
                                      floor=floor, global_scale=s.global_scale, global_divisor=divisor))
        else:
            out.append(StaticScale())
        out.append(ElementCode(element=s.dtype, convert=cfg.convert, value_type=value_type, near=near,
                               exact_product=exact_product))
        if cfg.dequantize:
            decode = cfg.convert if cfg.convert in ("e4m3", "e5m2") else None  # (no e2m1 -> f16x2 cvt)
            out.append(ElementValue(element=s.dtype, convert=decode, out_dtype=cfg.dequantize,
                                    pair_cvt=cfg.target.has("mma_bf16")))
    out.append(VectorIO(input_dtype=cfg.input_dtype, wide=cfg.wide, vector=cfg.vector, bits=cfg.bits,
                        quantize=cfg.stage == "quantize", panels=cfg.panels, near_quotient=near,
                        dequantize=cfg.dequantize, power_of_two_scale=exact_product))
    if cfg.kind in ("tensor_amax", "quantize_rows") or partials:
        out.append(BlockMax(partials=partials))
    out.append(Skeleton(kind=cfg.kind, kernel_name=cfg.kernel_name, input_dtype=cfg.input_dtype,
                        granularity=s.granularity, static=cfg.static, partials=partials,
                        global_scale=("static" if cfg.static else "dynamic") if s.global_scale else None,
                        scale_bits=cfg.scale_bits, pdl=cfg.pdl, panels=cfg.panels))
    return out


def constants(cfg: QuantizeConfig) -> list[tuple[str, int, str]]:
    def words(bits: int) -> int:
        return max(1, -(-cfg.vector * bits // 32))

    out = [("kThreads", THREADS, "threads per CTA"), ("kVector", cfg.vector, "elements per thread step")]
    if cfg.dequantize:
        out += [("kCodeWords", words(16), f"32-bit words of one vector's {cfg.dequantize} values"),
                ("kElementCodeWords", words(cfg.bits), "32-bit words of one vector's codes")]
    else:
        out.append(("kCodeWords", words(cfg.bits), "32-bit words of one vector's codes"))
    if cfg.scheme.granularity == "group" and cfg.stage == "quantize":
        out.append(("kGroupSize", cfg.scheme.group_size, "elements per scale"))
        if cfg.group_lanes:
            out.append(("kGroupLanes", cfg.group_lanes, "lanes sharing one group"))
    if cfg.needs_amax_pass:
        out.append(("kPartials", PARTIALS, "per-CTA amaxes of the tensor_amax kernel"))
    if cfg.row_warps:
        out.append(("kRowsPerCta", cfg.rows_per_cta, "one warp per row"))
    if cfg.kind in ("quantize_rows", "quantize_row_warps"):
        held = ROW_WARPS_MAX_VECTORS // 32 if cfg.row_warps else HELD_VECTORS
        out.append(("kHeldVectors", held, "vectors a thread loads at once and holds"))
    return out


def param_fields(cfg: QuantizeConfig) -> list[tuple[str, str, str]]:
    """(name, C type, comment) of the kernel's by-value Params struct, in packing order."""
    s = cfg.scheme
    fields = [("x", "const void*", f"activations (m, k) {cfg.input_dtype}, row stride ldx elements"),
              ("ldx", "long long", "")]
    if cfg.stage == "quantize":
        codes = (f"{cfg.dequantize} values (m, k), row stride ldq bytes" if cfg.dequantize else
                 "8-bit codes in 128-column panels of m rows, panel stride ldq bytes" if cfg.panels else
                 f"{cfg.bits}-bit codes, row stride ldq bytes")
        fields += [("codes", "unsigned char*", codes), ("ldq", "long long", "")]
        if not (s.granularity == "tensor" and cfg.static):
            fields.append(("scales", "void*", f"{s.scale_dtype.name} scales, (m, groups) row-major"))
        if s.granularity == "group":
            fields.append(("groups", "long long", "scales per row: ceil(k / group size)"))
        if cfg.kind == "quantize_group_lanes":
            fields.append(("row_vectors", "long long", "vectors per row, rounded up to whole groups"))
        if s.granularity == "tensor" and cfg.static:
            fields.append(("tensor_scale", "const float*", "the static per-tensor scale"))
        if s.global_scale:
            fields.append(("global_scale", "float*", "read (static) or written (dynamic)"))
    if cfg.needs_amax_pass:
        fields.append(("partials", "float*", "per-CTA amaxes (kPartials)"))
    fields += [("m", "long long", "rows"), ("k", "int", "elements per row")]
    return fields


def params_struct(cfg: QuantizeConfig) -> struct.Struct:
    """struct.Struct packing Params with C alignment (8-byte fields aligned, tail padded to 8)."""
    return standalone.params_struct(param_fields(cfg))


def generate(cfg: QuantizeConfig, compiler: str | None = None) -> str:
    """The kernel's complete .cu (deterministic)."""
    return standalone.render_source(cfg, "activation/header.cuh.j2", VERSION, components(cfg), constants(cfg),
                                    param_fields(cfg), compiler)


@functools.lru_cache(maxsize=256)
def build(cfg: QuantizeConfig, compiler: str | None = None) -> "QuantizeKernel":
    """Generate and compile (memory and disk cache of humming_gen.runtime); one Kernel object per config."""
    source = generate(cfg, compiler)
    return QuantizeKernel(cfg, source, standalone.compile_source(cfg, source, compiler), param_fields(cfg))


class QuantizeKernel(standalone.StandaloneKernel):
    """A compiled activation-quantization kernel; loaded on first launch."""

    def launch(self, grid: int, values: dict[str, int], device: int) -> None:
        """Launch on torch's current stream with PDL where the target has it; `values` fills every Params field."""
        runtime.launch(self.function(device), (grid, 1, 1), (THREADS, 1, 1), 0, self.pack(values), pdl=self._pdl)

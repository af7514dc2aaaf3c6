"""Components of the activation-quantization kernels: each renders one template of templates/activation/ with
resolved values (format constants, literals, flags), so the generated source holds only the chosen branch."""

from __future__ import annotations

import math
import struct
from typing import Any, ClassVar

import attrs

from humming_gen.components.base import Component, option_field
from humming_gen.formats import DType, FloatType, IntType

# Formats with a cvt.rn.satfinite.<name>x2.f32 instruction, by (exponent, mantissa, bias, nan) and target feature.
HARDWARE_CONVERT = {(4, 3, 7, "all_ones"): ("e4m3", "cvt_fp8"), (5, 2, 15, "ieee"): ("e5m2", "cvt_fp8"),
                    (2, 1, 1, "none"): ("e2m1", "cvt_fp4")}
STORE_TYPE = {8: "unsigned char", 16: "u16", 32: "u32"}
INPUT_TYPE = {"bfloat16": "u16", "float16": "u16", "float32": "float"}


def double_literal(value: float) -> str:
    """A C++ double literal that parses to exactly `value` (hex float; finite values only)."""
    return float(value).hex()


def hardware_convert(fmt: DType) -> tuple[str, str] | None:
    """(PTX spelling, target feature) of the pair conversion into `fmt`, or None when there is none."""
    if not isinstance(fmt, FloatType) or not fmt.is_signed or not fmt.subnormals:
        return None
    return HARDWARE_CONVERT.get((fmt.exponent_bits, fmt.mantissa_bits, fmt.bias, fmt.nan))


def _nan_code(fmt: FloatType) -> int | None:
    """The code the reference's encode gives NaN: the format's NaN code; torch's canonical NaN for 16-bit formats."""
    if fmt.nan == "none":
        return None
    if fmt.bits == 16:
        return ((1 << (fmt.exponent_bits + 1)) - 1) << (fmt.mantissa_bits - 1)
    return fmt.nan_code


def format_constants(fmt: DType) -> dict[str, Any]:
    """Template values of encode_<fmt> (round half to even, saturating)."""
    if isinstance(fmt, IntType):
        return {"name": fmt.name, "kind": "int", "min": fmt.min_value, "max": fmt.max_value,
                "mask": hex((1 << fmt.bits) - 1)}
    assert isinstance(fmt, FloatType) and fmt.is_signed and fmt.subnormals and fmt.exponent_bits > 0
    values = fmt.code_values()
    finite = [c for c in range(1 << (fmt.bits - 1)) if math.isfinite(float(values[c]))]
    nan = _nan_code(fmt)
    return {"name": fmt.name, "kind": "float", "mantissa": fmt.mantissa_bits, "emin": 1 - fmt.bias,
            "sign_shift": fmt.bits - 1, "max_code": hex(max(finite, key=lambda c: float(values[c]))),
            "nan_code": None if nan is None else hex(nan), "inf_code": None if fmt.inf_code is None else hex(fmt.inf_code),
            "nan_text": hex(nan) if nan is not None else "a signed 0 (the reference's nan_to_num)"}


def decoder_constants(fmt: FloatType) -> dict[str, Any]:
    """Template values of decode_<fmt> (a scale format's code -> fp32)."""
    quantum_exponent = 1 - fmt.bias - fmt.mantissa_bits
    quantum_bits = struct.unpack("<I", struct.pack("<f", 2.0 ** quantum_exponent))[0]
    return {"name": fmt.name, "mantissa": fmt.mantissa_bits, "bias": fmt.bias, "nan": fmt.nan,
            "exponent_mask": hex((1 << fmt.exponent_bits) - 1), "mantissa_mask": hex((1 << fmt.mantissa_bits) - 1),
            "magnitude_mask": hex((1 << (fmt.exponent_bits + fmt.mantissa_bits)) - 1),
            "subnormal_quantum_bits": hex(quantum_bits), "subnormal_exponent": quantum_exponent}


@attrs.frozen
class ScalarPtx(Component):
    """Bit casts, IEEE fp32 division / fma, round to int, warp max and (where the target has it) the pair cvt."""

    template: ClassVar[str] = "activation/scalar_ptx.cuh.j2"
    family: ClassVar[str] = "ptx"
    input_dtype: str
    convert: str | None  # "e4m3", "e5m2", "e2m1" or None
    f64: bool  # double bit access (e8m0 exponents)
    f64_from_bits: bool


@attrs.frozen
class Rounding(Component):
    """round_to_odd and the software encoders (element format, scale format) and scale decoders."""

    template: ClassVar[str] = "activation/round.cuh.j2"
    family: ClassVar[str] = "numeric"
    encoders: tuple[DType, ...]
    decoders: tuple[DType, ...]
    sign_of_difference: bool  # a float64 value rounded to fp32 first (narrow scale formats, NVFP4 quotients)

    def extra_context(self) -> dict[str, Any]:
        return {"formats": [format_constants(f) for f in self.encoders],
                "decoders": [decoder_constants(f) for f in self.decoders]}


@attrs.frozen
class BlockScaleRule(Component):
    """The scale of a block (token / group / tensor) from its amax, exactly as the float64 reference rounds it."""

    template: ClassVar[str] = "activation/block_scale.cuh.j2"
    family: ClassVar[str] = "numeric"
    element: DType
    scale_dtype: DType
    scale_rule: str
    floor: float | None  # vLLM's lower bound of float-element scales
    global_scale: bool
    global_divisor: float | None  # qmax * top of a dynamic global scale

    def extra_context(self) -> dict[str, Any]:
        from humming_gen.schemes.quantize import element_qmax

        qmax = element_qmax(self.element)
        ctx: dict[str, Any] = {"qmax": qmax, "qmax_literal": double_literal(qmax), "element": self.element.name,
                               "scale_dtype": self.scale_dtype.name,
                               "global_divisor_literal": (double_literal(self.global_divisor)
                                                          if self.global_divisor is not None else None)}
        if self.scale_dtype.name == "float8e8m0":
            emax = int(math.floor(math.log2(qmax)))
            m = (self.element.mantissa_bits if isinstance(self.element, FloatType) and self.element.exponent_bits > 0
                 else emax)
            ctx.update(rule="e8m0", emax=emax, even_bits=m, even_threshold=double_literal(2.0 - 2.0 ** -(m + 1)))
            return ctx
        fmt = self.scale_dtype
        one_code = None if fmt.name == "float32" else hex(int(fmt.encode(__import__("torch").tensor([1.0]))[0]))
        formula = "amax / global_scale / qmax" if self.global_scale else "amax / qmax"
        if self.floor is not None:
            formula += " (at least the floor)"
        ctx.update(rule="rounded", value_type="double" if self.global_scale else "float", one_code=one_code,
                   floor_literal=double_literal(self.floor) if self.floor is not None else None, formula=formula)
        return ctx


@attrs.frozen
class ElementCode(Component):
    """quotient (x / scale rounded to odd) and encode_pair: two elements' codes, hardware cvt where it exists."""

    template: ClassVar[str] = "activation/element.cuh.j2"
    family: ClassVar[str] = "numeric"
    element: DType
    convert: str | None
    value_type: str  # "float" or "double"
    # rounds_as_quotient: x times the scale's reciprocal where that product rounds as the quotient does
    # (near_quotient; quantize_vector takes it for whole vectors)
    near: bool = option_field()
    exact_product: bool = option_field()  # power-of-two (e8m0) scales: x times the reciprocal, no quotient()

    def __attrs_post_init__(self) -> None:
        if self.near and not near_quotient(self.element, self.value_type):
            raise ValueError(f"rounds_as_quotient serves float elements whose normal binades lie in fp32's, with "
                             f"fp32 scales; got {self.element.name} with {self.value_type} scales")

    def extra_context(self) -> dict[str, Any]:
        fmt = self.element
        nan = _nan_code(fmt) if isinstance(fmt, FloatType) else None
        inf = fmt.inf_code if isinstance(fmt, FloatType) else None
        context = {"element": fmt.name, "bits": fmt.bits, "mask": hex((1 << fmt.bits) - 1),
                   "pair_mask": hex((1 << 2 * fmt.bits) - 1),
                   "nan_code": None if nan is None else hex(nan), "inf_code": None if inf is None else hex(inf)}
        if self.near:  # fp32 bit patterns: the element's normal binades, and its rounding midpoints inside one
            low_bits = 23 - fmt.mantissa_bits  # fp32 mantissa bits below the element's last one
            top = math.frexp(fmt.max_finite)[1] - 1  # the binade of the largest finite value
            context.update(near_low_mask=hex((1 << low_bits) - 1), near_half=hex(1 << (low_bits - 1)),
                           near_margin=NEAR_MARGIN_ULPS, near_lo=hex((1 - fmt.bias + 127) << 23),
                           near_hi=hex((top + 1 + 127) << 23))
        return context


#: fp32 ulps between x * reciprocal and every rounding midpoint for the product to be taken (rounds_as_quotient): with
#: a normal reciprocal (quantize_vector checks it) the product is within 1.5 ulps of the exact quotient (reciprocal
#: and product each rounded to nearest; 1.466 the largest of 12M fuzzed cases in a review), so 4 leaves margin.
NEAR_MARGIN_ULPS = 4


def near_quotient(element: DType, value_type: str) -> bool:
    """Whether rounds_as_quotient serves the element: a float format with exponent bits and at most 20 mantissa bits
    (its midpoints lie inside an fp32 mantissa) whose normal binades are fp32 normal binades (smallest normal at least
    2^-126, largest finite below 2^128: else fp32 infinities would pass the range test), divided by an fp32 scale."""
    return (isinstance(element, FloatType) and element.exponent_bits > 0 and element.mantissa_bits <= 20
            and 1 - element.bias >= -126 and element.max_finite < 2.0 ** 128 and value_type == "float")


@attrs.frozen
class VectorIO(Component):
    """Vector loads of an activation row (16-byte or masked element loads), amax, quantize, packed code stores."""

    template: ClassVar[str] = "activation/vector_io.cuh.j2"
    family: ClassVar[str] = "memory"
    input_dtype: str
    wide: bool
    vector: int
    bits: int
    quantize: bool  # False in the tensor_amax kernel: loads and amax only
    panels: bool = option_field()  # 8-bit codes in the panel layout (QuantizeConfig.panels): codes_at
    near_quotient: bool = option_field()  # quantize_vector takes x * reciprocal where rounds_as_quotient holds
    dequantize: str | None = option_field(None)  # QuantizeConfig.dequantize: stores 16-bit values, not codes
    power_of_two_scale: bool = option_field()  # e8m0 scales: quantize_vector multiplies by the exact reciprocal

    def extra_context(self) -> dict[str, Any]:
        store_bits = 16 if self.dequantize else self.bits
        # store_codes addresses 16-bit values only in its 16- and 8-byte wide branches and its element stores
        assert not (self.dequantize and self.wide) or self.vector * 2 in (8, 16), "no store of this vector's values"
        return {"input_type": INPUT_TYPE[self.input_dtype], "store_bytes": self.vector * store_bits // 8,
                "store_bits": store_bits, "mask": hex((1 << self.bits) - 1),
                "codes_type": "ElementCodes" if self.dequantize else "Codes",
                "codes_words": "kElementCodeWords" if self.dequantize else "kCodeWords",
                "encode_name": "element_codes" if self.dequantize else "quantize_vector"}


@attrs.frozen
class ElementValue(Component):
    """QuantizeConfig.dequantize: element codes back to values, times the scale, rounded once to a 16-bit type."""

    template: ClassVar[str] = "activation/element_value.cuh.j2"
    family: ClassVar[str] = "numeric"
    element: DType
    convert: str | None  # "e4m3" / "e5m2": the pair cvt to f16x2 (None: the software decode)
    out_dtype: str  # "bfloat16" or "float16"
    pair_cvt: bool  # cvt.rn.{bf16,f16}x2.f32 (sm_80+); else two scalar cvts

    def extra_context(self) -> dict[str, Any]:
        fmt = self.element
        context: dict[str, Any] = {"element": fmt.name, "bits": fmt.bits, "mask": hex((1 << fmt.bits) - 1),
                                   "ptx_type": {"bfloat16": "bf16", "float16": "f16"}[self.out_dtype],
                                   "kind": "int" if isinstance(fmt, IntType) else "float",
                                   "convert": self.convert}
        if isinstance(fmt, FloatType):
            context.update(decoder_constants(fmt))
            context["name"] = fmt.name
        return context


@attrs.frozen
class StaticScale(Component):
    """A static per-tensor scale: elements are divided by the checkpoint's fp32 value, unrounded (as the reference)."""

    template: ClassVar[str] = "activation/static_scale.cuh.j2"
    family: ClassVar[str] = "numeric"


@attrs.frozen
class BlockMax(Component):
    """CTA-wide max (row amax, tensor amax partials)."""

    template: ClassVar[str] = "activation/block_max.cuh.j2"
    family: ClassVar[str] = "schedule"
    partials: bool


@attrs.frozen
class Skeleton(Component):
    """The kernel entry: tensor_amax, quantize_rows, quantize_group_lanes or quantize_group_threads."""

    family: ClassVar[str] = "pipeline"
    kind: str
    kernel_name: str
    input_dtype: str
    granularity: str
    static: bool
    partials: bool
    global_scale: str | None  # None, "dynamic", "static"
    scale_bits: int
    pdl: bool
    panels: bool = option_field()  # codes stored through codes_at (QuantizeConfig.panels)

    @property
    def template(self) -> str:  # type: ignore[override]
        return f"activation/{self.kind}.cuh.j2"

    def extra_context(self) -> dict[str, Any]:
        return {"input_type": INPUT_TYPE[self.input_dtype], "scale_store_type": STORE_TYPE[self.scale_bits]}

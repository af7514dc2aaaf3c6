"""Conversion of code pairs (codes in the low bits of two 16-bit lanes) to packed 16-bit compute values.

Each converter states what its output means: `bias` is the constant the scale step still has to subtract
(the magic number of exponent insertion), so zero points and format offsets merge into that subtraction.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component
from humming_gen.components.numeric.halfbits import BIAS, EXPONENT_BITS, MANTISSA_BITS, bits16, lanes_hex, pair_hex
from humming_gen.formats import DType, FloatType, IntType


@attrs.frozen
class IntMagicConvert(Component):
    """code | magic: the 16-bit float 2^mantissa_bits + code, exact while code < 2^mantissa_bits."""

    template: ClassVar[str] = "numeric/int_magic_convert.cuh.j2"
    family: ClassVar[str] = "numeric"
    bits: int
    dtype: str

    @property
    def bias(self) -> float:
        return float(1 << MANTISSA_BITS[self.dtype])

    def extra_context(self) -> dict:
        return {"magic_value": int(self.bias), "magic_hex": pair_hex(self.bias, self.dtype),
                "mantissa_bits": MANTISSA_BITS[self.dtype]}

    def emulate(self, lane_code: int) -> float:
        return float(lane_code) + self.bias


@attrs.frozen
class Int8ViaFp32Convert(Component):
    """8-bit codes into bf16: exact through fp32 magic numbers (a bf16 mantissa has only 7 bits)."""

    template: ClassVar[str] = "numeric/int8_via_fp32_convert.cuh.j2"
    family: ClassVar[str] = "numeric"
    ptx: ClassVar[tuple[str, ...]] = ("prmt", "cvt_pack")
    dtype: str
    bias: ClassVar[float] = 0.0

    def emulate(self, lane_code: int) -> float:
        return float(lane_code)


@attrs.frozen
class FloatPlaceConvert(Component):
    """Move exponent+mantissa (and sign) of a small float into the 16-bit float, then multiply by
    2^(bias difference) so normals and subnormals both come out exact."""

    template: ClassVar[str] = "numeric/float_place_convert.cuh.j2"
    family: ClassVar[str] = "numeric"
    fmt: str
    exponent_bits: int
    mantissa_bits: int
    signed: bool
    source_bias: int
    dtype: str
    bias: ClassVar[float] = 0.0

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("fma2",) if self.exponent_shift else ()

    @property
    def exponent_shift(self) -> int:
        return BIAS[self.dtype] - self.source_bias

    def extra_context(self) -> dict:
        bits = int(self.signed) + self.exponent_bits + self.mantissa_bits
        ctx = {"sign_bits": int(self.signed), "bias": self.source_bias,
               "magnitude_mask": lanes_hex((1 << (self.exponent_bits + self.mantissa_bits)) - 1),
               "magnitude_shift": MANTISSA_BITS[self.dtype] - self.mantissa_bits,
               "sign_mask": lanes_hex(1 << (bits - 1)), "sign_shift": 16 - bits,
               "exponent_shift": self.exponent_shift, "exp_scale_hex": None,
               "neg_zero_hex": lanes_hex(0x8000)}
        if self.exponent_shift:
            ctx["exp_scale_hex"] = pair_hex(2.0 ** self.exponent_shift, self.dtype)
        return ctx


@attrs.frozen
class SignMagnitudeConvert(Component):
    """e0 formats (value = +-mantissa): magnitude through the magic number, then the sign bit moved."""

    template: ClassVar[str] = "numeric/sign_magnitude_convert.cuh.j2"
    family: ClassVar[str] = "numeric"
    ptx: ClassVar[tuple[str, ...]] = ("fma2",)
    fmt: str
    bits: int
    dtype: str
    bias: ClassVar[float] = 0.0

    def extra_context(self) -> dict:
        magic = float(1 << MANTISSA_BITS[self.dtype])
        return {"max_magnitude": (1 << (self.bits - 1)) - 1, "magnitude_mask": lanes_hex((1 << (self.bits - 1)) - 1),
                "magic_value": int(magic), "magic_hex": pair_hex(magic, self.dtype),
                "one_hex": pair_hex(1.0, self.dtype), "neg_magic_hex": pair_hex(-magic, self.dtype),
                "sign_mask": lanes_hex(1 << (self.bits - 1)), "sign_shift": 16 - self.bits}


def select_converter(weight: DType, dtype: str) -> Component:
    """The converter serving (stored weight format, compute type); ValueError when none can be exact."""
    if isinstance(weight, IntType):
        if weight.bits <= MANTISSA_BITS[dtype]:
            return IntMagicConvert(bits=weight.bits, dtype=dtype)
        if weight.bits == 8 and dtype == "bfloat16":
            return Int8ViaFp32Convert(dtype=dtype)
    elif isinstance(weight, FloatType):
        if weight.is_sign_magnitude_int:
            if weight.bits - 1 <= MANTISSA_BITS[dtype]:
                return SignMagnitudeConvert(fmt=weight.name, bits=weight.bits, dtype=dtype)
        elif (weight.exponent_bits <= EXPONENT_BITS[dtype] and weight.mantissa_bits <= MANTISSA_BITS[dtype]
              and 0 <= BIAS[dtype] - weight.bias <= (BIAS[dtype])):
            return FloatPlaceConvert(fmt=weight.name, exponent_bits=weight.exponent_bits,
                                     mantissa_bits=weight.mantissa_bits, signed=weight.signed,
                                     source_bias=weight.bias, dtype=dtype)
    raise ValueError(f"weight format {weight.name} cannot be converted exactly to {dtype} activations"
                     + (" (try dtype=torch.bfloat16)" if dtype == "float16" else ""))


def kernel_codes_offset(weight: DType) -> int:
    """Signed ints are stored offset-binary in the kernel layout: value = code - 2^(bits-1)."""
    return 1 << (weight.bits - 1) if isinstance(weight, IntType) and weight.signed else 0


def check_exact(value: float, dtype: str) -> None:
    bits16(value, dtype)

"""Conversion of code pairs (codes in the low bits of two 16-bit lanes) to packed 16-bit compute values.

Each converter states what its output means: `bias` is the constant the scale step still has to subtract
(the magic number of exponent insertion), so zero points and format offsets merge into that subtraction.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component
from humming_gen.components.numeric.halfbits import (BIAS, EXPONENT_BITS, MANTISSA_BITS, bits16, fma2_lane,
                                                     lane_value, lanes_hex, pair_hex)
from humming_gen.formats import DType, FloatType, IntType


@attrs.frozen
class IntMagicConvert(Component):
    """code | magic: the 16-bit float 2^mantissa_bits + code, exact while code < 2^mantissa_bits. It renders
    nothing itself: the OR rides in the extraction's LOP3 (`or_bits`, merged by compose)."""

    family: ClassVar[str] = "numeric"
    bits: int
    dtype: str

    @property
    def bias(self) -> float:
        return float(1 << MANTISSA_BITS[self.dtype])

    @property
    def or_bits(self) -> str:
        """The conversion is an OR of this constant, so the extract step's LOP3 does it (see compose)."""
        return pair_hex(self.bias, self.dtype)

    def emulate(self, lane_code: int) -> float:
        return float(lane_code) + self.bias


@attrs.frozen
class IntTopBitConvert(Component):
    """Codes one bit wider than the mantissa (8-bit codes into bf16), exact without leaving 16 bits: the low bits
    go under the magic number 2^m (LOP3), the top bit picks -2^(m+1) or -2^m by flipping an exponent bit (LOP3),
    and one packed fma adds the two. The sum is code - 2^m. Reads the plane unmasked: it masks what it needs."""

    template: ClassVar[str] = "numeric/int_top_bit_convert.cuh.j2"
    family: ClassVar[str] = "numeric"
    ptx: ClassVar[tuple[str, ...]] = ("and_or", "and_xor", "fma2")
    provides: ClassVar[frozenset[str]] = frozenset({"convert_pair"})
    needs: ClassVar[frozenset[str]] = frozenset({"and_or", "and_xor", "fma2"})
    takes_unmasked: ClassVar[bool] = True
    dtype: str

    @property
    def bias(self) -> float:
        return -float(1 << MANTISSA_BITS[self.dtype])

    def extra_context(self) -> dict:
        m = MANTISSA_BITS[self.dtype]
        top_clear = bits16(-float(1 << (m + 1)), self.dtype)  # the top bit clear: -2^(m+1)
        if top_clear ^ (1 << m) != bits16(-float(1 << m), self.dtype):
            raise ValueError(f"{self.dtype}: flipping bit {m} of -2^{m + 1} does not give -2^{m}")
        return {"low_mask": lanes_hex((1 << m) - 1), "magic_hex": pair_hex(float(1 << m), self.dtype),
                "top_mask": lanes_hex(1 << m), "top_hex": f"0x{top_clear * 0x10001:08X}",
                "one_hex": pair_hex(1.0, self.dtype), "magic_value": 1 << m, "code_bits": m + 1}

    def emulate(self, lane_code: int) -> float:
        """Python model of convert_pair on the low 16-bit lane, from the rendered constants."""
        ctx = self.extra_context()
        low = (lane_code & _low(ctx["low_mask"])) | _low(ctx["magic_hex"])
        top = (lane_code & _low(ctx["top_mask"])) ^ _low(ctx["top_hex"])
        return lane_value(fma2_lane(low, _low(ctx["one_hex"]), top, self.dtype), self.dtype)


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
    # the group scales carry 2^exponent_shift (pipelines.common.scale_exponent): no multiply here, the output is
    # 2^-exponent_shift times the element value and the scale step's fma makes it whole
    scale_carries_exponent: bool = False
    bias: ClassVar[float] = 0.0

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("fma2",) if self.exponent_shift and not self.scale_carries_exponent else ()

    provides: ClassVar[frozenset[str]] = frozenset({"convert_pair"})

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset(self.ptx)

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
               "neg_zero_hex": lanes_hex(0x8000), "scale_carries_exponent": self.scale_carries_exponent}
        if self.exponent_shift and not self.scale_carries_exponent:
            ctx["exp_scale_hex"] = pair_hex(2.0 ** self.exponent_shift, self.dtype)
        return ctx

    def emulate(self, lane_code: int) -> float:
        """Python model of convert_pair on the low 16-bit lane, built from the constants the template renders:
        mask and shift the magnitude under the compute type's mantissa MSB, move the sign to bit 15, then the
        packed fma by 2^exponent_shift (adding -0) when there is one. Returns the value after that multiply
        (2^-exponent_shift times the element value where the scale carries the exponent)."""
        ctx = self.extra_context()
        x = (lane_code & _low(ctx["magnitude_mask"])) << ctx["magnitude_shift"]
        if self.signed:
            x |= (lane_code & _low(ctx["sign_mask"])) << ctx["sign_shift"]
        assert x <= 0xFFFF, f"code {lane_code:#x} spills into the neighbouring lane ({x:#x})"
        if ctx["exp_scale_hex"] is not None:
            x = fma2_lane(x, _low(ctx["exp_scale_hex"]), _low(ctx["neg_zero_hex"]), self.dtype)
        return lane_value(x, self.dtype)


@attrs.frozen
class SignMagnitudeConvert(Component):
    """e0 formats (value = +-mantissa): magnitude through the magic number, then the sign bit moved."""

    template: ClassVar[str] = "numeric/sign_magnitude_convert.cuh.j2"
    family: ClassVar[str] = "numeric"
    ptx: ClassVar[tuple[str, ...]] = ("fma2",)
    provides: ClassVar[frozenset[str]] = frozenset({"convert_pair"})
    needs: ClassVar[frozenset[str]] = frozenset({"fma2"})
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

    def emulate(self, lane_code: int) -> float:
        """Python model of convert_pair on the low 16-bit lane: (magnitude | magic) * 1 - magic with one packed
        fma, then the sign bit XOR-ed into bit 15 (so a negative zero code gives -0)."""
        ctx = self.extra_context()
        placed = (lane_code & _low(ctx["magnitude_mask"])) | _low(ctx["magic_hex"])
        magnitude = fma2_lane(placed, _low(ctx["one_hex"]), _low(ctx["neg_magic_hex"]), self.dtype)
        x = magnitude ^ ((lane_code & _low(ctx["sign_mask"])) << ctx["sign_shift"])
        assert x <= 0xFFFF, f"code {lane_code:#x} spills into the neighbouring lane ({x:#x})"
        return lane_value(x, self.dtype)


def select_converter(weight: DType, dtype: str) -> Component:
    """The converter serving (stored weight format, compute type); ValueError when none can be exact."""
    if isinstance(weight, IntType):
        if weight.bits <= MANTISSA_BITS[dtype]:
            return IntMagicConvert(bits=weight.bits, dtype=dtype)
        if weight.bits == MANTISSA_BITS[dtype] + 1:
            return IntTopBitConvert(dtype=dtype)
    elif isinstance(weight, FloatType):
        if weight.is_sign_magnitude_int:
            if weight.bits - 1 <= MANTISSA_BITS[dtype]:
                return SignMagnitudeConvert(fmt=weight.name, bits=weight.bits, dtype=dtype)
        elif (weight.exponent_bits <= EXPONENT_BITS[dtype] and weight.mantissa_bits <= MANTISSA_BITS[dtype]
              and 0 <= BIAS[dtype] - weight.bias <= (BIAS[dtype])):
            if not weight.subnormals:
                raise ValueError(f"weight format {weight.name} has no subnormals (its exponent-0 codes are normal "
                                 f"numbers), which exponent placement cannot express; it cannot be converted "
                                 f"exactly to {dtype}")
            return FloatPlaceConvert(fmt=weight.name, exponent_bits=weight.exponent_bits,
                                     mantissa_bits=weight.mantissa_bits, signed=weight.signed,
                                     source_bias=weight.bias, dtype=dtype)
    raise ValueError(f"weight format {weight.name} cannot be converted exactly to {dtype} activations"
                     + (" (try dtype=torch.bfloat16)" if dtype == "float16" else ""))


def kernel_codes_offset(weight: DType) -> int:
    """Signed ints are stored offset-binary in the kernel layout: value = code - 2^(bits-1)."""
    return 1 << (weight.bits - 1) if isinstance(weight, IntType) and weight.signed else 0


# --- helpers of the `emulate` models (Python stand-ins for the 16-bit lane arithmetic) ----------------------
def _low(hex_literal: str) -> int:
    """Low 16-bit lane of a rendered pair constant such as "0x43004300"."""
    return int(hex_literal, 16) & 0xFFFF


def check_exact(value: float, dtype: str) -> None:
    """Raise ValueError unless `value` is exactly representable in the 16-bit compute type."""
    bits16(value, dtype)

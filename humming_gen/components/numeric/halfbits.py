"""Bit patterns of 16-bit compute-type constants, as they appear in generated source."""

from __future__ import annotations

import torch

TORCH_DTYPE = {"bfloat16": torch.bfloat16, "float16": torch.float16}
MANTISSA_BITS = {"bfloat16": 7, "float16": 10}
EXPONENT_BITS = {"bfloat16": 8, "float16": 5}
BIAS = {"bfloat16": 127, "float16": 15}


def bits16(value: float, dtype: str) -> int:
    """16-bit pattern of `value` in `dtype`; raises when the value is not exact there."""
    t = torch.tensor([value], dtype=torch.float64).to(TORCH_DTYPE[dtype])
    if t.to(torch.float64).item() != value:
        raise ValueError(f"{value} is not exactly representable in {dtype}")
    return t.view(torch.int16).item() & 0xFFFF


def pair_hex(value: float, dtype: str) -> str:
    """`value` in both 16-bit lanes, as a hex literal."""
    b = bits16(value, dtype)
    return f"0x{(b << 16) | b:08X}"


def lanes_hex(mask: int) -> str:
    """A 16-bit mask repeated in both lanes."""
    return f"0x{(mask << 16) | mask:08X}"


# --- lane arithmetic of the `emulate` models (Python stand-ins for 16-bit lane operations) ---------------
def lane_value(bits: int, dtype: str) -> float:
    """The 16-bit pattern `bits` read as a `dtype` value."""
    signed = bits - 0x10000 if bits & 0x8000 else bits
    return torch.tensor([signed], dtype=torch.int16).view(TORCH_DTYPE[dtype]).item()


def round_bits(value: float, dtype: str) -> int:
    """16-bit pattern of `value` rounded to nearest even in `dtype` (the .rn of fma and cvt)."""
    return torch.tensor([value], dtype=torch.float64).to(TORCH_DTYPE[dtype]).view(torch.int16).item() & 0xFFFF


def fma2_lane(a: int, b: int, c: int, dtype: str) -> int:
    """One lane of fma.rn.{bf16x2,f16x2}: a * b + c with a single rounding (exact in float64 for 16-bit inputs
    whose sum needs no more than float64's precision, which holds for every constant the converters use)."""
    return round_bits(lane_value(a, dtype) * lane_value(b, dtype) + lane_value(c, dtype), dtype)

"""Weights of at most 4 bits widened in registers to the 8-bit operands of mma.sync m16n8k32: one word of eight
nibble codes (schemes.packing.BLayoutNibble8) becomes two A registers X and Y of four bytes each.

int8 activations: a signed code in a byte's high nibble is the int8 16 x code (two LOP3 and a shift per word;
the 1/16 is folded into the fp32 scales, an exact power of two). fp8 activations: every code's value is an e4m3
value, looked up with prmt in an 8-entry byte table indexed by the code's low 3 bits; the top bit is the e4m3 sign
where the format is sign-magnitude (e2m1), else it picks one of two tables through a sign-replicated byte mask.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from humming_gen.components.base import Component
from humming_gen.formats import DType, IntType, dtype

NIBBLE_ACTIVATIONS = ("int8", "float8e4m3", "float8e5m2")
INT8_CODE_SCALE = 1.0 / 16  # what a code's int8 register value is multiplied by to give the code


def e4m3_table(weight: DType) -> tuple[int, ...]:
    """e4m3 code of each nibble's value (0 past the format's codes); ValueError naming a value e4m3 lacks."""
    values = weight.decode(torch.arange(1 << weight.bits)).to(torch.float32)
    e4m3 = dtype("float8e4m3")
    codes = e4m3.encode(values)
    back = e4m3.decode(codes).to(torch.float32)
    bad = [v for v, b in zip(values.tolist(), back.tolist()) if not (v == b or (v != v and b != b))]
    if bad:
        raise ValueError(f"weight format {weight.name}: value {bad[0]:g} is not an e4m3 value, so its codes cannot "
                         f"meet fp8 activations exactly")
    return tuple(int(c) for c in codes.tolist()) + (0,) * (16 - len(values))


def nibble_reasons(weight: DType, activation: DType) -> list[str]:
    """Why weights of at most 4 bits of format `weight` cannot meet 8-bit activations `activation` exactly."""
    if weight.bits > 4:
        return [f"weight format {weight.name} ({weight.bits} bits) with 8-bit activations: weights of 8 bits or of at "
                f"most 4 bits (widened in registers) are generated"]
    if activation.name not in NIBBLE_ACTIVATIONS:
        return [f"weight format {weight.name} x activation format {activation.name}: weights of at most 4 bits meet "
                f"{', '.join(NIBBLE_ACTIVATIONS)} activations"]
    if not activation.is_float:
        if not (isinstance(weight, IntType) and weight.signed):
            return [f"weight format {weight.name} x int8 activations: the nibble-to-int8 widening (a code in a byte's "
                    f"high nibble is 16 x its value) is exact for signed ints of at most 4 bits only"]
        return []
    try:
        e4m3_table(weight)
    except ValueError as e:
        return [str(e)]
    return []


def prmt_model(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 (default mode): byte n of the result is byte selector[4n:4n+3] & 7 of {b, a}, or that byte's
    sign bit replicated where the selector nibble's top bit is set."""
    pool = (b << 32) | a
    out = 0
    for n in range(4):
        sel = (selector >> 4 * n) & 0xF
        byte = (pool >> 8 * (sel & 7)) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << 8 * n
    return out


@attrs.frozen
class NibbleToInt8(Component):
    """Signed codes of at most 4 bits (sign-extended to nibbles at packing) -> int8 registers of 16 x code."""

    template: ClassVar[str] = "numeric/nibble_to_int8.cuh.j2"
    family: ClassVar[str] = "numeric"
    provides: ClassVar[frozenset[str]] = frozenset({"nibbles_to_a8"})
    weight: str

    @staticmethod
    def emulate(word: int) -> tuple[int, int]:
        """Python model of nibbles_to_a8: the X and Y registers."""
        return word & 0xF0F0F0F0, (word << 4) & 0xF0F0F0F0


@attrs.frozen
class NibbleToE4m3(Component):
    """Codes of at most 4 bits whose values are all e4m3 values -> e4m3 registers by prmt table lookup."""

    template: ClassVar[str] = "numeric/nibble_to_e4m3.cuh.j2"
    family: ClassVar[str] = "numeric"
    ptx: ClassVar[tuple[str, ...]] = ("prmt",)
    needs: ClassVar[frozenset[str]] = frozenset({"prmt"})
    weight: DType

    @property
    def table(self) -> tuple[int, ...]:
        return e4m3_table(self.weight)

    @property
    def mode(self) -> str:
        """"narrow": codes of at most 3 bits, one table and no top bit; "sign_magnitude": codes 8-15 are codes 0-7
        negated (e2m1), so the top bit is the e4m3 sign bit; "two_tables": the top bit picks the table."""
        t = self.table
        if self.weight.bits < 4:
            return "narrow"
        return "sign_magnitude" if all(t[i] < 0x80 and t[8 + i] == t[i] | 0x80 for i in range(8)) else "two_tables"

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"nibbles_to_a8", "kE4m3Low0", "kE4m3Low1"}
                         | ({"kE4m3High0", "kE4m3High1"} if self.mode == "two_tables" else set()))

    def _words(self) -> tuple[int, int, int, int]:
        t = self.table
        return tuple(sum(t[4 * w + i] << 8 * i for i in range(4)) for w in range(4))  # type: ignore[return-value]

    def extra_context(self) -> dict:
        words = [f"0x{w:08X}u" for w in self._words()]
        return {"weight_name": self.weight.name, "mode": self.mode, "low": words[:2], "high": words[2:]}

    def emulate(self, word: int) -> tuple[int, int]:
        """Python model of nibbles_to_a8 from the rendered tables: the X and Y registers."""
        lo0, lo1, hi0, hi1 = self._words()
        index = word & 0x77777777
        top_y = (word << 4) & 0xFFFFFFFF
        out = []
        for sel, top in ((index, word), (index >> 16, top_y)):
            if self.mode == "narrow":
                out.append(prmt_model(lo0, lo1, sel))
            elif self.mode == "sign_magnitude":
                out.append(prmt_model(lo0, lo1, sel) | (top & 0x80808080))
            else:
                mask = prmt_model(top, top, 0xBA98)
                out.append((prmt_model(hi0, hi1, sel) & mask) | (prmt_model(lo0, lo1, sel) & ~mask & 0xFFFFFFFF))
        return out[0], out[1]

"""Code extraction from the bit-plane weight layout (humming_gen.schemes.packing)."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component
from humming_gen.components.numeric.halfbits import lanes_hex
from humming_gen.schemes.packing import bit_planes


@attrs.frozen
class PlaneExtract(Component):
    """Shift-and-mask per plane, planes OR-ed together: a code pair per mma register."""

    template: ClassVar[str] = "numeric/extract_planes.cuh.j2"
    family: ClassVar[str] = "numeric"
    bits: int

    def extra_context(self) -> dict:
        planes, offset, shift = [], 0, self.bits
        for w in bit_planes(self.bits):
            shift -= w
            planes.append({"width": w, "word_offset": offset, "per_word": 16 // w,
                           "mask": lanes_hex((1 << w) - 1), "code_shift": shift})
            offset += 4 * w
        return {"planes": planes, "chunk_words": 4 * self.bits}

    @staticmethod
    def emulate(words: list[int], reg: int, bits: int) -> tuple[int, int]:
        """Python model of extract_code_pair: the (low lane, high lane) codes of register `reg`."""
        code, offset, shift = 0, 0, bits
        for w in bit_planes(bits):
            shift -= w
            per_word = 16 // w
            word = words[offset + reg // per_word] >> (reg % per_word * w)
            code |= (word & (((1 << w) - 1) * 0x10001)) << shift
            offset += 4 * w
        return code & 0xFFFF, code >> 16

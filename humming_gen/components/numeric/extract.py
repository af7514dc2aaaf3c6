"""Code extraction from the bit-plane weight layout (humming_gen.schemes.packing)."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component, option_field
from humming_gen.components.numeric.halfbits import lanes_hex
from humming_gen.schemes.packing import bit_planes


@attrs.frozen
class PlaneExtract(Component):
    """One shift and one LOP3 per plane: a code pair per mma register. `or_bits` (a converter's magic number,
    when its conversion is an OR) rides along in the first LOP3, so such a conversion costs nothing."""

    template: ClassVar[str] = "numeric/extract_planes.cuh.j2"
    family: ClassVar[str] = "numeric"
    bits: int
    or_bits: str | None = None  # hex literal OR-ed into both lanes
    mask_codes: bool = option_field(True)  # False (one plane only): the converter masks the bits it reads

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("lop3",) if self.or_bits or len(bit_planes(self.bits)) > 1 else ()

    def __attrs_post_init__(self) -> None:
        if not self.mask_codes and (self.or_bits or len(bit_planes(self.bits)) > 1):
            raise ValueError("unmasked extraction serves a single bit plane without or_bits")

    def extra_context(self) -> dict:
        planes, offset, shift = [], 0, self.bits
        for w in bit_planes(self.bits):
            shift -= w
            # ((word >> s) & m) << c == (word >> (s - c)) & (m << c): the plane's place in the code costs no shift
            planes.append({"width": w, "word_offset": offset, "per_word": 16 // w,
                           "mask": lanes_hex(((1 << w) - 1) << shift), "code_shift": shift})
            offset += 4 * w
        return {"planes": planes, "chunk_words": 4 * self.bits}

    @staticmethod
    def emulate(words: list[int], reg: int, bits: int) -> tuple[int, int]:
        """Python model of extract_code_pair (without or_bits): the (low lane, high lane) codes of `reg`."""
        code, offset, shift = 0, 0, bits
        for w in bit_planes(bits):
            shift -= w
            word = words[offset + reg // (16 // w)]
            net = reg % (16 // w) * w - shift  # one shift instruction per plane, as in the template
            placed = (word >> net) if net >= 0 else (word << -net) & 0xFFFFFFFF
            code |= placed & ((((1 << w) - 1) << shift) * 0x10001)
            offset += 4 * w
        return code & 0xFFFF, code >> 16

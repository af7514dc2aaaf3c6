"""Code extraction from the bit-plane weight layout (humming_gen.schemes.packing)."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component, option_field
from humming_gen.components.numeric.halfbits import fma2_lane, lane_value, lanes_hex, pair_hex
from humming_gen.schemes.packing import bit_planes, plane_positions


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
        return ("and_or",) if self.or_bits or len(bit_planes(self.bits)) > 1 else ()

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"kChunkWords", "extract_code_pair"} | ({"kOrBits"} if self.or_bits else set()))

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset(self.ptx)

    def __attrs_post_init__(self) -> None:
        if not self.mask_codes and (self.or_bits or len(bit_planes(self.bits)) > 1):
            raise ValueError("unmasked extraction serves a single bit plane without or_bits")

    def extra_context(self) -> dict:
        planes, offset, shift = [], 0, self.bits
        for w in bit_planes(self.bits):
            shift -= w
            per_word = 16 // w
            interleaved = plane_positions(self.bits, w) != tuple(j * w for j in range(per_word))
            position = ("2 * (reg % 8) + reg % 16 / 8" if interleaved  # the one exception (plane_positions)
                        else f"reg % {per_word} * {w}")
            # the C expression (integer division) must give plane_positions' bit for every register
            if [eval(position.replace("/", "//"), {"reg": reg}) for reg in range(per_word)] != list(
                    plane_positions(self.bits, w)):
                raise ValueError(f"the {w}-bit plane of {self.bits}-bit codes has no position expression")
            # ((word >> s) & m) << c == (word >> (s - c)) & (m << c): the plane's place in the code costs no shift
            planes.append({"width": w, "word_offset": offset, "per_word": per_word, "position": position,
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
            net = plane_positions(bits, w)[reg % (16 // w)] - shift  # one shift instruction per plane
            placed = (word >> net) if net >= 0 else (word << -net) & 0xFFFFFFFF
            code |= placed & ((((1 << w) - 1) << shift) * 0x10001)
            offset += 4 * w
        return code & 0xFFFF, code >> 16


@attrs.frozen
class ThreeBitSharedShiftExtract(Component):
    """3-bit codes whose conversion is an OR of a magic number: one shift of each plane word serves three
    registers, whose codes land at bits 0, 2 and 4; a packed fma by 2^-j returns those at bit j > 0
    to magic + code. Per register pair: 2 LOP3, about 0.7 shifts, 5/8 of an fma (plane extraction: 2 shifts and
    2 LOP3)."""

    template: ClassVar[str] = "numeric/extract_3bit_shared_shift.cuh.j2"
    family: ClassVar[str] = "numeric"
    ptx: ClassVar[tuple[str, ...]] = ("and_or", "fma2")
    provides: ClassVar[frozenset[str]] = frozenset({"kChunkWords", "kOrBits", "extract_code_pair"})
    needs: ClassVar[frozenset[str]] = frozenset({"and_or", "fma2"})
    or_bits: str  # the magic number, as the IntMagic converter renders it
    dtype: str
    AT: ClassVar[tuple[int, ...]] = (2, 4)  # landing bits that need the fma (bit 0 needs none)

    def extra_context(self) -> dict:
        magic = lane_value(int(self.or_bits, 16) & 0xFFFF, self.dtype)
        norm = {at: (pair_hex(2.0 ** -at, self.dtype), pair_hex(magic * (1 - 2.0 ** -at), self.dtype))
                for at in self.AT}
        return {"magic": int(magic), "norm": norm}

    @classmethod
    def shift_and_landing(cls, reg: int) -> tuple[int, int]:
        """(right shift shared by fields 0-2, 3-5, 6-7 of a word; bit where the register's code lands)."""
        field = reg % 8
        shift = field // 3 * 6
        return shift, 2 * field - shift

    def emulate(self, words: list[int], reg: int) -> tuple[int, int]:
        """Python model of extract_code_pair: the (low lane, high lane) codes it hands on (value - magic)."""
        shift, at = self.shift_and_landing(reg)
        word = words[reg // 8]
        high = (word << 1) & 0xFFFFFFFF if shift == 0 else word >> (shift - 1)
        low = words[8 + reg // 16] >> (shift + reg // 8 % 2)
        magic = int(self.or_bits, 16)
        pair = (high & ((0x00060006 << at) & 0xFFFFFFFF)) | magic
        pair |= low & ((0x00010001 << at) & 0xFFFFFFFF)
        codes = []
        for lane in (pair & 0xFFFF, pair >> 16):
            if at:
                scale, add = (int(h, 16) & 0xFFFF for h in self.extra_context()["norm"][at])
                lane = fma2_lane(lane, scale, add, self.dtype)
            codes.append(lane_value(lane, self.dtype) - lane_value(magic & 0xFFFF, self.dtype))
        return int(codes[0]), int(codes[1])

"""MMA atoms as data: the shape one warp computes, which element of the A (weights) and C (accumulator) tiles
each lane's registers hold, and the instruction's spelling. The weight packing (humming_gen.schemes.packing)
and the output epilogue read these maps instead of hard-coding a fragment order, so an MMA with another order
(the Zhenwu PPU's N-before-M accumulators) is a new atom, not edits across packing and templates.

Roles: weights are the A operand (rows = output features n), tokens the B / C columns (swap-AB), so an A
fragment is indexed (row n, column k) and a C fragment (row n, column token).
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen(repr=False)
class MmaAtom:
    """One warp's share of an MMA: A is `m` x `k` (weights, 32 / `a_bits` elements in each of `a_registers`
    registers), C is `m` x `n` in `c_registers` fp32 (or s32) registers per 8 columns of tokens."""

    name: str
    instruction: str   # PTX spelling; {n} stands for the token count where the instruction takes one
    m: int
    n: int             # tokens per instruction (0: chosen by the tile, as wgmma's N)
    k: int
    a_registers: int
    c_registers: int
    # C expressions of the maps below, in the names the templates use (g = lane / 4, t = lane % 4, half, j)
    c_row_expr: str
    c_col_expr: str
    a_bits: int = 16   # bits of one A element: 16 (bf16 / fp16 pairs), 8 (s8 / e4m3 / e5m2 quads) or 4 (s4)

    def __repr__(self) -> str:
        return self.name

    @property
    def a_per_register(self) -> int:
        return 32 // self.a_bits

    def a_element(self, lane: Any, reg: Any, half: Any) -> tuple[Any, Any]:
        """(row, k) of element `half` (0..a_per_register - 1, lowest bits first) of A register `reg` of `lane`
        (ints or tensors). Registers 0 / 1 hold rows g / g + 8 of the first k half, 2 / 3 those of the second."""
        g, t = lane // 4, lane % 4
        e = self.a_per_register
        return g + 8 * (reg % 2), e * t + 4 * e * (reg // 2) + half

    def c_element(self, lane: Any, half: Any, j: Any) -> tuple[Any, Any]:
        """(row, column) of accumulator register 2 * half + j of an 8-column group, for `lane`."""
        g, t = lane // 4, lane % 4
        return g + 8 * half, 2 * t + j


# mma.sync m16n8k16: the standard pipeline's instruction, one per (16-row n tile, 8-token m tile).
MMA_SYNC_M16N8K16 = MmaAtom(name="mma.sync.m16n8k16", instruction="mma.sync.aligned.m16n8k16.row.col.f32",
                            m=16, n=8, k=16, a_registers=4, c_registers=4, c_row_expr="g + 8 * half",
                            c_col_expr="2 * t + j")
# wgmma m64nNk16 with A from registers: warp w of the warpgroup holds rows 16w..16w+15 in exactly the
# m16n8k16 A fragment order, and its accumulators hold those rows in m16n8 C order per 8 tokens.
WGMMA_M64NNK16_WARP = MmaAtom(name="wgmma.m64nNk16 (one warp's rows)",
                              instruction="wgmma.mma_async.sync.aligned.m64n{n}k16.f32", m=16, n=0, k=16,
                              a_registers=4, c_registers=4, c_row_expr="g + 8 * half", c_col_expr="2 * t + j")
# mma.sync m16n8k32 with 8-bit operands (s8 x s8 -> s32 on sm_80+, e4m3 / e5m2 -> f32 on sm_89+): register r of
# lane (g, t) holds the four k-consecutive bytes 4t..4t+3 (+16 for r = 2, 3) of row g (+8 for odd r): the m16n8k16
# A fragment of a matrix whose elements are byte pairs. C is the m16n8k16 order.
MMA_SYNC_M16N8K32_8BIT = MmaAtom(name="mma.sync.m16n8k32 (8-bit)", instruction="mma.sync.aligned.m16n8k32.row.col",
                                 m=16, n=8, k=32, a_registers=4, c_registers=4, c_row_expr="g + 8 * half",
                                 c_col_expr="2 * t + j", a_bits=8)
# mma.sync m16n8k64 with int4 operands (s4 x s4 -> s32; sm_80+ where the target has mma_int4): register r of lane
# (g, t) holds the eight k-consecutive nibbles 8t..8t+7 (+32 for r = 2, 3) of row g (+8 for odd r), element 0 in the
# least significant nibble. So byte b of a register holds k = 2 * (4t + b) + {0, 1}: int4 codes packed two per byte
# along k (low nibble first) are, byte for byte, the m16n8k32 8-bit fragments of the packed bytes (B likewise).
MMA_SYNC_M16N8K64_S4 = MmaAtom(name="mma.sync.m16n8k64 (s4)", instruction="mma.sync.aligned.m16n8k64.row.col",
                               m=16, n=8, k=64, a_registers=4, c_registers=4, c_row_expr="g + 8 * half",
                               c_col_expr="2 * t + j", a_bits=4)

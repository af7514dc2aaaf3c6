"""The canonical 128-byte-swizzled K-major weight layout (schemes.packing.BLayoutSw128), CPU only: packing round
trips; the panel image is the activation tile's (a_tile_sw128: chunk c of row r at c ^ (r % 8)); and ldmatrix on it
gives exactly the m16n8k32 8-bit A fragments, so one packed copy could feed SS wgmma (descriptor), RS wgmma and
mma.sync (registers)."""

from __future__ import annotations

import pytest
import torch

from humming_gen.components.mma.atoms import MMA_SYNC_M16N8K32_8BIT as ATOM
from humming_gen.schemes.packing import (BLayoutSw128, pack_codes_sw128, sw128_ldmatrix_a, sw128_offset,
                                         unpack_codes_sw128)


@pytest.mark.parametrize("block_n,n,k", [(128, 256, 384), (256, 256, 128), (64, 192, 256)])
def test_round_trip_and_panel_image(block_n: int, n: int, k: int) -> None:
    codes = torch.randint(0, 256, (n, k), dtype=torch.uint8)
    layout = BLayoutSw128(block_n=block_n)
    packed = pack_codes_sw128(codes, layout)
    assert packed.shape == (n // block_n, k // 128, block_n * 128)
    assert torch.equal(unpack_codes_sw128(packed, layout, n, k), codes)
    for nb, kp, r, kb in ((0, 0, 0, 0), (0, 0, 9, 17), (n // block_n - 1, k // 128 - 1, block_n - 1, 127)):
        chunk = kb // 16
        want = codes[nb * block_n + r, kp * 128 + kb]
        assert packed[nb, kp, r * 128 + (chunk ^ (r % 8)) * 16 + kb % 16] == want  # the activation tile's swizzle


def test_ldmatrix_gives_the_mma_a_fragments() -> None:
    torch.manual_seed(0)
    codes = torch.randint(0, 256, (128, 128), dtype=torch.uint8)
    panel = pack_codes_sw128(codes, BLayoutSw128(block_n=128))[0, 0]
    lane = torch.arange(32).view(-1, 1, 1)
    reg = torch.arange(4).view(1, -1, 1)
    byte = torch.arange(4).view(1, 1, -1)
    for row0 in (0, 16, 112):
        for step in range(4):
            row, k = ATOM.a_element(lane, reg, byte)
            want = codes[row0 + row, 32 * step + k]
            assert torch.equal(sw128_ldmatrix_a(panel, row0, step), want), (row0, step)


def test_each_ldmatrix_row_is_one_aligned_chunk() -> None:
    """A 16-byte ldmatrix row never straddles chunks: the swizzle permutes whole chunks within a 128-byte row."""
    for row in range(16):
        offsets = {sw128_offset(row, kb) // 16 for kb in range(0, 128, 16)}
        assert offsets == set(range(row * 8, row * 8 + 8))


def test_block_n_must_tile_the_swizzle_atom() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_codes_sw128(torch.zeros(12, 128, dtype=torch.uint8), BLayoutSw128(block_n=12))

"""The standard pipeline's weight layout (humming_gen.schemes.packing) and the in-register code extraction.

The expected positions are computed here from the module docstring, not from packing's own index helpers:
global order [n block][k slice][warp n][chunk][plane][load][lane][4 words]; a chunk is 16 mma tiles numbered
k-step-major; register R of a chunk is tile R // 4, A-fragment register R % 4 (rows g / g+8, columns 2t, 2t+1,
+8 for registers 2, 3); in a plane of width w, register R = q * (16 / w) + j sits in word q at bits j*w (low
lane, even column) and 16 + j*w (high lane, odd column).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from humming_gen.components.numeric.convert import IntMagicConvert
from humming_gen.components.numeric.extract import PlaneExtract, ThreeBitSharedShiftExtract
from humming_gen.schemes.packing import BLayout, bit_planes, pack_codes, permute_group_rows, unpack_codes

# (block_n, warps_n, warp_k): the heuristic layout, a 1-warp block, warp_k 128, a 256-wide block, and a warp
# slice of two chunks (64 x 128 = 32 tiles).
LAYOUTS = [(128, 2, 64), (64, 1, 64), (64, 2, 128), (256, 4, 64), (128, 2, 128)]


def _layout_id(spec) -> str:
    return "bn{}-wn{}-wk{}".format(*spec)


def _random_codes(n: int, k: int, bits: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.int64).to(torch.uint8)


def _expected_position(layout: BLayout, n: int, k: int) -> tuple[int, int, int, int, int, int, int]:
    """(n block, k slice, warp n, chunk, register R, lane, half) of element (n, k), from the docstring."""
    nb, n_in = divmod(n, layout.block_n)
    wn, n_warp = divmod(n_in, layout.warp_n)
    ks, k_warp = divmod(k, layout.warp_k)
    n_tiles = layout.warp_n // 16
    tile = (k_warp // 16) * n_tiles + n_warp // 16  # k-step-major
    chunk, tile_in_chunk = divmod(tile, 16)
    row, col = n_warp % 16, k_warp % 16
    g, t, half = row % 8, (col % 8) // 2, col % 2
    r = (row // 8) + 2 * (col // 8)  # a0: (g, 2t), a1: (g+8, 2t), a2: (g, 2t+8), a3: (g+8, 2t+8)
    return nb, ks, wn, chunk, tile_in_chunk * 4 + r, 4 * g + t, half


def _word_and_bit(layout: BLayout, n: int, k: int, plane_index: int) -> tuple[int, int, int, int]:
    """(n block, k slice, word index inside the (n block, k slice) run, bit) holding plane `plane_index` of
    element (n, k)."""
    nb, ks, wn, chunk, reg, lane, half = _expected_position(layout, n, k)
    planes = bit_planes(layout.bits)
    w = planes[plane_index]
    load0 = sum(planes[:plane_index])  # 16-byte loads of the planes before this one
    q, j = divmod(reg, 16 // w)
    load, i = divmod(q, 4)
    loads_per_chunk = layout.bits
    word = (((wn * layout.chunks_per_warp + chunk) * loads_per_chunk + load0 + load) * 32 + lane) * 4 + i
    # the 1-bit plane of 3-bit codes interleaves: pairs 0-7 at even bits, 8-15 at odd bits (one shift, 3 registers)
    position = 2 * (j % 8) + j // 8 if (layout.bits, w) == (3, 1) else j * w
    return nb, ks, word, position + 16 * half


@pytest.mark.parametrize("spec", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("bits", range(1, 9))
def test_pack_unpack_round_trip(bits: int, spec) -> None:
    layout = BLayout(*spec, bits=bits)
    n, k = 2 * layout.block_n, 3 * layout.warp_k
    codes = _random_codes(n, k, bits, seed=bits)
    packed = pack_codes(codes, layout)
    assert packed.dtype == torch.int32
    assert packed.shape == (n // layout.block_n, k // layout.warp_k, layout.block_n * layout.warp_k * bits // 32)
    assert packed.numel() * 32 == n * k * bits  # no padding words
    assert torch.equal(unpack_codes(packed, layout, n, k), codes)


@pytest.mark.parametrize("bits", range(1, 9))
def test_stage_bytes_matches_packed_run(bits: int) -> None:
    layout = BLayout(128, 2, 64, bits)
    packed = pack_codes(_random_codes(128, 256, bits, 0), layout)
    # one k slice of one n block is warps_k=1 stage; a stage of warps_k slices is contiguous
    assert packed[0, 0].numel() * 4 == layout.stage_bytes(1)
    assert packed[0].numel() * 4 == layout.stage_bytes(4)


@pytest.mark.parametrize("spec", LAYOUTS[:3], ids=_layout_id)
@pytest.mark.parametrize("bits", [1, 3, 4, 6, 8])
def test_documented_bit_positions(bits: int, spec) -> None:
    """Pack a single non-zero element and find each of its bits exactly where the docstring puts it."""
    layout = BLayout(*spec, bits=bits)
    n, k = 2 * layout.block_n, 2 * layout.warp_k
    rng = torch.Generator().manual_seed(7)
    picks = [(0, 0), (n - 1, k - 1), (9, 1), (layout.warp_n + 8, 17)]
    picks += [(int(torch.randint(n, (1,), generator=rng)), int(torch.randint(k, (1,), generator=rng)))
              for _ in range(4)]
    code = (1 << bits) - 1  # every bit set, so every plane shows up
    for pn, pk in picks:
        codes = torch.zeros(n, k, dtype=torch.uint8)
        codes[pn, pk] = code
        words = pack_codes(codes, layout).to(torch.int64) & 0xFFFFFFFF
        expected = set()
        for p in range(len(layout.planes)):
            nb, ks, word, bit0 = _word_and_bit(layout, pn, pk, p)
            for b in range(layout.planes[p]):
                expected.add((nb, ks, word, bit0 + b))
        found = set()
        for idx in torch.nonzero(words).tolist():
            value = int(words[tuple(idx)])
            found |= {(idx[0], idx[1], idx[2], b) for b in range(32) if value >> b & 1}
        assert found == expected, f"element (n={pn}, k={pk}), bits={bits}, layout={spec}"


@pytest.mark.parametrize("bits", range(1, 9))
def test_plane_bit_order(bits: int) -> None:
    """The widest plane holds the most significant bits: code = planes OR-ed, shifted by what follows."""
    layout = BLayout(64, 1, 64, bits)
    codes = (torch.arange(64 * 64) % (1 << bits)).view(64, 64).to(torch.uint8)  # every code, many places
    words = pack_codes(codes, layout).to(torch.int64) & 0xFFFFFFFF
    for n, k in itertools.product(range(0, 64, 3), range(64)):
        got, shift = 0, bits
        for p, w in enumerate(layout.planes):
            shift -= w
            _, _, word, bit0 = _word_and_bit(layout, n, k, p)
            got |= ((int(words[0, 0, word]) >> bit0) & ((1 << w) - 1)) << shift
        assert got == int(codes[n, k]), (n, k)


@pytest.mark.parametrize("spec", [(128, 2, 64), (64, 2, 128)], ids=_layout_id)
@pytest.mark.parametrize("bits", range(1, 9))
def test_plane_extract_emulation_reads_every_register(bits: int, spec) -> None:
    """PlaneExtract.emulate over a lane's 4 * bits chunk words gives the codes of each of the 64 registers,
    in the order the mma A fragment needs them (low lane: even column, high lane: odd column)."""
    layout = BLayout(*spec, bits=bits)
    n, k = layout.block_n, layout.warp_k
    codes = _random_codes(n, k, bits, seed=100 + bits)
    packed = pack_codes(codes, layout).to(torch.int64) & 0xFFFFFFFF
    # [warp n][chunk][load][lane][4 words] of the single (n block, k slice)
    words = packed[0, 0].view(layout.warps_n, layout.chunks_per_warp, bits, 32, 4)
    n_tiles = layout.warp_n // 16
    for wn, chunk, lane in itertools.product(range(layout.warps_n), range(layout.chunks_per_warp), range(32)):
        lane_words = [int(v) for v in words[wn, chunk, :, lane, :].reshape(-1)]  # words[4 * load + i]
        g, t = lane // 4, lane % 4
        for reg in range(64):
            tile = chunk * 16 + reg // 4
            r = reg % 4
            row = wn * layout.warp_n + (tile % n_tiles) * 16 + g + 8 * (r % 2)
            col = (tile // n_tiles) * 16 + 2 * t + 8 * (r // 2)
            want = (int(codes[row, col]), int(codes[row, col + 1]))
            assert PlaneExtract.emulate(lane_words, reg, bits) == want, (wn, chunk, lane, reg)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_three_bit_shared_shift_reads_every_register(dtype: str) -> None:
    """ThreeBitSharedShiftExtract.emulate (shared shifts, codes landing at bits 0 / 2 / 4, the fma back) gives
    the codes of each of the 64 registers of every lane, with the rendered constants."""
    layout = BLayout(128, 2, 64, bits=3)
    codes = _random_codes(128, 64, 3, seed=7)
    packed = pack_codes(codes, layout).to(torch.int64) & 0xFFFFFFFF
    words = packed[0, 0].view(layout.warps_n, layout.chunks_per_warp, 3, 32, 4)
    extract = ThreeBitSharedShiftExtract(or_bits=IntMagicConvert(bits=3, dtype=dtype).or_bits, dtype=dtype)
    n_tiles = layout.warp_n // 16
    landed = set()
    for wn, chunk, lane in itertools.product(range(layout.warps_n), range(layout.chunks_per_warp), range(32)):
        lane_words = [int(v) for v in words[wn, chunk, :, lane, :].reshape(-1)]
        g, t = lane // 4, lane % 4
        for reg in range(64):
            tile, r = chunk * 16 + reg // 4, reg % 4
            row = wn * layout.warp_n + (tile % n_tiles) * 16 + g + 8 * (r % 2)
            col = (tile // n_tiles) * 16 + 2 * t + 8 * (r // 2)
            want = (int(codes[row, col]), int(codes[row, col + 1]))
            assert extract.emulate(lane_words, reg) == want, (wn, chunk, lane, reg)
            landed.add(extract.shift_and_landing(reg)[1])
    assert landed == {0, 2, 4}


@pytest.mark.parametrize("bits", range(1, 9))
def test_plane_extract_template_constants(bits: int) -> None:
    """The rendered plane table agrees with bit_planes: word offsets 4 * (widths before), masks per lane."""
    ctx = PlaneExtract(bits=bits).extra_context()
    assert ctx["chunk_words"] == 4 * bits
    offset, shift = 0, bits
    for p, w in zip(ctx["planes"], bit_planes(bits)):
        shift -= w
        assert (p["width"], p["word_offset"], p["per_word"], p["code_shift"]) == (w, offset, 16 // w, shift)
        assert int(p["mask"], 16) == (((1 << w) - 1) << shift) * 0x10001  # the plane's bits of the code
        offset += 4 * w


def test_bit_planes() -> None:
    assert [bit_planes(b) for b in range(1, 9)] == [(1,), (2,), (2, 1), (4,), (4, 1), (4, 2), (4, 2, 1), (8,)]
    for bad in (0, 9):
        with pytest.raises(ValueError, match="1..8"):
            bit_planes(bad)


def test_layout_check_and_padding_errors() -> None:
    assert BLayout(128, 2, 64, 4).check() == []
    assert BLayout(128, 8, 64, 4).check()  # 16 x 64 warp slice: 4 tiles, not a whole chunk
    with pytest.raises(ValueError, match="weight layout"):
        pack_codes(torch.zeros(128, 64, dtype=torch.uint8), BLayout(128, 16, 64, 4))
    with pytest.raises(ValueError, match="not padded"):
        pack_codes(torch.zeros(100, 64, dtype=torch.uint8), BLayout(128, 2, 64, 4))


@pytest.mark.parametrize("n", [16, 128, 4096])
def test_permute_group_rows_and_inverse(n: int) -> None:
    t = torch.arange(3 * n).view(3, n)
    p = permute_group_rows(t)
    assert p.shape == t.shape
    # inside each 16-row tile: 0, 8, 1, 9, ... so the pair (row g, row g + 8) is adjacent at 2g, 2g + 1
    base = torch.arange(n).view(-1, 16)[:, :8]
    assert torch.equal(p[:, 0::2].reshape(3, -1, 8), t[:, base])
    assert torch.equal(p[:, 1::2].reshape(3, -1, 8), t[:, base + 8])
    # a permutation: the inverse (argsort of the index it applies) restores the original order
    idx = permute_group_rows(torch.arange(n))
    assert torch.equal(idx.sort().values, torch.arange(n))
    inverse = torch.argsort(idx)
    assert torch.equal(p[..., inverse], t)
    assert torch.equal(permute_group_rows(t[..., inverse]), t)


def test_mma_atoms_fragment_maps() -> None:
    """The atom's A map is the mma.sync m16n8k16 A fragment (each 16 x 16 tile exactly once per lane, register
    and half), its C map the m16n8 accumulator order, and the C expressions the epilogue renders say the same."""
    from humming_gen.components.mma.atoms import MMA_SYNC_M16N8K16, WGMMA_M64NNK16_WARP

    for atom in (MMA_SYNC_M16N8K16, WGMMA_M64NNK16_WARP):
        a = {atom.a_element(lane, reg, half) for lane in range(32) for reg in range(4) for half in range(2)}
        assert a == {(r, c) for r in range(16) for c in range(16)}
        c = {atom.c_element(lane, half, j) for lane in range(32) for half in range(2) for j in range(2)}
        assert c == {(r, col) for r in range(16) for col in range(8)}
        for lane in range(32):
            for half in range(2):
                for j in range(2):
                    env = {"g": lane // 4, "t": lane % 4, "half": half, "j": j}
                    assert (eval(atom.c_row_expr, env), eval(atom.c_col_expr, env)) == atom.c_element(lane, half, j)
    assert MMA_SYNC_M16N8K16.a_element(5, 3, 1) == (1 + 8, 2 + 8 + 1)  # lane 5: g=1, t=1; register 3 is (g+8, k+8)

"""Weight layout of the standard pipeline: codes split into power-of-two bit planes, arranged so that one
16-byte shared-memory load per plane gives a thread its fragments of 16 consecutive mma tiles.

Global order: [n block][k slice of warp_k][warp n][chunk][plane][load (plane width w of them)][lane][4 words].
A chunk is 16 mma tiles (16 n x 16 k each) enumerated k-step-major (tile = kstep * n_tiles + nt). Within a
plane of width w a 32-bit word holds 16/w register pairs: pair j sits at bits [p, p+w) (low lane) and
[16+p, ...) (high lane), p = j*w (see plane_positions for the one exception), so `(word >> p) & mask` lands both
elements in their 16-bit lanes. Register R of
a chunk (0..63) belongs to tile R // 4 and is mma A-fragment register R % 4: rows g / g+8 (g = lane/4), columns
2t, 2t+1 (+8 for registers 2, 3) with t = lane % 4.
Group parameters (scales, zero points) are stored [group][n] with rows permuted inside each 16-row tile as
0, 8, 1, 9, ... so a thread reads the pair (row g, row g+8) with one 4-byte load.

Kernels whose activations are quantized to 8 bits multiply the 8-bit weight codes directly (mma m16n8k32):
`BLayout8` stores them [n block][k slice of warp_k][warp n][tile][lane][16 bytes], tiles of 16 n x 32 k
enumerated k-step-major, so one 16-byte load gives a lane the four A registers of one tile, ready to use.
Weights of at most 4 bits with 8-bit activations (`BLayoutNibble8`) store each code as a nibble and widen it to a
byte in registers: [n block][k slice][warp n][tile pair][lane][4 words], word 2j + q holding registers 2q (X) and
2q + 1 (Y) of tile 2 * pair + j, so one 16-byte load per lane gives two tiles (nibble_bit_positions).
int4 weights with int4 activations (`BLayoutS4`, mma m16n8k64 s4) pack the codes two per byte along k, low nibble
first, and store those bytes in BLayout8 order: the s4 fragments are the 8-bit fragments of the packed bytes.
"""

from __future__ import annotations

import attrs
import torch

MMA_M, MMA_K, CHUNK_TILES = 16, 16, 16


def bit_planes(bits: int) -> tuple[int, ...]:
    """Split a width into power-of-two planes, widest (most significant) first: 3 -> (2, 1), 6 -> (4, 2)."""
    if not 1 <= bits <= 8:
        raise ValueError(f"weight bits must be 1..8, got {bits}")
    return tuple(w for w in (8, 4, 2, 1) if bits & w)


def plane_positions(bits: int, width: int) -> tuple[int, ...]:
    """Low-lane bit position of pair j's field in a plane word of `width` bits: j * width, except in the 1-bit
    plane of 3-bit codes, where pairs 0-7 of a word sit at even bits and 8-15 at odd bits. There each code's
    low bit lies at the same position as its 2-bit field (pre-shifted by one): one shift of both plane words
    then serves three registers (components.numeric.extract)."""
    if bits == 3 and width == 1:
        return tuple(2 * (j % 8) + j // 8 for j in range(16))
    return tuple(j * width for j in range(16 // width))


@attrs.frozen
class BLayout:
    """The weight geometry every kernel of a layer shares: block_n, warps_n and the warp's k slice.

    Global order is [n block][k slice of warp_k][warp n][chunk]..., so a stage of block_k = warps_k * warp_k
    is one contiguous run for any warps_k: kernels for different M can differ in block_k and warps_k.
    """

    block_n: int
    warps_n: int
    warp_k: int
    bits: int

    @property
    def warp_n(self) -> int:
        return self.block_n // self.warps_n

    @property
    def tiles_per_warp(self) -> int:
        return (self.warp_n // MMA_M) * (self.warp_k // MMA_K)

    @property
    def chunks_per_warp(self) -> int:
        return self.tiles_per_warp // CHUNK_TILES

    @property
    def planes(self) -> tuple[int, ...]:
        return bit_planes(self.bits)

    def stage_bytes(self, warps_k: int) -> int:
        """Bytes of one (block_n x warps_k * warp_k) stage."""
        return self.block_n * self.warp_k * warps_k * self.bits // 8

    def check(self) -> list[str]:
        errors = []
        if self.block_n % (self.warps_n * MMA_M):
            errors.append(f"block_n={self.block_n} is not a multiple of 16 * warps_n={self.warps_n}")
        if self.warp_k % MMA_K:
            errors.append(f"the warp k slice {self.warp_k} is not a multiple of 16")
        elif self.tiles_per_warp % CHUNK_TILES:
            errors.append(f"a warp slice of {self.warp_n}x{self.warp_k} (n x k) holds {self.tiles_per_warp} mma "
                          f"tiles; the weight layout needs a multiple of {CHUNK_TILES}")
        return errors


def _fragment_index(layout: BLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, k) inside one warp slice for each [chunk][R 0..63][lane][lo/hi] element: tile R // 4 of the chunk,
    register R % 4 of the MMA atom's A fragment (components.mma.atoms; both pipelines' atoms share it)."""
    from humming_gen.components.mma.atoms import MMA_SYNC_M16N8K16 as atom

    n_tiles = layout.warp_n // MMA_M
    chunk = torch.arange(layout.chunks_per_warp).view(-1, 1, 1, 1)
    reg = torch.arange(64).view(1, -1, 1, 1)
    lane = torch.arange(32).view(1, 1, -1, 1)
    half = torch.arange(2).view(1, 1, 1, -1)
    tile = chunk * CHUNK_TILES + reg // 4
    r = reg % 4
    kstep, nt = tile // n_tiles, tile % n_tiles
    row, col = atom.a_element(lane, r, half)
    n = nt * atom.m + row
    k = kstep * atom.k + col
    return n.expand(-1, -1, 32, 2), k.expand(-1, 64, -1, -1)


def pack_codes(codes: torch.Tensor, layout: BLayout) -> torch.Tensor:
    """Kernel codes (N_pad, K_pad) uint8 -> packed int32 words, one contiguous run per (n-tile, k-tile).

    Output shape (N_pad/block_n, K_pad/warp_k, warps_n * slice words). Works on any device.
    """
    errors = layout.check()
    if errors:
        raise ValueError("weight layout: " + "; ".join(errors))
    n_pad, k_pad = codes.shape
    bn, wk = layout.block_n, layout.warp_k
    if n_pad % bn or k_pad % wk:
        raise ValueError(f"codes shape {tuple(codes.shape)} is not padded to ({bn}, {wk})")
    wn = layout.warp_n
    nb, ks = n_pad // bn, k_pad // wk
    # [nb, wn_idx, n_in_warp, ks, k_in_slice] -> [nb, ks, 1, wn_idx, n_in_warp, k_in_slice]
    c = codes.to(torch.int32).view(nb, layout.warps_n, wn, ks, 1, wk).permute(0, 3, 4, 1, 2, 5)
    n_idx, k_idx = _fragment_index(layout)
    n_idx, k_idx = n_idx.to(codes.device), k_idx.to(codes.device)
    frag = c[:, :, :, :, n_idx, k_idx]  # [nb, ks, 1, wn, chunk, 64, 32, 2]
    words = []
    shift = layout.bits
    for w in layout.planes:
        shift -= w
        plane = (frag >> shift) & ((1 << w) - 1)
        per_word = 16 // w  # register pairs per word
        p = plane.view(*plane.shape[:5], 4 * w, per_word, 32, 2)  # R = q * per_word + j
        pos = torch.tensor(plane_positions(layout.bits, w), device=codes.device, dtype=torch.int32)
        pos = pos.view(per_word, 1)
        word_bits = (p[..., 0] << pos) | (p[..., 1] << (16 + pos))  # [.., q, j, lane]
        word = torch.zeros(word_bits.shape[:-2] + word_bits.shape[-1:], dtype=torch.int64, device=codes.device)
        for jj in range(per_word):
            word |= word_bits[..., jj, :].to(torch.int64) & 0xFFFFFFFF
        # [.., q=(load, i), lane] -> [.., load, lane, i]
        word = word.view(*word.shape[:5], w, 4, 32).transpose(-1, -2)
        words.append(word)
    packed = torch.cat(words, dim=5)  # [nb, kb, wk, wn, chunk, loads, lane, 4]
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.reshape(nb, ks, -1)


def unpack_codes(packed: torch.Tensor, layout: BLayout, n_pad: int, k_pad: int) -> torch.Tensor:
    """Inverse of `pack_codes` (used by tests and by `Kernel.inspect`)."""
    nb, kb = n_pad // layout.block_n, k_pad // layout.warp_k
    words = packed.to(torch.int64).reshape(nb, kb, 1, layout.warps_n, layout.chunks_per_warp,
                                           layout.bits, 32, 4) & 0xFFFFFFFF
    frag = torch.zeros(nb, kb, 1, layout.warps_n, layout.chunks_per_warp, 64, 32, 2,
                       dtype=torch.int64, device=packed.device)
    load0, shift = 0, layout.bits
    for w in layout.planes:
        shift -= w
        per_word = 16 // w
        wd = words[:, :, :, :, :, load0:load0 + w].transpose(-1, -2)  # [.., load, i, lane]
        wd = wd.reshape(*wd.shape[:5], 4 * w, 1, 32)
        pos = torch.tensor(plane_positions(layout.bits, w), device=packed.device).view(per_word, 1)
        lo = (wd >> pos) & ((1 << w) - 1)
        hi = (wd >> (16 + pos)) & ((1 << w) - 1)
        plane = torch.stack([lo, hi], dim=-1).reshape(*wd.shape[:5], 64, 32, 2)
        frag |= plane << shift
        load0 += w
    codes = torch.zeros(nb, kb, 1, layout.warps_n, layout.warp_n, layout.warp_k, dtype=torch.int64,
                        device=packed.device)
    n_idx, k_idx = _fragment_index(layout)
    codes[:, :, :, :, n_idx.to(packed.device), k_idx.to(packed.device)] = frag
    codes = codes.permute(0, 3, 4, 1, 2, 5).reshape(n_pad, k_pad)
    return codes.to(torch.uint8)


def permute_group_rows(t: torch.Tensor) -> torch.Tensor:
    """[..., N_pad] -> rows reordered 0, 8, 1, 9, ... inside each 16-row tile (one 4-byte load per pair)."""
    n = t.shape[-1]
    idx = torch.arange(n, device=t.device).view(-1, 2, 8).transpose(1, 2).reshape(-1)
    return t[..., idx]


def pad_to(t: torch.Tensor, dims: dict[int, int], value: float = 0) -> torch.Tensor:
    """Pad dimension d of t up to size dims[d] with `value`."""
    pads = []
    for d in range(t.dim() - 1, -1, -1):
        pads += [0, dims.get(d, t.shape[d]) - t.shape[d]]
    if not any(pads):
        return t
    return torch.nn.functional.pad(t, pads, value=value)


@attrs.frozen
class BLayout8:
    """The weight geometry of kernels with 8-bit activations: 8-bit codes as the m16n8k32 A operand, one 16-byte
    load per (lane, tile) (module docstring). Same block_n / warps_n / warp_k roles as BLayout."""

    block_n: int
    warps_n: int
    warp_k: int

    bits = 8  # read by the loaders and the shared-memory plan like BLayout.bits
    tile_k = 32

    @property
    def warp_n(self) -> int:
        return self.block_n // self.warps_n

    @property
    def tiles_per_warp(self) -> int:
        return (self.warp_n // MMA_M) * (self.warp_k // self.tile_k)

    def stage_bytes(self, warps_k: int) -> int:
        """Bytes of one (block_n x warps_k * warp_k) stage."""
        return self.block_n * self.warp_k * warps_k

    def check(self) -> list[str]:
        errors = []
        if self.block_n % (self.warps_n * MMA_M):
            errors.append(f"block_n={self.block_n} is not a multiple of 16 * warps_n={self.warps_n}")
        if self.warp_k % self.tile_k:
            errors.append(f"the warp k slice {self.warp_k} is not a multiple of {self.tile_k} (the 8-bit mma k step)")
        return errors


def _byte_index(layout: BLayout8) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, k) inside one warp slice for each [tile][lane][register][byte]: the m16n8k32 atom's A fragment."""
    from humming_gen.components.mma.atoms import MMA_SYNC_M16N8K32_8BIT as atom

    n_tiles = layout.warp_n // atom.m
    tile = torch.arange(layout.tiles_per_warp).view(-1, 1, 1, 1)
    lane = torch.arange(32).view(1, -1, 1, 1)
    reg = torch.arange(4).view(1, 1, -1, 1)
    byte = torch.arange(4).view(1, 1, 1, -1)
    kstep, nt = tile // n_tiles, tile % n_tiles
    row, col = atom.a_element(lane, reg, byte)
    return (nt * atom.m + row).expand(-1, -1, -1, 4), (kstep * atom.k + col).expand(layout.tiles_per_warp, -1, -1, -1)


def pack_codes8(codes: torch.Tensor, layout: BLayout8) -> torch.Tensor:
    """Kernel codes (N_pad, K_pad) uint8 -> int32 words in BLayout8 order, shape (N_pad/block_n, K_pad/warp_k,
    warps_n * warp_n * warp_k / 4). Works on any device."""
    errors = layout.check()
    if errors:
        raise ValueError("weight layout: " + "; ".join(errors))
    n_pad, k_pad = codes.shape
    bn, wk = layout.block_n, layout.warp_k
    if n_pad % bn or k_pad % wk:
        raise ValueError(f"codes shape {tuple(codes.shape)} is not padded to ({bn}, {wk})")
    nb, ks = n_pad // bn, k_pad // wk
    c = codes.view(nb, layout.warps_n, layout.warp_n, ks, wk).permute(0, 3, 1, 2, 4)  # [nb, ks, wn, n, k]
    n_idx, k_idx = (i.to(codes.device) for i in _byte_index(layout))
    frag = c[:, :, :, n_idx, k_idx].contiguous()  # [nb, ks, wn, tile, lane, reg, byte]
    return frag.view(torch.int32).reshape(nb, ks, -1)


def unpack_codes8(packed: torch.Tensor, layout: BLayout8, n_pad: int, k_pad: int) -> torch.Tensor:
    """Inverse of `pack_codes8`."""
    nb, ks = n_pad // layout.block_n, k_pad // layout.warp_k
    frag = packed.contiguous().view(torch.uint8).reshape(nb, ks, layout.warps_n, layout.tiles_per_warp, 32, 4, 4)
    codes = torch.zeros(nb, ks, layout.warps_n, layout.warp_n, layout.warp_k, dtype=torch.uint8,
                        device=packed.device)
    n_idx, k_idx = (i.to(packed.device) for i in _byte_index(layout))
    codes[:, :, :, n_idx, k_idx] = frag
    return codes.permute(0, 2, 3, 1, 4).reshape(n_pad, k_pad)


# How a 32-bit word of BLayoutNibble8 holds the eight codes of its two A registers X (2q) and Y (2q + 1).
#   "int8": byte b = (X code b << 4) | Y code b, so `w & 0xF0F0F0F0` and `(w << 4) & 0xF0F0F0F0` are the registers
#           with each signed code in its byte's high nibble (16 x the code as int8).
#   "e4m3": the low 3 bits of X code b at nibble b (bits 0-15: a prmt selector), of Y code b at nibble 4 + b, the top
#           bits of X codes at bits 7, 15, 23, 31 (each byte's sign position) and of Y codes at 3, 11, 19, 27 (the
#           same after `w << 4`), so a byte-table lookup plus the top bit gives e4m3 codes.
NIBBLE_ORDERS = ("int8", "e4m3")


def nibble_bit_positions(order: str) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Bit of the word holding bit i of code b of register X / Y: positions[xy][b][i]."""
    if order == "int8":
        return tuple(tuple(tuple(8 * b + 4 * (1 - xy) + i for i in range(4)) for b in range(4)) for xy in range(2))
    if order == "e4m3":
        return tuple(tuple(tuple(16 * xy + 4 * b + i for i in range(3)) + (8 * b + 7 - 4 * xy,) for b in range(4))
                     for xy in range(2))
    raise ValueError(f"nibble order must be one of {NIBBLE_ORDERS}, got {order!r}")


@attrs.frozen
class BLayoutNibble8:
    """The weight geometry of kernels with 8-bit activations and weights of at most 4 bits: codes as nibbles, two
    m16n8k32 tiles per 16-byte load (module docstring); `order` says how a word's nibbles become its two registers.
    Same block_n / warps_n / warp_k roles as BLayout."""

    block_n: int
    warps_n: int
    warp_k: int
    order: str

    bits = 4
    tile_k = 32

    @property
    def warp_n(self) -> int:
        return self.block_n // self.warps_n

    @property
    def tiles_per_warp(self) -> int:
        return (self.warp_n // MMA_M) * (self.warp_k // self.tile_k)

    def stage_bytes(self, warps_k: int) -> int:
        """Bytes of one (block_n x warps_k * warp_k) stage."""
        return self.block_n * self.warp_k * warps_k // 2

    def check(self) -> list[str]:
        errors = []
        if self.order not in NIBBLE_ORDERS:
            errors.append(f"nibble order {self.order!r} is not one of {NIBBLE_ORDERS}")
        if self.block_n % (self.warps_n * MMA_M):
            errors.append(f"block_n={self.block_n} is not a multiple of 16 * warps_n={self.warps_n}")
        if self.warp_k % self.tile_k:
            errors.append(f"the warp k slice {self.warp_k} is not a multiple of {self.tile_k} (the 8-bit mma k step)")
        elif self.tiles_per_warp % 2:
            errors.append(f"a warp slice of {self.warp_n}x{self.warp_k} (n x k) holds {self.tiles_per_warp} tiles of "
                          f"16 x 32; 4-bit codes are loaded two tiles at a time")
        return errors


def _nibble_index(layout: BLayoutNibble8) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, k) inside one warp slice for each [pair][lane][j][q][xy][byte]: byte `byte` of A register 2q + xy of
    tile 2 * pair + j (the m16n8k32 atom's A fragment)."""
    from humming_gen.components.mma.atoms import MMA_SYNC_M16N8K32_8BIT as atom

    n_tiles = layout.warp_n // atom.m
    shape = (layout.tiles_per_warp // 2, 32, 2, 2, 2, 4)
    pair, lane, j, q, xy, byte = (torch.arange(d).view([-1 if i == a else 1 for i in range(6)])
                                  for a, d in enumerate(shape))
    tile = 2 * pair + j
    row, col = atom.a_element(lane, 2 * q + xy, byte)
    n = (tile % n_tiles) * atom.m + row
    k = (tile // n_tiles) * atom.k + col
    return n.expand(shape), k.expand(shape)


def _check_padded(codes: torch.Tensor, layout) -> None:
    errors = layout.check()
    if errors:
        raise ValueError("weight layout: " + "; ".join(errors))
    if codes.shape[0] % layout.block_n or codes.shape[1] % layout.warp_k:
        raise ValueError(f"codes shape {tuple(codes.shape)} is not padded to ({layout.block_n}, {layout.warp_k})")


def pack_nibbles8(codes: torch.Tensor, layout: BLayoutNibble8) -> torch.Tensor:
    """Nibble codes (N_pad, K_pad) uint8 in 0..15 -> int32 words in BLayoutNibble8 order, shape (N_pad/block_n,
    K_pad/warp_k, warps_n * warp_n * warp_k / 8). Works on any device."""
    _check_padded(codes, layout)
    n_pad, k_pad = codes.shape
    nb, ks = n_pad // layout.block_n, k_pad // layout.warp_k
    c = codes.to(torch.int64).view(nb, layout.warps_n, layout.warp_n, ks, layout.warp_k).permute(0, 3, 1, 2, 4)
    n_idx, k_idx = (i.to(codes.device) for i in _nibble_index(layout))
    frag = c[:, :, :, n_idx, k_idx]  # [nb, ks, wn, pair, lane, j, q, xy, byte]
    pos = torch.tensor(nibble_bit_positions(layout.order), device=codes.device)  # [xy, byte, bit]
    bit = torch.arange(4, device=codes.device)
    # each (xy, byte) place's bits of code v, summed: a gather per code instead of four shifts and masks
    table = (((torch.arange(16, device=codes.device).view(16, 1, 1, 1) >> bit) & 1) << pos).sum(dim=-1)
    xy, byte = torch.arange(2, device=codes.device).view(2, 1), torch.arange(4, device=codes.device)
    words = table[frag, xy, byte].sum(dim=(-2, -1))  # [nb, ks, wn, pair, lane, j, q]
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.reshape(nb, ks, -1)


def unpack_nibbles8(packed: torch.Tensor, layout: BLayoutNibble8, n_pad: int, k_pad: int) -> torch.Tensor:
    """Inverse of `pack_nibbles8`."""
    nb, ks = n_pad // layout.block_n, k_pad // layout.warp_k
    words = packed.to(torch.int64).reshape(nb, ks, layout.warps_n, layout.tiles_per_warp // 2, 32, 2, 2) & 0xFFFFFFFF
    pos = torch.tensor(nibble_bit_positions(layout.order), device=packed.device)
    bit = torch.arange(4, device=packed.device)
    frag = (((words[..., None, None, None] >> pos) & 1) << bit).sum(dim=-1)  # [.., j, q, xy, byte]
    codes = torch.zeros(nb, ks, layout.warps_n, layout.warp_n, layout.warp_k, dtype=torch.int64, device=packed.device)
    n_idx, k_idx = (i.to(packed.device) for i in _nibble_index(layout))
    codes[:, :, :, n_idx, k_idx] = frag
    return codes.permute(0, 2, 3, 1, 4).reshape(n_pad, k_pad).to(torch.uint8)


@attrs.frozen
class BLayoutS4:
    """The weight geometry of int4 weights x int4 activations (mma.sync m16n8k64 s4): the codes packed two per byte
    along k (`pair_nibbles`: even k in the low nibble), then those bytes in BLayout8 order, since the k64 s4 A
    fragment of the codes is, byte for byte, the k32 8-bit A fragment of the packed bytes
    (components.mma.atoms.MMA_SYNC_M16N8K64_S4). `warp_k` counts packed bytes (two k each); block_n / warps_n as
    BLayout8."""

    block_n: int
    warps_n: int
    warp_k: int

    bits = 4
    tile_k = 32  # bytes: 64 k of codes

    @property
    def bytes_layout(self) -> BLayout8:
        return BLayout8(block_n=self.block_n, warps_n=self.warps_n, warp_k=self.warp_k)

    @property
    def warp_n(self) -> int:
        return self.block_n // self.warps_n

    @property
    def tiles_per_warp(self) -> int:
        return self.bytes_layout.tiles_per_warp

    def stage_bytes(self, warps_k: int) -> int:
        return self.bytes_layout.stage_bytes(warps_k)

    def check(self) -> list[str]:
        return self.bytes_layout.check()


def pair_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Nibble codes (N, K) uint8 in 0..15, K even -> bytes (N, K / 2): byte j = codes[2j] | codes[2j + 1] << 4."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pair_nibbles: K must be even, got codes of shape {tuple(codes.shape)}")
    c = codes.to(torch.uint8) & 0xF
    return c[..., 0::2] | (c[..., 1::2] << 4)


def split_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pair_nibbles`: bytes (N, K / 2) -> nibble codes (N, K) uint8."""
    p = packed.to(torch.uint8)
    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])


def pack_s4(codes: torch.Tensor, layout: BLayoutS4) -> torch.Tensor:
    """Nibble codes (N_pad, K_pad) uint8 in 0..15 (two's complement int4) -> int32 words in BLayoutS4 order, shape
    (N_pad/block_n, K_pad/(2 warp_k), warps_n * warp_n * warp_k / 4). Works on any device."""
    return pack_codes8(pair_nibbles(codes), layout.bytes_layout)


def unpack_s4(packed: torch.Tensor, layout: BLayoutS4, n_pad: int, k_pad: int) -> torch.Tensor:
    """Inverse of `pack_s4` (k_pad counts codes)."""
    return split_nibbles(unpack_codes8(packed, layout.bytes_layout, n_pad, k_pad // 2))


@attrs.frozen
class BLayoutSw128:
    """8-bit weight codes in wgmma's canonical K-major layout with the 128-byte swizzle, one (block_n rows x 128 k)
    panel after another, [n block][k panel], so a stage of one n block is one contiguous run (a bulk copy) that lands
    in shared memory exactly as a wgmma shared-memory descriptor reads it (the same image the activation tile
    loader writes: row r at r * 128, 16-byte chunk c at chunk c ^ (r % 8)). The register paths read the same image
    with ldmatrix: the four 8 x 16-byte matrices (rows 0-7 / 8-15, chunks 2s / 2s + 1) of a 16-row tile's k32 step s
    are the m16n8k32 A registers 0-3 (sw128_ldmatrix_a), so one packed copy could feed SS wgmma, RS wgmma and
    mma.sync kernels. Read by the shared-weight warp-specialized kernels (TuningConfig.b_operand='shared')."""

    block_n: int

    bits = 8
    panel_k = 128  # bytes of k per panel: one 128-byte swizzle row

    def check(self) -> list[str]:
        return [] if self.block_n % 8 == 0 and self.block_n > 0 else [
            f"block_n={self.block_n} is not a positive multiple of 8 (the swizzle's 8-row atom)"]


def sw128_offset(row: torch.Tensor | int, kbyte: torch.Tensor | int) -> torch.Tensor | int:
    """Byte offset of (row, k byte) inside one 128-byte-swizzled panel."""
    return row * 128 + (((kbyte // 16) ^ (row % 8)) * 16) + kbyte % 16


def _sw128_panel_offsets(layout: BLayoutSw128, device: torch.device) -> torch.Tensor:
    """Byte offset in a panel of each (row, k byte), row-major over (block_n, 128)."""
    row = torch.arange(layout.block_n, device=device).view(-1, 1)
    kb = torch.arange(layout.panel_k, device=device).view(1, -1)
    return sw128_offset(row, kb).reshape(-1)


def pack_codes_sw128(codes: torch.Tensor, layout: BLayoutSw128) -> torch.Tensor:
    """Kernel codes (N_pad, K_pad) uint8 -> (N_pad / block_n, K_pad / 128, block_n * 128) uint8 panels."""
    errors = layout.check()
    if errors:
        raise ValueError("weight layout: " + "; ".join(errors))
    n_pad, k_pad = codes.shape
    bn, pk = layout.block_n, layout.panel_k
    if n_pad % bn or k_pad % pk:
        raise ValueError(f"codes shape {tuple(codes.shape)} is not padded to ({bn}, {pk})")
    offset = _sw128_panel_offsets(layout, codes.device)
    blocks = codes.view(n_pad // bn, bn, k_pad // pk, pk).permute(0, 2, 1, 3).reshape(n_pad // bn, k_pad // pk, -1)
    out = torch.empty_like(blocks)
    out[:, :, offset] = blocks
    return out


def unpack_codes_sw128(packed: torch.Tensor, layout: BLayoutSw128, n_pad: int, k_pad: int) -> torch.Tensor:
    """Inverse of `pack_codes_sw128`."""
    bn, pk = layout.block_n, layout.panel_k
    offset = _sw128_panel_offsets(layout, packed.device)
    blocks = packed[:, :, offset].view(n_pad // bn, k_pad // pk, bn, pk)
    return blocks.permute(0, 2, 1, 3).reshape(n_pad, k_pad)


def sw128_ldmatrix_a(panel: torch.Tensor, row0: int, step: int) -> torch.Tensor:
    """What ldmatrix.x4 (b16, not transposed) gives each lane from one packed panel (block_n * 128 bytes) for the
    16-row tile at row0 and k32 step `step`: thread t points at row t % 8 (+8 for matrices 1 and 3) of 16-byte chunk
    2 * step (+1 for matrices 2 and 3); lane l receives from matrix i the 4 bytes at its row l / 4, bytes
    4 * (l % 4). Returns (32 lanes, 4 registers, 4 bytes) uint8, for comparing with the m16n8k32 A fragment."""
    out = torch.empty(32, 4, 4, dtype=torch.uint8)
    for lane in range(32):
        for i in range(4):
            row = row0 + lane // 4 + 8 * (i % 2)
            chunk = 2 * step + i // 2
            start = sw128_offset(row, chunk * 16) + 4 * (lane % 4)
            out[lane, i] = panel[start:start + 4]
    return out

"""Bit packing shared by every converter: LSB-first dense fields in int32 or uint8 words.

One definition (docs/FORMATS.md conventions): element i of a run along `dim` occupies bits [i*b, i*b+b) of the
little-endian bit string made of consecutive words, so 3-bit fields may straddle two int32 words. Nibble
packing (two fp4/int4 codes per uint8, low nibble first) is the same rule with 8-bit words.
"""

from __future__ import annotations

import torch

_WORD_BITS = {torch.int32: 32, torch.uint8: 8, torch.int8: 8}


def _word_bits(dtype: torch.dtype) -> int:
    if dtype not in _WORD_BITS:
        raise ValueError(f"packed words must be int32 or uint8, got {dtype}")
    return _WORD_BITS[dtype]


def unpack(packed: torch.Tensor, bits: int, count: int, dim: int = -1) -> torch.Tensor:
    """Unpack `count` b-bit unsigned fields per run along `dim` -> uint8 codes (count replaces that dim)."""
    wb = _word_bits(packed.dtype)
    words = packed.movedim(dim, -1)
    if words.shape[-1] * wb < count * bits:
        raise ValueError(f"{words.shape[-1]} words of {wb} bits cannot hold {count} fields of {bits} bits")
    if wb % bits == 0:
        # No field straddles two words (nibbles, 2- and 8-bit codes): each field shifts out of its word in the
        # word's own width, a byte per code, where the general path below holds several int64 copies of the codes
        # (531M nibbles, 64 of gpt-oss-120b's 2880 x 2880 experts, on the CPU: 18.7 GB peak and 38 s that way,
        # 1.0 GB and 2.7 s this way).
        mask = (1 << bits) - 1
        fields = [((words >> (bits * j)) & mask).to(torch.uint8) for j in range(wb // bits)]
        return torch.stack(fields, dim=-1).flatten(-2)[..., :count].movedim(-1, dim)
    x = words.to(torch.int64) & ((1 << wb) - 1)
    pos = torch.arange(count, dtype=torch.int64) * bits
    word, off = pos // wb, pos % wb
    nxt = (word + 1).clamp(max=x.shape[-1] - 1)
    lo = x[..., word] >> off
    # A field straddles when off + bits > wb; its high bits come from the next word.
    hi = torch.where(off + bits > wb, x[..., nxt] << (wb - off), torch.zeros_like(lo))
    out = ((lo | hi) & ((1 << bits) - 1)).to(torch.uint8)
    return out.movedim(-1, dim)


def pack(codes: torch.Tensor, bits: int, dim: int = -1, word_dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """Inverse of `unpack`: b-bit codes along `dim` -> ceil(count*b/wb) words (int32 wraps to signed)."""
    wb = _word_bits(word_dtype)
    c = codes.movedim(dim, -1).to(torch.int64) & ((1 << bits) - 1)
    count = c.shape[-1]
    nwords = -(-count * bits // wb)
    pos = torch.arange(count, dtype=torch.int64) * bits
    word, off = pos // wb, pos % wb
    out = torch.zeros(*c.shape[:-1], nwords + 1, dtype=torch.int64)
    # Fields never overlap, so adding is OR; the spill of a straddling field goes to the next word.
    out.index_add_(-1, word, (c << off) & ((1 << wb) - 1))
    out.index_add_(-1, word + 1, c >> (wb - off))
    out = out[..., :nwords]
    if word_dtype == torch.int32:
        out = torch.where(out >= 1 << 31, out - (1 << 32), out)
    return out.to(word_dtype).movedim(-1, dim).contiguous()


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 (..., K/2) -> uint8 codes (..., K), low nibble = even element."""
    return unpack(packed.view(torch.uint8), 4, packed.shape[-1] * 2, dim=-1)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes (..., K) -> (..., K/2) uint8, low nibble = even element."""
    if codes.shape[-1] % 2:
        raise ValueError(f"nibble packing needs an even last dimension, got {codes.shape[-1]}")
    return pack(codes, 4, dim=-1, word_dtype=torch.uint8)

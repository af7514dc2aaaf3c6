"""OCP MXFP4 checkpoints (`quant_method: "mxfp4"`, gpt-oss) <-> the standard form (docs/FORMATS.md 2.1, 3.6).

gpt-oss stacks experts: `{prefix}_blocks` uint8 (E, N, K/32, 16) and `{prefix}_scales` uint8 (E, N, K/32) (HF
names; OpenAI's original checkpoints use `{prefix}.blocks` / `{prefix}.scales`). Byte j of block kb holds elements
32*kb + 2j (low nibble) and 32*kb + 2j + 1 (high nibble); the scale is 2^(c - 127). gate_up rows stay interleaved
as stored (row 2i = gate_i, row 2i + 1 = up_i): the MoE layer, not the converter, owns that convention.
A plain OCP layer (`weight` uint8 (N, K/2), `weight_scale` uint8 (N, K/32)) is read too.
"""

from __future__ import annotations

from typing import Any

import torch

from humming_gen.formats import dtype
from humming_gen.schemes.converters.bits import pack_nibbles, unpack_nibbles
from humming_gen.schemes.converters.common import Tensors, check_dtype, check_shape, named
from humming_gen.schemes.scheme import QuantizedWeight, QuantScheme

SCHEME = QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0")


def _names(t: Tensors) -> tuple[str, str, str]:
    """(blocks, scales, separator) of the layout present under t.prefix."""
    for sep in ("_", "."):
        if t.has("blocks", sep):
            return "blocks", "scales", sep
    if t.has("weight"):
        return "weight", "weight_scale", "."
    raise ValueError(f"checkpoint tensor {t.name('blocks', '_')!r} is missing (also looked for "
                     f"{t.name('blocks')!r} and {t.name('weight')!r})")


def convert(t: Tensors, cfg: dict[str, Any] | None = None) -> QuantizedWeight:
    """MXFP4 blocks/scales (stacked experts or one layer) -> QuantizedWeight (E, N, K) or (N, K)."""
    bname, sname, sep = _names(t)
    blocks, scales = t.get(bname, sep), t.get(sname, sep)
    check_dtype(t.name(bname, sep), blocks, (torch.uint8,))
    check_dtype(t.name(sname, sep), scales, (torch.uint8,))
    if bname == "blocks":
        if blocks.dim() not in (3, 4) or blocks.shape[-1] != 16:
            raise ValueError(f"checkpoint tensor {t.name(bname, sep)!r} has shape {tuple(blocks.shape)}, expected "
                             f"([E,] N, K/32, 16)")
        check_shape(t.name(sname, sep), scales, tuple(blocks.shape[:-1]))
        packed = blocks.reshape(*blocks.shape[:-2], blocks.shape[-2] * 16)
    else:
        packed = blocks
        k = packed.shape[-1] * 2
        if k % 32:
            raise ValueError(f"MXFP4 needs K divisible by 32, got K={k} from {t.name(bname)!r}")
        check_shape(t.name(sname), scales, (*packed.shape[:-1], k // 32))
    codes = unpack_nibbles(packed)
    return QuantizedWeight(SCHEME, codes, dtype("float8e8m0").decode(scales))


def to_checkpoint(qw: QuantizedWeight, prefix: str = "") -> tuple[dict[str, torch.Tensor], dict]:
    """float4e2m1 with e8m0 group-32 scales -> gpt-oss `{prefix}_blocks` / `{prefix}_scales` and its config."""
    s = qw.scheme
    if s.weight.name != "float4e2m1" or s.scale_dtype.name != "float8e8m0" or s.group_size != 32 or \
            s.global_scale or qw.channel_scale is not None or qw.k_perm is not None:
        raise ValueError(f"MXFP4 cannot express scheme {s.summary()}")
    packed = pack_nibbles(qw.codes.to(torch.uint8))
    blocks = packed.reshape(*packed.shape[:-1], qw.k // 32, 16)
    exps = torch.log2(qw.scales.to(torch.float64)).round().to(torch.int64) + 127
    tensors = {"blocks": blocks, "scales": exps.to(torch.uint8)}
    return named(prefix, tensors, sep="_"), {"quant_method": "mxfp4"}

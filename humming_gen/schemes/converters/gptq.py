"""GPTQ (AutoGPTQ / GPTQModel / optimum) checkpoints <-> the standard form (docs/FORMATS.md 3.1).

qweight int32 (K*b/32, N) is LSB-first dense along K (3-bit fields straddle words); qzeros int32 (G, N*b/32) the
same along N; scales (G, N); g_idx (K,) the group of each input channel. v1 checkpoints ("gptq") store zero - 1,
v2 ("gptq_v2") the zero itself. Symmetric layers ignore qzeros (implicit 2^(b-1)) and become intB codes;
asymmetric ones stay uintB with integer zero points. Act-order (desc_act) becomes `k_perm`: K sorted by g_idx so
that groups are contiguous in stored order.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from humming_gen.schemes.converters.bits import pack, unpack
from humming_gen.schemes.converters.common import (
    Tensors, check_dtype, check_shape, config_int, f32, g_idx_of, group_order, named, offset_to_signed,
    scale_dtype_name, torch_scale_dtype)
from humming_gen.schemes.scheme import QuantizedWeight, QuantScheme

BITS = (2, 3, 4, 8)
CHECKPOINT_FORMATS = ("gptq", "gptq_v2")


def _settings(cfg: dict[str, Any]) -> tuple[int, int, bool, bool]:
    bits = cfg.get("bits")
    if bits not in BITS:
        raise ValueError(f"GPTQ bits must be one of {BITS}, got {bits!r}")
    # GPTQModel 7 writes `format` (legacy `checkpoint_format`); "gptq_p" is its planar layout.
    fmt = cfg.get("checkpoint_format") or cfg.get("format") or "gptq"
    if fmt not in CHECKPOINT_FORMATS:
        raise ValueError(f"GPTQ checkpoint_format must be one of {CHECKPOINT_FORMATS} (dense int32 bit string), "
                         f"got {fmt!r}")
    pack_dtype = str(cfg.get("pack_dtype") or "int32").replace("torch.", "")
    if pack_dtype != "int32":
        raise ValueError(f"GPTQ pack_dtype {pack_dtype!r} is not supported (only int32 words)")
    group_size = config_int(cfg, "group_size", default=-1)
    if group_size == 0 or group_size < -1:
        raise ValueError(f"GPTQ group_size must be -1 or positive, got {group_size}")
    return bits, group_size, bool(cfg.get("sym", True)), fmt == "gptq"


def convert(t: Tensors, cfg: dict[str, Any]) -> QuantizedWeight:
    """One GPTQ linear layer (tensors under `t.prefix`) -> QuantizedWeight."""
    bits, group_size, sym, v1 = _settings(cfg)
    qweight, scales = t.get("qweight"), t.get("scales")
    check_dtype(t.name("qweight"), qweight, (torch.int32,))
    if qweight.dim() != 2:
        raise ValueError(f"checkpoint tensor {t.name('qweight')!r} must be 2-D (K*bits/32, N), got "
                         f"shape {tuple(qweight.shape)}")
    n = qweight.shape[1]
    g_idx = t.opt("g_idx")
    k = g_idx.numel() if g_idx is not None else qweight.shape[0] * 32 // bits
    if k * bits % 32:
        raise ValueError(f"GPTQ {bits}-bit packing needs K*bits divisible by 32, got K={k}")
    check_shape(t.name("qweight"), qweight, (k * bits // 32, n))
    g = k if group_size == -1 else group_size
    groups = math.ceil(k / g)
    if tuple(scales.shape) != (groups, n):
        raise ValueError(f"checkpoint tensor {t.name('scales')!r} has shape {tuple(scales.shape)}, expected "
                         f"{(groups, n)} for group_size {group_size} and K={k} (group size not matching K?)")
    codes = unpack(qweight, bits, k, dim=0).T
    perm = group_order(g_idx, k, g, t.name("g_idx")) if g_idx is not None else None
    if perm is not None:
        codes = codes[:, perm]
    gran = dict(granularity="channel") if group_size == -1 else dict(group_size=g)
    scale_dtype = scale_dtype_name(scales, t.name("scales"))
    if sym:
        scheme = QuantScheme(f"int{bits}", scale_dtype=scale_dtype, **gran)
        return QuantizedWeight(scheme, offset_to_signed(codes, bits).contiguous(), f32(scales.T).contiguous(),
                               k_perm=perm)
    qzeros = t.get("qzeros")
    if n * bits % 32:
        raise ValueError(f"GPTQ qzeros packing needs N*bits divisible by 32, got N={n}")
    check_shape(t.name("qzeros"), qzeros, (groups, n * bits // 32))
    zeros = unpack(qzeros, bits, n, dim=1).to(torch.float32) + (1.0 if v1 else 0.0)
    scheme = QuantScheme(f"uint{bits}", scale_dtype=scale_dtype, zero_point="int", **gran)
    return QuantizedWeight(scheme, codes.contiguous(), f32(scales.T).contiguous(), zeros.T.contiguous(),
                           k_perm=perm)


def to_checkpoint(qw: QuantizedWeight, prefix: str = "", checkpoint_format: str = "gptq_v2"
                  ) -> tuple[dict[str, torch.Tensor], dict]:
    """Write a QuantizedWeight as GPTQ tensors (local names) and its quantization_config.

    Expressible: 2-D intB (sym) or uintB + integer zero point (asym), B in 2/3/4/8, group or channel scales in
    fp16/bf16/fp32, optional k_perm (act-order: g_idx keeps only each channel's group, so reading back orders the
    channels of a group by index; the dequantized weight is the same). v1 cannot store a zero point of 0.
    """
    s = qw.scheme
    bits = s.weight.bits
    if not s.weight.is_int or bits not in BITS or qw.codes.dim() != 2:
        raise ValueError(f"GPTQ stores 2-D int/uint weights of {BITS} bits, got {s.weight.name} {qw.shape}")
    if s.granularity not in ("group", "channel") or s.zero_point == "float" or s.global_scale or \
            qw.channel_scale is not None or (s.zero_point is None) != s.weight.signed:
        raise ValueError(f"GPTQ cannot express scheme {s.summary()}")
    if checkpoint_format not in CHECKPOINT_FORMATS:
        raise ValueError(f"checkpoint_format must be one of {CHECKPOINT_FORMATS}, got {checkpoint_format!r}")
    n, k = qw.n, qw.k
    g = k if s.granularity == "channel" else s.group_size
    v1 = checkpoint_format == "gptq"
    u = qw.codes.to(torch.uint8) ^ (1 << (bits - 1)) if s.weight.signed else qw.codes.to(torch.uint8)
    if qw.k_perm is not None:
        orig = torch.empty_like(u)
        orig[:, qw.k_perm.long()] = u
        u = orig
    if s.zero_point is None:
        zeros = torch.full((math.ceil(k / g), n), 1 << (bits - 1), dtype=torch.int64)
    else:
        zeros = qw.zero_points.T.to(torch.int64)
    if v1:
        if bool((zeros == 0).any()):
            raise ValueError("GPTQ v1 (checkpoint_format 'gptq') cannot store a zero point of 0; use 'gptq_v2'")
        zeros = zeros - 1
    tensors = {"qweight": pack(u.T, bits, dim=0), "qzeros": pack(zeros, bits, dim=1),
               "scales": qw.scales.T.to(torch_scale_dtype(s.scale_dtype.name)).contiguous(),
               "g_idx": g_idx_of(qw.k_perm, k, g)}
    cfg = {"quant_method": "gptq", "bits": bits, "group_size": -1 if s.granularity == "channel" else g,
           "desc_act": qw.k_perm is not None, "sym": s.zero_point is None, "checkpoint_format": checkpoint_format}
    return named(prefix, tensors), cfg

"""AWQ (AutoAWQ, GEMM layout) checkpoints <-> the standard form (docs/FORMATS.md 3.2).

qweight int32 (K, N/8) and qzeros int32 (K/g, N/8) are packed along N with interleaved nibbles: nibble i of word j
holds output column 8j + ORDER[i], ORDER = [0, 2, 4, 6, 1, 3, 5, 7]. scales (K/g, N). Zeros are stored raw:
W = s * (q - z), so the standard form is uint4 codes with integer zero points.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from humming_gen.schemes.converters.bits import pack, unpack
from humming_gen.schemes.converters.common import (
    Tensors, check_dtype, check_shape, config_get, config_int, f32, named, scale_dtype_name, torch_scale_dtype)
from humming_gen.schemes.scheme import QuantizedWeight, QuantScheme

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # nibble that holds column 8j + c


def _unpack_n(packed: torch.Tensor, n: int) -> torch.Tensor:
    """(R, N/8) interleaved int32 -> (R, N) uint8 in column order."""
    fields = unpack(packed, 4, n, dim=1)
    return fields.reshape(-1, n // 8, 8)[..., list(REVERSE_ORDER)].reshape(-1, n)


def _pack_n(codes: torch.Tensor) -> torch.Tensor:
    """(R, N) uint8 in column order -> (R, N/8) interleaved int32."""
    r, n = codes.shape
    return pack(codes.reshape(r, n // 8, 8)[..., list(ORDER)].reshape(r, n), 4, dim=1)


def _settings(cfg: dict[str, Any]) -> int:
    bits = config_int(cfg, "bits", "w_bit")
    if bits != 4:
        raise ValueError(f"AWQ bits must be 4 (the only width AutoAWQ's GEMM packer defines), got {bits!r}")
    version = str(config_get(cfg, "version", default="gemm")).lower()
    if version != "gemm":
        raise ValueError(f"AWQ version {version!r} is not supported (only the 'gemm' layout)")
    if not config_get(cfg, "zero_point", default=True):
        raise ValueError("AWQ zero_point=false is not supported: AutoAWQ's GEMM packer never produces it")
    group_size = config_int(cfg, "group_size", "q_group_size", default=-1)
    if group_size == 0 or group_size < -1:
        raise ValueError(f"AWQ group_size must be -1 or positive, got {group_size}")
    return group_size


def convert(t: Tensors, cfg: dict[str, Any]) -> QuantizedWeight:
    """One AWQ GEMM linear layer -> QuantizedWeight (uint4 codes, integer zero points, group scales)."""
    group_size = _settings(cfg)
    qweight, qzeros, scales = t.get("qweight"), t.get("qzeros"), t.get("scales")
    check_dtype(t.name("qweight"), qweight, (torch.int32,))
    check_dtype(t.name("qzeros"), qzeros, (torch.int32,))
    if qweight.dim() != 2:
        raise ValueError(f"checkpoint tensor {t.name('qweight')!r} must be 2-D (K, N/8), got {tuple(qweight.shape)}")
    k, n = qweight.shape[0], qweight.shape[1] * 8
    g = k if group_size == -1 else group_size
    groups = math.ceil(k / g)
    if tuple(scales.shape) != (groups, n):
        raise ValueError(f"checkpoint tensor {t.name('scales')!r} has shape {tuple(scales.shape)}, expected "
                         f"{(groups, n)} for group_size {group_size} and K={k} (group size not matching K?)")
    check_shape(t.name("qzeros"), qzeros, (groups, n // 8))
    codes = _unpack_n(qweight, n).T.contiguous()
    zeros = _unpack_n(qzeros, n).T.to(torch.float32).contiguous()
    gran = dict(granularity="channel") if group_size == -1 else dict(group_size=g)
    scheme = QuantScheme("uint4", scale_dtype=scale_dtype_name(scales, t.name("scales")), zero_point="int", **gran)
    return QuantizedWeight(scheme, codes, f32(scales.T).contiguous(), zeros)


def to_checkpoint(qw: QuantizedWeight, prefix: str = "") -> tuple[dict[str, torch.Tensor], dict]:
    """uint4 + integer zero point, group scales, 2-D, N % 8 == 0 -> AWQ GEMM tensors and quantization_config."""
    s = qw.scheme
    if s.weight.name != "uint4" or s.zero_point != "int" or s.granularity != "group" or qw.codes.dim() != 2 \
            or s.global_scale or qw.channel_scale is not None or qw.k_perm is not None or qw.n % 8:
        raise ValueError(f"AWQ cannot express scheme {s.summary()} with shape {qw.shape}")
    tensors = {"qweight": _pack_n(qw.codes.T.to(torch.uint8)),
               "qzeros": _pack_n(qw.zero_points.T.to(torch.uint8)),
               "scales": qw.scales.T.to(torch_scale_dtype(s.scale_dtype.name)).contiguous()}
    cfg = {"quant_method": "awq", "bits": 4, "group_size": s.group_size, "zero_point": True, "version": "gemm"}
    return named(prefix, tensors), cfg

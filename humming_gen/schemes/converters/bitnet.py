"""BitNet b1.58 checkpoints (`quant_method: "bitnet"`) <-> the standard form (docs/FORMATS.md 3.7).

weight uint8 (N/4, K) packs ternary t in {-1, 0, 1} as t + 1 in 2-bit fields along N in four blocks: bit pair j of
byte row r holds row j*N/4 + r. weight_scale (1,): `bitlinear` divides by it, `autobitlinear` multiplies. The
standard form is int2 codes (t & 3) with one fp32 tensor scale (1/weight_scale for bitlinear, rounded once to
fp32) and dynamic per-token int8 activations.
"""

from __future__ import annotations

from typing import Any

import torch

from humming_gen.schemes.converters.bits import pack, unpack
from humming_gen.schemes.converters.common import Tensors, check_dtype, named, reciprocal
from humming_gen.schemes.scheme import ActivationScheme, QuantizedWeight, QuantScheme

SCHEME = QuantScheme("int2", granularity="tensor", scale_dtype="float32",
                     activation=ActivationScheme("int8", granularity="token"))
LINEAR_CLASSES = ("bitlinear", "autobitlinear")


def _linear_class(cfg: dict[str, Any]) -> str:
    cls = cfg.get("linear_class") or "bitlinear"
    if cls not in LINEAR_CLASSES:
        raise ValueError(f"BitNet linear_class must be one of {LINEAR_CLASSES}, got {cls!r}")
    if (cfg.get("quantization_mode") or "offline") != "offline":
        raise ValueError("BitNet quantization_mode 'online' stores float weights; only 'offline' (packed) converts")
    return cls


def convert(t: Tensors, cfg: dict[str, Any]) -> QuantizedWeight:
    """One packed BitNet layer -> QuantizedWeight (int2 ternary codes, per-tensor scale)."""
    cls = _linear_class(cfg)
    weight, ws = t.get("weight"), t.get("weight_scale")
    check_dtype(t.name("weight"), weight, (torch.uint8,))
    if weight.dim() != 2 or ws.numel() != 1:
        raise ValueError(f"checkpoint tensors {t.name('weight')!r} {tuple(weight.shape)} and "
                         f"{t.name('weight_scale')!r} {tuple(ws.shape)}: expected (N/4, K) and (1,)")
    n4, k = weight.shape
    fields = unpack(weight, 2, 4 * n4, dim=0)  # field 4r + j = bit pair j of byte row r
    if bool((fields == 3).any()):
        raise ValueError(f"checkpoint tensor {t.name('weight')!r} holds the 2-bit value 3; BitNet stores t + 1 <= 2")
    t_vals = fields.reshape(n4, 4, k).transpose(0, 1).reshape(4 * n4, k).to(torch.int16) - 1
    scale = (reciprocal(ws) if cls == "bitlinear" else ws.to(torch.float32)).reshape(1, 1)
    return QuantizedWeight(SCHEME, (t_vals & 3).to(torch.uint8), scale)


def to_checkpoint(qw: QuantizedWeight, prefix: str = "", linear_class: str = "bitlinear"
                  ) -> tuple[dict[str, torch.Tensor], dict]:
    """int2 ternary codes with one tensor scale, N % 4 == 0 -> BitNet tensors and quantization_config."""
    s = qw.scheme
    if s.weight.name != "int2" or s.granularity != "tensor" or qw.codes.dim() != 2 or qw.n % 4 or \
            qw.channel_scale is not None or qw.k_perm is not None or s.global_scale:
        raise ValueError(f"BitNet cannot express scheme {s.summary()} {qw.shape}")
    t_vals = s.weight.decode(qw.codes).to(torch.int64)
    if bool((t_vals < -1).any()):
        raise ValueError("BitNet weights are ternary; code -2 cannot be stored")
    n, k = qw.n, qw.k
    fields = (t_vals + 1).reshape(4, n // 4, k).transpose(0, 1).reshape(n, k)
    ws = qw.scales.reshape(1)
    tensors = {"weight": pack(fields, 2, dim=0, word_dtype=torch.uint8),
               "weight_scale": reciprocal(ws) if linear_class == "bitlinear" else ws.to(torch.float32)}
    cfg = {"quant_method": "bitnet", "linear_class": linear_class, "quantization_mode": "offline"}
    _linear_class(cfg)
    return named(prefix, tensors), cfg

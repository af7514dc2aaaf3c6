"""`quant_method: "fp8"` checkpoints <-> the standard form (docs/FORMATS.md 2.3, 3.4).

Per-tensor: weight e4m3 (N, K), weight_scale fp32 scalar, input_scale fp32 scalar when activation_scheme is
"static". Block (`weight_block_size` [bn, bk], DeepSeek): weight_scale_inv fp32 (ceil(N/bn), ceil(K/bk)), which
is multiplied despite its name; activations are then quantized per token and per bk-group at run time.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from humming_gen.schemes.converters.common import Tensors, check_dtype, check_shape, config_int, f32, named
from humming_gen.schemes.scheme import ActivationScheme, QuantizedWeight, QuantScheme

_FP8 = {torch.float8_e4m3fn: "float8e4m3", torch.float8_e5m2: "float8e5m2"}


def convert(t: Tensors, cfg: dict[str, Any]) -> QuantizedWeight:
    """One FP8 linear layer -> QuantizedWeight (float8e4m3 codes, per-tensor or block fp32 scales)."""
    weight = t.get("weight")
    check_dtype(t.name("weight"), weight, tuple(_FP8))
    if weight.dim() != 2:
        raise ValueError(f"checkpoint tensor {t.name('weight')!r} must be 2-D (N, K), got {tuple(weight.shape)}")
    n, k = weight.shape
    codes = weight.view(torch.uint8).contiguous()
    block = cfg.get("weight_block_size")
    if block is not None:
        if not isinstance(block, (list, tuple)) or len(block) != 2:
            raise ValueError(f"quantization_config.weight_block_size: got {block!r}; allowed: [bn, bk]")
        bn, bk = (config_int({"weight_block_size": v}, "weight_block_size") for v in block)
        ue8m0 = cfg.get("scale_fmt") == "ue8m0"
        act = ActivationScheme("float8e4m3", granularity="group", group_size=bk,
                               scale_dtype="float8e8m0" if ue8m0 else "float32")
        scheme = QuantScheme(_FP8[weight.dtype], block_size=(bn, bk), scale_dtype="float32", activation=act)
        local = "weight_scale_inv" if t.has("weight_scale_inv") else "weight_scale"
        scales = t.get(local)
        check_shape(t.name(local), scales, (math.ceil(n / bn), math.ceil(k / bk)))
        return QuantizedWeight(scheme, codes, f32(scales))
    static = cfg.get("activation_scheme", "dynamic") == "static"
    act = ActivationScheme("float8e4m3", granularity="tensor" if static else "token")
    scale = t.get("weight_scale")
    if scale.numel() == 1:
        scheme = QuantScheme(_FP8[weight.dtype], granularity="tensor", scale_dtype="float32", activation=act)
        scales = f32(scale).reshape(1, 1)
    elif scale.numel() == n:
        scheme = QuantScheme(_FP8[weight.dtype], granularity="channel", scale_dtype="float32", activation=act)
        scales = f32(scale).reshape(n, 1)
    else:
        raise ValueError(f"checkpoint tensor {t.name('weight_scale')!r} has shape {tuple(scale.shape)}, expected "
                         f"a scalar (per tensor) or ({n}, 1) (per channel)")
    input_scale = t.opt("input_scale")
    if static and input_scale is None:
        raise ValueError(f"checkpoint tensor {t.name('input_scale')!r} is missing (activation_scheme 'static')")
    return QuantizedWeight(scheme, codes, scales,
                           input_scale=None if input_scale is None else f32(input_scale).reshape(()))


def to_checkpoint(qw: QuantizedWeight, prefix: str = "") -> tuple[dict[str, torch.Tensor], dict]:
    """float8e4m3 with one fp32 scale (per tensor) or 2-D blocks -> FP8 tensors and quantization_config."""
    s = qw.scheme
    if s.weight.name != "float8e4m3" or qw.codes.dim() != 2 or s.global_scale or qw.channel_scale is not None \
            or qw.k_perm is not None or s.granularity not in ("tensor", "block"):
        raise ValueError(f"quant_method 'fp8' cannot express scheme {s.summary()} {qw.shape}")
    tensors = {"weight": qw.codes.to(torch.uint8).view(torch.float8_e4m3fn)}
    cfg: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3"}
    if s.granularity == "block":
        tensors["weight_scale_inv"] = qw.scales.to(torch.float32)
        cfg.update(activation_scheme="dynamic", weight_block_size=list(s.block_size))
    else:
        tensors["weight_scale"] = qw.scales.reshape(()).to(torch.float32)
        if qw.input_scale is not None:
            tensors["input_scale"] = qw.input_scale.reshape(()).to(torch.float32)
        cfg["activation_scheme"] = "static" if qw.input_scale is not None else "dynamic"
    return named(prefix, tensors), cfg

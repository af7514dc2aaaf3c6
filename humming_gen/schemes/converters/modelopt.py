"""NVIDIA ModelOpt (TensorRT Model Optimizer) checkpoints <-> the standard form (docs/FORMATS.md 2.2, 3.5).

Config: `hf_quant_config.json` ({"producer": ..., "quantization": {"quant_algo": ...}}) or `quant_method:
"modelopt"` + `quant_algo` in config.json. NVFP4: weight uint8 (N, K/2) low nibble first, weight_scale e4m3
(N, K/16), weight_scale_2 fp32 (global, multiplied), input_scale fp32 (absent for W4A16_NVFP4). FP8: e4m3 weight,
per-tensor weight_scale and input_scale. MXFP8: e4m3 weight with uint8 e8m0 weight_scale (N, K/32).
"""

from __future__ import annotations

import fnmatch
from typing import Any

import torch

from humming_gen.formats import dtype
from humming_gen.schemes.converters.bits import pack_nibbles, unpack_nibbles
from humming_gen.schemes.converters.common import Tensors, check_dtype, check_shape, config_int, f32, named
from humming_gen.schemes.scheme import ActivationScheme, QuantizedWeight, QuantScheme

ALGOS = ("NVFP4", "W4A16_NVFP4", "FP8", "MXFP8")
_NVFP4_ACT = ActivationScheme("float4e2m1", granularity="group", group_size=16, scale_dtype="float8e4m3",
                              global_scale=True)


def layer_algo(cfg: dict[str, Any], prefix: str) -> str:
    """quant_algo of layer `prefix` from either config form (exclude_modules and MIXED_PRECISION honoured)."""
    q = cfg.get("quantization", cfg)
    excluded = q.get("exclude_modules") or q.get("ignore") or ()
    if any(fnmatch.fnmatchcase(prefix, p) for p in excluded):
        raise ValueError(f"layer {prefix!r} matches ModelOpt exclude_modules: it is not quantized")
    algo = q.get("quant_algo")
    if algo == "MIXED_PRECISION":
        layer = (q.get("quantized_layers") or {}).get(prefix)
        if layer is None:
            raise ValueError(f"layer {prefix!r} is not in ModelOpt quantized_layers (MIXED_PRECISION)")
        algo = layer.get("quant_algo")
    if algo not in ALGOS:
        raise ValueError(f"ModelOpt quant_algo {algo!r} is not supported; expected one of {ALGOS}")
    return algo


def convert(t: Tensors, cfg: dict[str, Any], layer_name: str | None = None) -> QuantizedWeight:
    """One ModelOpt linear layer -> QuantizedWeight."""
    algo = layer_algo(cfg, t.prefix if layer_name is None else layer_name)
    if t.has("pre_quant_scale"):
        raise ValueError(f"checkpoint tensor {t.name('pre_quant_scale')!r}: AWQ-style pre-quant smoothing "
                         f"scales are not supported")
    weight, scale = t.get("weight"), t.get("weight_scale")
    input_scale = t.opt("input_scale")
    if weight.dim() != 2:
        raise ValueError(f"checkpoint tensor {t.name('weight')!r} must be 2-D, got {tuple(weight.shape)}")
    n = weight.shape[0]
    if algo in ("NVFP4", "W4A16_NVFP4"):
        check_dtype(t.name("weight"), weight, (torch.uint8,))
        check_dtype(t.name("weight_scale"), scale, (torch.float8_e4m3fn,))
        k = weight.shape[1] * 2
        group = config_int(cfg.get("quantization", cfg), "group_size", default=16, where="quantization")
        check_shape(t.name("weight_scale"), scale, (n, -(-k // group)))
        s2 = t.get("weight_scale_2")
        scheme = QuantScheme("float4e2m1", group_size=group, scale_dtype="float8e4m3", global_scale=True,
                             activation=_NVFP4_ACT if algo == "NVFP4" else None)
        qw = QuantizedWeight(scheme, unpack_nibbles(weight), f32(scale), global_scale=f32(s2).reshape(()))
    elif algo == "MXFP8":
        check_dtype(t.name("weight"), weight, (torch.float8_e4m3fn,))
        check_shape(t.name("weight_scale"), scale, (n, -(-weight.shape[1] // 32)))
        act = ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0")
        scheme = QuantScheme("float8e4m3", group_size=32, scale_dtype="float8e8m0", activation=act)
        qw = QuantizedWeight(scheme, weight.view(torch.uint8).contiguous(), dtype("float8e8m0").decode(scale))
    else:
        check_dtype(t.name("weight"), weight, (torch.float8_e4m3fn,))
        if scale.numel() != 1:
            raise ValueError(f"checkpoint tensor {t.name('weight_scale')!r} has shape {tuple(scale.shape)}, "
                             f"expected a scalar (per-tensor FP8)")
        static = input_scale is not None
        act = ActivationScheme("float8e4m3", granularity="tensor" if static else "token")
        scheme = QuantScheme("float8e4m3", granularity="tensor", scale_dtype="float32", activation=act)
        qw = QuantizedWeight(scheme, weight.view(torch.uint8).contiguous(), f32(scale).reshape(1, 1))
    if input_scale is not None:
        qw.input_scale = f32(input_scale).reshape(())
    return qw


def to_checkpoint(qw: QuantizedWeight, prefix: str = "") -> tuple[dict[str, torch.Tensor], dict]:
    """NVFP4 (float4e2m1, e4m3 group-16 scales, global scale) or per-tensor FP8 -> ModelOpt tensors and the
    hf_quant_config.json content."""
    s = qw.scheme
    if qw.codes.dim() != 2 or qw.channel_scale is not None or qw.k_perm is not None:
        raise ValueError(f"ModelOpt export needs a plain 2-D weight, got {s.summary()} {qw.shape}")
    if s.weight.name == "float4e2m1" and s.scale_dtype.name == "float8e4m3" and s.global_scale:
        tensors = {"weight": pack_nibbles(qw.codes.to(torch.uint8)), "weight_scale": qw.scales.to(torch.float8_e4m3fn),
                   "weight_scale_2": qw.global_scale.reshape(()).to(torch.float32)}
        algo = "NVFP4" if qw.input_scale is not None else "W4A16_NVFP4"
        quant = {"quant_algo": algo, "group_size": s.group_size}
    elif s.weight.name == "float8e4m3" and s.granularity == "tensor" and not s.global_scale:
        tensors = {"weight": qw.codes.to(torch.uint8).view(torch.float8_e4m3fn),
                   "weight_scale": qw.scales.reshape(()).to(torch.float32)}
        quant = {"quant_algo": "FP8"}
    else:
        raise ValueError(f"ModelOpt cannot express scheme {s.summary()}")
    if qw.input_scale is not None:
        tensors["input_scale"] = qw.input_scale.reshape(()).to(torch.float32)
    cfg = {"producer": {"name": "modelopt"}, "quantization": {**quant, "exclude_modules": []}}
    return named(prefix, tensors), cfg

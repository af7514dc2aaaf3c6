"""compressed-tensors (llm-compressor) checkpoints <-> the standard form (docs/FORMATS.md 3.3).

The layer's QuantizationArgs come from the config group whose `targets` match the layer name (`re:` regexes
and exact names first, module class names such as "Linear" otherwise); `ignore` lists unquantized layers.
Formats: pack-quantized (int 1-8 bit in int32 words, offset binary), naive-/int-/float-quantized (int8 or fp8
elements), nvfp4-pack-quantized (global scale g: W = q * s_b / g, converted with global_scale = 1/g),
mxfp4-pack-quantized and mxfp8-quantized (uint8 e8m0 scales).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from humming_gen.formats import dtype
from humming_gen.schemes.converters.bits import pack, pack_nibbles, unpack, unpack_nibbles
from humming_gen.schemes.converters.common import (
    Tensors, check_dtype, check_shape, config_int, f32, g_idx_of, group_order, named, offset_to_signed, reciprocal,
    scale_dtype_name, torch_scale_dtype)
from humming_gen.schemes.scheme import ActivationScheme, QuantizedWeight, QuantScheme

FORMATS = ("pack-quantized", "naive-quantized", "int-quantized", "float-quantized", "nvfp4-pack-quantized",
           "mxfp4-pack-quantized", "mxfp8-quantized")
STRATEGIES = ("tensor", "channel", "group", "block", "tensor_group")


def _matches(target: str, name: str) -> bool:
    return re.match(target[3:], name) is not None if target.startswith("re:") else target == name


def layer_group(cfg: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The config group that quantizes layer `prefix` (raises ValueError when none or when ignored)."""
    if any(_matches(t, prefix) for t in cfg.get("ignore") or ()):
        raise ValueError(f"layer {prefix!r} is listed in the compressed-tensors 'ignore' list: it is not quantized")
    groups = cfg.get("config_groups") or {}
    if not groups:
        raise ValueError("compressed-tensors quantization_config has no config_groups")
    by_name = [g for g in groups.values() if any(_matches(t, prefix) for t in g.get("targets", ()))]
    by_type = [g for g in groups.values() if any(not t.startswith("re:") and "." not in t and t[:1].isupper()
                                                 for t in g.get("targets", ()))]
    found = by_name or by_type or (list(groups.values()) if len(groups) == 1 else [])
    if not found:
        raise ValueError(f"no compressed-tensors config group targets layer {prefix!r}; groups: "
                         f"{ {k: g.get('targets') for k, g in groups.items()} }")
    return found[0]


def _activation(args: dict[str, Any] | None) -> ActivationScheme | None:
    """Map input_activations args to an ActivationScheme (None: 16-bit activations)."""
    if not args:
        return None
    bits, typ, strategy = args.get("num_bits"), args.get("type", "int"), args.get("strategy", "tensor")
    if args.get("symmetric", True) is False:
        raise ValueError("compressed-tensors asymmetric input activations are not supported")
    elem = {("float", 8): "float8e4m3", ("int", 8): "int8", ("float", 4): "float4e2m1"}.get((typ, bits))
    if elem is None:
        raise ValueError(f"compressed-tensors input_activations type {typ!r} with {bits} bits is not supported")
    if strategy in ("token", "tensor"):
        return ActivationScheme(elem, granularity=strategy)
    if strategy == "group":
        scale = "float8e8m0" if elem == "float4e2m1" and args.get("group_size") == 32 else "float32"
        return ActivationScheme(elem, granularity="group", group_size=args.get("group_size"), scale_dtype=scale)
    if strategy == "tensor_group":
        return ActivationScheme(elem, granularity="group", group_size=args.get("group_size"),
                                scale_dtype="float8e4m3", global_scale=True)
    raise ValueError(f"compressed-tensors input_activations strategy {strategy!r} is not supported")


def _granularity(w: dict[str, Any]) -> dict[str, Any]:
    strategy = w.get("strategy") or "tensor"
    if strategy not in STRATEGIES:
        raise ValueError(f"compressed-tensors weight strategy {strategy!r} is not supported; expected one of "
                         f"{STRATEGIES}")
    if strategy in ("group", "tensor_group"):
        return dict(group_size=config_int(w, "group_size", where="weights"))
    if strategy == "block":
        return dict(block_size=tuple(w["block_structure"]))
    return dict(granularity=strategy)


def _scales(t: Tensors, scheme: QuantScheme, n: int, k: int, local: str = "weight_scale") -> torch.Tensor:
    """Stored scale tensor -> float32 of scheme.scale_shape (tensor scales may be stored as () or (1,))."""
    s = t.get(local)
    expected = scheme.scale_shape(n, k)
    if scheme.granularity == "tensor" and s.numel() == 1:
        s = s.reshape(1, 1)
    if tuple(s.shape) != expected:
        raise ValueError(f"checkpoint tensor {t.name(local)!r} has shape {tuple(s.shape)}, expected {expected} for "
                         f"{scheme.granularity} scales of a ({n}, {k}) weight (group size not matching K?)")
    if s.dtype == torch.uint8:
        return dtype("float8e8m0").decode(s)
    return f32(s)


def _act_order(t: Tensors, scheme: QuantScheme, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    g_idx = t.opt("weight_g_idx")
    if g_idx is None or scheme.granularity != "group":
        return codes, None
    perm = group_order(g_idx, codes.shape[-1], scheme.group_size, t.name("weight_g_idx"))
    return (codes, None) if perm is None else (codes[:, perm].contiguous(), perm)


def convert(t: Tensors, cfg: dict[str, Any], layer_name: str | None = None) -> QuantizedWeight:
    """One compressed-tensors linear layer -> QuantizedWeight. `layer_name` picks the config group."""
    group = layer_group(cfg, t.prefix if layer_name is None else layer_name)
    fmt = group.get("format") or cfg.get("format")
    if fmt not in FORMATS:
        raise ValueError(f"compressed-tensors format {fmt!r} is not supported; expected one of {FORMATS}")
    w = group.get("weights")
    if not w:
        raise ValueError(f"compressed-tensors config group for layer {t.prefix!r} quantizes no weights")
    act = _activation(group.get("input_activations"))
    input_scale = t.opt("input_scale")
    if fmt == "pack-quantized":
        qw = _pack_quantized(t, w, act)
    elif fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
        qw = _fp4(t, w, act, fmt)
    else:
        qw = _unpacked(t, w, act)
    if input_scale is not None:
        qw.input_scale = f32(input_scale).reshape(())
    return qw


def _pack_quantized(t: Tensors, w: dict[str, Any], act: ActivationScheme | None) -> QuantizedWeight:
    bits, sym = config_int(w, "num_bits", where="weights"), w.get("symmetric", True)
    if w.get("type", "int") != "int" or not 1 <= bits <= 8:
        raise ValueError(f"pack-quantized needs int weights of 1-8 bits, got type {w.get('type')!r} bits {bits}")
    packed, shape = t.get("weight_packed"), t.get("weight_shape")
    check_dtype(t.name("weight_packed"), packed, (torch.int32,))
    n, k = (int(v) for v in shape.reshape(-1).tolist())
    check_shape(t.name("weight_packed"), packed, (n, math.ceil(k * bits / 32)))
    gran = _granularity(w)
    scale_t = t.get("weight_scale")
    scheme_args = dict(scale_dtype=scale_dtype_name(scale_t, t.name("weight_scale")), activation=act, **gran)
    codes = unpack(packed, bits, k, dim=-1)
    if sym:
        scheme = QuantScheme(f"int{bits}", **scheme_args)
        codes, perm = _act_order(t, scheme, offset_to_signed(codes, bits))
        return QuantizedWeight(scheme, codes, _scales(t, scheme, n, k), k_perm=perm)
    scheme = QuantScheme(f"uint{bits}", zero_point="int", **scheme_args)
    groups = scheme.scale_shape(n, k)[1]
    zp = t.get("weight_zero_point")
    check_shape(t.name("weight_zero_point"), zp, (math.ceil(n * bits / 32), groups))
    zeros = unpack(zp, bits, n, dim=0).to(torch.float32)
    codes, perm = _act_order(t, scheme, codes)
    return QuantizedWeight(scheme, codes, _scales(t, scheme, n, k), zeros, k_perm=perm)


def _unpacked(t: Tensors, w: dict[str, Any], act: ActivationScheme | None) -> QuantizedWeight:
    """naive-/int-/float-quantized and mxfp8-quantized: one element per int8 / fp8 byte."""
    weight = t.get("weight")
    if weight.dim() != 2:
        raise ValueError(f"checkpoint tensor {t.name('weight')!r} must be 2-D (N, K), got {tuple(weight.shape)}")
    n, k = weight.shape
    bits, typ, sym = config_int(w, "num_bits", where="weights"), w.get("type", "int"), w.get("symmetric", True)
    scale_t = t.get("weight_scale")
    gran = _granularity(w)
    scale_dtype = "float8e8m0" if scale_t.dtype == torch.uint8 else scale_dtype_name(scale_t, t.name("weight_scale"))
    args = dict(scale_dtype=scale_dtype, activation=act, **gran)
    if scale_dtype == "float8e8m0":
        args["scale_rule"] = "even"
    if typ == "float":
        fp8 = {torch.float8_e4m3fn: "float8e4m3", torch.float8_e5m2: "float8e5m2"}
        check_dtype(t.name("weight"), weight, tuple(fp8))
        scheme = QuantScheme(fp8[weight.dtype], **args)
        return QuantizedWeight(scheme, weight.view(torch.uint8).contiguous(), _scales(t, scheme, n, k))
    check_dtype(t.name("weight"), weight, (torch.int8,))
    mask = (1 << bits) - 1
    codes = (weight.view(torch.uint8) & mask).contiguous()
    if sym:
        scheme = QuantScheme(f"int{bits}", **args)
        codes, perm = _act_order(t, scheme, codes)
        return QuantizedWeight(scheme, codes, _scales(t, scheme, n, k), k_perm=perm)
    # Asymmetric signed codes c and zero points z: c - z = (c + 2^(b-1)) - (z + 2^(b-1)) with unsigned codes.
    scheme = QuantScheme(f"uint{bits}", zero_point="int", **args)
    zp = t.get("weight_zero_point")
    expected = scheme.scale_shape(n, k)
    if zp.numel() != math.prod(expected):
        check_shape(t.name("weight_zero_point"), zp, expected)
    zeros = zp.reshape(expected).to(torch.float32) + (1 << (bits - 1))
    codes, perm = _act_order(t, scheme, offset_to_signed(codes, bits))
    return QuantizedWeight(scheme, codes, _scales(t, scheme, n, k), zeros, k_perm=perm)


def _fp4(t: Tensors, w: dict[str, Any], act: ActivationScheme | None, fmt: str) -> QuantizedWeight:
    packed = t.get("weight_packed")
    check_dtype(t.name("weight_packed"), packed, (torch.uint8,))
    if w.get("type") != "float" or config_int(w, "num_bits", default=0, where="weights") != 4:
        raise ValueError(f"{fmt} needs 4-bit float weights, got {w.get('type')!r} {w.get('num_bits')!r} bits")
    n, k = packed.shape[0], packed.shape[1] * 2
    codes = unpack_nibbles(packed)
    if fmt == "mxfp4-pack-quantized":
        group = config_int(w, "group_size", default=32, where="weights")
        scheme = QuantScheme("float4e2m1", group_size=group, scale_dtype="float8e8m0", scale_rule="even",
                             activation=act)
        check_dtype(t.name("weight_scale"), t.get("weight_scale"), (torch.uint8,))
        return QuantizedWeight(scheme, codes, _scales(t, scheme, n, k))
    group = config_int(w, "group_size", default=16, where="weights")
    scheme = QuantScheme("float4e2m1", group_size=group, scale_dtype="float8e4m3", global_scale=True, activation=act)
    check_dtype(t.name("weight_scale"), t.get("weight_scale"), (torch.float8_e4m3fn,))
    g = t.get("weight_global_scale")
    if g.numel() != 1:
        raise ValueError(f"checkpoint tensor {t.name('weight_global_scale')!r} has shape {tuple(g.shape)}, "
                         f"expected (1,)")
    qw = QuantizedWeight(scheme, codes, _scales(t, scheme, n, k), global_scale=reciprocal(g).reshape(()))
    g_in = t.opt("input_global_scale")
    if g_in is not None:
        qw.input_scale = reciprocal(g_in).reshape(())
    return qw


# --- export --------------------------------------------------------------------------------------------------
def _weights_args(s: QuantScheme) -> dict[str, Any]:
    args: dict[str, Any] = {"num_bits": s.weight.bits, "type": "int" if s.weight.is_int else "float",
                            "symmetric": s.zero_point is None, "dynamic": False}
    if s.granularity == "group":
        args.update(strategy="tensor_group" if s.global_scale else "group", group_size=s.group_size)
    elif s.granularity == "block":
        args.update(strategy="block", block_structure=list(s.block_size))
    else:
        args.update(strategy=s.granularity)
    return args


def to_checkpoint(qw: QuantizedWeight, prefix: str = "", targets: list[str] | None = None
                  ) -> tuple[dict[str, torch.Tensor], dict]:
    """Write a 2-D QuantizedWeight as compressed-tensors tensors (local names) and its quantization_config.

    int/uint 1-8 bit -> pack-quantized; float8e4m3 with float scales -> float-quantized; float4e2m1 with e4m3
    group-16 scales and a global scale -> nvfp4-pack-quantized (g = 1/global_scale in float32); float4e2m1 or
    float8e4m3 with e8m0 scales -> mxfp4-pack-quantized / mxfp8-quantized.
    """
    s = qw.scheme
    if qw.codes.dim() != 2 or qw.channel_scale is not None or s.zero_point == "float" or \
            (qw.k_perm is not None and not (s.weight.is_int and s.granularity == "group")):
        raise ValueError(f"compressed-tensors export needs a 2-D weight without channel_scale or float zero "
                         f"points (k_perm only with int group scales), got {s.summary()} {qw.shape}")
    n, k = qw.n, qw.k
    out: dict[str, torch.Tensor] = {}
    scales = qw.scales
    if s.granularity == "tensor":
        scales = scales.reshape(1)
    name = s.weight.name
    if s.weight.is_int:
        bits = s.weight.bits
        if s.global_scale or s.granularity not in ("tensor", "channel", "group") or \
                (s.zero_point is None) != s.weight.signed:
            raise ValueError(f"pack-quantized cannot express scheme {s.summary()}")
        u = qw.codes.to(torch.uint8) ^ (1 << (bits - 1)) if s.weight.signed else qw.codes.to(torch.uint8)
        if qw.k_perm is not None:  # act-order checkpoints keep K in original order, groups given by weight_g_idx
            u = torch.empty_like(u).index_copy_(1, qw.k_perm.long(), u)
        out["weight_packed"] = pack(u, bits, dim=-1)
        out["weight_shape"] = torch.tensor([n, k], dtype=torch.int64)
        out["weight_scale"] = scales.to(torch_scale_dtype(s.scale_dtype.name))
        if s.zero_point is not None:
            out["weight_zero_point"] = pack(qw.zero_points.to(torch.int64), bits, dim=0)
        if qw.k_perm is not None:
            out["weight_g_idx"] = g_idx_of(qw.k_perm, k, s.group_size)
        fmt = "pack-quantized"
    elif name == "float4e2m1" and s.scale_dtype.name == "float8e4m3" and s.global_scale:
        out["weight_packed"] = pack_nibbles(qw.codes.to(torch.uint8))
        out["weight_scale"] = scales.to(torch.float8_e4m3fn)
        out["weight_global_scale"] = reciprocal(qw.global_scale).reshape(1)
        fmt = "nvfp4-pack-quantized"
    elif name in ("float4e2m1", "float8e4m3") and s.scale_dtype.name == "float8e8m0" and s.granularity == "group":
        e = torch.log2(scales.to(torch.float64)).round().to(torch.int64) + 127
        out["weight_scale"] = e.to(torch.uint8)
        if name == "float4e2m1":
            out["weight_packed"] = pack_nibbles(qw.codes.to(torch.uint8))
            fmt = "mxfp4-pack-quantized"
        else:
            out["weight"] = qw.codes.to(torch.uint8).view(torch.float8_e4m3fn)
            fmt = "mxfp8-quantized"
    elif name in ("float8e4m3", "float8e5m2") and not s.global_scale:
        out["weight"] = qw.codes.to(torch.uint8).view(
            torch.float8_e4m3fn if name == "float8e4m3" else torch.float8_e5m2)
        out["weight_scale"] = scales.to(torch_scale_dtype(s.scale_dtype.name))
        fmt = "float-quantized"
    else:
        raise ValueError(f"compressed-tensors cannot express scheme {s.summary()}")
    if qw.input_scale is not None and fmt == "nvfp4-pack-quantized":
        out["input_global_scale"] = reciprocal(qw.input_scale).reshape(1)
    elif qw.input_scale is not None:
        out["input_scale"] = qw.input_scale.reshape(1).to(torch.float32)
    group = {"targets": targets or ["Linear"], "weights": _weights_args(s), "format": fmt}
    if s.activation is not None:
        a = s.activation
        group["input_activations"] = {
            "num_bits": a.dtype.bits, "type": "int" if a.dtype.is_int else "float", "symmetric": True,
            "strategy": "tensor_group" if a.global_scale else a.granularity, "group_size": a.group_size,
            "dynamic": qw.input_scale is None}
    cfg = {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
           "config_groups": {"group_0": group}, "ignore": []}
    return named(prefix, out), cfg

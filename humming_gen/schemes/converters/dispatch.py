"""`convert`: pick the converter from a checkpoint's quantization_config and assemble layers from it.

A prefix may name one layer, a stacked-experts layer (`...experts.*.down_proj`: the `*` runs over the expert
indices, results stacked into (E, N, K)), or a list of layers fused along N without re-quantizing (q/k/v,
gate/up): per-shard per-tensor scales and differing global scales move into `channel_scale`, input_scale is the
maximum over shards.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import torch

from humming_gen.schemes.converters import awq, bitnet, compressed_tensors, fp8, gptq, modelopt, mxfp4
from humming_gen.schemes.converters.common import Tensors
from humming_gen.schemes.scheme import QuantizedWeight

CONVERTERS: dict[str, ModuleType] = {"gptq": gptq, "awq": awq, "compressed-tensors": compressed_tensors,
                                     "fp8": fp8, "mxfp4": mxfp4, "modelopt": modelopt, "bitnet": bitnet}
_ALIASES = {"compressed_tensors": "compressed-tensors", "gptq_v2": "gptq"}


def detect_format(quantization_config: Mapping[str, Any]) -> str:
    """Converter name for a quantization_config (config.json form, hf_quant_config.json form or legacy)."""
    method = quantization_config.get("quant_method")
    if method is None and "quant_algo" in (quantization_config.get("quantization") or {}):
        return "modelopt"
    method = _ALIASES.get(str(method).lower(), str(method).lower())
    if method not in CONVERTERS:
        raise ValueError(f"unknown quant_method {quantization_config.get('quant_method')!r}; supported: "
                         f"{sorted(CONVERTERS)}")
    return method


def convert(tensors: Mapping[str, torch.Tensor], quantization_config: Mapping[str, Any],
            prefix: str | Sequence[str] = "", format: str | None = None) -> QuantizedWeight:
    """Tensors of one layer (names `prefix.<local>`) -> the standard-form QuantizedWeight.

    tensors: checkpoint names -> tensors (a lazy mapping works: only the layer's names are read).
    quantization_config: the checkpoint's quantization_config (or hf_quant_config.json content).
    prefix: layer name; `*` in it stacks experts; a list fuses layers along N.
    format: converter name (keys of CONVERTERS), overriding quant_method.
    Raises ValueError for missing tensors, shape mismatches and unsupported settings.
    """
    fmt = format if format is not None else detect_format(quantization_config)
    if fmt not in CONVERTERS:
        raise ValueError(f"unknown format {fmt!r}; supported: {sorted(CONVERTERS)}")
    cfg = dict(quantization_config)
    if not isinstance(prefix, str):
        if not prefix:
            raise ValueError("prefix list for a fused layer is empty")
        return concat_n([convert(tensors, cfg, p, fmt) for p in prefix], list(prefix))
    if "*" in prefix:
        experts = expert_prefixes(tensors, prefix)
        return stack_experts([_convert_one(tensors, cfg, p, fmt) for p in experts], experts)
    return _convert_one(tensors, cfg, prefix, fmt)


def _convert_one(tensors: Mapping[str, torch.Tensor], cfg: dict[str, Any], prefix: str, fmt: str) -> QuantizedWeight:
    return CONVERTERS[fmt].convert(Tensors(tensors, prefix), cfg)


def expert_prefixes(tensors: Mapping[str, torch.Tensor], pattern: str) -> list[str]:
    """Concrete prefixes for `pattern` with `*` = expert index, ordered 0..E-1 (all must be present)."""
    if pattern.count("*") != 1:
        raise ValueError(f"a stacked-experts prefix has exactly one '*', got {pattern!r}")
    head, tail = pattern.split("*")
    rx = re.compile(re.escape(head) + r"(\d+)" + re.escape(tail) + r"[._]")
    found = sorted({int(m.group(1)) for name in tensors if (m := rx.match(name))})
    if not found:
        raise ValueError(f"no checkpoint tensors match the stacked-experts prefix {pattern!r}")
    if found != list(range(len(found))):
        missing = sorted(set(range(found[-1] + 1)) - set(found))
        raise ValueError(f"stacked-experts prefix {pattern!r}: expert indices {missing} are missing")
    return [f"{head}{i}{tail}" for i in found]


def _same(values: list[torch.Tensor | None], what: str, names: list[str]) -> torch.Tensor | None:
    if all(v is None for v in values):
        return None
    if any(v is None for v in values) or any(not torch.equal(values[0], v) for v in values[1:]):
        raise ValueError(f"{what} differs between {names}; they cannot be combined into one weight")
    return values[0]


def _max_input_scale(parts: list[QuantizedWeight]) -> torch.Tensor | None:
    scales = [p.input_scale.reshape(()) for p in parts if p.input_scale is not None]
    return torch.stack(scales).max() if scales else None


def stack_experts(parts: list[QuantizedWeight], names: list[str]) -> QuantizedWeight:
    """Per-expert (N, K) weights of one scheme -> one (E, N, K) weight (global scales become (E,))."""
    if any(p.scheme != parts[0].scheme for p in parts) or any(p.codes.dim() != 2 for p in parts):
        raise ValueError(f"experts {names} must share one scheme and be 2-D to be stacked")

    def stack(attr: str) -> torch.Tensor | None:
        vals = [getattr(p, attr) for p in parts]
        if all(v is None for v in vals):
            return None
        if any(v is None for v in vals):
            raise ValueError(f"{attr} is present for some of the experts {names} only")
        return torch.stack([v.reshape(-1) if attr == "global_scale" else v for v in vals]).reshape(
            len(vals), *(() if attr == "global_scale" else vals[0].shape))

    return QuantizedWeight(parts[0].scheme, stack("codes"), stack("scales"), stack("zero_points"),
                           stack("global_scale"), _same([p.k_perm for p in parts], "k_perm", names),
                           stack("channel_scale"), _max_input_scale(parts))


def concat_n(parts: list[QuantizedWeight], names: list[str]) -> QuantizedWeight:
    """Fuse layers along N (q/k/v, gate/up) without re-quantizing."""
    scheme = parts[0].scheme
    if any(p.scheme != scheme for p in parts) or any(p.shape[:-2] != parts[0].shape[:-2] or p.k != parts[0].k
                                                      for p in parts):
        raise ValueError(f"layers {names} must share one scheme, K and expert count to be fused; got "
                         f"{[p.scheme.summary() + ' ' + str(p.shape) for p in parts]}")
    if scheme.granularity == "block":
        bn = scheme.block_size[0]
        if any(p.n % bn for p in parts[:-1]):
            raise ValueError(f"layers {names} with N {[p.n for p in parts]} cannot be fused: block scales of "
                             f"{bn} rows would straddle layers")
    lead = parts[0].shape[:-2]
    k_perm = _same([p.k_perm for p in parts], "k_perm", names)
    row_scale = [p.channel_scale if p.channel_scale is not None else torch.ones(*lead, p.n) for p in parts]
    scales = [p.scales for p in parts]
    use_rows = any(p.channel_scale is not None for p in parts)
    if scheme.granularity == "tensor" and any(not torch.equal(s, scales[0]) for s in scales):
        # One scale per shard: keep it per row instead of re-quantizing to a common scale.
        row_scale = [r * s.reshape(*lead, 1) for r, s in zip(row_scale, scales)]
        scales, use_rows = [torch.ones_like(s) for s in scales], True
    glob = [p.global_scale for p in parts]
    if glob[0] is not None and any(not torch.equal(g, glob[0]) for g in glob):
        row_scale = [r * g.reshape(*lead, 1) if g.numel() > 1 else r * g for r, g in zip(row_scale, glob)]
        glob, use_rows = [torch.ones_like(g) for g in glob], True
    cat_scales = scales[0] if scheme.granularity == "tensor" else torch.cat(scales, dim=-2)
    zeros = None if parts[0].zero_points is None else torch.cat([p.zero_points for p in parts], dim=-2)
    return QuantizedWeight(scheme, torch.cat([p.codes for p in parts], dim=-2), cat_scales, zeros, glob[0],
                           k_perm, torch.cat(row_scale, dim=-1) if use_rows else None, _max_input_scale(parts))

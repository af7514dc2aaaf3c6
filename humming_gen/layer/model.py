"""Whole models: replace the `nn.Linear` modules of any torch module (a Hugging Face transformers model included)
by QuantLinear, quantizing their float weights with a scheme (`quantize_model`) or reading them from a quantized
checkpoint directory (`load_quantized_model`).

A linear layer the scheme cannot serve (a format the activation dtype cannot hold, a NaN weight, ...) stays a
float `nn.Linear` and is listed with its reason in the returned report (and a warning): a model with a few float
layers still runs, and the report says which. `strict=True` raises instead, naming the layer.
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import torch

from humming_gen.layer.linear import QuantLinear
from humming_gen.schemes import QuantScheme

DEFAULT_SKIP = ("lm_head",)  # the output projection usually stays in float (GPTQ, AWQ, ModelOpt do the same)
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@attrs.define
class QuantizeReport:
    """What `quantize_model` / `load_quantized_model` did: layers replaced, layers left in float (name -> why),
    and, for checkpoints, model tensors the checkpoint lacked."""

    quantized: list[str] = attrs.Factory(list)
    skipped: dict[str, str] = attrs.Factory(dict)
    missing: list[str] = attrs.Factory(list)

    def __str__(self) -> str:
        lines = [f"{len(self.quantized)} linear layers quantized, {len(self.skipped)} left in float"]
        lines += [f"  {name}: {why}" for name, why in self.skipped.items()]
        if self.missing:
            lines.append(f"{len(self.missing)} model tensors not in the checkpoint: {', '.join(self.missing)}")
        return "\n".join(lines)


def _skip_patterns(skip: "str | Iterable[str] | None") -> tuple[str, ...]:
    if skip is None:
        return ()
    patterns = (skip,) if isinstance(skip, str) else tuple(skip)
    for p in patterns:
        if not isinstance(p, str):
            raise TypeError(f"skip must be a module name pattern or a list of them (fnmatch, e.g. 'lm_head', "
                            f"'*.mlp.gate'), got an entry {p!r}")
    return patterns


def _skipped_by(name: str, patterns: tuple[str, ...]) -> str | None:
    """The pattern that matches the module name in full or as its last dotted components, if any."""
    for p in patterns:
        if fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "*." + p):
            return p
    return None


def _linears(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Linear]]:
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear):
            yield name, module


def _replace(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def _device(device: "torch.device | str | None") -> torch.device:
    if device is not None:
        return torch.device(device)
    if not torch.cuda.is_available():
        raise ValueError("device: no CUDA device here; pass device= (and target=) to build layers elsewhere")
    return torch.device("cuda", torch.cuda.current_device())


def _check_model(model: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def _leave_float(report: QuantizeReport, name: str, why: str, strict: bool) -> None:
    if strict:
        raise ValueError(f"linear layer {name!r} cannot be quantized: {why}")
    report.skipped[name] = why


def _warn(report: QuantizeReport) -> None:
    unserved = {n: w for n, w in report.skipped.items() if not w.startswith("skip pattern")}
    if unserved:
        warnings.warn(f"humming_gen: {len(unserved)} linear layers left in float: " +
                      "; ".join(f"{n}: {w}" for n, w in unserved.items()), stacklevel=3)


def quantize_model(model: torch.nn.Module, scheme: "QuantScheme | str", *,
                   skip: "str | Iterable[str] | None" = DEFAULT_SKIP, dtype: torch.dtype = torch.bfloat16,
                   strict: bool = False, device: "torch.device | str | None" = None,
                   **layer_kwargs: Any) -> QuantizeReport:
    """Replace every `nn.Linear` of `model` (in place) by a QuantLinear of its weight quantized with `scheme`.

    skip: module name patterns (fnmatch; a pattern also matches the last components of a dotted name, so
        'lm_head' matches 'model.lm_head'); those layers stay float. Default: the output projection.
    dtype: activation dtype of the QuantLinears (bfloat16 or float16); cast the rest of the model to it.
    strict: raise for a layer the scheme cannot serve instead of leaving it in float.
    device: where the layers run (default: the current CUDA device); layer_kwargs go to QuantLinear (target,
        tunings, out_dtype, weight_only, ...).
    Returns a QuantizeReport (quantized names, skipped names with the reason).
    """
    _check_model(model)
    if isinstance(scheme, str):
        from humming_gen.schemes.presets import preset

        scheme = preset(scheme)
    if not isinstance(scheme, QuantScheme):
        raise TypeError(f"scheme must be a QuantScheme or a preset name, got {type(scheme).__name__}")
    patterns = _skip_patterns(skip)
    dev = _device(device)
    report = QuantizeReport()
    for name, linear in _linears(model):
        pattern = _skipped_by(name, patterns)
        if pattern is not None:
            report.skipped[name] = f"skip pattern {pattern!r}"
            continue
        weight = linear.weight.detach().to(dev)
        bias = None if linear.bias is None else linear.bias.detach().to(dev)
        try:
            layer = QuantLinear.from_float(weight, scheme, bias=bias, dtype=dtype, device=dev, **layer_kwargs)
        except ValueError as exc:  # ComposeError is one: the scheme cannot serve this shape or these values
            _leave_float(report, name, str(exc), strict)
            continue
        _replace(model, name, layer)
        report.quantized.append(name)
    _warn(report)
    return report


def load_quantized_model(model: torch.nn.Module, checkpoint_dir: "str | Path", *,
                         skip: "str | Iterable[str] | None" = DEFAULT_SKIP, dtype: torch.dtype = torch.bfloat16,
                         strict: bool = False, device: "torch.device | str | None" = None,
                         **layer_kwargs: Any) -> QuantizeReport:
    """Load a quantized checkpoint directory (GPTQ, AWQ, compressed-tensors, FP8, MXFP4, ModelOpt, ...) into
    `model`, built from the same architecture (e.g. transformers' `AutoModelForCausalLM.from_config`).

    Each `nn.Linear` whose weight the checkpoint stores quantized becomes a QuantLinear (read with the converter
    of the checkpoint's config, as `load_layer` does; its bias, when the checkpoint has one); linear layers the
    checkpoint stores in float (lm_head, modules_to_not_convert) and every other model tensor (embeddings, norms)
    are copied in. A quantized layer that is skipped (`skip`) or that QuantLinear cannot serve keeps its float
    module, holding the dequantized weight. Arguments as in `quantize_model`. Returns a QuantizeReport whose
    `missing` lists model tensors the checkpoint lacks (tied tensors loaded under another name are not missing).
    Raises the converter's ValueError for a layer the checkpoint holds but cannot be read.
    """
    from humming_gen.schemes.checkpoint import SafetensorsCheckpoint, read_quantization_config
    from humming_gen.schemes.converters.dispatch import convert

    _check_model(model)
    patterns = _skip_patterns(skip)
    dev = _device(device)
    cfg = read_quantization_config(checkpoint_dir)
    ckpt = SafetensorsCheckpoint(checkpoint_dir)
    report = QuantizeReport()
    loaded: set[str] = set()  # model tensor names filled from quantized tensors (layers left in float)
    for name, linear in _linears(model):
        stored = ckpt[f"{name}.weight"] if f"{name}.weight" in ckpt else None
        if stored is not None and stored.dtype in _FLOAT_DTYPES:
            continue  # a float layer in the checkpoint: loaded with the other tensors below
        if not any(key.startswith(name + ".") for key in ckpt):
            continue  # not in the checkpoint at all: its weight is reported missing below
        qweight = convert(ckpt, cfg, name)  # the layer is there: a converter error is the checkpoint's, raised
        if (qweight.n, qweight.k) != (linear.out_features, linear.in_features):
            raise ValueError(f"checkpoint layer {name!r} is ({qweight.n}, {qweight.k}) (N, K); the model's "
                             f"nn.Linear is ({linear.out_features}, {linear.in_features})")
        bias = ckpt[f"{name}.bias"].to(dev) if f"{name}.bias" in ckpt else None
        pattern = _skipped_by(name, patterns)
        why = None if pattern is None else f"skip pattern {pattern!r}"
        if why is None:
            try:
                layer = QuantLinear.from_quantized(qweight.to(dev), bias=bias, dtype=dtype, device=dev,
                                                   **layer_kwargs)
            except ValueError as exc:
                why = str(exc)
                if strict:
                    raise ValueError(f"linear layer {name!r} cannot be quantized: {why}") from exc
        if why is not None:  # keep the float layer, holding the dequantized weight
            report.skipped[name] = f"{why} (the float layer holds the dequantized weight)"
            with torch.no_grad():
                linear.weight.copy_(qweight.dequantize())
                loaded.add(f"{name}.weight")
                if bias is not None and linear.bias is not None:
                    linear.bias.copy_(bias)
                    loaded.add(f"{name}.bias")
            continue
        _replace(model, name, layer)
        report.quantized.append(name)
    _load_float_tensors(model, ckpt, report, loaded)
    _warn(report)
    return report


def _load_float_tensors(model: torch.nn.Module, ckpt: Any, report: QuantizeReport, loaded: set[str]) -> None:
    """Copy every parameter and buffer the checkpoint has; tied tensors (one storage, several names) once."""
    seen: set[int] = set()
    with torch.no_grad():
        for key, tensor in model.state_dict(keep_vars=True).items():
            if key in ckpt:
                value = ckpt[key]
                if tuple(value.shape) != tuple(tensor.shape):
                    raise ValueError(f"checkpoint tensor {key!r} has shape {tuple(value.shape)}; the model's is "
                                     f"{tuple(tensor.shape)}")
                tensor.copy_(value)
                seen.add(tensor.data_ptr())
        for key, tensor in model.state_dict(keep_vars=True).items():
            if key not in ckpt and key not in loaded and tensor.data_ptr() not in seen:
                report.missing.append(key)

"""Checkpoint fixtures for the converter tests: writing safetensors directories, comparing QuantizedWeights,
building compressed-tensors checkpoints with the library's own compressors, and loading single oracle files of
packages whose top-level import pulls heavy dependencies (AutoGPTQ, AutoAWQ)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest
import torch
from safetensors.torch import save_file

from humming_gen.schemes.scheme import QuantizedWeight

FIELDS = ("codes", "scales", "zero_points", "global_scale", "k_perm", "channel_scale", "input_scale")


def write_checkpoint(path: Path, tensors: dict[str, torch.Tensor], quantization_config: dict[str, Any] | None,
                     shards: int = 1, config_name: str = "config.json") -> Path:
    """Write tensors as safetensors (`shards` files + index when > 1) and the config into directory `path`."""
    path.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    if shards == 1:
        save_file({k: tensors[k].contiguous() for k in names}, str(path / "model.safetensors"))
    else:
        per = math.ceil(len(names) / shards)
        weight_map = {}
        for i in range(shards):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            chunk = names[i * per:(i + 1) * per]
            save_file({k: tensors[k].contiguous() for k in chunk}, str(path / file))
            weight_map.update(dict.fromkeys(chunk, file))
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if quantization_config is not None:
        content = quantization_config if config_name != "config.json" else \
            {"architectures": ["LlamaForCausalLM"], "quantization_config": quantization_config}
        (path / config_name).write_text(json.dumps(content))
    return path


def assert_same(a: QuantizedWeight, b: QuantizedWeight, exact_scheme: bool = True) -> None:
    """Every field bit-identical (values compared in float64 / int64 so storage dtypes may differ)."""
    if exact_scheme:
        assert a.scheme == b.scheme, f"{a.scheme.summary()} != {b.scheme.summary()}"
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f"{f}: {x is None} vs {y is None}"
        if x is not None:
            kind = torch.int64 if not x.dtype.is_floating_point else torch.float64
            assert x.shape == y.shape or x.numel() == y.numel() == 1, f"{f}: {tuple(x.shape)} vs {tuple(y.shape)}"
            assert torch.equal(x.to(kind).reshape(y.shape), y.to(kind)), f"{f} differs"


def oracle_missing(reason: str) -> NoReturn:
    """Skip a test whose optional oracle library is absent - or fail it where the oracles are required
    (HUMMING_GEN_REQUIRE_ORACLES=1, set by .ci/run), so CI cannot skip an oracle test unnoticed."""
    if os.environ.get("HUMMING_GEN_REQUIRE_ORACLES") == "1":
        pytest.fail(f"{reason} (HUMMING_GEN_REQUIRE_ORACLES=1: see .ci/run for the install)")
    pytest.skip(reason)


def load_file_module(package: str, relpath: str) -> ModuleType:
    """Import one source file of an installed package without running the package's __init__ (which pulls
    datasets/peft/... for AutoAWQ and AutoGPTQ); skips the test when the package is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        oracle_missing(f"optional oracle {package} is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / relpath
    mod_spec = importlib.util.spec_from_file_location(f"_oracle_{package}_{path.stem}", path)
    module = importlib.util.module_from_spec(mod_spec)
    try:
        mod_spec.loader.exec_module(module)
    except ImportError as e:  # a dependency of that file is missing
        oracle_missing(f"optional oracle {package}/{relpath} cannot be imported: {e}")
    return module


# --- compressed-tensors ---------------------------------------------------------------------------------------
def _blockwise(w: torch.Tensor, args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) per scale entry of the strategy, shaped like the checkpoint's weight_scale."""
    n, k = w.shape
    strategy = args.strategy.value if hasattr(args.strategy, "value") else args.strategy
    if strategy == "channel":
        return w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    if strategy in ("group", "tensor_group"):
        g = w.reshape(n, k // args.group_size, args.group_size)
        return g.amin(-1), g.amax(-1)
    if strategy == "block":
        bn, bk = args.block_structure
        b = w.reshape(n // bn, bn, k // bk, bk).transpose(1, 2).reshape(n // bn, k // bk, -1)
        return b.amin(-1), b.amax(-1)
    return w.amin().reshape(1), w.amax().reshape(1)


def ct_compress(w: torch.Tensor, preset: str | None = None, fmt: str | None = None,
                **weight_overrides: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any], torch.Tensor]:
    """Quantize w with compressed-tensors' own qparams and compressor.

    Returns (compressed local-name state dict, quantization_config, the library's decompressed weight).
    """
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.compressors.format import infer_module_format
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    base = PRESET_SCHEMES[preset] if preset else {"weights": QuantizationArgs(num_bits=4)}
    wargs = base["weights"].model_copy(update=weight_overrides) if weight_overrides else base["weights"]
    wargs = QuantizationArgs.model_validate(wargs.model_dump())
    act = base.get("input_activations")
    scheme = QuantizationScheme(targets=["Linear"], weights=wargs, input_activations=act)
    lo, hi = _blockwise(w, wargs)
    state: dict[str, torch.Tensor] = {"weight": w}
    gscale = None
    if wargs.strategy == "tensor_group":
        gscale = generate_gparam(w.amin().float(), w.amax().float())
        state["weight_global_scale"] = gscale
    scale, zp = calculate_qparams(lo, hi, wargs, global_scale=gscale)
    state["weight_scale"] = scale
    if not wargs.symmetric:
        state["weight_zero_point"] = zp
    if fmt is None:
        fmt = infer_module_format(torch.nn.Linear, scheme).value
    compressor = BaseCompressor.get_value_from_registry(fmt)
    compressed = compressor.compress(state, scheme)
    decompressed = compressor.decompress(dict(compressed), scheme)["weight"]
    group = {"targets": ["Linear"], "weights": wargs.model_dump(mode="json"),
             "input_activations": act.model_dump(mode="json") if act else None, "format": fmt}
    cfg = {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
           "config_groups": {"group_0": group}, "ignore": ["lm_head"]}
    return {k: v.contiguous() for k, v in compressed.items()}, cfg, decompressed

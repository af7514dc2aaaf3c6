"""humming_gen: quantized GEMM kernels generated from Python descriptions of the format.

describe (formats, schemes, configs, targets) -> compose (components -> CUDA source) -> compile + run.
Names are imported on first use, so `import humming_gen.runtime` (or the CLI) stays light.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ActivationScheme": "humming_gen.schemes.scheme",
    "QuantScheme": "humming_gen.schemes.scheme",
    "QuantizedWeight": "humming_gen.schemes.scheme",
    "QuantizedActivation": "humming_gen.schemes.quantize",
    "quantize_activation": "humming_gen.activation.api",
    "fake_quantize_activation": "humming_gen.activation.api",
    "moe_align": "humming_gen.moe.align",
    "MoeAlignment": "humming_gen.reference.moe",
    "scheme": ("humming_gen.schemes.presets", "preset"),
    "list_presets": "humming_gen.schemes.presets",
    "DType": "humming_gen.formats",
    "FloatType": "humming_gen.formats",
    "IntType": "humming_gen.formats",
    "dtype": "humming_gen.formats",
    "register_dtype": "humming_gen.formats",
    "LayerConfig": "humming_gen.config",
    "ComputeConfig": "humming_gen.config",
    "TuningConfig": "humming_gen.config",
    "Target": "humming_gen.targets",
    "get_target": "humming_gen.targets",
    "list_targets": "humming_gen.targets",
    "Kernel": "humming_gen.kernel",
    "compile": "humming_gen.kernel",
    "QuantLinear": "humming_gen.layer.linear",
    "QuantMoE": "humming_gen.layer.moe",
    "shard_moe": "humming_gen.layer.moe_shard",
    "fused_moe": "humming_gen.layer.moe_ops",
    "moe_gemm": "humming_gen.layer.moe_ops",
    "grouped_moe_gemm": "humming_gen.layer.moe_ops",
    "quantize_model": "humming_gen.layer.model",
    "load_quantized_model": "humming_gen.layer.model",
    "QuantizeReport": "humming_gen.layer.model",
    "autotune": "humming_gen.tuning.autotune",
    "reference_gemm": "humming_gen.reference",
    "reference_moe": "humming_gen.reference",
    "reference_fused_moe": "humming_gen.reference.moe",
    "convert": "humming_gen.schemes.converters",
    "load_layer": "humming_gen.schemes.converters",
    "load_moe": "humming_gen.schemes.converters.moe",
    "MoeWeights": "humming_gen.schemes.converters.moe",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        # a subpackage the docs reach through the top-level module (`hg.heuristics.choose_tunings`)
        if name.isidentifier() and importlib.util.find_spec(f"humming_gen.{name}") is not None:
            return importlib.import_module(f"humming_gen.{name}")
        raise AttributeError(f"module 'humming_gen' has no attribute {name!r}")
    module_name, attr = target if isinstance(target, tuple) else (target, name)
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)

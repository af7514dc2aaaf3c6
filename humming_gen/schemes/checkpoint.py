"""Reading quantized layers from a Hugging Face style checkpoint directory, one layer at a time.

Tensors are read lazily from the safetensors files (via model.safetensors.index.json when sharded), so loading
a layer touches only that layer's tensors. The quantization config comes from config.json
(`quantization_config`), hf_quant_config.json (ModelOpt) or a legacy quantize_config.json / quant_config.json.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from humming_gen.schemes.scheme import QuantizedWeight


class SafetensorsCheckpoint(Mapping[str, torch.Tensor]):
    """Checkpoint tensor names -> tensors, opened on first access (only the safetensors headers are read here)."""

    def __init__(self, checkpoint_dir: str | Path):
        from safetensors import safe_open

        self._safe_open = safe_open
        self.dir = Path(checkpoint_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.files = {name: self.dir / file for name, file in weight_map.items()}
        else:
            paths = sorted(self.dir.glob("*.safetensors"))
            if not paths:
                raise ValueError(f"no .safetensors files in checkpoint directory {str(self.dir)!r}")
            self.files = {}
            for path in paths:
                with safe_open(path, "pt") as f:
                    self.files.update(dict.fromkeys(f.keys(), path))
        self._open: dict[Path, Any] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        path = self.files[name]
        if path not in self._open:
            self._open[path] = self._safe_open(path, "pt")
        return self._open[path].get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def __contains__(self, name: object) -> bool:
        return name in self.files


def read_quantization_config(checkpoint_dir: str | Path) -> dict[str, Any]:
    """The checkpoint's quantization config (see module docstring for where it is looked up)."""
    d = Path(checkpoint_dir)
    cfg: dict[str, Any] | None = None
    if (d / "config.json").exists():
        cfg = json.loads((d / "config.json").read_text()).get("quantization_config")
    if (d / "hf_quant_config.json").exists() and (cfg is None or cfg.get("quant_method") == "modelopt"):
        return json.loads((d / "hf_quant_config.json").read_text())
    if cfg is not None:
        return cfg
    for name, method in (("quantize_config.json", "gptq"), ("quant_config.json", "awq")):
        if (d / name).exists():
            legacy = json.loads((d / name).read_text())
            legacy.setdefault("quant_method", method)
            return legacy
    raise ValueError(f"no quantization config in {str(d)!r}: expected config.json with 'quantization_config', "
                     f"hf_quant_config.json, quantize_config.json or quant_config.json")


def load_layer(checkpoint_dir: str | Path, prefix: str | Sequence[str], format: str | None = None,
               quantization_config: Mapping[str, Any] | None = None) -> QuantizedWeight:
    """Read one layer of a quantized checkpoint into the standard form.

    prefix: the layer name (`model.layers.0.mlp.down_proj`); `*` stacks per-expert modules
    (`model.layers.0.mlp.experts.*.down_proj`); a list fuses layers along N (`[q_proj, k_proj, v_proj]`).
    gpt-oss stacked experts are one prefix (`model.layers.0.mlp.experts.gate_up_proj`).
    format / quantization_config: override the converter / the config read from the directory.
    """
    from humming_gen.schemes.converters.dispatch import convert

    cfg = quantization_config if quantization_config is not None else read_quantization_config(checkpoint_dir)
    return convert(SafetensorsCheckpoint(checkpoint_dir), cfg, prefix, format=format)

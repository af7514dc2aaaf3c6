"""Reading quantized layers from a Hugging Face style checkpoint directory, one layer at a time.

Tensors are read lazily from the safetensors files (via model.safetensors.index.json when sharded), so loading
a layer touches only that layer's tensors. The quantization config comes from config.json
(`quantization_config`), hf_quant_config.json (ModelOpt) or a legacy quantize_config.json / quant_config.json.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from humming_gen.schemes.scheme import QuantizedWeight

INDEX_NAME = "model.safetensors.index.json"


def _safetensors() -> Any:
    """The safetensors module, or an ImportError that says how to install it."""
    try:
        import safetensors
    except ImportError as e:
        raise ImportError(f"reading checkpoints needs the safetensors package ({e}); install it with "
                          f"pip install 'humming_gen[checkpoints]' (or pip install safetensors)") from e
    return safetensors


def _check_dir(d: Path) -> None:
    if not d.exists():
        raise FileNotFoundError(f"checkpoint directory {str(d)!r} does not exist")
    if not d.is_dir():
        raise NotADirectoryError(f"checkpoint directory {str(d)!r} is not a directory")


def _read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; ValueError naming the file when it is not valid JSON or not an object."""
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{str(path)!r} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{str(path)!r}: expected a JSON object, got a JSON {type(value).__name__}")
    return value


def _index_entry(checkpoint_dir: Path, index: Path, name: str, file: Any) -> Path:
    """The shard file of one index entry, confined to the checkpoint directory: a relative path without '..'.

    The check is on the entry's text, not on the resolved path, so shards that are symlinks into a download
    cache (the Hugging Face hub layout) still load.
    """
    parts = PurePosixPath(file).parts if isinstance(file, str) and file else ()
    if not parts or PurePosixPath(file).is_absolute() or ".." in parts:
        raise ValueError(f"{str(index)!r}: weight_map entry {name!r} -> {file!r} is not a file name inside the "
                         f"checkpoint directory (absolute paths and '..' are refused)")
    return checkpoint_dir / PurePosixPath(file)


class SafetensorsCheckpoint(Mapping[str, torch.Tensor]):
    """Checkpoint tensor names -> tensors, opened on first access (only the safetensors headers are read here)."""

    def __init__(self, checkpoint_dir: str | Path):
        safetensors = _safetensors()
        self._safe_open = safetensors.safe_open
        self._errors = (OSError, safetensors.SafetensorError)
        self.dir = Path(checkpoint_dir)
        _check_dir(self.dir)
        index = self.dir / INDEX_NAME
        if index.exists():
            weight_map = _read_json_object(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"{str(index)!r}: expected a 'weight_map' object (tensor name -> shard file), "
                                 f"got {type(weight_map).__name__}")
            self.files = {name: _index_entry(self.dir, index, name, file) for name, file in weight_map.items()}
        else:
            paths = sorted(self.dir.glob("*.safetensors"))
            if not paths:
                raise ValueError(f"no .safetensors files in checkpoint directory {str(self.dir)!r}")
            self.files = {}
            for path in paths:
                self.files.update(dict.fromkeys(self._file(path).keys(), path))
        self._open: dict[Path, Any] = {}

    def _file(self, path: Path) -> Any:
        """An open safetensors file; a missing, truncated or corrupt file raises ValueError naming it."""
        try:
            return self._safe_open(path, "pt")
        except self._errors as e:
            raise ValueError(f"cannot read safetensors file {str(path)!r}: {e}") from e

    def __getitem__(self, name: str) -> torch.Tensor:
        path = self.files[name]
        if path not in self._open:
            self._open[path] = self._file(path)
        try:
            return self._open[path].get_tensor(name)
        except self._errors as e:
            raise ValueError(f"cannot read tensor {name!r} from safetensors file {str(path)!r}: {e}") from e

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def __contains__(self, name: object) -> bool:
        return name in self.files


def read_quantization_config(checkpoint_dir: str | Path) -> dict[str, Any]:
    """The checkpoint's quantization config (see module docstring for where it is looked up)."""
    d = Path(checkpoint_dir)
    _check_dir(d)
    cfg: dict[str, Any] | None = None
    if (d / "config.json").exists():
        cfg = _read_json_object(d / "config.json").get("quantization_config")
        if cfg is not None and not isinstance(cfg, dict):
            raise ValueError(f"{str(d / 'config.json')!r}: 'quantization_config' must be an object, got "
                             f"{type(cfg).__name__}")
    if (d / "hf_quant_config.json").exists() and (cfg is None or cfg.get("quant_method") == "modelopt"):
        return _read_json_object(d / "hf_quant_config.json")
    if cfg is not None:
        return cfg
    for name, method in (("quantize_config.json", "gptq"), ("quant_config.json", "awq")):
        if (d / name).exists():
            legacy = _read_json_object(d / name)
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

    _safetensors()  # the missing-package error first, before any config is read
    cfg = quantization_config if quantization_config is not None else read_quantization_config(checkpoint_dir)
    return convert(SafetensorsCheckpoint(checkpoint_dir), cfg, prefix, format=format)

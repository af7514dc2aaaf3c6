"""load_layer on broken checkpoints: every error names the file, the field or the entry at fault."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
import torch

from converter_fixtures import write_checkpoint
from humming_gen.schemes.converters import awq, load_layer, read_quantization_config
from humming_gen.schemes.presets import preset

pytest.importorskip("safetensors")


def _awq_checkpoint(path: Path, shards: int = 1, **cfg) -> Path:
    qw = preset("w4a16-int4-g128-zp").quantize(torch.randn(64, 256))
    tensors, config = awq.to_checkpoint(qw, "layer")
    return write_checkpoint(path, tensors, {**config, **cfg}, shards=shards)


def test_a_good_checkpoint_loads(tmp_path):
    assert load_layer(_awq_checkpoint(tmp_path, shards=2), "layer").shape == (64, 256)


def test_missing_directory_says_so(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        load_layer(missing, "layer")
    assert str(missing) in str(info.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_quantization_config(missing)


@pytest.mark.parametrize("content,fragment", [("{not json", "is not valid JSON"),
                                              ("[1, 2]", "expected a JSON object, got a JSON list"),
                                              ('{"quantization_config": 7}', "'quantization_config' must be an object")])
def test_bad_config_json_names_the_file(tmp_path, content, fragment):
    _awq_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ValueError) as info:
        load_layer(tmp_path, "layer")
    assert fragment in str(info.value) and str(tmp_path / "config.json") in str(info.value)


@pytest.mark.parametrize("index,fragment", [
    ({"metadata": {}}, "expected a 'weight_map' object"),
    ({"weight_map": ["a"]}, "expected a 'weight_map' object"),
    ({"weight_map": {"layer.qweight": "/etc/passwd"}}, "not a file name inside the checkpoint directory"),
    ({"weight_map": {"layer.qweight": "../outside.safetensors"}}, "not a file name inside the checkpoint directory"),
    ({"weight_map": {"layer.qweight": "sub/../../outside.safetensors"}}, "'..' are refused"),
    ({"weight_map": {"layer.qweight": 5}}, "not a file name inside"),
])
def test_bad_index_names_the_index(tmp_path, index, fragment):
    _awq_checkpoint(tmp_path, shards=2)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError) as info:
        load_layer(tmp_path, "layer")
    assert fragment in str(info.value) and "model.safetensors.index.json" in str(info.value)


def test_index_entries_in_subdirectories_still_load(tmp_path):
    _awq_checkpoint(tmp_path, shards=2)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    (tmp_path / "shards").mkdir()
    for file in set(index["weight_map"].values()):
        (tmp_path / file).rename(tmp_path / "shards" / file)
    index["weight_map"] = {name: f"shards/{file}" for name, file in index["weight_map"].items()}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert load_layer(tmp_path, "layer").shape == (64, 256)


@pytest.mark.parametrize("shards", [1, 2])
def test_truncated_safetensors_names_the_file(tmp_path, shards):
    _awq_checkpoint(tmp_path, shards=shards)
    victim = sorted(tmp_path.glob("*.safetensors"))[0]
    victim.write_bytes(victim.read_bytes()[:40])
    with pytest.raises(ValueError) as info:
        load_layer(tmp_path, "layer")
    assert "cannot read" in str(info.value) and str(victim) in str(info.value)


@pytest.mark.parametrize("field,value", [("group_size", "garbage"), ("group_size", 12.5), ("bits", "four")])
def test_bad_config_field_is_named(tmp_path, field, value):
    _awq_checkpoint(tmp_path, **{field: value})
    with pytest.raises(ValueError) as info:
        load_layer(tmp_path, "layer")
    assert f"quantization_config.{field}: got {value!r}" in str(info.value)


def test_missing_safetensors_says_how_to_install(tmp_path, monkeypatch):
    _awq_checkpoint(tmp_path)
    real_import = builtins.__import__

    def no_safetensors(name, *args, **kwargs):
        if name == "safetensors" or name.startswith("safetensors."):
            raise ModuleNotFoundError("No module named 'safetensors'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_safetensors)
    with pytest.raises(ImportError, match=r"humming_gen\[checkpoints\]"):
        load_layer(tmp_path, "layer")

"""LayerConfig, ComputeConfig, TuningConfig: clear errors per field, JSON round trip, stable keys, summaries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.formats import dtype
from humming_gen.schemes import ActivationScheme, QuantScheme

REPO = Path(__file__).resolve().parents[2]

W4_G128 = QuantScheme("uint4", group_size=128, zero_point="int")
FP8_BLOCK = QuantScheme("float8e4m3", block_size=(128, 128), scale_dtype="float32")
MXFP4_W4A4 = QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0",
                         activation=ActivationScheme("float4e2m1", granularity="group", group_size=32,
                                                     scale_dtype="float8e8m0"))
LAYER_BASE = dict(n=4096, k=4096, scheme=W4_G128)


def _make(cls, base: dict, **override):
    return cls(**{**base, **override})


# (field, bad value, exception, fragments the message must hold: field, value given, what is allowed)
TUNING_FIELD_ERRORS = [
    ("pipeline", "fast", ValueError, ["TuningConfig.pipeline", "'fast'", "'standard'", "'umma'"]),
    ("mma", "m16n8k4", ValueError, ["TuningConfig.mma", "'m16n8k4'", "'m16n8k16'", "'wgmma'"]),
    ("block_m", 20, ValueError, ["TuningConfig.block_m", "got 20", "multiple of 8 in [8, 256]"]),
    ("block_m", 0, ValueError, ["TuningConfig.block_m", "got 0", "[8, 256]"]),
    ("block_m", 264, ValueError, ["TuningConfig.block_m", "got 264", "[8, 256]"]),
    ("block_m", "64", TypeError, ["TuningConfig.block_m", "'64'", "multiple of 8"]),
    ("block_n", 24, ValueError, ["TuningConfig.block_n", "got 24", "multiple of 16 in [16, 512]"]),
    ("block_n", 528, ValueError, ["TuningConfig.block_n", "got 528", "[16, 512]"]),
    ("block_k", 8, ValueError, ["TuningConfig.block_k", "got 8", "multiple of 16 in [16, 1024]"]),
    ("block_k", 2048, ValueError, ["TuningConfig.block_k", "got 2048", "[16, 1024]"]),
    ("warps_m", 0, ValueError, ["TuningConfig.warps_m", "got 0", "[1, 16]"]),
    ("warps_n", 17, ValueError, ["TuningConfig.warps_n", "got 17", "[1, 16]"]),
    ("warps_k", 1.0, TypeError, ["TuningConfig.warps_k", "got 1.0", "an int"]),
    ("stages", 0, ValueError, ["TuningConfig.stages", "got 0", "[2, 8]"]),
    ("stages", 1, ValueError, ["TuningConfig.stages", "got 1", "[2, 8]", "at least 2"]),
    ("stages", 9, ValueError, ["TuningConfig.stages", "got 9", "[2, 8]"]),
    ("a_load", "ldg", ValueError, ["TuningConfig.a_load", "'ldg'", "'cp_async'", "'tma_multicast'"]),
    ("b_load", None, ValueError, ["TuningConfig.b_load", "None", "'tma'"]),
    ("scale_load", "TMA", ValueError, ["TuningConfig.scale_load", "'TMA'", "'tma'"]),
    ("ctas_per_sm", 5, ValueError, ["TuningConfig.ctas_per_sm", "got 5", "[1, 4]"]),
    ("split_k", 0, ValueError, ["TuningConfig.split_k", "got 0", "[1, 512]"]),
    ("split_k", 513, ValueError, ["TuningConfig.split_k", "got 513", "[1, 512]", "32-bit"]),
    ("stream_k", 1, TypeError, ["TuningConfig.stream_k", "got 1", "True or False"]),
    ("raster", "diagonal", ValueError, ["TuningConfig.raster", "'diagonal'", "'n_major'", "'m_major'"]),
    ("cluster_m", 5, ValueError, ["TuningConfig.cluster_m", "got 5", "[1, 4]"]),
    ("cluster_n", 0, ValueError, ["TuningConfig.cluster_n", "got 0", "[1, 4]"]),
]

COMPUTE_FIELD_ERRORS = [
    ("gemm", "sparse", ValueError, ["ComputeConfig.gemm", "'sparse'", "'dense'", "'grouped_masked'"]),
    ("batch_invariant", "no", TypeError, ["ComputeConfig.batch_invariant", "'no'", "True or False"]),
    ("accumulate", "bfloat16", ValueError, ["ComputeConfig.accumulate", "'bfloat16'", "'float32'", "'float16'"]),
    ("input_scale_layout", "tiled", ValueError,
     ["ComputeConfig.input_scale_layout", "'tiled'", "'row_major'", "'column_major'"]),
    ("epilogue_activation", "relu", ValueError,
     ["ComputeConfig.epilogue_activation", "'relu'", "None", "'silu_mul'", "'swiglu_oai'"]),
    ("topk_weight", 1, TypeError, ["ComputeConfig.topk_weight", "got 1", "True or False"]),
]

LAYER_FIELD_ERRORS = [
    ("n", 0, ValueError, ["LayerConfig.n", "got 0", "[1, "]),
    ("n", -4096, ValueError, ["LayerConfig.n", "got -4096", "[1, "]),
    ("n", 4096.0, TypeError, ["LayerConfig.n", "got 4096.0", "an int"]),
    ("k", 0, ValueError, ["LayerConfig.k", "got 0", "[1, "]),
    ("scheme", 42, TypeError, ["LayerConfig.scheme", "got 42", "QuantScheme"]),
    ("num_experts", 0, ValueError, ["LayerConfig.num_experts", "got 0", ">= 1"]),
    ("top_k", 0, ValueError, ["LayerConfig.top_k", "got 0", ">= 1"]),
    ("has_bias", "yes", TypeError, ["LayerConfig.has_bias", "'yes'", "True or False"]),
    ("dtype", "float32", ValueError, ["LayerConfig.dtype", "'float32'", "'bfloat16'", "'float16'"]),
    ("dtype", "int8", ValueError, ["LayerConfig.dtype", "'int8'", "'bfloat16'"]),
    ("dtype", "nonsense", ValueError, ["LayerConfig.dtype", "'nonsense'", "'bfloat16'"]),
    ("out_dtype", "float8e4m3", ValueError, ["LayerConfig.out_dtype", "'float8e4m3'", "'float32'"]),
]


@pytest.mark.parametrize("field,value,exc,fragments", TUNING_FIELD_ERRORS, ids=lambda v: str(v))
def test_tuning_field_errors(field, value, exc, fragments):
    with pytest.raises(exc) as info:
        TuningConfig(**{field: value})
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("field,value,exc,fragments", COMPUTE_FIELD_ERRORS, ids=lambda v: str(v))
def test_compute_field_errors(field, value, exc, fragments):
    with pytest.raises(exc) as info:
        ComputeConfig(**{field: value})
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("field,value,exc,fragments", LAYER_FIELD_ERRORS, ids=lambda v: str(v))
def test_layer_field_errors(field, value, exc, fragments):
    with pytest.raises(exc) as info:
        _make(LayerConfig, LAYER_BASE, **{field: value})
    for fragment in fragments:
        assert fragment in str(info.value)


# Cross-field rules: (kwargs, fragments of the single ValueError).
TUNING_RULE_ERRORS = [
    (dict(block_m=256, block_n=256, block_k=64, warps_m=4, warps_n=4, warps_k=2), ["32 warps", "1..16"]),
    (dict(block_m=16, warps_m=4), ["block_m=16 / warps_m=4", "multiple of 8"]),
    (dict(block_n=128, warps_n=3), ["block_n=128 / warps_n=3"]),
    (dict(block_k=32, warps_k=4), ["block_k=32 / warps_k=4", "multiple of 16"]),
    (dict(mma="m16n8k64", block_k=32), ["block_k/warps_k = 32", "K depth 64", "'m16n8k64'"]),
    (dict(mma="wgmma"), ["mma='wgmma'", "warp_specialized", "pipeline='standard'"]),
    (dict(mma="tcgen05", pipeline="warp_specialized"), ["mma='tcgen05'", "umma"]),
    (dict(pipeline="umma"), ["mma='m16n8k16'", "pipeline='umma'"]),
    (dict(mma="ppu_m16n16k16", pipeline="warp_specialized"), ["mma='ppu_m16n16k16'", "standard"]),
    (dict(a_load="tma"), ["a_load='tma'", "pipeline='standard'"]),
    (dict(scale_load="tma_multicast", cluster_m=2), ["scale_load='tma_multicast'", "pipeline='standard'"]),
    (dict(pipeline="warp_specialized", a_load="tma_multicast", cluster_m=2), ["a_load='tma_multicast'", "cluster_n"]),
    (dict(pipeline="warp_specialized", b_load="tma_multicast", cluster_n=2), ["b_load='tma_multicast'", "cluster_m"]),
    (dict(pipeline="warp_specialized", scale_load="tma_multicast"), ["scale_load='tma_multicast'", "cluster"]),
    (dict(stream_k=True, split_k=2), ["stream_k=True", "split_k=2", "mutually exclusive"]),
]


@pytest.mark.parametrize("kwargs,fragments", TUNING_RULE_ERRORS, ids=lambda v: str(v))
def test_tuning_rule_errors(kwargs, fragments):
    with pytest.raises(ValueError) as info:
        TuningConfig(**kwargs)
    assert "invalid TuningConfig" in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_tuning_rule_errors_are_collected():
    with pytest.raises(ValueError) as info:
        TuningConfig(mma="wgmma", stream_k=True, split_k=4)
    assert "mma='wgmma'" in str(info.value) and "mutually exclusive" in str(info.value)


def test_compute_rule_errors():
    with pytest.raises(ValueError, match=r"topk_weight=True needs an MoE gemm .*gemm='dense'"):
        ComputeConfig(topk_weight=True)
    assert ComputeConfig(gemm="indexed", topk_weight=True).is_moe


LAYER_RULE_ERRORS = [
    (dict(num_experts=2, top_k=3), ["top_k=3 exceeds num_experts=2"]),
    (dict(k=4016, scheme=attrs.evolve(MXFP4_W4A4, group_size=16)), ["activation scheme's group_size=32"]),
]


@pytest.mark.parametrize("kwargs,fragments", LAYER_RULE_ERRORS, ids=lambda v: str(v))
def test_layer_rule_errors(kwargs, fragments):
    with pytest.raises(ValueError) as info:
        _make(LayerConfig, LAYER_BASE, **kwargs)
    assert "invalid LayerConfig" in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_partial_weight_groups_are_allowed():
    """K need not be a multiple of the weight group or block: the last group is partial."""
    assert _make(LayerConfig, LAYER_BASE, k=4000).k == 4000
    assert _make(LayerConfig, LAYER_BASE, k=4000, scheme=FP8_BLOCK).k == 4000


def test_valid_tuning_configs():
    t = TuningConfig(pipeline="warp_specialized", mma="wgmma", block_m=128, block_n=256, block_k=64, warps_m=2,
                     warps_n=2, warps_k=1, a_load="tma", b_load="tma_multicast", scale_load="tma", cluster_m=2)
    assert t.threads == 128 and t.cluster_size == 2
    t = TuningConfig(pipeline="umma", mma="tcgen05", block_m=128, block_n=256, block_k=128, a_load="tma",
                     b_load="tma", scale_load="tma")
    assert t.warp_tile == (128, 64, 128)
    assert TuningConfig(mma="ppu_m16n16k16", block_n=64, warps_n=4).warp_tile == (16, 16, 128)
    assert TuningConfig(block_m=16, block_n=128, block_k=128, warps_m=1, warps_n=4, warps_k=2).threads == 256
    assert TuningConfig(warps_m=1, warps_n=8, warps_k=2, block_n=128, block_k=256).num_warps == 16


def test_defaults():
    t = TuningConfig()
    assert (t.pipeline, t.mma, t.a_load, t.b_load, t.scale_load) == ("standard", "m16n8k16", "cp_async",
                                                                      "cp_async", "cp_async")
    assert (t.ctas_per_sm, t.split_k, t.stream_k, t.cluster_m, t.cluster_n) == (1, 1, False, 1, 1)
    c = ComputeConfig()
    assert (c.gemm, c.batch_invariant, c.accumulate, c.input_scale_layout, c.epilogue_activation,
            c.topk_weight) == ("dense", False, "float32", "row_major", None, False)
    layer = LayerConfig(4096, 4096, W4_G128)
    assert (layer.num_experts, layer.top_k, layer.has_bias, layer.dtype, layer.out_dtype) == (
        1, 1, False, "bfloat16", "bfloat16")
    assert LayerConfig(4096, 4096, W4_G128, dtype="float16").out_dtype == "float16"
    assert LayerConfig(4096, 4096, W4_G128, dtype="float16", out_dtype="float32").out_dtype == "float32"


def test_layer_dtype_aliases_and_dtype_objects():
    layer = LayerConfig(4096, 4096, W4_G128, dtype="fp16", out_dtype=dtype("bfloat16"))
    assert (layer.dtype, layer.out_dtype) == ("float16", "bfloat16")
    assert layer == LayerConfig(4096, 4096, W4_G128, dtype="float16", out_dtype="bfloat16")


def test_layer_partial_n_block_is_allowed():
    # DeepSeek's kv_a_proj: n=576 with 128x128 blocks (the last block row is partial).
    assert LayerConfig(576, 7168, FP8_BLOCK).n == 576


def test_layer_scheme_from_preset_name():
    from humming_gen.schemes.presets import preset

    layer = LayerConfig(4096, 4096, "w4a16-int4-g128")
    assert layer.scheme == preset("w4a16-int4-g128")
    assert LayerConfig.from_json(layer.to_json()) == layer
    with pytest.raises(ValueError, match=r"LayerConfig.scheme: got 'no-such-preset'.*w4a16-int4-g128"):
        LayerConfig(4096, 4096, "no-such-preset")


def test_frozen():
    for config in (TuningConfig(), ComputeConfig(), LayerConfig(4096, 4096, W4_G128)):
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            config.n = 1  # type: ignore[misc]


def _sample_configs():
    return [
        TuningConfig(),
        TuningConfig(pipeline="warp_specialized", mma="wgmma", block_m=64, block_n=256, block_k=64, stages=5,
                     a_load="tma", b_load="tma_multicast", cluster_m=2, raster="m_major", ctas_per_sm=2),
        TuningConfig(split_k=4, warps_k=2),
        ComputeConfig(),
        ComputeConfig(gemm="grouped_masked", batch_invariant=True, accumulate="float16",
                      input_scale_layout="column_major", epilogue_activation="silu_mul", topk_weight=True),
        LayerConfig(4096, 4096, W4_G128),
        LayerConfig(7168, 2048, FP8_BLOCK, num_experts=256, top_k=8, has_bias=True, dtype="float16",
                    out_dtype="float32"),
        LayerConfig(2880, 2880, MXFP4_W4A4, num_experts=32, top_k=4),
    ]


@pytest.mark.parametrize("config", _sample_configs(), ids=lambda c: type(c).__name__)
def test_json_round_trip(config):
    text = config.to_json()
    again = type(config).from_json(text)
    assert again == config
    assert again.key() == config.key()
    assert hash(again) == hash(config)
    assert json.loads(text) == config.to_dict()
    assert type(config).from_dict(config.to_dict()) == config
    assert again.to_json() == text


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match=r"TuningConfig.from_dict: unknown keys \['block_q'\]"):
        TuningConfig.from_dict({"block_q": 16})
    with pytest.raises(ValueError, match=r"LayerConfig.from_dict: unknown keys \['experts'\]"):
        LayerConfig.from_dict({**LayerConfig(4096, 4096, W4_G128).to_dict(), "experts": 8})
    with pytest.raises(TypeError, match="expected a dict"):
        ComputeConfig.from_dict(["gemm"])


def test_from_dict_fills_defaults():
    assert TuningConfig.from_dict({"split_k": 2}) == TuningConfig(split_k=2)


def test_key_is_sha256_of_canonical_json():
    import hashlib

    for config in _sample_configs():
        assert config.key() == hashlib.sha256(config.to_json().encode()).hexdigest()
        assert len(config.key()) == 64


_KEY_SCRIPT = """
import json, runpy
configs = runpy.run_path({path!r})["_sample_configs"]()
print(json.dumps([[c.key(), hash(c)] for c in configs]))
"""


def test_key_and_hash_stable_across_processes():
    expected = [[c.key(), hash(c)] for c in _sample_configs()]
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _KEY_SCRIPT.format(path=__file__)], env=env, cwd=REPO,
                             capture_output=True, text=True, check=True)
        assert json.loads(out.stdout) == expected


def test_hashable_and_usable_as_dict_keys():
    configs = _sample_configs()
    table = {c: i for i, c in enumerate(configs)}
    assert len(table) == len(configs)
    for i, c in enumerate(_sample_configs()):  # fresh, equal objects find the same entries
        assert table[c] == i
    assert len({c.key() for c in configs}) == len(configs)
    assert TuningConfig(split_k=2) != TuningConfig(split_k=3)
    assert hash(TuningConfig(split_k=2)) != hash(TuningConfig(split_k=3))
    assert (LayerConfig(4096, 4096, W4_G128), ComputeConfig(), TuningConfig()) in {
        (LayerConfig(4096, 4096, W4_G128), ComputeConfig(), TuningConfig()): "kernel"}


def test_evolve_recomputes_key():
    t = TuningConfig()
    t.key()
    t2 = attrs.evolve(t, split_k=2)
    assert t2.key() != t.key() and t2 == TuningConfig(split_k=2) and t2.key() == TuningConfig(split_k=2).key()


def test_tuning_summary():
    t = TuningConfig(block_m=16, block_n=128, block_k=128, warps_m=1, warps_n=4, warps_k=2, stages=4, split_k=2)
    s = t.summary()
    assert s.startswith("tuning  pipeline=standard mma=m16n8k16 block=16x128x128 warps=1x4x2 stages=4 split_k=2")
    assert "\n" not in s
    for fragment in ("stream_k=no", "load=a:cp_async,b:cp_async,scale:cp_async", "ctas_per_sm=1", "raster=n_major",
                     "cluster=1x1"):
        assert fragment in s


def test_compute_summary():
    assert ComputeConfig().summary() == ("compute gemm=dense batch_invariant=no accum=float32 input_scale=row_major "
                                         "epilogue=[]")
    s = ComputeConfig(gemm="indexed", epilogue_activation="silu_mul", topk_weight=True).summary()
    assert "gemm=indexed" in s and "epilogue=[silu_mul,topk_weight]" in s


def test_layer_summary():
    s = LayerConfig(8192, 8192, W4_G128).summary()
    assert s == ("layer   n=8192 k=8192 weight=uint4 scale=bfloat16/g128 zero_point=int act=16-bit dtype=bfloat16 "
                 "out=bfloat16 bias=no")
    s = LayerConfig(7168, 2048, FP8_BLOCK, num_experts=256, top_k=8, has_bias=True).summary()
    assert "experts=256 top_k=8" in s and "bias=yes" in s and "\n" not in s


def test_every_preset_makes_a_layer():
    from humming_gen.schemes.presets import list_presets

    for name in list_presets():
        layer = LayerConfig(4096, 4096, name, num_experts=8, top_k=2)
        assert LayerConfig.from_json(layer.to_json()) == layer
        assert layer.summary().startswith("layer   n=4096 k=4096 experts=8 top_k=2 ")


def test_custom_format_config_replays_in_a_fresh_process():
    """A layer of an unregistered custom format goes to JSON (as in a generated header) and back in a process
    that never saw the format: the format is written out in full, not by a name only this process knows."""
    from humming_gen.formats import FloatType

    scheme = QuantScheme(FloatType(2, 2, name="test_replay_e2m2"), group_size=64, scale_dtype="float8e8m0")
    layer = LayerConfig(n=256, k=512, scheme=scheme)
    code = ("import json, sys\nfrom humming_gen.config import LayerConfig\n"
            "layer = LayerConfig.from_json(sys.stdin.read())\nprint(layer.key())\n"
            "print(json.dumps(layer.scheme.weight.to_dict(), sort_keys=True))")
    out = subprocess.run([sys.executable, "-c", code], input=layer.to_json(), capture_output=True, text=True,
                         check=True, cwd=REPO).stdout.splitlines()
    assert out[0] == layer.key()
    assert json.loads(out[1]) == scheme.weight.to_dict()

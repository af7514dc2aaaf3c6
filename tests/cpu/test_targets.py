"""Targets as data: all load, each derives from its predecessor, the activation fallback rule, clear errors."""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import pytest

from humming_gen.config import TuningConfig
from humming_gen.config.tuning import MMAS
from humming_gen.targets import Target, get_target, list_targets
from humming_gen.targets.target import FEATURES

ALL = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_103a", "sm_120a", "sm_121a", "zhenwu810e"]


def t(name: str) -> Target:
    return get_target(name)


def test_all_targets_load():
    assert list_targets() == ALL
    for name in ALL:
        target = get_target(name)
        assert isinstance(target, Target) and target.name == name
        assert target.features <= FEATURES
        assert target.supports_mma("float16", "float16")
        assert target.regs_per_sm == 65536
        assert target.smem_per_sm >= target.smem_per_block_optin
        for shapes in target.mma_shapes.values():
            assert shapes and set(shapes) <= set(MMAS)


@pytest.mark.parametrize("name,sm,arch", [
    ("sm_75", 75, "sm_75"), ("sm_80", 80, "sm_80"), ("sm_86", 86, "sm_86"), ("sm_89", 89, "sm_89"),
    ("sm_90a", 90, "sm_90a"), ("sm_100a", 100, "sm_100a"), ("sm_103a", 103, "sm_103a"), ("sm_120a", 120, "sm_120a"),
    ("sm_121a", 121, "sm_121a"),
])
def test_sm_and_arch(name, sm, arch):
    assert (t(name).sm, t(name).arch) == (sm, arch)


def test_zhenwu_has_its_own_arch():
    assert not t("zhenwu810e").arch.startswith("sm_")


@pytest.mark.parametrize("name,smem_optin,sm_count", [
    ("sm_75", 64 * 1024, 40), ("sm_80", 166912, 108), ("sm_86", 101376, 84), ("sm_89", 101376, 128),
    ("sm_90a", 232448, 132), ("sm_100a", 232448, 148), ("sm_103a", 232448, 148), ("sm_120a", 101376, 188),
    ("zhenwu810e", 256 * 1024, None),
])
def test_resources(name, smem_optin, sm_count):
    assert t(name).smem_per_block_optin == smem_optin
    if sm_count is not None:
        assert t(name).sm_count == sm_count


def test_get_target_unknown_lists_names():
    with pytest.raises(ValueError) as info:
        get_target("sm_91")
    assert "'sm_91'" in str(info.value)
    for name in ALL:
        assert name in str(info.value)


def test_predecessors_exist_and_chain():
    assert t("sm_75").predecessor is None
    expected = {"sm_80": "sm_75", "sm_86": "sm_80", "sm_89": "sm_86", "sm_90a": "sm_89", "sm_100a": "sm_90a",
                "sm_103a": "sm_100a", "sm_120a": "sm_100a", "sm_121a": "sm_120a", "zhenwu810e": "sm_80"}
    for name, pred in expected.items():
        assert t(name).predecessor == pred
        get_target(pred)


def test_feature_inheritance():
    f = {name: t(name).features for name in ALL}
    assert f["sm_75"] == {"ldmatrix", "mma_int8", "mma_int4"}  # fp16 mma is the baseline
    assert f["sm_80"] == f["sm_75"] | {"cp_async", "mma_bf16"}
    assert f["sm_86"] == f["sm_80"]
    assert f["sm_89"] >= f["sm_80"] and f["sm_89"] - f["sm_80"] == {"mma_fp8", "cvt_fp8"}
    assert f["sm_90a"] >= f["sm_89"]
    assert {"wgmma", "tma", "tma_multicast", "clusters", "setmaxnreg"} <= f["sm_90a"]
    assert f["sm_100a"] >= f["sm_90a"] - {"wgmma"} and "wgmma" not in f["sm_100a"]
    assert {"tcgen05", "mx_block_scale", "cvt_fp4"} <= f["sm_100a"] and "cvt_fp4" not in f["sm_90a"]
    assert f["sm_103a"] == f["sm_100a"] - {"tcgen05_int8"}
    for name in ("sm_120a", "sm_121a"):
        assert "tcgen05" not in f[name] and "wgmma" not in f[name]
        assert {"mx_block_scale", "mma_fp8", "tma"} <= f[name]
    assert f["sm_121a"] == f["sm_120a"]
    assert f["zhenwu810e"] == (f["sm_80"] - {"mma_int4", "mma_int8"}) | {"ppu_variants"}
    assert not any(t(name).has("ppu_variants") for name in ALL if name != "zhenwu810e")


def test_mma_shape_inheritance():
    # Each target keeps its predecessor's mma.sync shapes unless the data says otherwise.
    for name, pred in [("sm_86", "sm_80"), ("sm_89", "sm_80"), ("sm_90a", "sm_89")]:
        for pair, shapes in t(pred).mma_shapes.items():
            assert set(shapes) <= set(t(name).mma_instructions(*pair))
    assert t("sm_75").mma_instructions("float16", "float16") == ("m16n8k8",)
    assert t("sm_80").mma_instructions("float16", "float16")[0] == "m16n8k16"
    assert not t("sm_75").supports_mma("bfloat16", "bfloat16")
    assert t("sm_80").supports_mma("bfloat16", "bfloat16")
    assert t("sm_80").mma_instructions("int8", "int8")[0] == "m16n8k32"
    assert t("sm_80").mma_instructions("int4", "int4")[0] == "m16n8k64"
    assert not t("sm_80").supports_mma("float8e4m3", "float8e4m3")
    for a in ("float8e4m3", "float8e5m2"):
        for b in ("float8e4m3", "float8e5m2"):
            assert t("sm_89").mma_instructions(a, b) == ("m16n8k32",)
    assert "wgmma" in t("sm_90a").mma_instructions("bfloat16", "bfloat16")
    assert "wgmma" not in t("sm_90a").mma_instructions("int4", "int4")
    assert not t("sm_90a").supports_mma("float4e2m1", "float4e2m1")
    assert t("sm_100a").mma_instructions("float4e2m1", "float4e2m1") == ("tcgen05",)
    assert t("sm_120a").mma_instructions("float4e2m1", "float4e2m1")[0] == "m16n8k64"
    assert t("zhenwu810e").mma_instructions("bfloat16", "bfloat16") == ("ppu_m16n16k16",)
    assert not t("zhenwu810e").supports_mma("int4", "int4")
    for name in ALL:
        assert ("wgmma" in str(dict(t(name).mma_shapes))) == t(name).has("wgmma")
        assert ("tcgen05" in str(dict(t(name).mma_shapes))) == t(name).has("tcgen05")


def test_sm103a_lacks_int8_umma():
    assert "tcgen05" in t("sm_100a").mma_instructions("int8", "int8")
    assert t("sm_100a").has("tcgen05_int8")
    assert "tcgen05" not in t("sm_103a").mma_instructions("int8", "int8")
    assert not t("sm_103a").has("tcgen05_int8")
    assert "tcgen05" in t("sm_103a").mma_instructions("float8e4m3", "float8e4m3")
    with pytest.raises(ValueError, match="tcgen05_int8.*sm_103a"):
        t("sm_103a").require(["tcgen05", "tcgen05_int8"], "UmmaInt8Mainloop")


def test_supports_mma_accepts_aliases():
    assert t("sm_89").supports_mma("fp8", "float8_e4m3fn")
    assert t("sm_80").supports_mma("bf16", "bf16")


# (target, activation format, expected compute format, fell back?)
FALLBACKS = [
    ("sm_90a", "float4e2m1", "float8e4m3", True),
    ("sm_80", "float8e4m3", "bfloat16", True),
    ("sm_75", "float8e4m3", "float16", True),
    ("sm_120a", "float4e2m1", "float4e2m1", False),
    ("sm_100a", "float4e2m1", "float4e2m1", False),
    ("sm_89", "float4e2m1", "float8e4m3", True),
    ("sm_80", "float4e2m1", "bfloat16", True),
    ("sm_75", "float4e2m1", "float16", True),
    ("sm_89", "float8e5m2", "float8e5m2", False),
    ("sm_80", "float8e5m2", "bfloat16", True),
    ("sm_80", "int8", "int8", False),
    ("sm_75", "int8", "int8", False),
    ("zhenwu810e", "int8", "bfloat16", True),
    ("zhenwu810e", "float8e4m3", "bfloat16", True),
    ("sm_80", "int4", "int4", False),
    ("zhenwu810e", "int4", "bfloat16", True),
    ("sm_90a", "bfloat16", "bfloat16", False),
    ("sm_75", "bfloat16", "float16", True),
    ("sm_75", "float16", "float16", False),
]


@pytest.mark.parametrize("target,act,expected,fell_back", FALLBACKS, ids=lambda v: str(v))
def test_activation_fallback(target, act, expected, fell_back):
    chosen, reason = t(target).activation_compute_dtype(act)
    assert chosen == expected
    if fell_back:
        assert reason is not None and target in reason and act in reason and expected in reason
    else:
        assert reason is None


def test_activation_fallback_int4_to_int8_when_only_int8_exists():
    no_int4 = attrs.evolve(t("sm_80"), name="test_no_int4",
                           features=t("sm_80").features - {"mma_int4"},
                           mma_shapes={k: v for k, v in t("sm_80").mma_shapes.items() if "int4" not in k[0]})
    assert no_int4.activation_compute_dtype("int4")[0] == "int8"


def test_activation_fallback_rejects_wide_formats():
    with pytest.raises(ValueError, match="float32"):
        t("sm_90a").activation_compute_dtype("float32")


def test_require_names_missing_features_and_target():
    t("sm_90a").require(["wgmma", "tma"], "WgmmaMainloop")  # present: no error
    with pytest.raises(ValueError) as info:
        t("sm_80").require(["cp_async", "wgmma", "tma"], "WgmmaMainloop")
    msg = str(info.value)
    assert "WgmmaMainloop" in msg and "sm_80" in msg and "wgmma" in msg and "tma" in msg
    assert "needs tma, wgmma" in msg  # only the missing ones, sorted
    with pytest.raises(ValueError, match="cp_async.*sm_75"):
        t("sm_75").require("cp_async", "CpAsyncLoadB")


def test_unknown_feature_is_an_error():
    with pytest.raises(ValueError, match="unknown target feature 'tmaa'"):
        t("sm_90a").has("tmaa")
    with pytest.raises(ValueError, match="unknown features"):
        attrs.evolve(t("sm_80"), features={"warp_drive"})


def test_targets_hashable_and_frozen():
    table = {get_target(name): name for name in ALL}
    assert len(table) == len(ALL)
    assert table[get_target("sm_90a")] == "sm_90a"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        t("sm_90a").sm_count = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        t("sm_90a").mma_shapes[("float16", "float16")] = ()  # type: ignore[index]


def test_zhenwu_tuning_is_valid():
    assert TuningConfig(mma="ppu_m16n16k16", block_m=16, block_n=64, block_k=64, warps_n=4).mma in \
        t("zhenwu810e").mma_instructions("float16", "float16")


def test_current_without_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        Target.current()


@pytest.mark.parametrize("major,minor,name", [
    (7, 5, "sm_75"), (8, 0, "sm_80"), (8, 6, "sm_86"), (8, 7, "sm_86"), (8, 9, "sm_89"), (9, 0, "sm_90a"),
    (10, 0, "sm_100a"), (10, 3, "sm_103a"), (12, 0, "sm_120a"), (12, 1, "sm_121a"),
])
def test_from_device_properties_maps_capability(major, minor, name):
    props = SimpleNamespace(major=major, minor=minor, name="NVIDIA Test GPU")
    target = Target.from_device_properties(props)
    assert target == get_target(name)  # nothing measured: the table values stay


def test_from_device_properties_overrides_measured_values():
    props = SimpleNamespace(major=9, minor=0, name="NVIDIA H20", multi_processor_count=78,
                            shared_memory_per_block_optin=232448, shared_memory_per_multiprocessor=233472,
                            L2_cache_size=60 * 2**20, regs_per_multiprocessor=65536,
                            max_threads_per_multi_processor=2048)
    target = Target.from_device_properties(props)
    assert target.name == "sm_90a" and target.sm_count == 78 and target.l2_bytes == 60 * 2**20
    assert target.features == get_target("sm_90a").features


def test_from_device_properties_unknown_capability_and_zhenwu():
    with pytest.raises(RuntimeError, match=r"compute capability 6\.1"):
        Target.from_device_properties(SimpleNamespace(major=6, minor=1, name="Tesla P40"))
    assert Target.from_device_properties(SimpleNamespace(major=8, minor=0, name="PPU-ZW810E")).name == "zhenwu810e"


def test_summary_is_one_line():
    s = t("sm_90a").summary()
    assert s.startswith("target  sm_90a") and "wgmma" in s and "\n" not in s

"""moe_align kernels: rendering (header with the full config, deterministic, only the chosen branch), config
errors, launch facts (shared memory within every target's opt-in limit) and NVRTC compilation for the targets."""

from __future__ import annotations

import json

import pytest

from humming_gen.moe.kernel import KINDS, MAX_EXPERTS, AlignConfig, generate, param_fields, params_struct
from humming_gen.runtime.compile import compile_source
from humming_gen.targets import get_target


def _code(src: str) -> str:
    """The generated code without comment lines (component descriptions name unselected options too)."""
    body = src.split("namespace hg {", 1)[1]
    return "\n".join(line.split("//", 1)[0] for line in body.splitlines())


def test_header_holds_the_full_config():
    cfg = AlignConfig("scatter", "int64", "int32", get_target("sm_90a"))
    src = generate(cfg)
    line = next(l for l in src.splitlines() if l.startswith("//   moe_align "))
    assert json.loads(line.split("moe_align ", 1)[1]) == cfg.to_dict()
    assert cfg.kernel_name in src and "kind=scatter threads=256 topk_ids=int64 expert_map=int32 pdl=yes" in src
    assert generate(cfg) == src  # deterministic


@pytest.mark.parametrize("kind, arch, id_dtype, map_dtype, absent, present", [
    ("single", "sm_80", "int32", None, ["griddepcontrol", "expert_map", "partials", "long long* "],
     ["match.any.sync.b32", "scatter_warp_chunk", "scan_offsets", "const int id ="]),
    ("single", "sm_90a", "int64", "int64", ["partials"],
     ["griddepcontrol.wait", "const long long id =", "const long long local ="]),
    ("count", "sm_90a", "int32", None, ["scatter_warp_chunk", "scan_offsets", "fill_outputs", "sorted_ids",
                                        "inverse"], ["count_warp_chunk", "p.partials[blockIdx.x"]),
    ("scatter", "sm_100a", "int32", "int32", [], ["p.partials[b * p.num_experts + e]", "scatter_warp_chunk"]),
])
def test_source_has_only_its_branch(kind, arch, id_dtype, map_dtype, absent, present):
    src = _code(generate(AlignConfig(kind, id_dtype, map_dtype, get_target(arch))))
    for word in absent:
        assert word not in src, word
    for word in present:
        assert word in src, word


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "sort"}, "AlignConfig.kind: got 'sort'"),
    ({"id_dtype": "int16"}, "AlignConfig.id_dtype: got 'int16'"),
    ({"map_dtype": "uint8"}, "AlignConfig.map_dtype: got 'uint8'"),
])
def test_config_errors_name_the_field(kwargs, message):
    args = {"kind": "single", "id_dtype": "int32", "map_dtype": None, "target": get_target("sm_80")} | kwargs
    with pytest.raises(ValueError) as info:
        AlignConfig(**args)
    assert message in str(info.value)


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a"])
def test_shared_memory_fits_every_target_at_max_experts(arch):
    target = get_target(arch)
    for kind in KINDS:
        assert AlignConfig(kind, "int32", None, target).shared_bytes(MAX_EXPERTS) <= target.smem_per_block_optin


def test_params_struct_matches_the_field_order():
    cfg = AlignConfig("scatter", "int32", "int32", get_target("sm_90a"))
    names = [f[0] for f in param_fields(cfg)]
    assert names[:3] == ["topk_ids", "expert_map", "partials"] and names[-2:] == ["block_m", "max_padded"]
    # 9 pointers, then 6 ints: 72 + 24 bytes, already a multiple of 8
    assert params_struct(cfg).size == 9 * 8 + 6 * 4


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a"])
def test_every_kernel_compiles(arch):
    target = get_target(arch)
    for kind in KINDS:
        for id_dtype, map_dtype in [("int32", None), ("int64", "int32"), ("int32", "int64")]:
            cfg = AlignConfig(kind, id_dtype, map_dtype, target)
            compiled = compile_source(generate(cfg), cfg.kernel_name, target.arch)
            assert compiled.cubin, cfg.kernel_name

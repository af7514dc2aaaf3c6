"""Activation-quantization kernels: rendering (header with the full config, only the chosen branch in the source),
configuration errors, and NVRTC compilation of every kernel kind for every target in humming_gen.targets."""

from __future__ import annotations

import json

import pytest

from humming_gen.activation.kernel import QuantizeConfig, generate
from humming_gen.runtime.compile import ARCHS, compile_source
from humming_gen.schemes.scheme import ActivationScheme as A
from humming_gen.targets import get_target, list_targets

FP8_TOKEN = A("float8e4m3")
SCHEMES = {
    "fp8-token": FP8_TOKEN,
    "int8-token": A("int8"),
    "int4-token": A("int4"),
    "e5m2-g128": A("float8e5m2", granularity="group", group_size=128),
    "fp8-g100": A("float8e4m3", granularity="group", group_size=100),
    "mxfp8-even": A("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0", scale_rule="even"),
    "nvfp4": A("float4e2m1", granularity="group", group_size=16, scale_dtype="float8e4m3", global_scale=True),
    "fp8-tensor": A("float8e4m3", granularity="tensor"),
}


def _code(src: str) -> str:
    """The generated code without comment lines (component descriptions name unselected options too)."""
    body = src.split("namespace hg {", 1)[1]
    return "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("//"))


def _configs(target):
    for name, s in SCHEMES.items():
        for static in (False, True):
            if static and not (s.granularity == "tensor" or s.global_scale):
                continue
            for wide in (True, False):
                if wide and s.granularity == "group" and s.group_size % 8:
                    continue
                cfg = QuantizeConfig(s, "bfloat16", target, static=static, wide=wide)
                yield f"{name}-{'static' if static else 'dynamic'}-{'wide' if wide else 'element'}", cfg
                if cfg.needs_amax_pass and wide:
                    yield f"{name}-amax", QuantizeConfig(s, "float16", target, wide=wide, stage="amax")
    yield "fp8-token-fp32", QuantizeConfig(FP8_TOKEN, "float32", target)
    for name in ("fp8-token", "int8-token", "int4-token"):  # one warp per row (short rows)
        for wide in (True, False):
            yield f"{name}-row-warps-{'wide' if wide else 'element'}", QuantizeConfig(SCHEMES[name], "bfloat16", target,
                                                                                       wide=wide, row_warps=True)


def test_header_holds_the_full_config():
    cfg = QuantizeConfig(SCHEMES["mxfp8-even"], "bfloat16", get_target("sm_90a"))
    src = generate(cfg)
    line = next(l for l in src.splitlines() if l.startswith("//   activation_quantize "))
    assert json.loads(line.split("activation_quantize ", 1)[1]) == cfg.to_dict()
    assert cfg.kernel_name in src and "scale=float8e8m0/g32 rule=even" in src
    assert generate(cfg) == src  # deterministic


@pytest.mark.parametrize("arch, absent, present", [
    # fp8 per token on sm_90a: cvt, no software fp8 encoder, no e8m0 / global / partials / group code, no double
    ("sm_90a", ["encode_float8e4m3", "f64_high_bits", "global_scale", "partials", "kGroupLanes",
                "sign_of_difference"],
     ["cvt.rn.satfinite.e4m3x2.f32", "griddepcontrol.launch_dependents", "block_max"]),
    # sm_80: no cvt instruction, no PDL; the software encoder instead
    ("sm_80", ["cvt.rn.satfinite", "griddepcontrol", "global_scale"], ["encode_float8e4m3"]),
])
def test_fp8_token_source_has_only_its_branch(arch, absent, present):
    src = _code(generate(QuantizeConfig(FP8_TOKEN, "bfloat16", get_target(arch))))
    for word in absent:
        assert word not in src, word
    for word in present:
        assert word in src, word


def test_nvfp4_source_on_sm_90a_and_sm_100a():
    nvfp4 = SCHEMES["nvfp4"]
    def body(cfg):
        return _code(generate(cfg))

    hopper = body(QuantizeConfig(nvfp4, "bfloat16", get_target("sm_90a")))
    blackwell = body(QuantizeConfig(nvfp4, "bfloat16", get_target("sm_100a")))
    assert "encode_float4e2m1" in hopper and "e2m1x2" not in hopper
    assert "cvt.rn.satfinite.e2m1x2.f32" in blackwell and "encode_float4e2m1" not in blackwell
    assert "global_scale_from_amax" in hopper and "float4e2m1 scale" not in hopper
    static = body(QuantizeConfig(nvfp4, "bfloat16", get_target("sm_90a"), static=True))
    assert "global_scale_from_amax" not in static and "partials" not in static


@pytest.mark.parametrize("kwargs, message", [
    (dict(scheme=A("float8e4m3"), static=True), "static scale needs granularity 'tensor'"),
    (dict(scheme=A("uint8")), "integer activations must be signed"),
    (dict(scheme=A("int4", granularity="group", group_size=7)), "even size"),
    (dict(scheme=A("float8e4m3"), stage="amax"), "stage 'amax' exists only"),
    (dict(scheme=A("float8e4m3"), input_dtype="int8"), "input_dtype"),
    (dict(scheme=A("float8e4m3", granularity="group", group_size=100)), "must not span two groups"),
    (dict(scheme=A("float8e4m3", granularity="tensor"), row_warps=True), "row_warps .one warp per row. serves per-token"),
])
def test_config_errors_name_the_problem(kwargs, message):
    args = dict(input_dtype="bfloat16", target=get_target("sm_90a"))
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        QuantizeConfig(**args)


COMPILABLE = [t for t in list_targets() if get_target(t).arch in ARCHS]


@pytest.mark.parametrize("target_name", COMPILABLE)
def test_every_kernel_compiles(target_name):
    target = get_target(target_name)
    for label, cfg in _configs(target):
        compiled = compile_source(generate(cfg), cfg.kernel_name, target.arch)
        assert compiled.cubin, label

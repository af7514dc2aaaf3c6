"""QuantLinear(dequantize_activations=...) and the dequantize kernels of fake_quantize_activation, on the CPU: which
layers run a scheme's quantized activations as 16-bit values on the 16-bit kernels (the default: fp8 activations in
groups shorter than 128 on sm_90a in bf16 layers), the errors where the route cannot be taken, and
the kernels' sources and NVRTC compilation for every target. The arithmetic is checked bit for bit in
test_activation_values_host.py (host) and tests/gpu/test_dequantized_activations_gpu.py (GPU)."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.activation.kernel import QuantizeConfig, generate
from humming_gen.codegen.standalone import compile_source
from humming_gen.runtime.compile import ARCHS
from humming_gen.layer.compute_type import dequantized_activations_default
from humming_gen.targets import get_target, list_targets

MXFP8 = hg.ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0")
FP8_G32 = hg.ActivationScheme("float8e4m3", granularity="group", group_size=32)
MXFP4_MXFP8 = hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", activation=MXFP8)


def _layer(scheme, target="sm_90a", **kw) -> hg.QuantLinear:
    torch.manual_seed(0)
    qw = (hg.scheme(scheme) if isinstance(scheme, str) else scheme).quantize(torch.randn(256, 512))
    return hg.QuantLinear.from_quantized(qw, target=target, device="cpu", **kw)


@pytest.mark.parametrize("scheme,target,dtype,expected", [
    ("w8a8-mxfp8", "sm_90a", torch.bfloat16, True),
    (MXFP4_MXFP8, "sm_90a", torch.bfloat16, True),
    (MXFP4_MXFP8, "sm_90a", torch.float16, False),   # MXFP8 values can leave fp16's range
    (MXFP4_MXFP8, "sm_89", torch.bfloat16, False),   # unmeasured there: the 8-bit kernels
    ("w8a8-fp8-block128", "sm_90a", torch.bfloat16, False),  # promoted every 128 k
    ("w4a8-mxfp4-fp8", "sm_90a", torch.bfloat16, False),     # per token
    (hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", activation=FP8_G32), "sm_90a",
     torch.bfloat16, True),  # fp32 group scales: values rounded to bf16
    (hg.QuantScheme("int4", group_size=32, activation=hg.ActivationScheme("int8", granularity="group", group_size=32)),
     "sm_90a", torch.bfloat16, False),  # int8 groups: unmeasured, inexact
], ids=["mxfp8", "mxfp4-x-mxfp8", "fp16-layer", "sm_89", "block128", "per-token", "fp32-group-scales", "int8-groups"])
def test_default_route(scheme, target: str, dtype: torch.dtype, expected: bool) -> None:
    layer = _layer(scheme, target, dtype=dtype)
    act = layer.scheme.activation
    assert (layer.value_scheme is not None) == expected
    assert dequantized_activations_default(act, {torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype],
                                           get_target(target)) == expected
    if expected:
        assert layer.compute_dtype == "bfloat16" and layer.value_scheme == act
        assert layer.layer_config.scheme.activation is None and layer.activation_scheme is None
        assert "dequantize_activations=True" in repr(layer)
        assert all(k.plan.layer.scheme.activation is None and k.plan.tuning.mma in ("m16n8k16", "wgmma")
                   for k in layer.kernels), [k.plan.kernel_name for k in layer.kernels]
    else:
        assert layer.compute_dtype != "bfloat16" or layer.fallback_reasons


def test_opt_out_and_other_switches_keep_the_8_bit_kernels() -> None:
    assert _layer("w8a8-mxfp8", dequantize_activations=False).compute_dtype == "float8e4m3"
    assert _layer("w8a8-mxfp8", quantize_in_gemm=True).value_scheme is None
    assert _layer("w8a8-mxfp8", batch_invariant=True).value_scheme is None
    strict = _layer("w8a8-mxfp8", strict=True)  # strict: the scheme's own activations on their own MMA
    assert strict.value_scheme is None and strict.compute_dtype == "float8e4m3"
    # explicit tunings (e.g. `humming-gen bench --standard`'s, chosen for the 8-bit layer) pin the 8-bit kernels
    pinned = _layer("w8a8-mxfp8", tunings=strict.tunings)
    assert pinned.value_scheme is None and pinned.tunings == strict.tunings
    weight_only = _layer("w8a8-mxfp8", weight_only=True)
    assert weight_only.value_scheme is None and weight_only.scheme.activation is None


def test_requested_route_runs_on_targets_without_the_8_bit_mma() -> None:
    """fp8 activations on sm_80 (no fp8 MMA) would fall back to unquantized bf16; requested, the layer quantizes and
    runs the values on the 16-bit kernels (no fallback reason: the scheme's arithmetic is kept)."""
    fallback = _layer("w8a8-fp8-channel", "sm_80")
    assert fallback.compute_dtype == "bfloat16" and fallback.fallback_reasons and fallback.scheme.activation is None
    layer = _layer("w8a8-fp8-channel", "sm_80", dequantize_activations=True)
    assert layer.value_scheme == hg.scheme("w8a8-fp8-channel").activation and not layer.fallback_reasons
    assert layer.scheme.activation == layer.value_scheme


def test_batch_invariant_route_needs_a_row_local_scale() -> None:
    """fake_quantize_activation's dynamic per-tensor scale is the batch's amax: not batch-invariant; a checkpoint's
    static per-tensor scale, or per-token scales, are."""
    with pytest.raises(ValueError, match="batch_invariant=True with a dynamic per-tensor"):
        _layer("w8a8-fp8-tensor", dequantize_activations=True, batch_invariant=True)
    qw = hg.scheme("w8a8-fp8-tensor").quantize(torch.randn(256, 512))
    qw.input_scale = torch.tensor([0.05])
    layer = hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu", dequantize_activations=True,
                                          batch_invariant=True)
    assert layer.value_scheme is not None and layer._static_scale is not None
    assert _layer("w8a8-fp8-channel", dequantize_activations=True, batch_invariant=True).value_scheme is not None


def test_static_e8m0_scale_takes_the_division() -> None:
    """A static per-tensor scale is the checkpoint's fp32 value, not a power of two: no exact-product path."""
    from humming_gen.activation.components import ElementCode
    from humming_gen.activation.kernel import components

    tensor_e8m0 = hg.ActivationScheme("float8e4m3", granularity="tensor", scale_dtype="float8e8m0")
    for static, exact in ((True, False), (False, True)):
        cfg = QuantizeConfig(tensor_e8m0, "bfloat16", get_target("sm_90a"), static=static)
        code = next(c for c in components(cfg) if isinstance(c, ElementCode))
        assert code.exact_product == exact
        assert ("power_of_two_quotient" in generate(cfg)) == exact


def test_cli_presets_and_inspect_name_the_route(capsys) -> None:
    from humming_gen.cli import main

    assert main(["presets", "--target", "sm_90a"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("w")}
    assert " as values " in lines["w8a8-mxfp8"] and " yes " in lines["w8a8-fp8-block128"]
    assert main(["presets", "--target", "sm_89"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("w")}
    assert " yes " in lines["w8a8-mxfp8"]
    for extra, act in (([], "act=16-bit"), (["--strict"], "act=float8e4m3/group")):
        rc = main(["tune", "--n", "256", "--k", "1024", "--scheme", "w8a8-mxfp8", "--target", "sm_90a", "--m", "16",
                   "--dry-run", *extra])
        out = capsys.readouterr().out
        assert rc == 0
        assert act in next(line for line in out.splitlines() if line.startswith("layer")), out
        assert ("bf16 values on the 16-bit kernels" in out) == (not extra)


@pytest.mark.parametrize("scheme,kwargs,match", [
    ("w4a16-int4-g128", {}, "does not quantize activations"),
    ("w4a4-nvfp4", {}, "global scale"),
    ("w8a8-mxfp8", {"weight_only": True}, "weight_only=True"),
    ("w8a8-mxfp8", {"quantize_in_gemm": True}, "quantize_in_gemm=True"),
])
def test_requested_route_refused_clearly(scheme, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match) as e:
        _layer(scheme, dequantize_activations=True, **kwargs)
    assert "dequantize_activations=True" in str(e.value)
    with pytest.raises(TypeError, match="True, False or None"):
        _layer("w8a8-mxfp8", dequantize_activations="yes")


def test_fake_quantize_refuses_before_launch() -> None:
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="dtype"):
        hg.fake_quantize_activation(x, MXFP8, dtype=torch.float32)
    with pytest.raises(ValueError, match="global scale"):
        hg.fake_quantize_activation(x, hg.scheme("w4a4-nvfp4").activation)
    with pytest.raises(ValueError, match="CUDA device"):
        hg.fake_quantize_activation(x, MXFP8)
    with pytest.raises(ValueError, match="dequantize"):
        QuantizeConfig(MXFP8, "bfloat16", get_target("sm_90a"), panels=True, dequantize="bfloat16")
    with pytest.raises(ValueError, match="dequantize"):
        QuantizeConfig(MXFP8, "bfloat16", get_target("sm_90a"), dequantize="float32")


CONFIGS = {"mxfp8-lanes": dict(scheme=MXFP8), "fp8-g32-element": dict(scheme=FP8_G32, wide=False),
           "fp8-g100-threads": dict(scheme=hg.ActivationScheme("float8e4m3", granularity="group", group_size=100),
                                    wide=False),
           "int8-token-rows": dict(scheme=hg.ActivationScheme("int8")),
           "fp8-token-row-warps": dict(scheme=hg.ActivationScheme("float8e4m3"), row_warps=True),
           "fp8-tensor-static-fp32": dict(scheme=hg.ActivationScheme("float8e4m3", granularity="tensor"),
                                          static=True, input_dtype="float32"),
           "int4-g32": dict(scheme=hg.ActivationScheme("int4", granularity="group", group_size=32))}


@pytest.mark.parametrize("out", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_dequantize_kernels_compile_for_every_target(name: str, out: str) -> None:
    kw = dict(CONFIGS[name])
    scheme, input_dtype = kw.pop("scheme"), kw.pop("input_dtype", "bfloat16")
    for arch in list_targets():
        if out == "bfloat16" and not get_target(arch).has("mma_bf16"):  # sm_75: no bf16 cvt (nor bf16 layers)
            with pytest.raises(ValueError, match="bf16 conversions"):
                QuantizeConfig(scheme, input_dtype, get_target(arch), dequantize=out, **kw)
            continue
        cfg = QuantizeConfig(scheme, input_dtype, get_target(arch), dequantize=out, **kw)
        src = generate(cfg)
        ptx = {"bfloat16": "bf16", "float16": "f16"}[out]
        pair = get_target(arch).has("mma_bf16")
        assert (f"cvt.rn.{ptx}x2.f32" in src) == pair and (f"cvt.rn.{ptx}.f32" in src) != pair
        assert "value_pair_bits" in src and f"_dq_{out}_" in cfg.kernel_name
        assert f"stores={out} values" in src  # the header's summary
        hardware = cfg.convert in ("e4m3", "e5m2")
        assert (f"cvt.rn.f16x2.{cfg.convert}x2" in src) == hardware and ("element_value(u32 code)" in src) != hardware
        if get_target(arch).arch in ARCHS:  # (a compiler here: the Zhenwu PPU's sources are generated only)
            compile_source(cfg, src, "nvrtc")

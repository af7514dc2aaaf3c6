"""Checkpoints whose scheme quantizes activations (FP8 per tensor with a static input scale, ModelOpt FP8, DeepSeek FP8
128 x 128 blocks, compressed-tensors W8A8 int8 and fp8, ModelOpt NVFP4) converted and built into QuantLinear on the
CPU for sm_90a: the W8A8 ones compose the 8-bit-activation kernels (and keep the checkpoint's static scale); W4A4
(no fp4 MMA on sm_90a) and fp8 on sm_80 fall back to 16-bit activations, logged, or are refused with strict=True
naming what is missing."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.schemes.converters import convert

PREFIX = "l"


def _fp8_tensor_static():
    w = (torch.randn(256, 512) * 0.1).to(torch.float8_e4m3fn)
    return convert({"weight": w, "weight_scale": torch.tensor(0.5), "input_scale": torch.tensor(0.125)},
                   {"quant_method": "fp8", "activation_scheme": "static"})


def _fp8_block_dynamic():
    w = (torch.randn(256, 512) * 0.1).to(torch.float8_e4m3fn)
    return convert({"weight": w, "weight_scale_inv": torch.rand(2, 4) + 0.5},
                   {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"})


def _ct(preset: str):
    from converter_fixtures import ct_compress

    state, cfg, _ = ct_compress(torch.randn(256, 512, dtype=torch.bfloat16) * 0.1, preset)
    return convert({f"{PREFIX}.{k}": v for k, v in state.items()}, cfg, PREFIX)


def _modelopt_fp8():
    """ModelOpt FP8 as hf_quant_config.json describes it: e4m3 weight, scalar fp32 weight_scale and a static scalar
    fp32 input_scale (|x| beyond 4 saturates to 448, as the reference does)."""
    w = (torch.randn(256, 512) * 0.1).to(torch.float8_e4m3fn)
    tensors = {"l.weight": w, "l.weight_scale": torch.tensor(0.0123), "l.input_scale": torch.tensor(4.0 / 448)}
    cfg = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]}}
    qw = convert(tensors, cfg, PREFIX)
    assert qw.scheme.activation == hg.ActivationScheme("float8e4m3", granularity="tensor")  # static per tensor
    return qw


def _modelopt_nvfp4():
    codes = torch.randint(0, 16, (256, 512), dtype=torch.uint8)
    tensors = {"l.weight": codes[:, 0::2] | (codes[:, 1::2] << 4),
               "l.weight_scale": torch.rand(256, 512 // 16).mul(8).to(torch.float8_e4m3fn),
               "l.weight_scale_2": torch.tensor(0.0123), "l.input_scale": torch.tensor(0.25)}
    return convert(tensors, {"quant_method": "modelopt", "quant_algo": "NVFP4"}, PREFIX)


W8A8 = {"fp8-tensor-static": _fp8_tensor_static, "fp8-block128": _fp8_block_dynamic, "modelopt-fp8": _modelopt_fp8,
        "ct-w8a8-int8": lambda: _ct("W8A8"), "ct-fp8-dynamic": lambda: _ct("FP8_DYNAMIC")}


@pytest.mark.parametrize("name", sorted(W8A8))
def test_w8a8_checkpoints_compose_8_bit_activation_kernels(name: str) -> None:
    if name.startswith("ct-"):
        pytest.importorskip("compressed_tensors")
    qw = W8A8[name]()
    assert qw.scheme.activation is not None
    layer = hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu")
    assert {k.plan.tuning.mma for k in layer.kernels} == {"wgmma"}, name  # every bucket warp-specialized
    assert layer.compute_dtype == qw.scheme.activation.dtype.name
    if qw.input_scale is not None and qw.scheme.activation.granularity == "tensor":
        assert layer._static_scale is not None and layer._static_scale.item() == qw.input_scale.item()
    if qw.scheme.activation.dtype.name.startswith("float8"):
        with pytest.raises(ValueError, match="mma_fp8"):
            hg.QuantLinear.from_quantized(qw, target="sm_80", device="cpu", strict=True)
        layer = hg.QuantLinear.from_quantized(qw, target="sm_80", device="cpu")
        assert layer.compute_dtype == "bfloat16" and layer.activation_scheme is None
        assert layer._static_scale is None and any("mma_fp8" in r for r in layer.fallback_reasons)


def test_w4a4_checkpoint_falls_back_or_is_refused_with_strict(caplog) -> None:
    qw = _modelopt_nvfp4()
    with pytest.raises(ValueError, match="weight_only=True") as e:
        hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu", strict=True)
    assert "float4e2m1" in str(e.value) and "strict=True" in str(e.value)
    from humming_gen.layer import compute_type

    compute_type._LOGGED.clear()  # "once" is per process: start from a clean slate
    with caplog.at_level("WARNING", logger="humming_gen"):
        layer = hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu")
        hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu")
    fallback_logs = [r for r in caplog.records if "float4e2m1 activations" in r.getMessage()]
    assert len(fallback_logs) == 1  # once per (scheme, target, result) in the process
    assert layer.compute_dtype == "bfloat16" and layer.activation_scheme is None
    assert {k.plan.tuning.mma for k in layer.kernels} <= {"m16n8k16", "wgmma"}
    layer = hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu", weight_only=True)
    assert {k.plan.tuning.mma for k in layer.kernels} <= {"m16n8k16", "wgmma"}

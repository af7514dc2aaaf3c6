"""NaN / inf weights: one behaviour for every scheme and every way into the standard form - a ValueError that
names the first bad element (row, column) and its value (docs/FORMATS.md 5)."""

from __future__ import annotations

import math

import pytest
import torch

from humming_gen.schemes import QuantScheme
from humming_gen.schemes.presets import preset
from humming_gen.schemes.scheme import QuantizedWeight

SCHEMES = {
    "int4-g128": preset("w4a16-int4-g128"),
    "uint4-g128-zp": preset("w4a16-int4-g128-zp"),
    "int8-channel": preset("w8a16-int8-channel"),
    "int8-tensor": QuantScheme("int8", granularity="tensor", scale_dtype="float32"),
    "fp8-channel": preset("w8a16-fp8-channel"),
    "fp8-block": QuantScheme("float8e4m3", block_size=(32, 32), scale_dtype="float32"),
    "mxfp4": preset("w4a16-mxfp4"),
    "nvfp4": preset("w4a16-nvfp4"),
    "e0m3-g64": QuantScheme("float4e0m3", group_size=64),
    "uint4-float-zp": QuantScheme("uint4", group_size=32, zero_point="float"),
}
BAD = [("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf)]


@pytest.mark.parametrize("value_id,value", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_quantize_refuses_nonfinite_weights(name, value_id, value):
    w = torch.randn(64, 256, dtype=torch.bfloat16)
    w[5, 77] = value
    w[40, 3] = value  # later in row-major order: the message names the first one
    with pytest.raises(ValueError) as info:
        SCHEMES[name].quantize(w)
    msg = str(info.value)
    assert f"weight[5, 77] is {value_id}" in msg and "2 non-finite" in msg and "finite" in msg


def test_quantize_names_the_expert_of_a_moe_weight():
    w = torch.randn(3, 32, 128)
    w[2, 0, 9] = math.nan
    with pytest.raises(ValueError, match=r"weight\[2, 0, 9\] is nan"):
        preset("w4a16-int4-g128").quantize(w)


def test_quantized_weight_refuses_nonfinite_scales_and_codes():
    """Converters build QuantizedWeight directly: a checkpoint's NaN scale or NaN fp8 code is refused there."""
    good = preset("w4a16-int4-g128").quantize(torch.randn(16, 256))
    scales = good.scales.clone()
    scales[3, 1] = math.inf
    with pytest.raises(ValueError, match=r"QuantizedWeight.scales\[3, 1\] is inf"):
        QuantizedWeight(good.scheme, good.codes, scales)
    fp8 = preset("w8a16-fp8-channel").quantize(torch.randn(16, 64))
    codes = fp8.codes.clone()
    codes[7, 60] = 0xFF  # e4m3fn: S.1111.111 is NaN
    with pytest.raises(ValueError, match=r"QuantizedWeight.codes\[7, 60\] = 0xff is nan in float8e4m3"):
        QuantizedWeight(fp8.scheme, codes, fp8.scales)
    nv = preset("w4a16-nvfp4").quantize(torch.randn(16, 64))
    with pytest.raises(ValueError, match=r"QuantizedWeight.global_scale is nan"):
        QuantizedWeight(nv.scheme, nv.codes, nv.scales, global_scale=torch.tensor(math.nan))


def test_quant_linear_gives_the_true_reason_for_a_bf16_layer():
    """The layer's scale-range check ("use bfloat16 activations") is never reached with a NaN weight."""
    from humming_gen.layer.linear import QuantLinear

    w = torch.randn(256, 256, dtype=torch.bfloat16)
    w[1, 2] = math.nan
    with pytest.raises(ValueError) as info:
        QuantLinear.from_float(w, "w4a16-int4-g128", dtype=torch.bfloat16)
    assert "weight[1, 2] is nan" in str(info.value) and "bfloat16 activations" not in str(info.value)

"""Named quantization schemes: `preset("w4a16-int4-g128")`.

Names read `w{weight bits}a{activation bits}-{format}[-{granularity}]`; a16 means 16-bit activations (no
activation quantization). Each preset is the common production recipe of its format (GPTQ/AWQ-style int
groups with bf16 scales, FP8 channel/block, OCP MXFP4 with RCEIL e8m0 scales, ModelOpt-style NVFP4).
"""

from __future__ import annotations

from humming_gen.schemes.scheme import ActivationScheme, QuantScheme

_FP8_TOKEN = ActivationScheme("float8e4m3", granularity="token", scale_dtype="float32")
_INT8_TOKEN = ActivationScheme("int8", granularity="token", scale_dtype="float32")

# Schemes are frozen attrs objects, so one shared instance per name is safe.
_PRESETS: dict[str, QuantScheme] = {
    "w4a16-int4-g128": QuantScheme("int4", group_size=128, scale_dtype="bfloat16"),
    "w4a16-int4-g128-zp": QuantScheme("uint4", group_size=128, scale_dtype="bfloat16", zero_point="int"),
    "w4a16-int4-channel": QuantScheme("int4", granularity="channel", scale_dtype="bfloat16"),
    "w3a16-int3-g128": QuantScheme("int3", group_size=128, scale_dtype="bfloat16"),
    "w2a16-int2-g64-zp": QuantScheme("uint2", group_size=64, scale_dtype="bfloat16", zero_point="int"),
    "w8a16-int8-channel": QuantScheme("int8", granularity="channel", scale_dtype="bfloat16"),
    "w8a16-fp8-channel": QuantScheme("float8e4m3", granularity="channel", scale_dtype="float32"),
    "w8a8-fp8-tensor": QuantScheme(
        "float8e4m3", granularity="tensor", scale_dtype="float32",
        activation=ActivationScheme("float8e4m3", granularity="tensor", scale_dtype="float32")),
    "w8a8-fp8-channel": QuantScheme("float8e4m3", granularity="channel", scale_dtype="float32",
                                    activation=_FP8_TOKEN),
    "w8a8-fp8-block128": QuantScheme(
        "float8e4m3", block_size=(128, 128), scale_dtype="float32",
        activation=ActivationScheme("float8e4m3", granularity="group", group_size=128, scale_dtype="float32")),
    "w8a8-int8-channel": QuantScheme("int8", granularity="channel", scale_dtype="float32",
                                     activation=_INT8_TOKEN),
    "w4a8-int4-g128-fp8": QuantScheme("int4", group_size=128, scale_dtype="bfloat16", activation=_FP8_TOKEN),
    "w4a8-int4-g128-int8": QuantScheme("int4", group_size=128, scale_dtype="bfloat16", activation=_INT8_TOKEN),
    "w4a8-int4-channel-int8": QuantScheme("int4", granularity="channel", scale_dtype="bfloat16",
                                          activation=_INT8_TOKEN),
    "w4a4-int4-g128": QuantScheme("int4", group_size=128, scale_dtype="bfloat16",
                                  activation=ActivationScheme("int4", granularity="token")),
    "w4a4-int4-channel": QuantScheme("int4", granularity="channel", scale_dtype="float32",
                                     activation=ActivationScheme("int4", granularity="token")),
    "w4a16-mxfp4": QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", scale_rule="rceil"),
    "w4a8-mxfp4-fp8": QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", scale_rule="rceil",
                                  activation=_FP8_TOKEN),
    "w8a8-mxfp8": QuantScheme(
        "float8e4m3", group_size=32, scale_dtype="float8e8m0", scale_rule="rceil",
        activation=ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0")),
    "w4a16-nvfp4": QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True),
    "w4a4-nvfp4": QuantScheme(
        "float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True,
        activation=ActivationScheme("float4e2m1", granularity="group", group_size=16, scale_dtype="float8e4m3",
                                    global_scale=True)),
}


def list_presets() -> list[str]:
    """Names accepted by `preset()`, sorted."""
    return sorted(_PRESETS)


def preset(name: str) -> QuantScheme:
    """The QuantScheme called `name`; raises ValueError listing the known names for anything else."""
    found = _PRESETS.get(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(list_presets())}")
    return found

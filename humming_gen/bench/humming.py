"""Humming (vLLM's quantized GEMM library, package `humming`) side of the benchmark. Optional: imported lazily,
never a dependency. Layers are built as Humming's README and its test runner (humming/testing/runner.py,
prepare_weight) build them: HummingLayer(...).cuda(), HummingWeightSchema.quant_tensor (what
load_from_unquantized calls), load_from_tensors, transform() (code conversion, repack, scale layout), forward.
The reference weight is schema.dequant_tensors of the quantized tensors, the runner's weight_ref."""

from __future__ import annotations

import torch

# preset -> (weight_config, input_config): Humming's schema fields (humming/schema/humming.py), for the dense
# bench and bench/moe_bench.py alike. An input_config quantizes x inside Humming's forward (dynamic per token, or per
# group of `group_size` along K; quant_mode as Humming derives it when left out).
FORMATS = {"w4a16-int4-g128": (dict(dtype="int4", group_size=128), None),  # symmetric: no zero point
           "w3a16-int3-g128": (dict(dtype="int3", group_size=128), None),
           "w8a16-int8-channel": (dict(dtype="int8"), None),  # group_size 0: one scale per output channel
           "w4a16-mxfp4": (dict(dtype="float4e2m1", group_size=32, scale_dtype="float8e8m0"), None),
           "w8a8-fp8-channel": (dict(dtype="float8e4m3"), dict(dtype="float8e4m3", quant_mode="dynamic_token")),
           "w8a8-int8-channel": (dict(dtype="int8"), dict(dtype="int8", quant_mode="dynamic_token")),
           "w8a8-fp8-block128": (dict(dtype="float8e4m3", group_size=128, group_size_n=128),
                                 dict(dtype="float8e4m3", quant_mode="dynamic_group", group_size=128,
                                      scale_dtype="float32")),
           "w4a8-mxfp4-fp8": (dict(dtype="float4e2m1", group_size=32, scale_dtype="float8e8m0"),
                              dict(dtype="float8e4m3", quant_mode="dynamic_token"))}


class HummingUnavailable(Exception):
    """Humming cannot run this format here; str() is the reason to print."""


def humming_layers(fmt: str, n: int, k: int, count: int, dtype=torch.bfloat16):
    """`count` Humming layers of random (randn * 0.02) weights -> (layers, w_ref). layers: callables
    x[M, K] -> y[M, N] (HummingLayer modules, kernels of every M bucket compiled). w_ref: layer 0's dequantized
    weight, float32 [N, K] (Humming's dequant_tensors: code value times scale, scales in `dtype` as the kernel reads
    them). With quantized activations x stays 16-bit and Humming quantizes it in its forward, so an error against
    x @ w_ref includes the activations' rounding."""
    if fmt not in FORMATS:
        raise HummingUnavailable(f"no Humming mapping for {fmt}")
    try:
        from humming.layer import HummingLayer
        from humming.schema import HummingWeightSchema
    except Exception as e:  # not installed, or its own dependencies (triton, cuda-bindings) missing
        raise HummingUnavailable(f"humming not importable: {type(e).__name__}: {e}") from e
    layers, w_ref = [], None
    for i in range(count):
        weight_config, input_config = FORMATS[fmt]
        layer = HummingLayer(shape_n=n, shape_k=k, weight_config=dict(weight_config),
                             input_config=None if input_config is None else dict(input_config),
                             torch_dtype=dtype).cuda()
        w = (torch.randn(n, k, device="cuda") * 0.02).to(dtype)
        tensors = HummingWeightSchema.quant_tensor(w, layer.weight_schema, dtype)
        if i == 0:
            w_ref = layer.weight_schema.dequant_tensors(tensors)
        layer.load_from_tensors(tensors)
        layer.transform()
        layers.append(layer)
    x = torch.zeros(1, k, device="cuda", dtype=dtype)
    for layer in layers:  # the first forward JIT-compiles the kernels of all M buckets (cached per config)
        layer(x)
    torch.cuda.synchronize()
    return layers, w_ref

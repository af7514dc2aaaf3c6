"""Humming (vLLM's quantized GEMM library, package `humming`) side of the benchmark. Optional: imported lazily,
never a dependency. Layers are built as Humming's README and its test runner (humming/testing/runner.py,
prepare_weight) build them: HummingLayer(...).cuda(), HummingWeightSchema.quant_tensor (what
load_from_unquantized calls), load_from_tensors, transform() (code conversion, repack, scale layout), forward.
The reference weight is schema.dequant_tensors of the quantized tensors, the runner's weight_ref."""

from __future__ import annotations

import torch

FORMATS = {"w4a16-int4-g128": dict(dtype="int4", group_size=128),  # symmetric: no zero point
           "w3a16-int3-g128": dict(dtype="int3", group_size=128),
           "w8a16-int8-channel": dict(dtype="int8")}  # group_size 0: one scale per output channel


class HummingUnavailable(Exception):
    """Humming cannot run this format here; str() is the reason to print."""


def humming_layers(fmt: str, n: int, k: int, count: int, dtype=torch.bfloat16):
    """`count` Humming layers of random (randn * 0.02) weights -> (layers, w_ref). layers: callables
    x[M, K] -> y[M, N] (HummingLayer modules, kernels of every M bucket compiled). w_ref: layer 0's dequantized
    weight, float32 [N, K] = (code - 2^(bits-1)) * scale, scales in `dtype` as the kernel reads them."""
    if fmt not in FORMATS:
        raise HummingUnavailable(f"no Humming mapping for {fmt}")
    try:
        from humming.layer import HummingLayer
        from humming.schema import HummingWeightSchema
    except Exception as e:  # not installed, or its own dependencies (triton, cuda-bindings) missing
        raise HummingUnavailable(f"humming not importable: {type(e).__name__}: {e}") from e
    layers, w_ref = [], None
    for i in range(count):
        layer = HummingLayer(shape_n=n, shape_k=k, weight_config=dict(FORMATS[fmt]), torch_dtype=dtype).cuda()
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

"""Quickstart: describe a quantized layer, generate its kernel, and (with a GPU) run it.

Without a GPU it generates and compiles the W4A16 int4 g128 kernel for sm_90a and prints where the .cu is.
With a GPU it also builds a QuantLinear for the current device and prints the error against the float64
reference and the time per call.

    python examples/quickstart.py
"""

from __future__ import annotations

import os
import tempfile
import time

import torch

import humming_gen as hg

N, K = 4096, 4096
scheme = hg.scheme("w4a16-int4-g128")  # int4 weights, bf16 scale per 128 inputs, bf16 activations
layer_config = hg.LayerConfig(n=N, k=K, scheme=scheme)

# 1. Generate and compile for an explicit target: works on any machine (NVRTC needs no GPU).
kernel = hg.compile(layer_config, target="sm_90a", m=1)
path = kernel.save(os.path.join(tempfile.gettempdir(), f"{kernel.name}.cu"))
print(f"generated {kernel.name}")
print(f"  source:    {path} ({len(kernel.source.splitlines())} lines)")
print(f"  ptxas:     {kernel.resources}")
print(f"  launch:    {kernel.plan.threads} threads, {kernel.plan.shared_bytes} B dynamic shared memory")

if not torch.cuda.is_available():
    print("no GPU here: skipping the run (the kernel above is ready for an sm_90a device)")
    raise SystemExit(0)

# 2. Quantize a weight and run it on the current GPU; every M bucket's kernel is compiled at construction.
torch.manual_seed(0)
weight = torch.randn(N, K, device="cuda") * 0.02
layer = hg.QuantLinear.from_float(weight, scheme, dtype=torch.bfloat16)
print(layer)
for m in (1, 16, 256):
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
    y = layer(x)
    ref = hg.reference_gemm(x.double(), scheme.quantize(weight))
    err = ((y.double() - ref).norm() / ref.norm()).item()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(100):
        layer(x)
    torch.cuda.synchronize()
    print(f"M={m:4d}: relative error {err:.2e}, {(time.perf_counter() - t0) * 1e4:.1f} us per call (eager)")

"""Issue 10's group-32 case: MXFP4 weights at M = 4096 with fp8 activations per token, per group of 32 (fp32
scales) and MXFP8 (e8m0 group-32 scales), beside cuBLAS bf16; CUDA-graph us per layer, the activation
quantization included (canonical method: distinct layers rotated, median of replays)."""

from __future__ import annotations

import torch

import humming_gen as hg
from bench_dense import graph_time_us
from humming_gen.bench.timing import cold_layer_count
from humming_gen.reference import reference_gemm
from humming_gen.targets import Target

ACTIVATIONS = {"fp8 per token": hg.ActivationScheme("float8e4m3", granularity="token"),
               "fp8 group-32": hg.ActivationScheme("float8e4m3", granularity="group", group_size=32),
               "MXFP8": hg.ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0")}
M = 4096
torch.manual_seed(0)
target = Target.current()
print("| N x K | cuBLAS bf16 | " + " | ".join(ACTIVATIONS) + " |\n|---|---|" + "---|" * len(ACTIVATIONS))
for n, k in ((3072, 4096), (14336, 4096)):
    x = torch.randn(M, k, device="cuda").bfloat16()
    count = cold_layer_count(n * k * 2, target.l2_bytes, 4)
    dense = [torch.randn(n, k, device="cuda").bfloat16() * 0.02 for _ in range(count)]
    cells = [f"{graph_time_us([lambda x, w=w: x @ w.t() for w in dense], x):.1f}"]
    del dense
    for name, act in ACTIVATIONS.items():
        scheme = hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", activation=act)
        qws = [scheme.quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(4)]
        layers = [hg.QuantLinear.from_quantized(q) for q in qws]
        ref = reference_gemm(x[:64].double(), qws[0])
        err = ((layers[0](x[:64]).double() - ref).norm() / ref.norm()).item()
        t = layers[0].kernel_for(M).plan.tuning
        cells.append(f"{graph_time_us(layers, x):.1f} ({t.pipeline[:8]} {t.block_m}, err {err:.1e})")
        del qws, layers
        torch.cuda.empty_cache()
    print(f"| {n}x{k} | " + " | ".join(cells) + " |", flush=True)

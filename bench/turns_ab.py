"""A/B in one process: the 8-bit warp-specialized kernels with and without consumer warpgroups taking turns issuing
their wgmmas (compose_a8.TURNS), dense N = K = 8192 through QuantLinear (its own tunings, activation quantization
included), graph method, rounds alternating the two. Usage: python turns_ab.py [preset,...] [M,...]"""

from __future__ import annotations

import sys

import torch

import humming_gen as hg
from bench_dense import graph_time_us
from humming_gen.pipelines.warp_specialized import compose_a8

presets = (sys.argv[1] if len(sys.argv) > 1 else "w8a8-fp8-channel,w4a8-mxfp4-fp8").split(",")
ms = [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "1024,4096,8192").split(",")]
torch.manual_seed(0)
print("| format | M | turns off | turns on |")
for name in presets:
    qws = [hg.scheme(name).quantize(torch.randn(8192, 8192, device="cuda") * 0.02) for _ in range(4)]
    layers = {}
    for turns in (False, True):
        compose_a8.TURNS = turns
        layers[turns] = [hg.QuantLinear.from_quantized(q) for q in qws]
    compose_a8.TURNS = True
    for m in ms:
        x = torch.randn(m, 8192, device="cuda").bfloat16()
        times = {t: [] for t in layers}
        for _ in range(3):
            for t, ls in layers.items():
                times[t].append(graph_time_us(ls, x))
        print(f"| {name} | {m} | {min(times[False]):.1f} | {min(times[True]):.1f} |", flush=True)
    del layers
    torch.cuda.empty_cache()

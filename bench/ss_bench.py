"""8-bit weights read by wgmma from shared memory (b_operand='shared', heuristics.shared_weight_tunings) against
the default plan (standard pipeline to M = 16, warp-specialized with register weights from 17): N = K = 8192, graph
us per layer including the activation quantization. Usage: python bench/ss_bench.py [formats] [M list]"""

from __future__ import annotations

import sys

import torch

import humming_gen as hg
from humming_gen.bench.timing import graph_time_us
from humming_gen.pipelines.warp_specialized.heuristics import shared_weight_tunings

FORMATS = (sys.argv[1] if len(sys.argv) > 1 else "w8a8-fp8-channel,w8a8-int8-channel,w8a8-fp8-block128").split(",")
MS = [int(m) for m in (sys.argv[2] if len(sys.argv) > 2 else "1,16,64,256,1024,4096,8192").split(",")]
n = k = 8192
torch.manual_seed(0)
print("| format | plan | " + " | ".join(f"M={m}" for m in MS) + " |\n|---|---|" + "---|" * len(MS))
for name in FORMATS:
    qws = [hg.scheme(name).quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(4)]
    default = [hg.QuantLinear.from_quantized(q) for q in qws]
    plan = shared_weight_tunings(default[0].layer_config, default[0].target)
    shared = [hg.QuantLinear.from_quantized(q, tunings=plan) for q in qws]
    rows = {"default": [], "shared": []}
    for m in MS:
        x = torch.randn(m, k, device="cuda").bfloat16()
        for label, layers in (("default", default), ("shared", shared)):
            rows[label].append(f"{graph_time_us(layers, x):.1f}")
    for label, cells in rows.items():
        print(f"| {name} | {label} | " + " | ".join(cells) + " |", flush=True)
    del default, shared, qws
    torch.cuda.empty_cache()

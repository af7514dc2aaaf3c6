"""QuantMoE forward time (CUDA graph, us per layer) with the gated activation in torch or fused in GEMM1's
epilogue; a Qwen3-30B-A3B-sized layer (E = 128, H = 2048, I = 768, top-8), W4A16 int4 g128, random routing."""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from humming_gen.bench import ms_argument
from bench_dense import graph_time_us

E, H, I, TOP_K = 128, 2048, 768, 8
parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("ms", nargs="?", default="1,16,256,1024", type=ms_argument("ms"),
                    help="comma-separated M (default: %(default)s)")
ms = parser.parse_args().ms
torch.manual_seed(0)
scheme = hg.scheme("w4a16-int4-g128")
q13 = scheme.quantize(torch.randn(E, 2 * I, H, device="cuda") * 0.02)
q2 = scheme.quantize(torch.randn(E, H, I, device="cuda") * 0.02)
layers = {name: hg.QuantMoE.from_quantized(q13, q2, fused_activation=fused)
          for name, fused in (("torch activation", False), ("fused activation", True))}
print("| M | " + " | ".join(layers) + " |\n|---|---|---|")
for m in ms:
    x = torch.randn(m, H, device="cuda").bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(m, E, device="cuda"), -1), TOP_K, dim=-1)
    ids = ids.to(torch.int32)
    times = [graph_time_us([lambda x, layer=layer: layer(x, weights, ids)], x) for layer in layers.values()]
    print(f"| {m} | " + " | ".join(f"{t:.1f}" for t in times) + " |", flush=True)

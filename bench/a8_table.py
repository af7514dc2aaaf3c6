"""Issue 10's speed table for our kernels alone (graph µs per layer, the activation quantization included; eager
µs at M = 1 and 16), N = K = 8192, a few layers whose weights exceed the L2: a quick check between full
`humming-gen bench` runs, which add Humming and cuBLAS. Usage: python bench/a8_table.py [formats] [ms]"""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from humming_gen.bench import ms_argument
from humming_gen.bench.timing import eager_time_us, graph_time_us

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("formats", nargs="?", default="w8a8-fp8-channel,w8a8-fp8-block128,w4a8-mxfp4-fp8",
                    help="comma-separated presets (default: %(default)s)")
parser.add_argument("ms", nargs="?", default="1,16,64,256,1024,4096,8192", type=ms_argument("ms"),
                    help="comma-separated M (default: %(default)s)")
args = parser.parse_args()
formats = args.formats.split(",")
ms = args.ms
n = k = 8192
torch.manual_seed(0)
print("| format | " + " | ".join(f"M={m}" for m in ms) + " | eager M=1 | eager M=16 |")
print("|---" * (len(ms) + 3) + "|")
for name in formats:
    layers = [hg.QuantLinear.from_quantized(hg.scheme(name).quantize(torch.randn(n, k, device="cuda") * 0.02))
              for _ in range(4)]
    xs = {m: torch.randn(m, k, device="cuda").bfloat16() for m in ms}
    graph = [graph_time_us(layers, xs[m]) for m in ms]
    eager = [eager_time_us(layers, xs.get(m, torch.randn(m, k, device="cuda").bfloat16())) for m in (1, 16)]
    print(f"| {name} | " + " | ".join(f"{g:.1f}" for g in graph) + " | " + " | ".join(f"{e:.1f}" for e in eager)
          + " |", flush=True)
    del layers
    torch.cuda.empty_cache()

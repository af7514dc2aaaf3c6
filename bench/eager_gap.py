"""Eager (no graph) time per call against the CUDA-graph time at small M, per format (issue 10: within 8 us at
M = 1): the host work of a forward call (activation quantization, launches, checks) shows as the difference."""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from humming_gen.bench.timing import eager_time_us, graph_time_us

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("formats", nargs="?",
                    default="w4a16-int4-g128,w8a8-fp8-channel,w8a8-int8-channel,w8a8-fp8-block128,w4a8-mxfp4-fp8",
                    help="comma-separated presets (default: %(default)s)")
FORMATS = parser.parse_args().formats.split(",")
n = k = 8192
torch.manual_seed(0)
print("| format | M | graph us | eager us | eager - graph |\n|---|---|---|---|---|")
for name in FORMATS:
    layers = [hg.QuantLinear.from_quantized(hg.scheme(name).quantize(torch.randn(n, k, device="cuda") * 0.02))
              for _ in range(4)]
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda").bfloat16()
        g, e = graph_time_us(layers, x), eager_time_us(layers, x)
        print(f"| {name} | {m} | {g:.1f} | {e:.1f} | {e - g:+.1f} |", flush=True)
    del layers
    torch.cuda.empty_cache()

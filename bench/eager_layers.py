"""Eager M = 1 calls of 1, 2 and 4 distinct layers: the host's enqueue time per call (the loop before its final
synchronize) against the wall time per call (after it), and the graph time. Host-bound where the two agree."""

from __future__ import annotations

import argparse
import time

import torch

import humming_gen as hg
from humming_gen.bench.timing import graph_time_us

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("preset", nargs="?", default="w8a8-fp8-channel", help="the layers' preset (default: %(default)s)")
name = parser.parse_args().preset
layers = [hg.QuantLinear.from_quantized(hg.scheme(name).quantize(torch.randn(8192, 8192, device="cuda") * 0.02))
          for _ in range(4)]
x = torch.randn(1, 8192, device="cuda").bfloat16()
print(f"| {name} layers | graph us | enqueue us/call | wall us/call |\n|---|---|---|---|")
for count in (1, 2, 4):
    fns = layers[:count]
    g = graph_time_us(fns, x)
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(400):
            fns[i % count](x)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
    print(f"| {count} | {g:.1f} | {(t1 - t0) / 400 * 1e6:.1f} | {(t2 - t0) / 400 * 1e6:.1f} |", flush=True)

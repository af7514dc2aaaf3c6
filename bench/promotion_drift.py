"""How far wgmma's fp8 accumulation drifts with the promotion interval (kPromoteK: k between additions of the partial
sums into fp32 accumulators), and what the interval costs: W8A8 fp8 per-channel layers, warp-specialized kernels
with 256-k stages, promoted every 32 / 64 / 128 / 256 k (compose_a8.PROMOTE_K_FP8, which the kernels take at
composition). Error: relative Frobenius and largest element error (over max |ref|) of fp32 outputs against the
float64 product of the quantized activations and dequantized weights, so no output rounding hides the drift.
Usage: python promotion_drift.py [K,...] (timing: N = K = 8192, M = 4096, graph method)."""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from bench_dense import graph_time_us
from humming_gen.pipelines.base import TuningPlan
from humming_gen.pipelines.warp_specialized import compose_a8
from humming_gen.pipelines.warp_specialized.heuristics import restaged
from humming_gen.reference import reference_gemm

INTERVALS = (32, 64, 128, 256)
parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("ks", nargs="?", default="1024,8192,32768",
                    help="comma-separated K of the error table (default: %(default)s)")
ks = [int(v) for v in parser.parse_args().ks.split(",")]
torch.manual_seed(0)
scheme = hg.scheme("w8a8-fp8-channel")


def layer_for(qw, interval: int, **kw):
    compose_a8.PROMOTE_K_FP8 = interval
    default = hg.QuantLinear.from_quantized(qw, **kw)
    t = restaged(default.layer_config, default.target, default.tunings.for_m(4096), block_k=256, split_k=1)
    return hg.QuantLinear.from_quantized(qw, tunings=TuningPlan(((None, t),)), **kw)


print("| K | " + " | ".join(f"promote {i}" for i in INTERVALS) + " |")
for k in ks:
    qw = scheme.quantize(torch.randn(1024, k, device="cuda") * 0.02)
    x = torch.randn(512, k, device="cuda").bfloat16() + 0.5  # a common offset: partial sums grow along K
    ref = reference_gemm(x.double(), qw)
    cells = []
    for interval in INTERVALS:
        y = layer_for(qw, interval, out_dtype=torch.float32)(x).double()
        err = ((y - ref).norm() / ref.norm()).item()
        worst = ((y - ref).abs().max() / ref.abs().max()).item()
        cells.append(f"{err:.2e} / {worst:.2e}")
    print(f"| {k} | " + " | ".join(cells) + " |", flush=True)

qws = [scheme.quantize(torch.randn(8192, 8192, device="cuda") * 0.02) for _ in range(4)]
x = torch.randn(4096, 8192, device="cuda").bfloat16()
times = {i: [] for i in (128, 256)}
layers = {i: [layer_for(q, i) for q in qws] for i in times}
for _ in range(3):  # rounds alternate the candidates
    for i in times:
        times[i].append(graph_time_us(layers[i], x))
print("| N = K = 8192, M = 4096 | " + " | ".join(f"promote {i}: {min(v):.1f} us" for i, v in times.items()) + " |")
compose_a8.PROMOTE_K_FP8 = 128

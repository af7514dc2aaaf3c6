"""Activations quantized in the GEMM's loader (QuantLinear(quantize_in_gemm=True), a_load='quantize') against the
unfused path (humming_gen.quantize_activation, then the GEMM), N = K = 8192, M = 1 and 16: graph and eager (no
graph) time per call, as bench/eager_gap.py measures them (issue 10: eager within 8 us of graph at M = 1), plus
whether the fused output equals the unfused one bitwise. Usage: python bench/fused_quant.py [formats, comma-separated]
"""

from __future__ import annotations

import argparse

import attrs
import torch

import humming_gen as hg
from humming_gen.bench.timing import eager_time_us, graph_time_us
from humming_gen.pipelines.base import TuningPlan

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("formats", nargs="?", default="w8a8-fp8-channel,w8a8-int8-channel",
                    help="comma-separated presets (default: %(default)s)")
FORMATS = parser.parse_args().formats.split(",")
n = k = 8192
torch.manual_seed(0)
print("| format | M | path | graph us | eager us | eager - graph | bitwise equal |\n|---|---|---|---|---|---|---|")
for name in FORMATS:
    qws = [hg.scheme(name).quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(4)]
    paths = {"unfused": [hg.QuantLinear.from_quantized(q) for q in qws],
             "fused": [hg.QuantLinear.from_quantized(q, quantize_in_gemm=True) for q in qws]}
    # bitwise against the fused kernels' own tiles with the plain loader (the default plan's kernels differ on sm_90a)
    same_tiles = TuningPlan(tuple((m, attrs.evolve(t, a_load="cp_async")) for m, t in paths["fused"][0].tunings.buckets))
    twin = hg.QuantLinear.from_quantized(qws[0], tunings=same_tiles)
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda").bfloat16()
        equal = torch.equal(paths["fused"][0](x), twin(x))
        for path, layers in paths.items():
            g, e = graph_time_us(layers, x), eager_time_us(layers, x)
            print(f"| {name} | {m} | {path} | {g:.1f} | {e:.1f} | {e - g:+.1f} | {equal} |", flush=True)
    del paths, qws
    torch.cuda.empty_cache()

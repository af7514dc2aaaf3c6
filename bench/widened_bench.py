"""Weights widened into shared memory by the producer warpgroup (TuningConfig.b_operand='widened',
heuristics.widened_weight_tunings) against the heuristics' register kernels, in one process: N = K = 8192 layers,
CUDA graph us per layer with the activation quantization where the scheme has one, layers rotated so each reads its
weights cold, each plan timed in both orders and the faster kept; the max relative error of each plan against
float64 (dequantized weights x the activations the scheme quantizes) on the largest M.

- 16-bit activations (w4a16-*, w8a16-*): the warp-specialized buckets (from M = 17) dequantize into 16-bit panels;
- 8-bit activations with weights of at most 4 bits (w4a8-*): every bucket widens nibbles to 8-bit codes, plan
  "widened", and with the tokens on wgmma's M from --tokens-m-from rows, plan "widened, tokens on M".

    python bench/widened_bench.py [formats] [M list] [--tokens-m-from 256]
"""

from __future__ import annotations

import argparse

import attrs
import torch

import humming_gen as hg
from humming_gen.bench import ms_argument
from humming_gen.bench.timing import graph_time_us
from humming_gen.pipelines.warp_specialized.heuristics import widened_weight_tunings
from humming_gen.reference import reference_gemm

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("formats", nargs="?", default="w4a16-int4-g128,w4a16-mxfp4,w8a16-int8-channel,w4a8-mxfp4-fp8",
                    help="comma-separated presets (default: %(default)s)")
parser.add_argument("ms", nargs="?", default="64,256,1024,4096,8192", type=ms_argument("ms"),
                    help="comma-separated M (default: %(default)s)")
parser.add_argument("--tokens-m-from", type=int, default=256,
                    help="8-bit activations: smallest bucket bound of the tokens-on-M plan (default: %(default)s)")
args = parser.parse_args()
n = k = 8192
torch.manual_seed(0)
print("| format | plan | " + " | ".join(f"M={m}" for m in args.ms) + " | max rel. error |\n|---|---|"
      + "---|" * (len(args.ms) + 1))
for name in args.formats.split(","):
    qws = [hg.scheme(name).quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(3)]
    layers = {"default": [hg.QuantLinear.from_quantized(q) for q in qws]}
    cfg, target = layers["default"][0].layer_config, layers["default"][0].target
    layers["widened"] = [hg.QuantLinear.from_quantized(q, tunings=widened_weight_tunings(cfg, target)) for q in qws]
    if hg.scheme(name).activation is not None:
        tm = widened_weight_tunings(cfg, target, tokens_m_from=args.tokens_m_from)
        layers["widened, tokens on M"] = [hg.QuantLinear.from_quantized(q, tunings=tm) for q in qws]
    best = {plan: [float("inf")] * len(args.ms) for plan in layers}
    for i, m in enumerate(args.ms):
        x = torch.randn(m, k, device="cuda").bfloat16()
        for order in (list(layers), list(layers)[::-1]):  # both orders, the faster kept (the first timed runs slower)
            for plan in order:
                best[plan][i] = min(best[plan][i], graph_time_us(layers[plan], x))
    x = torch.randn(args.ms[-1], k, device="cuda").bfloat16()
    q = qws[0]
    ref = reference_gemm(x.double(), attrs.evolve(q, scheme=layers["default"][0].scheme))
    for plan, times in best.items():
        err = ((layers[plan][0](x).double() - ref).norm() / ref.norm()).item()
        print(f"| {name} | {plan} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {err:.2e} |", flush=True)
    del layers, qws
    torch.cuda.empty_cache()

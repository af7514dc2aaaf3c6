"""Plans of a dense layer with 8-bit activations on the H200 (N = K = 8192, graph us per layer including the
activation quantization): the default (warp-specialized with register weights at every M on sm_90a) and the same
with weights read from shared memory ("shared", b_operand='shared', 8-bit weights only; session 10 also timed the
standard pipeline at M <= 16, the table in heuristics/choose.py). Usage: python bench/ss_bench.py [formats] [M list]"""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from humming_gen.bench import ms_argument
from humming_gen.bench.timing import graph_time_us
from humming_gen.pipelines.warp_specialized.heuristics import shared_weight_tunings

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("formats", nargs="?", default="w8a8-fp8-channel,w8a8-int8-channel,w8a8-fp8-block128",
                    help="comma-separated presets (default: %(default)s)")
parser.add_argument("ms", nargs="?", default="1,16,64,256,1024,4096,8192", type=ms_argument("ms"),
                    help="comma-separated M (default: %(default)s)")
args = parser.parse_args()
FORMATS = args.formats.split(",")
MS = args.ms
n = k = 8192
torch.manual_seed(0)
print("| format | plan | " + " | ".join(f"M={m}" for m in MS) + " |\n|---|---|" + "---|" * len(MS))
for name in FORMATS:
    qws = [hg.scheme(name).quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(4)]
    layers = {"default": [hg.QuantLinear.from_quantized(q) for q in qws]}
    base = layers["default"][0]
    if base.scheme.weight.bits == 8:
        tunings = shared_weight_tunings(base.layer_config, base.target)
        layers["shared"] = [hg.QuantLinear.from_quantized(q, tunings=tunings) for q in qws]
    rows = {plan: [] for plan in layers}
    for m in MS:
        x = torch.randn(m, k, device="cuda").bfloat16()
        for plan in rows:
            rows[plan].append(f"{graph_time_us(layers[plan], x):.1f}")
    for plan, cells in rows.items():
        print(f"| {name} | {plan} | " + " | ".join(cells) + " |", flush=True)
    del layers, qws
    torch.cuda.empty_cache()

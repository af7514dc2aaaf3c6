"""What the consumers' fence before a stage release costs (ptx/loads_fence, components.RELEASE_FENCE) in the
8-bit warp-specialized kernels: the default plans of N = K = 8192 layers with the fence, and the same plans built
without it (the kernels that raced: scales read after their release, tests/cpu/test_stage_release.py), in one
process. CUDA graph us per layer with the activation quantization, layers rotated so each reads its weights cold,
both orders alternated and the faster kept; the unfenced kernels' outputs are also compared run to run (bitwise).

    python bench/release_fence_bench.py [formats] [M list]
"""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from humming_gen.bench import ms_argument
from humming_gen.bench.timing import alternating_graph_times
from humming_gen.pipelines.warp_specialized import components

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("formats", nargs="?", default="w8a8-fp8-block128,w4a8-mxfp4-fp8,w8a8-mxfp8",
                    help="comma-separated presets (default: %(default)s)")
parser.add_argument("ms", nargs="?", default="64,256,1024,4096", type=ms_argument("ms"),
                    help="comma-separated M (default: %(default)s)")
args = parser.parse_args()
n = k = 8192
torch.manual_seed(0)
print("| format | release | " + " | ".join(f"M={m}" for m in args.ms) + " | repeatable at the largest M |\n|---|---|"
      + "---|" * (len(args.ms) + 1))
for name in args.formats.split(","):
    qws = [hg.scheme(name).quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(4)]
    fenced = [hg.QuantLinear.from_quantized(q) for q in qws]
    components.RELEASE_FENCE = False
    try:
        unfenced = [hg.QuantLinear.from_quantized(q) for q in qws]
    finally:
        components.RELEASE_FENCE = True
    best: dict[str, list[float]] = {"fenced": [], "unfenced": []}
    for m in args.ms:
        x = torch.randn(m, k, device="cuda").bfloat16()
        t = alternating_graph_times([fenced, unfenced], x, rounds=3)
        best["fenced"].append(t[0])
        best["unfenced"].append(t[1])
    x = torch.randn(args.ms[-1], k, device="cuda").bfloat16()
    for plan, layers in (("fenced", fenced), ("unfenced", unfenced)):
        outs = [layers[0](x) for _ in range(5)]
        same = all(torch.equal(outs[0], o) for o in outs)
        print(f"| {name} | {plan} | " + " | ".join(f"{t:.1f}" for t in best[plan]) + f" | {same} |", flush=True)
    del fenced, unfenced, qws
    torch.cuda.empty_cache()

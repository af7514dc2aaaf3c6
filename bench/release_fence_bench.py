"""How the 8-bit warp-specialized consumers release a ring stage, and what each way costs: the default plans of
N = K = 8192 layers built under each variant of the module switches in
humming_gen.pipelines.warp_specialized.components, each variant in a process of its own (variants built in one
process were ranked by build order: on the H200 the same kernel measured up to 8 % apart at M = 4096 between the
first and later allocations of the same weights, docs/DEVELOPING.md). CUDA graph us per layer with the activation
quantization, layers rotated so each reads its weights cold, best of three; every variant's outputs are also
compared run to run at the largest M (bitwise).

Variants (`--variants`, comma-separated):
  default   the switches as shipped
  immediate a stage released right after its last promotion (DEFERRED_RELEASE off)
  proxy     the consumers' proxy fence after every stage wait, bulk-copied codes too (PROXY_FENCE_AFTER_BULK on)
  before    both of the above: the release of d607a6d (not its fenced folded MXFP4 kernels or its e8m0 decode,
            which no switch brings back)
  unfenced  no fence before a release (RELEASE_FENCE off; the kernels that raced, tests/cpu/test_stage_release.py)

    python bench/release_fence_bench.py [formats] [M list] [--variants default,before,...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch

import humming_gen as hg
from humming_gen.bench import ms_argument
from humming_gen.bench.timing import alternating_graph_times
from humming_gen.pipelines.warp_specialized import components

VARIANTS = {
    "default": {},
    "immediate": {"DEFERRED_RELEASE": False},
    "proxy": {"PROXY_FENCE_AFTER_BULK": True},
    "before": {"DEFERRED_RELEASE": False, "PROXY_FENCE_AFTER_BULK": True},
    "unfenced": {"RELEASE_FENCE": False, "DEFERRED_RELEASE": False, "PROXY_FENCE_AFTER_BULK": True},
}

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("formats", nargs="?", default="w8a8-fp8-block128,w4a8-mxfp4-fp8,w8a8-mxfp8",
                    help="comma-separated presets (default: %(default)s)")
parser.add_argument("ms", nargs="?", default="64,256,1024,4096", type=ms_argument("ms"),
                    help="comma-separated M (default: %(default)s)")
parser.add_argument("--variants", default="default,before,unfenced",
                    help=f"comma-separated, of {', '.join(VARIANTS)} (default: %(default)s)")
parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)  # (one variant's child process)
args = parser.parse_args()
variants = args.variants.split(",")
unknown = [v for v in variants if v not in VARIANTS]
if unknown:
    parser.error(f"--variants: unknown {unknown}; allowed: {list(VARIANTS)}")
if not args.in_process:
    print("| format | variant | " + " | ".join(f"M={m}" for m in args.ms) + " | repeatable at the largest M |\n"
          "|---|---|" + "---|" * (len(args.ms) + 1), flush=True)
    for v in variants:  # one process each: every variant's weights land in the same allocations
        child = subprocess.run([sys.executable, __file__, args.formats, ",".join(map(str, args.ms)), "--variants", v,
                                "--in-process"], capture_output=True, text=True)
        rows = [line for line in child.stdout.splitlines() if line.startswith("| ")]
        print("\n".join(rows) if child.returncode == 0 else f"| {v} | failed: {child.stderr.strip()[-300:]} |",
              flush=True)
    sys.exit(0)


def build(qws: list, settings: dict) -> list:
    saved = {name: getattr(components, name) for name in settings}
    for name, value in settings.items():
        setattr(components, name, value)
    try:
        return [hg.QuantLinear.from_quantized(q) for q in qws]
    finally:
        for name, value in saved.items():
            setattr(components, name, value)


n = k = 8192
torch.manual_seed(0)
for name in args.formats.split(","):
    qws = [hg.scheme(name).quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(4)]
    layers = {v: build(qws, VARIANTS[v]) for v in variants}
    best: dict[str, list[float]] = {v: [] for v in variants}
    for m in args.ms:
        x = torch.randn(m, k, device="cuda").bfloat16()
        for v, t in zip(variants, alternating_graph_times([layers[v] for v in variants], x, rounds=3)):
            best[v].append(t)
    x = torch.randn(args.ms[-1], k, device="cuda").bfloat16()
    for v in variants:
        outs = [layers[v][0](x) for _ in range(5)]
        same = all(torch.equal(outs[0], o) for o in outs)
        print(f"| {name} | {v} | " + " | ".join(f"{t:.1f}" for t in best[v]) + f" | {same} |", flush=True)
    del layers, qws
    torch.cuda.empty_cache()

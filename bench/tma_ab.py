"""A/B in one process: dense warp-specialized W4A16 layers and grouped MoE GEMMs with the activations by TMA
(heuristics.TMA_ACTIVATIONS, the default) or by the producer threads' cp.async; and whole W4A16 QuantMoE layers whose
grouped-down buckets take GEMM1 into the expert windows (humming_gen.layer.moe.WINDOWED_GEMM1, off by default) or
GEMM1 per assignment and the compaction copy. Graph method (humming_gen.bench.timing.graph_time_us), layers rotated, us per layer, each pair timed in both
orders and the faster of each kept (a GPU that has run hot for a while clocks lower); the dense rows also report the
max relative error of each path against float64.

    python bench/tma_ab.py [--shapes 8192x8192,...] [--m 64,...] [--moe-m 1024,4096] [--models deepseek,...]
"""

from __future__ import annotations

import argparse
import sys

import torch

import humming_gen as hg
import humming_gen.layer.moe as moe_module
from humming_gen.bench.timing import graph_time_us
from humming_gen.pipelines.warp_specialized import heuristics

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from moe_bench import MODELS, make_batch, quantize_experts  # noqa: E402


def dense_layers(n: int, k: int, tma: bool, count: int) -> tuple[list, torch.Tensor]:
    own = heuristics.TMA_ACTIVATIONS
    heuristics.TMA_ACTIVATIONS = tma
    try:
        torch.manual_seed(n + k)
        weights = [torch.randn(n, k, device="cuda") * 0.02 for _ in range(count)]
        return [hg.QuantLinear.from_float(w, hg.scheme("w4a16-int4-g128")) for w in weights], weights[0]
    finally:
        heuristics.TMA_ACTIVATIONS = own


def dense(shapes: list[tuple[int, int]], ms: list[int]) -> None:
    print("| N x K | M | cp.async | TMA | ratio | rel err cp.async / TMA |\n|---|---|---|---|---|---|", flush=True)
    for n, k in shapes:
        count = max(2, min(8, (1 << 29) // (n * k)))
        paths = {tma: dense_layers(n, k, tma, count) for tma in (False, True)}
        w = paths[True][1]
        deq = hg.scheme("w4a16-int4-g128").quantize(w).dequantize(torch.float64)
        for m in ms:
            x = torch.randn(m, k, device="cuda").bfloat16()
            ref = x.double() @ deq.T
            times, errors = {False: [], True: []}, {}
            for order in ((False, True), (True, False)):  # both orders: later runs of a hot GPU clock lower
                for tma in order:
                    layers = paths[tma][0]
                    times[tma].append(graph_time_us([lambda a, lay=lay: lay(a) for lay in layers], x))
            for tma, (layers, _) in paths.items():
                out = layers[0](x)
                errors[tma] = ((out.double() - ref).abs().max() / ref.abs().max()).item()
            times = {tma: min(v) for tma, v in times.items()}
            print(f"| {n} x {k} | {m} | {times[False]:.1f} | {times[True]:.1f} | {times[False] / times[True]:.3f} | "
                  f"{errors[False]:.1e} / {errors[True]:.1e} |", flush=True)
        del paths
        torch.cuda.empty_cache()


def large_tiles(tiles: list[int], ms: list[int], n: int = 8192, k: int = 8192) -> None:
    """The open-ended bucket's token tile (heuristics.LARGE_M_BLOCK) with TMA activations."""
    print("\n| N x K | M | " + " | ".join(f"tile {t}" for t in tiles) + " |\n|---|---|" + "---|" * len(tiles),
          flush=True)
    own = heuristics.LARGE_M_BLOCK
    built = {}
    try:
        for t in tiles:
            heuristics.LARGE_M_BLOCK = t
            built[t] = dense_layers(n, k, True, 4)[0]
    finally:
        heuristics.LARGE_M_BLOCK = own
    for m in ms:
        x = torch.randn(m, k, device="cuda").bfloat16()
        cells = [f"{graph_time_us([lambda a, lay=lay: lay(a) for lay in built[t]], x):.1f}" for t in tiles]
        print(f"| {n} x {k} | {m} | " + " | ".join(cells) + " |", flush=True)


def moe(models: list[str], ms: list[int], fmt: str = "w4a16-int4-g128", count: int = 2) -> None:
    print("\n| model | M | GEMM1 + compaction | windowed GEMM1 | ratio |\n|---|---|---|---|---|", flush=True)
    for name in models:
        spec = MODELS[name]
        layers = []
        own = moe_module.WINDOWED_GEMM1
        moe_module.WINDOWED_GEMM1 = True  # build the windowed GEMM1s (off by default); _windowed picks per run
        try:
            for i in range(count):
                torch.manual_seed(1000 * i + 7)
                q13 = quantize_experts(hg.scheme(fmt), spec.experts, 2 * spec.intermediate, spec.hidden)
                q2 = quantize_experts(hg.scheme(fmt), spec.experts, spec.hidden, spec.intermediate)
                layers.append(hg.QuantMoE.from_quantized(q13, q2, activation=spec.activation,
                                                         gate_up_layout=spec.gate_up_layout))
        finally:
            moe_module.WINDOWED_GEMM1 = own
        windowed = layers[0]._windowed
        for m in ms:
            b = make_batch(spec, m, seed=m)
            times = {False: [], True: []}
            for order in ((False, True), (True, False)):
                for window in order:
                    for layer in layers:
                        layer._windowed = windowed if window else (False,) * len(windowed)
                    fns = [lambda a, lay=lay: lay(a, b.weights, b.ids) for lay in layers]
                    times[window].append(graph_time_us(fns, b.x))
            times = {window: min(v) for window, v in times.items()}
            bucket = layers[0].bucket_for(m, spec.top_k)
            note = "" if windowed[bucket] else " (bucket not windowed)"
            print(f"| {name} | {m} | {times[False]:.1f} | {times[True]:.1f}{note} | {times[False] / times[True]:.3f} |",
                  flush=True)
        for layer in layers:
            layer._windowed = windowed
        del layers
        torch.cuda.empty_cache()


def grouped(models: list[str], m: int, fmt: str = "w4a16-int4-g128") -> None:
    """grouped_moe_gemm (contiguous rows) with the windows read by TMA or by cp.async, both orders, the faster kept."""
    print("\n| model | GEMM | M | cp.async | TMA | ratio |\n|---|---|---|---|---|---|", flush=True)
    own = heuristics.TMA_ACTIVATIONS
    for name in models:
        spec = MODELS[name]
        torch.manual_seed(7)
        q13 = quantize_experts(hg.scheme(fmt), spec.experts, 2 * spec.intermediate, spec.hidden)
        q2 = quantize_experts(hg.scheme(fmt), spec.experts, spec.hidden, spec.intermediate)
        b = make_batch(spec, m, seed=m)
        layers = {}
        for tma in (False, True):
            heuristics.TMA_ACTIVATIONS = tma
            try:
                layers[tma] = hg.QuantMoE.from_quantized(q13, q2, activation=spec.activation,
                                                         gate_up_layout=spec.gate_up_layout, fused_activation=False)
                for gemm, a in (("w13", b.a13), ("w2", b.a2)):
                    hg.grouped_moe_gemm(a, layers[tma], gemm, b.offsets, layout="grouped_contiguous")  # compile
            finally:
                heuristics.TMA_ACTIVATIONS = own
        for gemm, a in (("w13", b.a13), ("w2", b.a2)):
            times = {False: [], True: []}
            for order in ((False, True), (True, False)):
                for tma in order:
                    fn = lambda x, lay=layers[tma], g=gemm: hg.grouped_moe_gemm(x, lay, g, b.offsets,  # noqa: E731
                                                                               layout="grouped_contiguous")
                    times[tma].append(graph_time_us([fn], a))
            t = {tma: min(v) for tma, v in times.items()}
            print(f"| {name} | {gemm} | {m} | {t[False]:.1f} | {t[True]:.1f} | {t[False] / t[True]:.3f} |", flush=True)
        del layers
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="8192x8192,4096x4096,14336x4096,4096x14336")
    ap.add_argument("--m", default="64,128,256,1024,4096,8192")
    ap.add_argument("--moe-m", default="1024,4096")
    ap.add_argument("--models", default="deepseek,qwen3,gptoss")
    ap.add_argument("--large-tiles", default="", help="open-ended bucket token tiles to compare, e.g. 128,176")
    ap.add_argument("--large-m", default="8192")
    ap.add_argument("--grouped-models", default="deepseek,qwen3", help="grouped GEMMs, TMA against cp.async")
    ap.add_argument("--grouped-m", type=int, default=4096)
    args = ap.parse_args()
    if args.large_tiles:
        large_tiles([int(v) for v in args.large_tiles.split(",")], [int(v) for v in args.large_m.split(",")])
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    if shapes:
        dense(shapes, [int(v) for v in args.m.split(",")])
    if args.grouped_models:
        grouped(args.grouped_models.split(","), args.grouped_m)
    if args.models:
        moe(args.models.split(","), [int(v) for v in args.moe_m.split(",")])


if __name__ == "__main__":
    main()

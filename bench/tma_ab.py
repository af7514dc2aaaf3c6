"""A/B in one process: dense warp-specialized W4A16 layers and grouped MoE GEMMs with the activations by TMA
(heuristics.TMA_ACTIVATIONS, the default) or by the producer threads' cp.async. Graph method
(humming_gen.bench.timing.graph_time_us), layers rotated, us per layer, each pair timed in both orders and the faster
of each kept (a GPU that has run hot for a while clocks lower); the dense rows also report the max relative error of
each path against float64. The open-ended bucket's token tile: --large-tiles.

    python bench/tma_ab.py [--shapes 8192x8192,...] [--m 64,...] [--grouped-models deepseek,qwen3]
"""

from __future__ import annotations

import argparse
import sys

import torch

import humming_gen as hg
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="8192x8192,4096x4096,14336x4096,4096x14336")
    ap.add_argument("--m", default="64,128,256,1024,4096,8192")
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


if __name__ == "__main__":
    main()

"""A/B in one process: the warp-specialized 16-bit kernels with the activations by TMA (heuristics.TMA_ACTIVATIONS,
the default) or by the producer threads' cp.async, timed by the graph method (humming_gen.bench.timing.graph_time_us),
layers rotated, us per layer; each variant timed in both orders and the faster kept (a GPU that has run hot for a
while clocks lower).

- dense W4A16 layers, with the max relative error of each path against float64;
- MoE (W4A16 int4 g128, the models' shapes): the grouped-contiguous gate-up GEMM (expert windows: one TMA box per
  panel, or cp.async) and the whole QuantMoE layer (its grouped down GEMM from 64 rows per expert on); the indexed
  GEMMs gather rows by cp.async either way;
- the open-ended bucket's token tile: --large-tiles.

    python bench/tma_ab.py [--shapes 8192x8192,...] [--m 64,...] [--moe-models deepseek,qwen3] [--moe-m 1024,4096]
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch

import humming_gen as hg
from humming_gen.bench.timing import graph_time_us
from humming_gen.layer.moe import expert_weight
from humming_gen.pipelines.warp_specialized import heuristics

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from moe_bench import MODELS, make_batch, quantize_experts  # noqa: E402

SCHEME = "w4a16-int4-g128"
VARIANTS = {"cp.async": False, "TMA": True}


@contextlib.contextmanager
def tma_activations(on: bool):
    """heuristics.TMA_ACTIVATIONS while layers are built and their kernels compiled."""
    own = heuristics.TMA_ACTIVATIONS
    heuristics.TMA_ACTIVATIONS = on
    try:
        yield
    finally:
        heuristics.TMA_ACTIVATIONS = own


def best_of_both_orders(calls: dict[str, list], x) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in calls}
    for order in (list(calls), list(reversed(calls))):
        for name in order:
            times[name].append(graph_time_us(calls[name], x))
    return {name: min(v) for name, v in times.items()}


def dense(shapes: list[tuple[int, int]], ms: list[int]) -> None:
    names = list(VARIANTS)
    print("| N x K | M | " + " | ".join(names) + " | rel err " + " / ".join(names) + " |\n|---|---|"
          + "---|" * (len(names) + 1), flush=True)
    for n, k in shapes:
        count = max(2, min(8, (1 << 29) // (n * k)))
        torch.manual_seed(n + k)
        quantized = [hg.scheme(SCHEME).quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(count)]
        deq = quantized[0].dequantize(torch.float64)
        layers = {}
        for name, on in VARIANTS.items():
            with tma_activations(on):  # (a QuantLinear compiles every bucket's kernel when built)
                layers[name] = [hg.QuantLinear.from_quantized(q) for q in quantized]
        for m in ms:
            x = torch.randn(m, k, device="cuda").bfloat16()
            ref = x.double() @ deq.T
            errors = {name: ((ls[0](x).double() - ref).abs().max() / ref.abs().max()).item()
                      for name, ls in layers.items()}
            times = best_of_both_orders({name: [lambda a, lay=lay: lay(a) for lay in ls]
                                         for name, ls in layers.items()}, x)
            print(f"| {n} x {k} | {m} | " + " | ".join(f"{times[v]:.1f}" for v in names) + " | "
                  + " / ".join(f"{errors[v]:.1e}" for v in names) + " |", flush=True)
        del layers, quantized
        torch.cuda.empty_cache()


def moe(models: list[str], ms: list[int], count: int = 2) -> None:
    names = list(VARIANTS)
    print("\n| model | M | GEMM | " + " | ".join(names) + " | rel err " + " / ".join(names) + " |\n|---|---|---|"
          + "---|" * (len(names) + 1), flush=True)
    scheme = hg.scheme(SCHEME)
    for model in models:
        spec = MODELS[model]
        torch.manual_seed(0)
        q13 = [quantize_experts(scheme, spec.experts, 2 * spec.intermediate, spec.hidden) for _ in range(count)]
        q2 = [quantize_experts(scheme, spec.experts, spec.hidden, spec.intermediate) for _ in range(count)]
        layers = {}
        for name, on in VARIANTS.items():
            with tma_activations(on):
                layers[name] = ([hg.QuantMoE.from_quantized(a, c, fused_activation=False) for a, c in zip(q13, q2)],
                                [hg.QuantMoE.from_quantized(a, c, activation=spec.activation,
                                                            gate_up_layout=spec.gate_up_layout)
                                 for a, c in zip(q13, q2)])
        for m in ms:
            b = make_batch(spec, m, seed=m)
            out = torch.empty(m * spec.top_k, 2 * spec.intermediate, dtype=torch.bfloat16, device="cuda")

            def grouped(a, layer):
                return hg.grouped_moe_gemm(a, layer, "w13", b.offsets, layout="grouped_contiguous", out=out)

            errors = {}
            for name, on in VARIANTS.items():
                unfused, whole = layers[name]
                with tma_activations(on):  # (grouped kernels and the layer's buckets compile at their first call)
                    errors[name] = _grouped_error(grouped(b.a13, unfused[0]), b, q13[0])
                    for layer in whole:
                        layer(b.x, b.weights, b.ids)
            cells = {
                "gate-up grouped": best_of_both_orders(
                    {name: [lambda a, lay=lay: grouped(a, lay) for lay in ls[0]] for name, ls in layers.items()},
                    b.a13),
                "whole layer": best_of_both_orders(
                    {name: [lambda a, lay=lay: lay(a, b.weights, b.ids) for lay in ls[1]]
                     for name, ls in layers.items()}, b.x),
            }
            for gemm, times in cells.items():
                err = " / ".join(f"{errors[v]:.1e}" for v in names) if gemm == "gate-up grouped" else ""
                print(f"| {model} | {m} | {gemm} | " + " | ".join(f"{times[v]:.1f}" for v in names) + f" | {err} |",
                      flush=True)
        del layers, q13, q2
        torch.cuda.empty_cache()


def _grouped_error(y: torch.Tensor, b, q13, experts: int = 4) -> float:
    """Max relative error of the grouped gate-up rows of the first `experts` experts against float64."""
    worst = 0.0
    for e in range(experts):
        lo, hi = int(b.offsets[e]), int(b.offsets[e + 1])
        if hi > lo:
            ref = b.a13[lo:hi].double() @ expert_weight(q13, e).dequantize(torch.float64).T
            worst = max(worst, ((y[lo:hi].double() - ref).abs().max() / ref.abs().max()).item())
    return worst


def large_tiles(tiles: list[int], ms: list[int], n: int = 8192, k: int = 8192) -> None:
    """The open-ended bucket's token tile (heuristics.LARGE_M_BLOCK) with TMA activations."""
    print("\n| N x K | M | " + " | ".join(f"tile {t}" for t in tiles) + " |\n|---|---|" + "---|" * len(tiles),
          flush=True)
    own = heuristics.LARGE_M_BLOCK
    built = {}
    torch.manual_seed(0)
    weights = [torch.randn(n, k, device="cuda") * 0.02 for _ in range(4)]
    try:
        for t in tiles:
            heuristics.LARGE_M_BLOCK = t
            built[t] = [hg.QuantLinear.from_float(w, hg.scheme(SCHEME)) for w in weights]
    finally:
        heuristics.LARGE_M_BLOCK = own
    for m in ms:
        x = torch.randn(m, k, device="cuda").bfloat16()
        cells = [f"{graph_time_us([lambda a, lay=lay: lay(a) for lay in built[t]], x):.1f}" for t in tiles]
        print(f"| {n} x {k} | {m} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="8192x8192,14336x4096")
    ap.add_argument("--m", default="256,1024,4096,8192")
    ap.add_argument("--large-tiles", default="", help="open-ended bucket token tiles to compare, e.g. 128,176")
    ap.add_argument("--large-m", default="8192")
    ap.add_argument("--moe-models", default="deepseek,qwen3", help="MoE gate-up GEMMs and layers, TMA against cp.async")
    ap.add_argument("--moe-m", default="1024,4096")
    args = ap.parse_args()
    if args.large_tiles:
        large_tiles([int(v) for v in args.large_tiles.split(",")], [int(v) for v in args.large_m.split(",")])
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    if shapes:
        dense(shapes, [int(v) for v in args.m.split(",")])
    if args.moe_models:
        moe(args.moe_models.split(","), [int(v) for v in args.moe_m.split(",")])


if __name__ == "__main__":
    main()

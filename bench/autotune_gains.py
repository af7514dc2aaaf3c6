"""What autotuning gains over the heuristics, and what batch invariance costs (issue 12's closing tables).

Part 1, per shape (W4A16 int4 g128 by default): humming_gen.autotune over the M list (store=False, so the user's
tuning store is left alone), then a fresh measurement of QuantLinears with the heuristic plan against the tuned plan
(the benchmark method; the two alternate over `--rounds`, best round), so the gain is not the tuning run's own.
Part 2: batch-invariant layers (standard pipeline, and warp-specialized where the GPU has it) against the default
at M = 1, 64, 1024. Prints markdown tables and writes autotune_gains.json.

    python bench/autotune_gains.py [--shapes 4096x4096,...] [--m 1,16,64,256,1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os

import torch

import humming_gen as hg
from humming_gen.bench import parse_ms, parse_shapes, scheme_for
from humming_gen.bench.timing import cold_layer_count, graph_time_us
from humming_gen.heuristics import choose_tunings, heuristic_tunings
from humming_gen.pipelines.base import TuningPlan

SHAPES = "4096x4096,14336x4096,4096x14336,2880x2880,576x7168"
BI_SHAPES = "4096x4096,8192x8192"


def layers_of(fmt: str, n: int, k: int, plans: dict, min_layers: int) -> dict:
    """name -> `count` QuantLinears of shared random weights, one list per plan (None: the layer's own choice)."""
    target = hg.Target.current()
    count = cold_layer_count(n * k * scheme_for(fmt).weight.bits // 8, target.l2_bytes, min_layers)
    qws = [scheme_for(fmt).quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(count)]
    return {name: [hg.QuantLinear.from_quantized(q, **kwargs) for q in qws] for name, kwargs in plans.items()}


def alternate(layer_sets: dict, ms: list[int], k: int, rounds: int) -> dict:
    """name -> {m: best-round graph us}, the sets timed in turn each round."""
    times = {name: {} for name in layer_sets}
    for m in ms:
        x = torch.randn(m, k, device="cuda").bfloat16()
        for r in range(rounds):
            names = list(layer_sets)
            for name in names[r % len(names):] + names[:r % len(names)]:
                us = graph_time_us(layer_sets[name], x)
                times[name][m] = min(us, times[name].get(m, float("inf")))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="w4a16-int4-g128")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--m", default="1,16,64,256,1024")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4, help="distinct layers per timing at least")
    ap.add_argument("--bi-shapes", default=BI_SHAPES, help="shapes of the batch-invariance cost table")
    ap.add_argument("--bi-m", default="1,64,1024")
    ap.add_argument("--skip-tune", action="store_true", help="only the batch-invariance table")
    ap.add_argument("--out", default="out")
    args = ap.parse_args()
    ms, bi_ms = parse_ms("--m", args.m), parse_ms("--bi-m", args.bi_m)
    torch.manual_seed(0)
    target = hg.Target.current()
    report = {"gpu": torch.cuda.get_device_name(), "format": args.format, "tune": [], "batch_invariant": []}
    lines = []
    if not args.skip_tune:
        lines += [f"\nAutotune gains, {args.format}, CUDA-graph us per layer ({report['gpu']})",
                  "| N x K | M | heuristic | tuned | gain | tuned bucket's tuning |", "|---|---|---|---|---|---|"]
        for n, k in parse_shapes("--shapes", args.shapes):
            layer = hg.LayerConfig(n=n, k=k, scheme=scheme_for(args.format))
            results = hg.autotune(layer, ms, rounds=args.rounds, store=False, min_layers=args.layers)
            winners = {r["m_max"]: r["winner"] for r in results}
            heuristic = heuristic_tunings(layer, target)
            tuned = TuningPlan(tuple((m_max, winners.get(m_max, t)) for m_max, t in heuristic.buckets))
            sets = layers_of(args.format, n, k, {"heuristic": dict(tunings=heuristic), "tuned": dict(tunings=tuned)},
                             args.layers)
            times = alternate(sets, ms, k, args.rounds)
            del sets
            torch.cuda.empty_cache()
            for m in ms:
                h, t = times["heuristic"][m], times["tuned"][m]
                tuning = tuned.for_m(m)
                changed = "(heuristic)" if tuning == heuristic.for_m(m) else tuning.summary()[8:]
                lines.append(f"| {n}x{k} | {m} | {h:.1f} | {t:.1f} | x{h / t:.3f} | {changed} |")
                report["tune"].append({"shape": f"{n}x{k}", "m": m, "heuristic_us": h, "tuned_us": t,
                                       "tuning": tuning.to_dict(), "changed": tuning != heuristic.for_m(m),
                                       "autotune_gain": next(r["gain"] for r in results if m in r["ms"])})
            print("\n".join(lines[-len(ms):]), flush=True)
    lines += [f"\nBatch invariance cost, {args.format}, CUDA-graph us per layer",
              "| N x K | M | default | batch-invariant standard | cost | batch-invariant warp-specialized | cost |",
              "|---|---|---|---|---|---|---|"]
    for n, k in parse_shapes("--bi-shapes", args.bi_shapes):
        layer = hg.LayerConfig(n=n, k=k, scheme=scheme_for(args.format))
        plans = {"default": dict(tunings=heuristic_tunings(layer, target)),
                 "standard": dict(batch_invariant=True)}
        try:
            plans["warp_specialized"] = dict(batch_invariant=True, tunings=choose_tunings(
                layer, target, batch_invariant=True, pipeline="warp_specialized"))
        except ValueError as e:
            print(f"batch-invariant warp-specialized: not on {target.name} ({str(e).splitlines()[-1]})")
        sets = layers_of(args.format, n, k, plans, args.layers)
        times = alternate(sets, bi_ms, k, args.rounds)
        del sets
        torch.cuda.empty_cache()
        for m in bi_ms:
            d, s = times["default"][m], times["standard"][m]
            w = times.get("warp_specialized", {}).get(m)
            ws = f"{w:.1f} | x{w / d:.2f}" if w else "- | -"
            lines.append(f"| {n}x{k} | {m} | {d:.1f} | {s:.1f} | x{s / d:.2f} | {ws} |")
            report["batch_invariant"].append({"shape": f"{n}x{k}", "m": m, "default_us": d, "standard_us": s,
                                              "warp_specialized_us": w})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "autotune_gains.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

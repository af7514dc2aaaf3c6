"""Sweep of split-K and token tile per (shape, M) for the warp-specialized pipeline, beside the heuristics' choice and
the standard pipeline's tuning for that M; canonical graph timing, candidates alternating in rounds.
Usage: python bench/split_sweep.py [--shapes 576x7168,2880x2880] [--ms 64,128,256,1024] [--out DIR]"""

from __future__ import annotations

import argparse
import json
import math
import os

import attrs
import torch

import humming_gen as hg
from bench_dense import graph_time_us
from humming_gen.codegen import compose
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build_many
from humming_gen.pipelines.base import TuningPlan
from humming_gen.pipelines.warp_specialized.compose import shared_memory
from humming_gen.pipelines.warp_specialized.heuristics import tuning_for

p = argparse.ArgumentParser()
p.add_argument("--shapes", default="576x7168,2880x2880,4096x4096,14336x4096,4096x14336,8192x8192")
p.add_argument("--ms", default="64,128,256,1024")
p.add_argument("--out", default=os.environ.get("OUT", "."))
args = p.parse_args()
target = hg.get_target("sm_90a") if not torch.cuda.is_available() else hg.Target.current()
scheme = hg.scheme("w4a16-int4-g128")


def candidates(layer: hg.LayerConfig, m: int) -> dict:
    """The heuristics' tuning, the standard pipeline's, and token tiles 64 / 128 with splits around the one that
    fills the SMs once."""
    k_tiles = math.ceil(layer.k / 128)
    cands = {"heuristic": choose_tunings(layer, target).for_m(m),
             "standard": choose_tunings(layer, target, pipeline="standard").for_m(m)}
    for bm in sorted({min(128, math.ceil(m / 8) * 8), 64}):
        base = attrs.evolve(tuning_for(layer, target, m), block_m=bm, split_k=1)
        base = attrs.evolve(base, stages=max(s for s in range(2, 9)
                                             if shared_memory(layer, attrs.evolve(base, stages=s)).fits(target)))
        tiles = math.ceil(layer.n / 256) * math.ceil(m / bm)
        s0 = max(1, round(target.sm_count / tiles))
        for s in sorted({max(1, s0 // 2), s0, min(16, s0 * 2), min(16, s0 * 3)}):
            if s <= k_tiles // 2:
                cands[f"ws bm{bm} k{s}"] = attrs.evolve(base, split_k=s)
    return cands


shapes = [tuple(map(int, shape.split("x"))) for shape in args.shapes.split(",")]
ms = list(map(int, args.ms.split(",")))
# compile every candidate at once (in parallel) so the layers below find them in the cache
plans = []
for n, k in shapes:
    layer = hg.LayerConfig(n=n, k=k, scheme=scheme)
    for m in ms:
        for t in candidates(layer, m).values():
            try:
                plans.append(compose(layer, hg.ComputeConfig(), t, target))
            except Exception:
                pass
build_many(plans)

results = []
for n, k in shapes:
    shape = f"{n}x{k}"
    layer = hg.LayerConfig(n=n, k=k, scheme=scheme)
    qws = [scheme.quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(max(2, min(8, 2**27 // (n * k))))]
    for m in ms:
        cands = candidates(layer, m)
        built = {}
        for name, t in cands.items():
            try:
                built[name] = [hg.QuantLinear.from_quantized(q, tunings=TuningPlan(((None, t),))) for q in qws]
            except Exception as e:  # a candidate the shape cannot take
                print(f"{shape} m={m} {name}: {type(e).__name__}: {str(e).splitlines()[-1]}")
        x = torch.randn(m, k, device="cuda").bfloat16()
        times = {name: [] for name in built}
        for _ in range(3):
            for name, layers in built.items():
                times[name].append(graph_time_us(layers, x))
        row = {name: round(min(v), 2) for name, v in times.items()}
        best = min(row, key=row.get)
        print(f"{shape} m={m}: best {best} {row[best]}  " + "  ".join(f"{a}={b}" for a, b in row.items()), flush=True)
        results.append(dict(shape=shape, m=m, times=row, tunings={a: cands[a].summary() for a in built}))
        del built
        torch.cuda.empty_cache()
with open(os.path.join(args.out, "split_sweep.json"), "w") as f:
    json.dump(results, f, indent=1)

"""Pipelines benchmark (issue 8's tables), canonical method of bench_dense.py: 8 distinct layers in one CUDA graph,
median of 20 replays, us per layer; numerics against the float64 reference on the same run.

Part 1, N = K = 8192, formats x M: humming_gen with its heuristics (standard below 64 tokens, warp-specialized
from 64 on sm_90a), humming_gen forced to the standard pipeline, cuBLAS bf16 and Humming when importable.
Part 2, W4A16 int4 g128 over N x K shapes x M: humming_gen, cuBLAS bf16, Humming.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch

import humming_gen as hg
from bench_dense import COPY_GBPS, FORMATS, graph_time_us  # bench/ is sys.path[0] when run as a script
from humming_gen.heuristics import choose_tunings
from humming_gen.reference import reference_gemm
from humming_side import HummingUnavailable, humming_layers

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (2880, 2880), (576, 7168), (8192, 8192))
SHAPE_MS = (1, 16, 32, 64, 128, 256, 1024, 4096)
L2_COLD_BYTES = 180e6  # the layers of one shape hold ~3x the H200's 60 MB L2 of int4 weights (cold reads)


def layers_for_shape(n: int, k: int, minimum: int) -> int:
    """Distinct layers so that their int4 weights are several times the L2 (docs/BENCHMARKS.md, step 1)."""
    return min(64, max(minimum, math.ceil(L2_COLD_BYTES / (n * k / 2))))


def layers_for(name, n, k, count, pipeline=None):
    scheme = hg.QuantScheme(**FORMATS[name])
    qws = [scheme.quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(count)]
    layers = []
    for q in qws:
        layer_config = hg.LayerConfig(n=n, k=k, scheme=scheme)
        tunings = choose_tunings(layer_config, hg.Target.current(), pipeline=pipeline) if pipeline else None
        layers.append(hg.QuantLinear.from_quantized(q, tunings=tunings))
    return qws, layers


def time_rows(rows, impl, layers, xs, qw0=None, w_ref=None, **extra):
    for m, x in xs.items():
        y = layers[0](x)
        if qw0 is not None:
            ref = reference_gemm(x.double(), qw0)
        else:
            ref = x.double() @ w_ref.t()
        err = ((y.double() - ref).norm() / ref.norm()).item()
        row = {"impl": impl, "m": m, "graph_us": graph_time_us(layers, x), "rel_err": err, **extra}
        if hasattr(layers[0], "kernel_for"):
            row["tuning"] = layers[0].kernel_for(m).plan.tuning.summary()
        rows.append(row)
        print(f"{impl} {extra} m={m}: {row['graph_us']:.1f} us err {err:.1e}", flush=True)


def cublas_rows(rows, n, k, count, xs, **extra):
    dense = [torch.randn(n, k, device="cuda").bfloat16() * 0.02 for _ in range(count)]
    fns = [lambda x, w=w: x @ w.t() for w in dense]
    for m, x in xs.items():
        rows.append({"impl": "cublas-bf16", "m": m, "graph_us": graph_time_us(fns, x), **extra})
    del dense, fns


def humming(rows, name, n, k, count, xs, **extra):
    try:
        layers, w_ref = humming_layers(name, n, k, count)
    except Exception as e:
        reason = str(e) if isinstance(e, HummingUnavailable) else f"{type(e).__name__}: {e}"
        print(f"humming {name} {extra}: skipped ({' '.join(reason.split())[:300]})", flush=True)
        return
    for m, x in xs.items():
        try:
            time_rows(rows, "humming", layers, {m: x}, w_ref=w_ref.double(), **extra)
        except Exception as e:  # its heuristics fail on some shapes: record the failure
            rows.append({"impl": "humming", "m": m, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}",
                         "format": name, **extra})
            print(f"humming {name} {extra} m={m}: {type(e).__name__}", flush=True)
    del layers
    torch.cuda.empty_cache()


def table(rows, key_fields, ms, title):
    groups = list(dict.fromkeys(tuple(r.get(f) for f in key_fields) for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    print(f"\n{title}")
    for g in groups:
        print(f"{dict(zip(key_fields, g))}")
        print("| M | " + " | ".join(impls) + " |")
        print("|---|" + "---|" * len(impls))
        for m in ms:
            cells = []
            for impl in impls:
                r = next((r for r in rows if r["impl"] == impl and r["m"] == m
                          and tuple(r.get(f) for f in key_fields) in (g, g[:1] + (None,) * (len(g) - 1))), None)
                cells.append("-" if r is None else ("err" if "error" in r else f"{r['graph_us']:.1f}"))
            print(f"| {m} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--m", default="1,16,32,64,128,256,1024,4096,8192")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--standard", default="w4a16-int4-g128", help="formats also timed on the standard pipeline")
    ap.add_argument("--shapes", action="store_true", help="part 2: the shape sweep")
    ap.add_argument("--no-part1", action="store_true", help="skip part 1 (N = K = 8192)")
    ap.add_argument("--shape-list", default=None, help="part 2 shapes as NxK,NxK (default: all of SHAPES)")
    ap.add_argument("--no-humming", action="store_true", help="skip Humming")
    args = ap.parse_args()
    torch.manual_seed(0)
    L = args.layers
    results = {"gpu": torch.cuda.get_device_name(), "part1": [], "part2": []}
    ms = [int(v) for v in args.m.split(",")]
    n = k = 8192
    xs = {m: torch.randn(m, k, device="cuda").bfloat16() for m in ms}
    if not args.no_part1:
        cublas_rows(results["part1"], n, k, L, xs)
    for name in ([] if args.no_part1 else args.formats.split(",")):
        qws, layers = layers_for(name, n, k, L)
        limit = layers[0].weight.nbytes() / (COPY_GBPS * 1e3)
        time_rows(results["part1"], "humming_gen", layers, xs, qw0=qws[0], format=name, bytes_limit_us=limit)
        del layers
        if name in args.standard.split(","):
            qws, layers = layers_for(name, n, k, L, pipeline="standard")
            time_rows(results["part1"], "humming_gen-standard", layers, {m: x for m, x in xs.items() if m >= 32},
                      qw0=qws[0], format=name)
            del layers
        del qws
        torch.cuda.empty_cache()
        humming(results["part1"], name, n, k, L, xs, format=name)
    os.makedirs(args.out, exist_ok=True)
    if args.shapes:
        shapes = SHAPES if not args.shape_list else [tuple(int(v) for v in s.split("x"))
                                                      for s in args.shape_list.split(",")]
        for n, k in shapes:
            count = layers_for_shape(n, k, L)
            xs = {m: torch.randn(m, k, device="cuda").bfloat16() for m in SHAPE_MS}
            cublas_rows(results["part2"], n, k, count, xs, shape=f"{n}x{k}")
            qws, layers = layers_for("w4a16-int4-g128", n, k, count)
            time_rows(results["part2"], "humming_gen", layers, xs, qw0=qws[0], shape=f"{n}x{k}")
            del layers, qws
            torch.cuda.empty_cache()
            if not args.no_humming:
                humming(results["part2"], "w4a16-int4-g128", n, k, count, xs, shape=f"{n}x{k}")
    with open(os.path.join(args.out, "bench_pipelines" + ("_shapes" if args.no_part1 else "") + ".json"), "w") as f:
        json.dump(results, f, indent=1)
    if not args.no_part1:
        table(results["part1"], ("format",), ms, "Part 1: N = K = 8192, CUDA-graph us per layer")
    if args.shapes:
        table(results["part2"], ("shape",), list(SHAPE_MS), "Part 2: W4A16 int4 g128 by shape")


if __name__ == "__main__":
    main()

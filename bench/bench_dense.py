"""Dense benchmark with eager times and standard-pipeline tuning sweeps; the timing is humming_gen.bench.timing's
(`humming-gen bench` is the canonical benchmark). Method of docs/BENCHMARKS.md: L distinct layers (weights several times the L2), the L
forwards captured in one CUDA graph, replayed 20x with CUDA events, median / L; eager wall time per call;
numerics against the float64 reference on the same run. Compares cuBLAS bf16 (x @ w.t()) in the same process
and Humming's HummingLayer when the `humming` package is importable (optional, never a dependency)."""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm
from humming_gen.bench.humming import HummingUnavailable, humming_layers
from humming_gen.bench.report import DEVICE_LIMITS
from humming_gen.bench.timing import eager_time_us, graph_time_us  # noqa: F401 (the sweep scripts import them here)

COPY_GBPS = DEVICE_LIMITS["H200"]["memory_gbps"]  # measured H200 device-to-device copy (docs/BENCHMARKS.md)
FORMATS = {"w4a16-int4-g128": dict(weight="int4", group_size=128),
           "w3a16-int3-g128": dict(weight="int3", group_size=128),
           "w8a16-int8-channel": dict(weight="int8")}
EXTRA_FORMATS = {"w4a16-e0m3-g128": dict(weight="float4e0m3", group_size=128),  # sign-magnitude, +-7
                 "w4a16-int4-g100": dict(weight="int4", group_size=100),  # a group size that is not 16k
                 "w4a16-int4-g7": dict(weight="int4", group_size=7)}


def weight_bytes(layer) -> int:
    return layer.weight.nbytes()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--m", default="1,16,64,256,1024,4096,8192")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--sweep", action="store_true", help="also time tuning variants at small M")
    ap.add_argument("--humming", default=",".join(FORMATS),
                    help="formats to time with Humming too, when its package is importable ('' for none)")
    args = ap.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    n, k, L = args.n, args.k, args.layers
    torch.manual_seed(0)
    results = {"n": n, "k": k, "layers": L, "gpu": torch.cuda.get_device_name(), "rows": []}
    xs = {m: torch.randn(m, k, device="cuda").bfloat16() for m in ms}

    dense = [torch.randn(n, k, device="cuda").bfloat16() * 0.02 for _ in range(L)]
    cublas = [lambda x, w=w: x @ w.t() for w in dense]
    for m in ms:
        results["rows"].append({"impl": "cublas-bf16", "m": m, "graph_us": graph_time_us(cublas, xs[m]),
                                "eager_us": eager_time_us(cublas, xs[m]) if m == 1 else None})
    del dense, cublas

    for name in args.formats.split(","):
        scheme = hg.QuantScheme(**{**FORMATS, **EXTRA_FORMATS}[name])
        t0 = time.perf_counter()
        qws = [scheme.quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(L)]
        layers = [hg.QuantLinear.from_quantized(q) for q in qws]
        build_s = time.perf_counter() - t0
        limit_us = weight_bytes(layers[0]) / (COPY_GBPS * 1e3)
        for m in ms:
            x = xs[m]
            y = layers[0](x)
            ref = reference_gemm(x.double(), qws[0])
            err = ((y.double() - ref).norm() / ref.norm()).item()
            row = {"impl": f"humming_gen-{name}", "m": m, "graph_us": graph_time_us(layers, x),
                   "eager_us": eager_time_us(layers, x) if m in (1, 16) else None, "rel_err": err,
                   "bytes_limit_us": limit_us, "tuning": layers[0].kernel_for(m).plan.tuning.summary(),
                   "build_s": build_s}
            results["rows"].append(row)
            print(f"{name} m={m}: {row['graph_us']:.1f} us (limit {limit_us:.1f}), err {err:.1e}", flush=True)
        if args.sweep:
            sweep(results, name, qws, xs)
        del layers, qws
        torch.cuda.empty_cache()
        if name in args.humming.split(","):
            humming_rows(results, name, n, k, L, xs)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_dense.json"), "w") as f:
        json.dump(results, f, indent=1)
    print_table(results, ms)


def humming_rows(results, name, n, k, L, xs) -> None:
    """Rows "humming-<name>" from Humming's HummingLayer, timed and checked as ours; any failure is printed."""
    layers = w_ref = None
    try:
        t0 = time.perf_counter()
        layers, w_ref = humming_layers(name, n, k, L)
        build_s, w_ref = time.perf_counter() - t0, w_ref.double()
        for m, x in xs.items():
            ref = x.double() @ w_ref.t()
            err = ((layers[0](x).double() - ref).norm() / ref.norm()).item()
            row = {"impl": f"humming-{name}", "m": m, "graph_us": graph_time_us(layers, x),
                   "eager_us": eager_time_us(layers, x) if m in (1, 16) else None, "rel_err": err,
                   "build_s": build_s}
            results["rows"].append(row)
            print(f"humming {name} m={m}: {row['graph_us']:.1f} us, err {err:.1e}", flush=True)
    except Exception as e:  # Humming is optional: report and go on
        reason = " ".join(str(e).split())[:400]
        reason = reason if isinstance(e, HummingUnavailable) else f"{type(e).__name__}: {reason}"
        print(f"humming: skipped ({name}: {reason})", flush=True)
    del layers, w_ref
    torch.cuda.empty_cache()


def _tile(bm: int, bk: int, wm: int, wk: int, split: int, stages: int = 4, ctas: int = 1) -> dict:
    """A TuningConfig of the standard pipeline in the layer's shared weight layout (block_n 128, 2 n warps)."""
    return dict(block_m=bm, block_n=128, warps_n=2, block_k=bk, warps_m=wm, warps_k=wk, stages=stages,
                split_k=split, ctas_per_sm=ctas)


# (M, candidate tunings); each candidate runs as a one-bucket layer, the first of each M is the current heuristic's.
SWEEP = (
    (1, [_tile(8, 256, 1, 4, 4, 3, 2), _tile(8, 256, 1, 4, 2), _tile(8, 256, 1, 4, 4, 4, 2)]),
    (16, [_tile(16, 256, 1, 4, 2), _tile(16, 256, 1, 4, 4, 3, 2)]),
    (64, [_tile(32, 256, 1, 4, 1), _tile(64, 128, 1, 2, 2), _tile(64, 128, 2, 2, 2)]),
    (256, [_tile(64, 128, 1, 2, 1), _tile(128, 128, 2, 2, 1)]),
)
# Other formats: the small-M choice between one and two CTAs per SM.
SWEEP_OTHER = ((1, [_tile(8, 256, 1, 4, 2), _tile(8, 256, 1, 4, 4, 3, 2)]),
               (16, [_tile(16, 256, 1, 4, 2), _tile(16, 256, 1, 4, 4, 3, 2)]))


def sweep(results, name, qws, xs, rounds: int = 2) -> None:
    """Time one-bucket layers built from each candidate tuning. Candidates of one M are timed in turn, `rounds`
    times over, so that clock drift (e.g. after the large-M runs) shows as round-to-round spread, not as a
    difference between candidates."""
    from humming_gen.config import TuningConfig
    from humming_gen.heuristics import TuningPlan

    for m, candidates in SWEEP if name == "w4a16-int4-g128" else SWEEP_OTHER:
        if m not in xs:
            continue
        built = []
        for fields in candidates:
            try:
                plan = TuningPlan(((None, TuningConfig(**fields)),))
                built.append((fields, [hg.QuantLinear.from_quantized(q, tunings=plan) for q in qws]))
            except Exception as e:  # a candidate may not fit (shared memory, layout)
                print(f"sweep m={m} {fields}: {type(e).__name__}: {str(e).splitlines()[-1]}")
        times = {i: [] for i in range(len(built))}
        for _ in range(rounds):
            for i, (fields, layers) in enumerate(built):
                times[i].append(graph_time_us(layers, xs[m]))
        for i, (fields, _) in enumerate(built):
            t = min(times[i])
            results.setdefault("sweep", []).append({"format": name, "m": m, **fields, "graph_us": t,
                                                    "rounds_us": times[i]})
            tiles = f"{fields['block_m']}x128x{fields['block_k']} w{fields['warps_m']}x2x{fields['warps_k']} " \
                    f"s{fields['stages']} k{fields['split_k']} c{fields['ctas_per_sm']}"
            rounds_text = ", ".join(f"{v:.1f}" for v in times[i])
            print(f"sweep {name} m={m} {tiles}: {t:.1f} us (rounds {rounds_text})", flush=True)
        del built
        torch.cuda.empty_cache()


def print_table(results, ms) -> None:
    impls = list(dict.fromkeys(r["impl"] for r in results["rows"]))
    print(f"\nDense N={results['n']} K={results['k']}, {results['layers']} layers, CUDA-graph us per layer "
          f"({results['gpu']})")
    print("| M | " + " | ".join(impls) + " |")
    print("|---|" + "---|" * len(impls))
    for m in ms:
        cells = []
        for impl in impls:
            r = next((r for r in results["rows"] if r["impl"] == impl and r["m"] == m), None)
            cells.append("-" if r is None else f"{r['graph_us']:.1f}")
        print(f"| {m} | " + " | ".join(cells) + " |")
    print("eager us/call at M=1: " + ", ".join(f"{r['impl']} {r['eager_us']:.1f}" for r in results["rows"]
                                                if r["m"] == 1 and r.get("eager_us")))
    worst = {impl: max(r.get("rel_err") or 0 for r in results["rows"] if r["impl"] == impl) for impl in impls}
    print("max rel err: " + ", ".join(f"{impl} {e:.1e}" for impl, e in worst.items() if impl != "cublas-bf16"))


if __name__ == "__main__":
    main()

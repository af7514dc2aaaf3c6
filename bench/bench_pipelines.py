"""Pipelines benchmark (issue 8's tables) through `humming_gen.bench` (the implementation of `humming-gen bench`):
distinct cold layers in one CUDA graph, median of 20 replays, us per layer, numerics against the float64 reference.

Part 1, N = K = 8192, formats x M: humming_gen with its heuristics, humming_gen on the standard pipeline only
(--standard formats), cuBLAS bf16 and Humming when importable. Part 2 (--shapes), W4A16 int4 g128 over N x K shapes.
"""

from __future__ import annotations

import argparse
import os

from humming_gen.bench import DEFAULT_FORMATS, parse_formats, parse_ms, parse_shapes
from humming_gen.bench.report import format_table, plot_results, write_json
from humming_gen.bench.run import run_benchmark

SHAPES = "4096x4096,14336x4096,4096x14336,2880x2880,576x7168,8192x8192"
SHAPE_MS = "1,16,32,64,128,256,1024,4096"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--m", default="1,16,32,64,128,256,1024,4096,8192")
    ap.add_argument("--formats", default=",".join(DEFAULT_FORMATS))
    ap.add_argument("--standard", default="w4a16-int4-g128", help="formats also timed on the standard pipeline")
    ap.add_argument("--shapes", action="store_true", help="part 2: the shape sweep")
    ap.add_argument("--no-part1", action="store_true", help="skip part 1 (N = K = 8192)")
    ap.add_argument("--shape-list", default=SHAPES, help="part 2 shapes as NxK,NxK")
    ap.add_argument("--no-humming", action="store_true", help="skip Humming")
    args = ap.parse_args()
    standard = parse_formats("--standard", args.standard) if args.standard else []
    parts = []
    if not args.no_part1:
        parts.append(("part1", run_benchmark(parse_formats("--formats", args.formats), [(8192, 8192)],
                                             parse_ms("--m", args.m), min_layers=args.layers,
                                             humming=not args.no_humming, standard=standard)))
    if args.shapes:
        parts.append(("part2", run_benchmark(["w4a16-int4-g128"], parse_shapes("--shape-list", args.shape_list),
                                             parse_ms("--m", SHAPE_MS), min_layers=args.layers,
                                             humming=not args.no_humming)))
    for name, results in parts:
        write_json(results, os.path.join(args.out, f"bench_pipelines_{name}.json"))
        try:
            plot_results(results, os.path.join(args.out, f"bench_pipelines_{name}"))
        except ImportError:
            pass  # the tables are the result; plots only where matplotlib is installed
    for name, results in parts:
        print(f"\n{name}")
        print(format_table(results))


if __name__ == "__main__":
    main()

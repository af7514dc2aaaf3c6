"""Token-tile sweep of the warp-specialized indexed MoE GEMMs (issue 11): the whole QuantMoE forward (routing, both
GEMMs, activation, top-k sum) with every bucket from 32 rows per expert on forced to one token tile, beside the
heuristics' own tiles. Graph method (humming_gen.bench.timing.graph_time_us), 2 layers alternating (each GEMM's
weights are several times the L2), uniformly random routing.

    python bench/moe_tile_sweep.py [--models qwen3,deepseek] [--formats w4a16-int4-g128,w4a8-mxfp4-fp8]
                                   [--m 512,1024,2048,4096] [--tiles 64,128]
"""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from humming_gen.bench.timing import graph_time_us
from humming_gen.pipelines.warp_specialized import heuristics

MODELS = {"qwen3": (128, 8, 2048, 768), "deepseek": (256, 8, 7168, 256)}  # experts, top-k, hidden, intermediate


def build(model: str, fmt: str, tile: int | None, seed: int) -> hg.QuantMoE:
    e, _, h, i = MODELS[model]
    own = heuristics.MOE_BUCKETS
    if tile is not None:
        heuristics.MOE_BUCKETS = ((None, tile),)
    try:
        g = torch.Generator(device="cuda").manual_seed(seed)
        w13 = torch.randn(e, 2 * i, h, device="cuda", generator=g) * 0.02
        w2 = torch.randn(e, h, i, device="cuda", generator=g) * 0.02
        return hg.QuantMoE.from_float(w13, w2, hg.scheme(fmt))
    finally:
        heuristics.MOE_BUCKETS = own


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen3,deepseek")
    ap.add_argument("--formats", default="w4a16-int4-g128,w4a8-mxfp4-fp8")
    ap.add_argument("--m", default="512,1024,2048,4096")
    ap.add_argument("--tiles", default="64,128")
    args = ap.parse_args()
    tiles: list[int | None] = [None] + [int(t) for t in args.tiles.split(",")]
    print("| model | format | M | rows per expert | " + " | ".join("heuristics" if t is None else f"tile {t}"
                                                             for t in tiles) + " |")
    print("|---" * (4 + len(tiles)) + "|")
    for model in args.models.split(","):
        e, top_k, h, _ = MODELS[model]
        for fmt in args.formats.split(","):
            layers = {t: [build(model, fmt, t, seed) for seed in range(2)] for t in tiles}
            for m in (int(v) for v in args.m.split(",")):
                x = torch.randn(m, h, device="cuda").bfloat16()
                weights, ids = torch.topk(torch.softmax(torch.randn(m, e, device="cuda"), -1), top_k, dim=-1)
                ids = ids.to(torch.int32)
                cells = []
                for t in tiles:
                    fns = [lambda x, layer=layer: layer(x, weights, ids) for layer in layers[t]]
                    own = layers[t][0].block_m(m, top_k)
                    cells.append(f"{graph_time_us(fns, x):.1f}" + (f" ({own})" if t is None else ""))
                print(f"| {model} | {fmt} | {m} | {m * top_k / e:.0f} | " + " | ".join(cells) + " |", flush=True)
            del layers
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

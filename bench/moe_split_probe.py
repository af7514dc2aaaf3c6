"""Sweep of the split-K bucket's tuning (split_k, CTAs per SM, stages) for the standard pipeline's indexed MoE GEMMs
at a few tokens (issue 11): DeepSeek-V3 per-rank shapes (gate-up N = 512, K = 7168; down N = 7168, K = 256, top-8),
each variant composed, compiled and bound to the same layers' packed weights as the heuristic's own first bucket.
Graph method (humming_gen.bench.timing.graph_time_us): L = 4 layers of E = 64 experts per timing (the 8-64 experts a
batch of 1-8 tokens reads are, over 4 layers, above the 50 MB L2), one fixed uniformly random routing per M.

    python bench/moe_split_probe.py [--formats w8a8-fp8-block128,w4a16-int4-g128] [--m 1,2,4]
"""

from __future__ import annotations

import argparse

import attrs
import torch

import humming_gen as hg
from humming_gen.bench.timing import graph_time_us
from humming_gen.codegen import ComposeError, compose
from humming_gen.kernel import build_many
from humming_gen.moe import moe_align

E, TOP_K, H, I, LAYERS = 64, 8, 7168, 256, 4
GATE_UP = [(s, c, st) for s in (1, 2, 4, 7, 14) for c, st in ((1, 4), (2, 3))]
DOWN = [(1, 1, 4), (1, 1, 2), (1, 2, 2), (1, 2, 3), (1, 3, 2)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--formats", default="w8a8-fp8-block128,w4a8-mxfp4-fp8,w4a16-int4-g128,w8a8-fp8-channel")
    p.add_argument("--m", default="1,2,4")
    args = p.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    rows = []
    for fmt in args.formats.split(","):
        torch.manual_seed(0)
        layers = [hg.QuantMoE.from_float(torch.randn(E, 2 * I, H, device="cuda") * 0.02,
                                         torch.randn(E, H, I, device="cuda") * 0.02, hg.scheme(fmt),
                                         fused_activation=False) for _ in range(LAYERS)]
        first = layers[0]
        for index, (weight, variants) in enumerate((("w13", GATE_UP), ("w2", DOWN))):
            own = first._kernels[0][index].plan
            plans, names = [], []
            for split, ctas, stages in variants:
                tuning = attrs.evolve(own.tuning, split_k=split, ctas_per_sm=ctas, stages=stages)
                try:
                    plans.append(compose(own.layer, own.compute, tuning, own.target))
                    names.append(f"split {split:2d} ctas {ctas} stages {stages}")
                except (ComposeError, ValueError) as e:
                    print(f"{fmt} {weight} split {split} ctas {ctas} stages {stages}: {' '.join(str(e).split())[:120]}")
            kernels = build_many(plans)
            most = max(ms) * TOP_K
            for m in ms:
                ids = torch.topk(torch.randn(m, E, device="cuda"), TOP_K, dim=-1).indices.to(torch.int32)
                routing = moe_align(ids, E, own.tuning.block_m)
                x = torch.randn(m, H if weight == "w13" else I, device="cuda").bfloat16()
                n = 2 * I if weight == "w13" else H
                out = torch.empty(m * TOP_K, n, device="cuda", dtype=torch.bfloat16)
                tw = torch.rand(m * TOP_K, device="cuda") if weight == "w2" else None
                top = TOP_K if weight == "w13" else 1
                if weight == "w2":
                    x = torch.randn(m * TOP_K, I, device="cuda").bfloat16()
                a, a_scale = first.gemm_input(x, index)
                own_t = (own.tuning.split_k, own.tuning.ctas_per_sm, own.tuning.stages)
                for name, kernel in zip(names, kernels):
                    launchers = [kernel.bind(layer.w13 if index == 0 else layer.w2,
                                             layer.bias13 if index == 0 else layer.bias2, layer.device, most)
                                 for layer in layers]
                    fns = [lambda _x, l=l: l.moe(a, out, routing, top, tw, a_scale=a_scale) for l in launchers]
                    us = graph_time_us(fns, x)  # per call: one layer's GEMM
                    t = kernel.plan.tuning
                    mark = " (heuristic)" if (t.split_k, t.ctas_per_sm, t.stages) == own_t else ""
                    rows.append((fmt, weight, m, name + mark, us))
                    print(f"{fmt} {weight} M={m} {name}{mark}: {us:.1f} us", flush=True)
        del layers, first
        torch.cuda.empty_cache()
    print("| format | GEMM | M | variant | us |\n|---|---|---|---|---|")
    for fmt, weight, m, name, us in rows:
        print(f"| {fmt} | {weight} | {m} | {name} | {us:.1f} |")


if __name__ == "__main__":
    main()

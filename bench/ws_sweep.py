"""Sweep of warp-specialized tunings (one-bucket layers), canonical graph timing; candidates alternate in rounds."""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from bench_dense import graph_time_us
from humming_gen.config import TuningConfig
from humming_gen.pipelines.base import TuningPlan


def ws(bm, bk=128, split=1, stages=4, wg=2):
    return TuningConfig(pipeline="warp_specialized", mma="wgmma", block_m=bm, block_n=256, block_k=bk, warps_m=1,
                        warps_n=4 * wg, warps_k=1, a_load="cp_async", b_load="tma", scale_load="tma",
                        split_k=split, stages=stages)


CANDIDATES = {
    8192: [ws(128, 128, 1, 4), ws(176, 128, 1, 3), ws(160, 128, 1, 3), ws(176, 64, 1, 5)],
    4096: [ws(128, 128, 1, 4), ws(176, 128, 1, 3), ws(160, 128, 1, 3), ws(144, 128, 1, 3), ws(176, 64, 1, 5)],
    1024: [ws(128, 128, 1, 4), ws(176, 128, 1, 3), ws(160, 128, 1, 3), ws(128, 64, 1, 6)],
    256: [ws(128, 128, 2, 4), ws(128, 128, 1, 4), ws(96, 128, 2, 4), ws(64, 128, 4, 6)],
    128: [ws(128, 128, 4, 4), ws(128, 128, 2, 4), ws(64, 128, 4, 6), ws(64, 128, 2, 6)],
    64: [ws(64, 128, 4, 6), ws(64, 64, 4, 8), ws(64, 128, 3, 6), ws(64, 128, 4, 6, wg=1)],
}

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("weight", nargs="?", default="int4", help="the weight dtype, group 128 (default: %(default)s)")
args = parser.parse_args()
torch.manual_seed(0)
n = k = 8192
scheme = hg.QuantScheme(weight=args.weight, group_size=128)
qws = [scheme.quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(8)]
for m, cands in CANDIDATES.items():
    x = torch.randn(m, k, device="cuda").bfloat16()
    built = []
    for t in cands:
        try:
            built.append((t, [hg.QuantLinear.from_quantized(q, tunings=TuningPlan(((None, t),))) for q in qws]))
        except Exception as e:
            print(f"m={m} {t.summary()}: {type(e).__name__}: {str(e).splitlines()[-1]}")
    times = {i: [] for i in range(len(built))}
    for _ in range(2):
        for i, (t, layers) in enumerate(built):
            times[i].append(graph_time_us(layers, x))
    for i, (t, _) in enumerate(built):
        print(f"m={m} {t.block_m}x{t.block_n}x{t.block_k} s{t.stages} k{t.split_k}: {min(times[i]):.1f} us", flush=True)
    del built
    torch.cuda.empty_cache()

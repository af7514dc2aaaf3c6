"""Where an eager MoE forward at a few tokens spends its time on the host: the wall time per call of a pipelined
loop (as bench/moe_bench.py's eager column) and of the same loop with a sync after every call, the torch profiler's
ops by self CPU time (a cudaStreamSynchronize or cudaMemcpy there would serialise host and GPU), and cProfile's
costliest Python functions. Companion of bench/eager_profile.py (dense layers).

    python bench/moe_eager_profile.py [--models deepseek,qwen3] [--formats w8a8-fp8-block128,...] [--m 1]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import humming_gen as hg

MODELS = {"deepseek": (256, 8, 7168, 256), "qwen3": (128, 8, 2048, 768)}  # experts, top-k, hidden, intermediate
CALLS = 200


def per_call_us(fn, calls: int, sync_each: bool) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
        if sync_each:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="deepseek,qwen3")
    ap.add_argument("--formats", default="w8a8-fp8-block128,w4a8-mxfp4-fp8,w4a16-int4-g128")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--tables", action="store_true", help="print the profiler and cProfile tables")
    args = ap.parse_args()
    torch.manual_seed(0)
    print("| model | format | pipelined us / call | synced us / call |\n|---|---|---|---|", flush=True)
    for model in args.models.split(","):
        e, top_k, h, i = MODELS[model]
        x = torch.randn(args.m, h, device="cuda").bfloat16()
        weights, ids = torch.topk(torch.softmax(torch.randn(args.m, e, device="cuda"), -1), top_k, dim=-1)
        for fmt in args.formats.split(","):
            try:
                moe = hg.QuantMoE.from_float(torch.randn(e, 2 * i, h, device="cuda") * 0.02,
                                             torch.randn(e, h, i, device="cuda") * 0.02, hg.scheme(fmt))
            except Exception as err:  # a format the layer refuses on this device
                print(f"| {model} | {fmt} | {type(err).__name__}: {err} | |")
                continue

            def call(moe=moe):
                return moe(x, weights, ids)

            for _ in range(20):
                call()
            pipelined = min(per_call_us(call, CALLS, False) for _ in range(3))
            synced = min(per_call_us(call, CALLS, True) for _ in range(3))
            print(f"| {model} | {fmt} | {pipelined:.1f} | {synced:.1f} |", flush=True)
            if not args.tables:
                continue
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(CALLS):
                    call()
                torch.cuda.synchronize()
            print(f"\n=== {model} {fmt}: torch profiler, {CALLS} eager calls at M = {args.m}")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=16, max_name_column_width=60))
            cp = cProfile.Profile()
            cp.enable()
            for _ in range(CALLS):
                call()
            torch.cuda.synchronize()
            cp.disable()
            print(f"=== {model} {fmt}: cProfile, {CALLS} eager calls")
            pstats.Stats(cp, stream=sys.stdout).sort_stats("tottime").print_stats(16)
            del moe
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Where an eager MoE forward at a few tokens spends its time on the host: the wall time per call of a pipelined
loop (humming_gen.bench.timing.eager_time_us, as bench/moe_bench.py's eager column) and of the same loop with a sync
after every call; with --tables, the torch profiler's ops by self CPU time (a cudaStreamSynchronize or cudaMemcpy
there would serialise host and GPU) and cProfile's costliest Python functions (timing.print_host_profiles).
Companion of bench/eager_profile.py (dense layers).

    python bench/moe_eager_profile.py [--models deepseek,qwen3] [--formats w8a8-fp8-block128,...] [--m 1]
"""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from humming_gen.bench.timing import eager_time_us, print_host_profiles

MODELS = {"deepseek": (256, 8, 7168, 256), "qwen3": (128, 8, 2048, 768)}  # experts, top-k, hidden, intermediate
CALLS = 200


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

            pipelined = eager_time_us([lambda _: call()], x, calls=CALLS)
            synced = eager_time_us([lambda _: call()], x, calls=CALLS, sync_each=True)
            print(f"| {model} | {fmt} | {pipelined:.1f} | {synced:.1f} |", flush=True)
            if args.tables:
                print_host_profiles(call, CALLS, f"{model} {fmt}, M = {args.m}")
            del moe
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

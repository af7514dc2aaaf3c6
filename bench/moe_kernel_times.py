"""Per-kernel GPU times (torch profiler) of one indexed down GEMM call, `humming_gen.moe_gemm(..., "w2")`, the
activation quantization included: which kernel a cell's time goes to. DeepSeek-V3 per-rank shapes by default.

Usage: python bench/moe_kernel_times.py M scheme[,scheme...]   (env SHAPE="E,top_k,H,I", default 256,8,7168,256)
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile

import humming_gen as hg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("m", nargs="?", type=int, default=4096, help="tokens (default: %(default)s)")
    parser.add_argument("schemes", nargs="?", default="w8a8-fp8-channel",
                        help="comma-separated presets (default: %(default)s)")
    args = parser.parse_args()
    m, schemes = args.m, args.schemes.split(",")
    e, top_k, h, i = (int(v) for v in os.environ.get("SHAPE", "256,8,7168,256").split(","))
    torch.manual_seed(0)
    for scheme in schemes:
        moe = hg.QuantMoE.from_float(torch.randn(e, 2 * i, h, device="cuda") * 0.02,
                                     torch.randn(e, h, i, device="cuda") * 0.02, hg.scheme(scheme))
        ids = torch.topk(torch.randn(m, e, device="cuda"), top_k, dim=-1).indices.to(torch.int32)
        weights = torch.rand(m * top_k, device="cuda")
        block_m = moe.block_m(m, top_k)
        routing = hg.moe_align(ids, e, block_m)
        act = torch.randn(m * top_k, i, device="cuda").bfloat16()
        out = torch.empty(m * top_k, h, device="cuda", dtype=torch.bfloat16)

        def call():
            hg.moe_gemm(act, moe, "w2", routing.sorted_ids, routing.expert_ids, routing.num_tokens_post_pad,
                        top_k=1, block_m=block_m, topk_weights=weights, out=out)

        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                call()
            torch.cuda.synchronize()
        print(f"== {scheme} M={m} E={e} top_k={top_k} H={h} I={i} block_m={block_m}")
        for ev in prof.key_averages():
            total = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0) or 0
            if total > 0:
                print(f"  {ev.key[:110]:110s} calls={ev.count} avg_us={total / ev.count:.1f}")
        del moe
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

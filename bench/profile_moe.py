"""A few forwards of one MoE layer for Nsight Compute (`ncu -k regex:gemm --launch-skip 4 --launch-count 2 python3
bench/profile_moe.py --m 1024`): Qwen3-30B-A3B's shape by default (E = 128, top-k 8, H = 2048, I = 768), uniformly
random routing. The third forward's two GEMMs are the ones to profile (the first two compile and warm up)."""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--scheme", default="w4a8-mxfp4-fp8")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=768)
    args = ap.parse_args()
    torch.manual_seed(0)
    e, h, i = args.experts, args.hidden, args.intermediate
    moe = hg.QuantMoE.from_float(torch.randn(e, 2 * i, h, device="cuda") * 0.02,
                                 torch.randn(e, h, i, device="cuda") * 0.02, hg.scheme(args.scheme))
    x = torch.randn(args.m, h, device="cuda").bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(args.m, e, device="cuda"), -1), args.top_k, dim=-1)
    for _ in range(3):
        moe(x, weights, ids.to(torch.int32))
    torch.cuda.synchronize()
    print(moe.extra_repr())


if __name__ == "__main__":
    main()

"""One indexed and one grouped-contiguous launch of the same MoE GEMM, for Nsight Compute side by side (the indexed
GEMM QuantMoE runs against the grouped one on the same rows; DeepSeek-V3's per-rank down GEMM at M = 4096 by
default, where the grouped one ran 367 us and the indexed one 517 on 2026-12-02). Each runs three times, the
indexed one first, so `ncu -k regex:^gemm --launch-skip 2 --launch-count 1` profiles the indexed GEMM's third launch
and `--launch-skip 5` the grouped one's.

    python bench/profile_moe_pair.py [--scheme w4a16-int4-g128] [--m 4096] [--gemm w2] [--shape 256,8,7168,256]
"""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scheme", default="w4a16-int4-g128")
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--gemm", choices=("w13", "w2"), default="w2")
    ap.add_argument("--shape", default="256,8,7168,256", help="experts, top-k, hidden, intermediate")
    args = ap.parse_args()
    e, top_k, h, i = (int(v) for v in args.shape.split(","))
    torch.manual_seed(0)
    moe = hg.QuantMoE.from_float(torch.randn(e, 2 * i, h, device="cuda") * 0.02,
                                 torch.randn(e, h, i, device="cuda") * 0.02, hg.scheme(args.scheme),
                                 fused_activation=False)
    m, rows = args.m, args.m * top_k
    ids = torch.topk(torch.randn(m, e, device="cuda"), top_k, dim=-1).indices.to(torch.int32)
    weights = torch.rand(rows, device="cuda")
    counts = torch.bincount(ids.reshape(-1).long(), minlength=e)
    offsets = torch.zeros(e + 1, dtype=torch.int32, device="cuda")
    offsets[1:] = torch.cumsum(counts, 0)
    k, n = (h, 2 * i) if args.gemm == "w13" else (i, h)
    x = torch.randn(m if args.gemm == "w13" else rows, k, device="cuda").bfloat16()
    grouped_in = torch.randn(rows, k, device="cuda").bfloat16()
    out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    block_m = moe.block_m(m, top_k)
    routing = hg.moe_align(ids, e, block_m)

    def indexed() -> None:
        if args.gemm == "w13":
            hg.moe_gemm(x, moe, "w13", routing.sorted_ids, routing.expert_ids, routing.num_tokens_post_pad,
                        top_k=top_k, block_m=block_m, out=out)
        else:
            hg.moe_gemm(x, moe, "w2", routing.sorted_ids, routing.expert_ids, routing.num_tokens_post_pad,
                        top_k=1, block_m=block_m, topk_weights=weights, out=out)

    def grouped() -> None:
        hg.grouped_moe_gemm(grouped_in, moe, args.gemm, offsets, layout="grouped_contiguous", out=out)

    for fn in (indexed, grouped):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    print(f"profile pair: {args.scheme} {args.gemm} M={m} E={e} top_k={top_k} block_m={block_m}")


if __name__ == "__main__":
    main()

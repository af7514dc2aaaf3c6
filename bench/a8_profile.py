"""A few launches of dense 8-bit-activation layers (N = K = 8192) and of cuBLASLt's fp8 GEMM (torch._scaled_mm,
rowwise scales) at one M, for Nsight Compute: `ncu -k regex:gemm python3 bench/a8_profile.py --m 4096`.
Weights are distinct per launch so each reads them cold from HBM."""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--schemes", default="w8a8-fp8-channel,w8a8-int8-channel")
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--no-cublas", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    n = k = 8192
    x = torch.randn(args.m, k, device="cuda").bfloat16()
    for name in args.schemes.split(","):
        layers = [hg.QuantLinear.from_float(torch.randn(n, k, device="cuda") * 0.02, hg.scheme(name))
                  for _ in range(args.launches)]
        for layer in layers:
            layer(x)
    if not args.no_cublas:
        xq = x.to(torch.float8_e4m3fn)
        sa = torch.ones(args.m, 1, device="cuda")
        for _ in range(args.launches):
            wq = (torch.randn(n, k, device="cuda") * 0.02).to(torch.float8_e4m3fn)
            torch._scaled_mm(xq, wq.t(), scale_a=sa, scale_b=torch.ones(1, n, device="cuda"),
                             out_dtype=torch.bfloat16)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

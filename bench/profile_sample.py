"""A few launches of one N=K=8192 layer (W4A16 int4 g128 unless told) at small M, for Nsight Compute
(`ncu -k regex:gemm python3 bench/profile_sample.py`). Weights are rebuilt per call site so the L2 is cold."""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg


def _tunings(scheme: str, n: int, k: int, pipeline: str | None):
    if pipeline is None:
        return None
    from humming_gen.config import LayerConfig
    from humming_gen.heuristics import choose_tunings
    from humming_gen.targets import Target

    return choose_tunings(LayerConfig(n=n, k=k, scheme=hg.scheme(scheme)), Target.current(), pipeline=pipeline)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--scheme", default="w4a16-int4-g128")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--pipeline", default=None, help="standard or warp_specialized (default: the heuristics')")
    args = ap.parse_args()
    torch.manual_seed(0)
    layers = [hg.QuantLinear.from_float(torch.randn(args.n, args.k, device="cuda") * 0.02, hg.scheme(args.scheme),
                                        tunings=_tunings(args.scheme, args.n, args.k, args.pipeline))
              for _ in range(3)]
    for m in (int(v) for v in args.m.split(",")):
        x = torch.randn(m, args.k, device="cuda").bfloat16()
        for layer in layers:
            layer(x)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

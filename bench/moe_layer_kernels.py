"""Per-kernel GPU times (torch profiler) of one whole QuantMoE forward, for each down GEMM path: where a layer's
time goes (routing, GEMM1, the row compaction, quantization, GEMM2, the top-k sum) and what the grouped down path
(QuantMoE(down_gemm="grouped_contiguous")) adds and saves beside the indexed one.

Usage: python bench/moe_layer_kernels.py [--model deepseek|qwen3|gptoss] [--m 4096] [--scheme w4a16-int4-g128]
       [--down-gemm indexed,grouped_contiguous]
Prints one markdown table per path: kernel and us per forward (the median of --repeats profiled forwards).
"""

from __future__ import annotations

import argparse

SHAPES = {"deepseek": (256, 8, 7168, 256, "silu_mul", "split"), "qwen3": (128, 8, 2048, 768, "silu_mul", "split"),
          "gptoss": (128, 4, 2880, 2880, "swiglu_oai", "interleaved")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="deepseek", choices=tuple(SHAPES))
    parser.add_argument("--m", type=int, default=4096, help="tokens (default: %(default)s)")
    parser.add_argument("--scheme", default="w4a16-int4-g128", help="preset (default: %(default)s)")
    parser.add_argument("--down-gemm", default="indexed,grouped_contiguous", help="comma-separated QuantMoE down_gemm "
                        "values (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import statistics

    import torch
    from torch.profiler import ProfilerActivity, profile

    import humming_gen as hg

    e, top_k, h, i, activation, layout = SHAPES[args.model]
    torch.manual_seed(0)
    q13 = hg.scheme(args.scheme).quantize(torch.randn(e, 2 * i, h, device="cuda") * 0.02)
    q2 = hg.scheme(args.scheme).quantize(torch.randn(e, h, i, device="cuda") * 0.02)
    x = torch.randn(args.m, h, device="cuda").bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(args.m, e, device="cuda"), -1), top_k, dim=-1)
    ids = ids.to(torch.int32)
    for down in args.down_gemm.split(","):
        moe = hg.QuantMoE.from_quantized(q13, q2, activation=activation, gate_up_layout=layout, down_gemm=down)
        for _ in range(3):
            moe(x, weights, ids)
        torch.cuda.synchronize()
        times: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                moe(x, weights, ids)
                torch.cuda.synchronize()
            per: dict[str, float] = {}
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    name = ev.name[:60]
                    per[name] = per.get(name, 0.0) + ev.device_time
            for name, us in per.items():
                times.setdefault(name, []).append(us)
        bucket = moe.bucket_for(args.m, top_k)
        print(f"\n### {args.model} {args.scheme} M = {args.m}, down_gemm={down} (bucket {bucket}: "
              f"{moe.down_gemms[bucket]}), us per forward\n| kernel | us |\n|---|---|")
        total = 0.0
        for name, values in sorted(times.items(), key=lambda kv: -statistics.median(kv[1])):
            us = statistics.median(values)
            total += us
            print(f"| {name} | {us:.1f} |")
        print(f"| total | {total:.1f} |")


if __name__ == "__main__":
    main()

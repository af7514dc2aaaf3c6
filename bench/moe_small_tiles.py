"""Sweep of the standard pipeline's small-tile MoE buckets (issue 11: from about 4 to 16 rows per expert the indexed
GEMMs are latency-bound, DRAM at 39-48 %): the bucket's own tuning against more, smaller CTAs per SM (block_k 128 or
64 with fewer k warps; the weight layout, a warp's 64-k slice, is kept) and 16-token tiles, each variant composed,
compiled and bound to the same layers' packed weights. Qwen3-30B-A3B, gpt-oss-120b and DeepSeek-V3 (per rank)
shapes, GEMM only (the activation quantization of 8-bit schemes outside the timing), graph method, 2 layers
alternating, one uniformly random routing per M.

    python bench/moe_small_tiles.py [--models qwen3,gptoss] [--formats w4a16-int4-g128,w4a8-mxfp4-fp8] [--m 16,128]
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
from humming_gen.pipelines.standard import compose_a8 as standard_a8
from moe_bench import quantize_experts

# experts, top-k, hidden, intermediate
MODELS = {"qwen3": (128, 8, 2048, 768), "gptoss": (128, 4, 2880, 2880), "deepseek": (256, 8, 7168, 256)}
LAYERS = 2
# TuningConfig fields over the bucket's own (which keeps block_n 128, warps_n 2 and a warp's 64-k slice); f16_mma:
# compose_a8.FP8_ON_F16_MMA (fp8 only; False: ptxas's own lowering of the fp8 mma.sync); stage_scales:
# compose_a8.STAGE_WEIGHT_SCALES (8-bit activations with weight group scales: staged through shared memory)
VARIANTS = [dict(),
            dict(block_k=256, warps_k=4, ctas_per_sm=2, stages=3),  # the dense M <= 8 bucket (before moe_small_tile)
            dict(block_k=128, warps_k=2, ctas_per_sm=4, stages=4),  # moe_small_tile's
            dict(block_k=128, warps_k=2, ctas_per_sm=3, stages=6),
            dict(block_k=128, warps_k=2, ctas_per_sm=2, stages=8),
            dict(block_k=64, warps_k=1, ctas_per_sm=4, stages=8),
            dict(f16_mma=False), dict(stage_scales=True)]
DEFAULTS = standard_a8.FP8_ON_F16_MMA, standard_a8.STAGE_WEIGHT_SCALES  # restored after each variant


def compose_is_fp8(layer) -> bool:
    a = layer.scheme.activation
    return a is not None and a.dtype.is_float


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="qwen3,gptoss")
    p.add_argument("--formats", default="w4a16-int4-g128,w4a16-mxfp4,w4a8-mxfp4-fp8")
    p.add_argument("--m", default="16,128")
    args = p.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    rows = []
    for model in args.models.split(","):
        e, top_k, h, i = MODELS[model]
        for fmt in args.formats.split(","):
            scheme = hg.scheme(fmt)
            torch.manual_seed(0)
            layers = [hg.QuantMoE.from_quantized(quantize_experts(scheme, e, 2 * i, h),
                                                 quantize_experts(scheme, e, h, i), fused_activation=False, split_k=1)
                      for _ in range(LAYERS)]
            first = layers[0]
            for m in ms:
                ids = torch.topk(torch.randn(m, e, device="cuda"), top_k, dim=-1).indices.to(torch.int32)
                bucket = first.bucket_for(m, top_k)
                for index, weight in enumerate(("w13", "w2")):
                    own = first._kernels[bucket][index].plan
                    if own.tuning.pipeline != "standard":
                        print(f"{model} {fmt} {weight} M={m}: the bucket is {own.tuning.pipeline}, skipped")
                        continue
                    plans, names = [], []
                    for v in VARIANTS:
                        if "f16_mma" in v and not compose_is_fp8(own.layer):
                            continue
                        if "stage_scales" in v and (own.layer.scheme.activation is None
                                                    or standard_a8.weight_group_k(own.layer) is None):
                            continue
                        standard_a8.FP8_ON_F16_MMA = v.get("f16_mma", DEFAULTS[0])
                        standard_a8.STAGE_WEIGHT_SCALES = v.get("stage_scales", DEFAULTS[1])
                        fields = {f: val for f, val in v.items() if f not in ("f16_mma", "stage_scales")}
                        try:
                            plans.append(compose(own.layer, own.compute, attrs.evolve(own.tuning, **fields),
                                                 own.target))
                            names.append(str(v) if v else "heuristic")
                        except (ComposeError, ValueError) as err:
                            print(f"{model} {fmt} {weight} {v}: {' '.join(str(err).split())[:140]}")
                        finally:
                            standard_a8.FP8_ON_F16_MMA, standard_a8.STAGE_WEIGHT_SCALES = DEFAULTS
                    kernels = build_many(plans)
                    routing = moe_align(ids, e, own.tuning.block_m)
                    n = 2 * i if weight == "w13" else h
                    x = torch.randn(m if weight == "w13" else m * top_k, h if weight == "w13" else i,
                                    device="cuda").bfloat16()
                    out = torch.empty(m * top_k, n, device="cuda", dtype=torch.bfloat16)
                    tw = torch.rand(m * top_k, device="cuda") if weight == "w2" else None
                    top = top_k if weight == "w13" else 1
                    a, a_scale = first.gemm_input(x, index)
                    for name, kernel in zip(names, kernels):
                        res = getattr(kernel, "resources", {})
                        launchers = [kernel.bind(layer.w13 if index == 0 else layer.w2,
                                                 layer.bias13 if index == 0 else layer.bias2, layer.device, m * top_k)
                                     for layer in layers]
                        fns = [lambda _x, l=l: l.moe(a, out, routing, top, tw, a_scale=a_scale) for l in launchers]
                        us = graph_time_us(fns, x)
                        rows.append((model, fmt, weight, m, name, us))
                        print(f"{model} {fmt} {weight} M={m} {name}: {us:.1f} us {res}", flush=True)
            del layers, first
            torch.cuda.empty_cache()
    print("| model | format | GEMM | M | variant | us |\n|---|---|---|---|---|---|")
    for model, fmt, weight, m, name, us in rows:
        print(f"| {model} | {fmt} | {weight} | {m} | {name} | {us:.1f} |")


if __name__ == "__main__":
    main()

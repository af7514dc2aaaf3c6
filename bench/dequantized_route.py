"""Group-scaled activations two ways, graph us per layer with the quantization (canonical method: distinct layers
rotated over more than the L2, median of replays): the 8-bit kernels (QuantLinear(dequantize_activations=False):
fp32 partial sums promoted every group) against the scheme's values on the 16-bit kernels
(dequantize_activations=True: fake_quantize_activation, then the bf16 GEMM). Prints a markdown table; the relative
error of each against the float64 reference at M = 64."""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from humming_gen.bench.timing import cold_layer_count, graph_time_us
from humming_gen.reference import reference_gemm
from humming_gen.targets import Target

MXFP8 = hg.ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0")
FP8_G32 = hg.ActivationScheme("float8e4m3", granularity="group", group_size=32)
SCHEMES = {"w8a8-mxfp8": hg.scheme("w8a8-mxfp8"),
           "mxfp4 x mxfp8": hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", activation=MXFP8),
           "mxfp4 x fp8 g32": hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", activation=FP8_G32)}
parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--shapes", default="3072x4096,14336x4096,8192x8192")
parser.add_argument("--m", default="1,16,64,256,1024,4096")
parser.add_argument("--schemes", default=",".join(SCHEMES))
args = parser.parse_args()
target = Target.current()
ms = [int(v) for v in args.m.split(",")]
print("| scheme | N x K | route | " + " | ".join(f"M={m}" for m in ms) + " | err (M=64) |")
print("|---|---|---|" + "---|" * len(ms) + "---|")
for shape in args.shapes.split(","):
    n, k = (int(v) for v in shape.split("x"))
    for name in args.schemes.split(","):
        scheme = SCHEMES[name]
        count = cold_layer_count(n * k * scheme.weight.bits // 8, target.l2_bytes, 4)
        torch.manual_seed(0)
        qws = [scheme.quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(count)]
        x64 = torch.randn(64, k, device="cuda").bfloat16()
        ref = reference_gemm(x64.double(), qws[0])
        for route, flag in (("8-bit kernels", False), ("16-bit values", True)):
            layers = [hg.QuantLinear.from_quantized(q, dequantize_activations=flag) for q in qws]
            err = ((layers[0](x64).double() - ref).norm() / ref.norm()).item()
            cells = []
            for m in ms:
                x = torch.randn(m, k, device="cuda").bfloat16()
                cells.append(f"{graph_time_us(layers, x):.1f}")
            print(f"| {name} | {n}x{k} | {route} | " + " | ".join(cells) + f" | {err:.2e} |", flush=True)
            del layers
        del qws
        torch.cuda.empty_cache()

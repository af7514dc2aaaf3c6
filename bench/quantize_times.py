"""Graph time of the activation-quantization kernels alone, inputs cold (rotated over more than twice the L2), and
the rate they reach in bytes read plus written: per token, 1 x 128 groups, MXFP8 (group 32, e8m0), int8 per token
and NVFP4, rows or panels layout, bf16 rows of 2048 (a warp per row), 7168, 8192 and 16384 columns.

    python bench/quantize_times.py [--ms 1,64,1024,4096] [--ks 2048,7168,8192,16384] [--held 4]

--held sets activation.kernel.HELD_VECTORS (vectors a thread of the per-token kernel loads at once and holds) before
any kernel is built. --values times fake_quantize_activation (bf16 values instead of codes; rows). --e8m0-division
quantizes e8m0-scaled elements by the fp32 scales' path (activation.kernel.EXACT_E8M0_PRODUCT = False).
"""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from humming_gen.activation import kernel as activation_kernel
from humming_gen.bench import ms_argument
from humming_gen.bench.timing import graph_time_us

SCHEMES = {"fp8-token": ("w8a8-fp8-channel", "panels"), "fp8-g128": ("w8a8-fp8-block128", "panels"),
           "mxfp8": ("w8a8-mxfp8", "rows"), "int8-token": ("w8a8-int8-channel", "rows"),
           "nvfp4": ("w4a4-nvfp4", "rows")}

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--schemes", default=",".join(SCHEMES))
parser.add_argument("--ms", default="1,64,1024,4096", type=ms_argument("--ms"))
parser.add_argument("--ks", default="2048,7168,8192,16384")
parser.add_argument("--held", type=int, default=None)
parser.add_argument("--label", default="")
parser.add_argument("--values", action="store_true", help="time fake_quantize_activation (bf16 values)")
parser.add_argument("--e8m0-division", action="store_true", help="EXACT_E8M0_PRODUCT = False")
args = parser.parse_args()
if args.e8m0_division:
    activation_kernel.EXACT_E8M0_PRODUCT = False
if args.held is not None:
    activation_kernel.HELD_VECTORS = args.held
L2_BYTES = torch.cuda.get_device_properties(0).L2_cache_size

print(f"| variant | scheme | layout | M | K | graph us | GB/s |\n|---|---|---|---|---|---|---|")
for key in args.schemes.split(","):
    preset, layout = SCHEMES[key]
    act = hg.scheme(preset).activation
    for k in (int(v) for v in args.ks.split(",")):
        for m in args.ms:
            copies = max(2, min(64, -(-2 * L2_BYTES // (m * k * 2))))
            xs = [torch.randn(m, k, device="cuda").bfloat16() for _ in range(copies)]
            if args.values:
                layout = "rows"
                fns = [lambda _, xi=xi: hg.fake_quantize_activation(xi, act) for xi in xs]
            else:
                fns = [lambda _, xi=xi: hg.quantize_activation(xi, act, layout=layout) for xi in xs]
            us = graph_time_us(fns, xs[0])
            q = hg.quantize_activation(xs[0], act, layout=layout)
            codes_bytes = xs[0].numel() * 2 if args.values else q.codes.numel() * q.codes.element_size()
            moved = xs[0].numel() * 2 + codes_bytes + q.scales.numel() * q.scales.element_size()
            print(f"| {args.label} | {key} | {layout} | {m} | {k} | {us:.1f} | {moved / us / 1e3:.0f} |", flush=True)
            del xs, fns, q

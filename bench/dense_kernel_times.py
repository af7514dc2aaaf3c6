"""Where an 8-bit-activation layer's graph time goes: the canonical graph time of the whole forward (activation
quantization + GEMM, layers rotated so each reads its weights cold) beside graphs of the quantization kernels alone
and of the GEMMs alone on codes quantized beforehand. (Per-kernel durations from a profiler mislead here: with
programmatic dependent launch each kernel starts before its predecessor ends and its duration includes the wait.)

    python bench/dense_kernel_times.py [formats] [M list] [--n 8192 --k 8192] [--exact-division]
"""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from humming_gen.bench import ms_argument
from humming_gen.bench.timing import cold_layer_count, graph_time_us

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("formats", nargs="?", default="w4a8-mxfp4-fp8,w8a8-fp8-channel")
parser.add_argument("ms", nargs="?", default="1,64,256", type=ms_argument("ms"))
parser.add_argument("--n", type=int, default=8192)
parser.add_argument("--k", type=int, default=8192)
parser.add_argument("--exact-division", action="store_true",
                    help="quantize with the exact division for every element (activation.kernel.NEAR_QUOTIENT off)")
args = parser.parse_args()
if args.exact_division:
    from humming_gen.activation import kernel as activation_kernel

    activation_kernel.NEAR_QUOTIENT = False


def _parts(layer, x: torch.Tensor):
    """(quantize, gemm): the layer's two launches of forward(x) as separate calls (its M bucket's launcher and row
    quantizer, bound by a first forward)."""
    out = layer(x)
    m = x.shape[0]
    launcher = next(lch for m_max, lch in layer._launchers if m_max is None or m <= m_max)
    quantizer = next(q for q in layer._row_quantizers.values() if q is not None)
    buf, codes, scales = quantizer(x)  # (pointers into buf, which the closure keeps)
    return (lambda a: quantizer(a),
            lambda a, buf=buf: launcher.launch_codes(codes, quantizer.lda(m), m, out, scales))


def _launches(layers):
    """(GEMM launchers, quantization kernels) of these layers (bound by a first forward)."""
    gemms = [launcher for layer in layers for _, launcher in layer._launchers]
    quantizers = [q.kernel for layer in layers for q in layer._row_quantizers.values() if q is not None]
    return gemms, quantizers


SHIPPED: dict[int, bool] = {}  # id(launcher or kernel) -> its own PDL setting


def set_pdl(layers, quantize: bool, gemm: bool) -> None:
    """Whether the quantization kernels and the GEMMs of these layers launch with programmatic dependent launch (as
    shipped, or not)."""
    gemms, quantizers = _launches(layers)
    for objects, on in ((gemms, gemm), (quantizers, quantize)):
        for o in objects:
            o._pdl = on and SHIPPED.setdefault(id(o), o._pdl)


print("| format | M | forward (graph us) | without PDL | PDL on the GEMM only | on the quantization only | "
      "quantization alone | GEMM alone on codes | forward - GEMM |\n|---|---|---|---|---|---|---|---|---|")
torch.manual_seed(0)
l2 = torch.cuda.get_device_properties(0).L2_cache_size
for name in args.formats.split(","):
    count = cold_layer_count(args.n * args.k, l2)  # (the 8-bit bytes: enough layers for narrower weights too)
    layers = [hg.QuantLinear.from_quantized(hg.scheme(name).quantize(torch.randn(args.n, args.k, device="cuda") * 0.02))
              for _ in range(count)]
    for m in args.ms:
        x = torch.randn(m, args.k, device="cuda").bfloat16()
        forward = graph_time_us(layers, x)
        variants = []
        for quantize, gemm in ((False, False), (False, True), (True, False)):
            set_pdl(layers, quantize, gemm)
            variants.append(graph_time_us(layers, x))
        set_pdl(layers, True, True)
        parts = [_parts(layer, x) for layer in layers]
        quantize = graph_time_us([q for q, _ in parts], x)
        gemm = graph_time_us([g for _, g in parts], x)
        print(f"| {name} | {m} | {forward:.1f} | " + " | ".join(f"{v:.1f}" for v in variants) + f" | {quantize:.1f} | {gemm:.1f} | {forward - gemm:.1f} |", flush=True)
        del parts
    del layers
    torch.cuda.empty_cache()

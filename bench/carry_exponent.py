"""A/B of group scales that carry the float converter's power of two (pipelines.common.CARRY_CONVERTER_EXPONENT,
the default) against the converter's own multiply per dequantized register, and with the split-K kernels' column
factors in the store and preloaded (pipelines.standard.compose.PRELOAD_SPLIT_K_FACTORS, the default): dense
16-bit-activation layers of float weights with small groups (MXFP4, NVFP4; N = K = 8192) and a gpt-oss-shaped
QuantMoE (E = 128, top-4, H = I = 2880, MXFP4, whole forward). Graph method, the variants in one process,
alternating rounds.
Usage: python bench/carry_exponent.py [dense M list] [MoE M list]"""

from __future__ import annotations

import argparse
import sys

import torch

import humming_gen as hg
from humming_gen.bench.timing import alternating_graph_times
from humming_gen.pipelines import common
from humming_gen.pipelines.standard import compose as standard_compose
from moe_bench import quantize_experts

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("dense_m", nargs="?", default="1,16,256,1024,4096",
                    help="comma-separated M of the dense layers, '' for none (default: %(default)s)")
parser.add_argument("moe_m", nargs="?", default="16,128,1024",
                    help="comma-separated M of the MoE layer, '' for none (default: %(default)s)")
args = parser.parse_args()
DENSE_M = [int(v) for v in args.dense_m.split(",") if v]
MOE_M = [int(v) for v in args.moe_m.split(",") if v]
# (name, carried exponent, split-K column factors preloaded: pipelines.standard.compose.PRELOAD_SPLIT_K_FACTORS)
VARIANTS = (("carried", True, False), ("multiply", False, False), ("carried+preload", True, True))


def build(make) -> dict:
    built = {}
    defaults = common.CARRY_CONVERTER_EXPONENT, standard_compose.PRELOAD_SPLIT_K_FACTORS
    for name, carry, preload in VARIANTS:
        common.CARRY_CONVERTER_EXPONENT, standard_compose.PRELOAD_SPLIT_K_FACTORS = carry, preload
        try:
            built[name] = make()
        finally:
            common.CARRY_CONVERTER_EXPONENT, standard_compose.PRELOAD_SPLIT_K_FACTORS = defaults
    return built


def report(label: str, m: int, variants: dict, fns_of, x: torch.Tensor) -> None:
    """Time each variant's calls (fns_of(its built layers)), alternating, and print one line."""
    times = alternating_graph_times([fns_of(built) for built in variants.values()], x)
    cells = " | ".join(f"{name} {us:.1f}" for name, us in zip(variants, times))
    print(f"{label} M={m}: {cells} us", flush=True)


torch.manual_seed(0)
n = k = 8192
for fmt in ("w4a16-mxfp4", "w4a16-nvfp4") if DENSE_M else ():
    qws = [hg.scheme(fmt).quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(4)]
    layers = build(lambda: [hg.QuantLinear.from_quantized(q) for q in qws])
    x0 = torch.randn(max(DENSE_M), k, device="cuda").bfloat16()
    ref = layers["multiply"][0](x0).float()
    err = (layers["carried"][0](x0).float() - ref).abs().max().item() / ref.abs().max().item()
    print(f"{fmt}: carried vs multiply, max rel diff {err:.2e}", flush=True)
    for m in DENSE_M:
        x = x0[:m]
        report(f"{fmt} {n}x{k}", m, layers, lambda ls: ls, x)
    del layers, qws
    torch.cuda.empty_cache()

if not MOE_M:
    sys.exit(0)
e, top_k, h, i = 128, 4, 2880, 2880
scheme = hg.scheme("w4a16-mxfp4")
q13 = quantize_experts(scheme, e, 2 * i, h)  # one layer (its packed weights are 1.6 GB)
q2 = quantize_experts(scheme, e, h, i)
moes = build(lambda: [hg.QuantMoE.from_quantized(q13, q2, activation="silu_mul")])
del q13, q2
torch.cuda.empty_cache()
for m in MOE_M:
    x = torch.randn(m, h, device="cuda").bfloat16()
    tw, ids = torch.topk(torch.softmax(torch.randn(m, e, device="cuda"), -1), top_k, dim=-1)
    ids = ids.to(torch.int32)
    report("gpt-oss MoE w4a16-mxfp4", m, moes, lambda ms: [lambda x, mo=mo: mo(x, tw, ids) for mo in ms], x)

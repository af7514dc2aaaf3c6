"""Plans of a dense layer with 8-bit weights x 8-bit activations on the H200 (N = K = 8192, graph us per layer
including the activation quantization, both orders, the faster kept): the heuristics' default (weights read from
shared memory where heuristics.shared_weights_default says so, the tokens on wgmma's M from TOKENS_M_FROM for block
scales), the same layer with register weights ("registers": the BLayout8 kernels, warp-specialized at every M on
sm_90a), shared weights with the tokens on N at every M ("shared"), and optional variants: tokens on M from
--tokens-m-from with --tokens-m-block-n weight rows, and shared-weight tiles under 128 tokens with one set of partial
sums (--small-one-set), 128-row tokens-on-M tiles in overlapped halves (--tokens-m-halves). Usage: python bench/ss_bench.py [formats] [M list] [options]"""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from humming_gen.bench import ms_argument
from humming_gen.bench.timing import graph_time_us
from humming_gen.heuristics import choose_tunings
from humming_gen.pipelines.warp_specialized import compose_a8
from humming_gen.pipelines.warp_specialized.heuristics import shared_weight_tunings

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("formats", nargs="?", default="w8a8-fp8-channel,w8a8-int8-channel,w8a8-fp8-block128",
                    help="comma-separated presets (default: %(default)s)")
parser.add_argument("ms", nargs="?", default="1,16,64,256,1024,4096,8192", type=ms_argument("ms"),
                    help="comma-separated M (default: %(default)s)")
parser.add_argument("--tokens-m-from", type=int, default=256,
                    help="smallest bucket bound of the tokens-on-M variants (default: %(default)s)")
parser.add_argument("--tokens-m-block-n", default="",
                    help="weight rows of tokens-on-M variants, one plan each: comma-separated numbers or 'auto' "
                         "(the heuristics' choice); none by default")
parser.add_argument("--tokens-m-halves", action="store_true",
                    help="also the default with 128-row tokens-on-M tiles promoted in two overlapped halves")
parser.add_argument("--small-one-set", action="store_true",
                    help="also the default with shared-weight tiles under 128 tokens keeping one set of partial sums")
args = parser.parse_args()
FORMATS = args.formats.split(",")
MS = args.ms
n = k = 8192
torch.manual_seed(0)
print("| format | plan | " + " | ".join(f"M={m}" for m in MS) + " |\n|---|---|" + "---|" * len(MS))
for name in FORMATS:
    qws = [hg.scheme(name).quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(4)]
    layers = {"default": [hg.QuantLinear.from_quantized(q) for q in qws]}
    base = layers["default"][0]
    cfg, target = base.layer_config, base.target
    layers["registers"] = [hg.QuantLinear.from_quantized(q, tunings=choose_tunings(cfg, target, stored=False,
                                                                                   register_weights=True))
                           for q in qws]
    if base.scheme.weight.bits == 8:
        layers["shared"] = [hg.QuantLinear.from_quantized(q, tunings=shared_weight_tunings(cfg, target)) for q in qws]
        for block_n in filter(None, args.tokens_m_block_n.split(",")):
            tunings = shared_weight_tunings(cfg, target, tokens_m_from=args.tokens_m_from,
                                            tokens_m_block_n=None if block_n == "auto" else int(block_n))
            layers[f"tokens_m {block_n}"] = [hg.QuantLinear.from_quantized(q, tunings=tunings) for q in qws]
        if args.small_one_set:
            saved, compose_a8.SHARED_OVERLAP_FROM_BLOCK_M = compose_a8.SHARED_OVERLAP_FROM_BLOCK_M, 128
            layers["default, small one set"] = [hg.QuantLinear.from_quantized(q) for q in qws]
            compose_a8.SHARED_OVERLAP_FROM_BLOCK_M = saved
        if args.tokens_m_halves:
            compose_a8.TOKENS_M_OVERLAP = True
            layers["default, tokens-on-M 128 halves"] = [hg.QuantLinear.from_quantized(q) for q in qws]
            compose_a8.TOKENS_M_OVERLAP = False
    rows = {plan: [] for plan in layers}
    for m in MS:
        x = torch.randn(m, k, device="cuda").bfloat16()
        best = {plan: float("inf") for plan in rows}
        for order in (list(rows), list(rows)[::-1]):  # both orders, the faster kept (the first timed runs slower)
            for plan in order:
                best[plan] = min(best[plan], graph_time_us(layers[plan], x))
        for plan in rows:
            rows[plan].append(f"{best[plan]:.1f}")
    for plan, cells in rows.items():
        print(f"| {name} | {plan} | " + " | ".join(cells) + " |", flush=True)
    del layers, qws
    torch.cuda.empty_cache()

"""Small-M sweep of the standard pipeline's 8-bit-activation kernels (mma.sync; F2FP + HMMA on sm_90a) against the
heuristics' bucket (warp-specialized), N = K = 8192, canonical graph timing with the activation quantization: splits,
CTAs per SM, stages and k tiles that keep the layer's weight layout (block_n, warps_n and block_k / warps_k), and
fp8 on f16 mmas (compose_a8.FP8_ON_F16_MMA, the default) against ptxas's own fp8 mma.sync.
Usage: python bench/a8_small_sweep.py [preset,...] [M,...]"""

from __future__ import annotations

import argparse

import attrs
import torch

import humming_gen as hg
from humming_gen.bench import ms_argument
from humming_gen.bench.timing import alternating_graph_times
from humming_gen.config import LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.layer.weights import scales_fold
from humming_gen.pipelines.base import TuningPlan
from humming_gen.pipelines.standard import compose_a8 as standard_a8
from humming_gen.targets import Target

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("presets", nargs="?", default="w4a8-mxfp4-fp8,w8a8-fp8-channel,w8a8-fp8-block128",
                    help="comma-separated presets (default: %(default)s)")
parser.add_argument("ms", nargs="?", default="1,16", type=ms_argument("ms"),
                    help="comma-separated M (default: %(default)s)")
args = parser.parse_args()
presets = args.presets.split(",")
ms = args.ms
# None: the heuristics' own bucket; the dicts: TuningConfig fields over the standard pipeline's bucket
VARIANTS = [None, dict(), dict(f16_mma=False), dict(split_k=8), dict(split_k=2), dict(stages=4),
            dict(ctas_per_sm=1, stages=4),
            dict(block_k=128, warps_k=2, split_k=8, ctas_per_sm=3, stages=4),
            dict(block_k=128, warps_k=2, split_k=4, ctas_per_sm=3, stages=3), dict(split_k=8, stages=2)]
torch.manual_seed(0)
n = k = 8192
target = Target.current()
for name in presets:
    scheme = hg.scheme(name)
    qws = [scheme.quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(4)]
    layer = LayerConfig(n=n, k=k, scheme=scheme, fold_scales=scales_fold(qws[0]))
    for m in ms:
        x = torch.randn(m, k, device="cuda").bfloat16()
        built = []
        for v in VARIANTS:
            fields = {f: val for f, val in (v or {}).items() if f != "f16_mma"}
            t = (choose_tunings(layer, target, stored=False).for_m(m) if v is None
                 else attrs.evolve(choose_tunings(layer, target, pipeline="standard").for_m(m), **fields))
            standard_a8.FP8_ON_F16_MMA = (v or {}).get("f16_mma", True)  # (False: ptxas's own fp8 mma.sync)
            try:
                built.append(("heuristics" if v is None else f"standard {v}",
                              [hg.QuantLinear.from_quantized(q, tunings=TuningPlan(((None, t),))) for q in qws]))
            except Exception as e:
                print(f"{name} m={m} {v}: {type(e).__name__}: {str(e).splitlines()[-1][:200]}", flush=True)
            finally:
                standard_a8.FP8_ON_F16_MMA = True
        times = alternating_graph_times([layers for _, layers in built], x)
        for (label, _), us in zip(built, times):
            print(f"{name} m={m} {label}: {us:.1f} us", flush=True)
        del built
        torch.cuda.empty_cache()

"""Sweep of the warp-specialized 8-bit-activation tunings (one-bucket QuantLinears, canonical graph timing, the
activation quantization included): token tile, stages and the persistent grid's raster, 8192 x 8192; or ("cluster")
those tiles with and without two-CTA clusters sharing weight stages; or ("overlap") the promoted partial sums in two
token halves (compose_a8.OVERLAP_PROMOTION, the default) against one set promoted after every wgmma has retired; or
("small") the bucket of each M against other splits and token tiles.
Usage: python a8_sweep.py [preset,...] [M,...] [tiles|cluster|acluster|wide|overlap|small]"""

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
from humming_gen.pipelines.warp_specialized import compose_a8
from humming_gen.pipelines.warp_specialized.heuristics import activation_multicast, restaged, weight_multicast
from humming_gen.targets import Target

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("presets", nargs="?", default="w8a8-fp8-channel,w8a8-int8-channel,w8a8-fp8-block128",
                    help="comma-separated presets (default: %(default)s)")
parser.add_argument("ms", nargs="?", default="1024,4096", type=ms_argument("ms"),
                    help="comma-separated M (default: %(default)s)")
parser.add_argument("mode", nargs="?", default="tiles",
                    choices=["tiles", "cluster", "acluster", "wide", "overlap", "small"],
                    help="which variants to time (default: %(default)s)")
args = parser.parse_args()
MODE = args.mode
presets = args.presets.split(",")
ms = args.ms
VARIANTS = {"tiles": [dict(), dict(block_m=128, raster="n_major"), dict(block_m=128, raster="m_band"),
                      dict(block_m=192, raster="n_major"), dict(block_m=192, raster="m_band"),
                      dict(block_m=160, raster="n_major")],  # {}: the heuristics' own
            "cluster": [dict(), dict(block_m=128, raster="n_major"), dict(block_m=128, cluster=True),
                        dict(block_m=192, raster="n_major"), dict(block_m=192, cluster=True)],
            # int8 x int8 channel tiles above 192 tokens (one set of s32 sums), e.g. `a8_sweep.py w8a8-int8-channel
            # 4096,8192 wide`
            "wide": [dict(), dict(block_m=224), dict(block_m=256), dict(block_m=256, raster="n_major")],
            # two-CTA clusters along N sharing activation stages (panels), banded and plain
            "acluster": [dict(), dict(block_m=192, acluster=True), dict(block_m=192, raster="n_major", acluster=True),
                         dict(block_m=128, acluster=True)],
            "overlap": [dict(), dict(overlap=False), dict(block_m=128), dict(block_m=128, overlap=False)],
            # small M: the bucket's own tuning (not the open-ended one's) against other splits and token tiles
            "small": [dict(), dict(split_k=1), dict(split_k=2), dict(split_k=4), dict(block_m=32),
                      dict(block_m=32, split_k=1),
                      dict(block_m=64, split_k=1), dict(block_m=64, split_k=2), dict(block_m=128, split_k=2),
                      dict(raster="n_major"), dict(raster="m_band")]}[MODE]
torch.manual_seed(0)
n = k = 8192
target = Target.current()
for name in presets:
    scheme = hg.scheme(name)
    qws = [scheme.quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(4)]
    layer = LayerConfig(n=n, k=k, scheme=scheme, fold_scales=scales_fold(qws[0]))  # as QuantLinear decides it
    # the register-weight kernels (their variants include clusters; the shared-weight plans: bench/ss_bench.py)
    plan = choose_tunings(layer, target, stored=False, register_weights=True)
    for m in ms:
        base = plan.for_m(m) if MODE == "small" else dict(plan.buckets)[None]
        x = torch.randn(m, k, device="cuda").bfloat16()
        built = []
        for v in VARIANTS:
            fields = {f: val for f, val in v.items() if f not in ("cluster", "acluster", "overlap")}
            t = attrs.evolve(base, **fields)
            if t.split_k > 1 and t.raster == "m_band" and "raster" not in fields:
                t = attrs.evolve(t, raster="n_major")  # split-K units walk n-major (an m_band bucket split)
            if t.split_k > 1 and t.raster == "m_band" or (v and v == fields and t == base):
                continue  # an m_band variant of a split bucket; a variant that is the bucket's own
            t = weight_multicast(t) if v.get("cluster") else t
            t = activation_multicast(t) if v.get("acluster") else t
            if v:  # as many stages as shared memory holds
                t = restaged(layer, target, t)
            compose_a8.OVERLAP_PROMOTION = v.get("overlap", True)
            try:
                built.append((v, [hg.QuantLinear.from_quantized(q, tunings=TuningPlan(((None, t),))) for q in qws]))
            except Exception as e:
                print(f"{name} m={m} {v}: {type(e).__name__}: {str(e).splitlines()[-1]}", flush=True)
            finally:
                compose_a8.OVERLAP_PROMOTION = True
        times = alternating_graph_times([layers for _, layers in built], x)
        for (v, _), us in zip(built, times):
            print(f"{name} m={m} {v}: {us:.1f} us ({2 * m * n * k / us / 1e6:.0f} TFLOP/s)", flush=True)
        del built
        torch.cuda.empty_cache()

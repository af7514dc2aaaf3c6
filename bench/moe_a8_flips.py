"""Whole-layer error of the 8-bit MoE on the standard and the warp-specialized pipeline on identical weights,
inputs and routing at small M, over many seeds (tests/gpu/test_quant_moe_a8_ws.py's layers and references): whether
an error above LAYER_TOLERANCE is the re-quantized intermediate's code flips, which both pipelines show alike, or
the warp-specialized kernels' own.

    python bench/moe_a8_flips.py        (from any directory)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS / "gpu"), str(TESTS)]  # the GPU tests' layers and their moe_cases, from any cwd
import humming_gen as hg  # noqa: E402
from test_quant_moe import _rel  # noqa: E402
from test_quant_moe_a8 import _reference  # noqa: E402
from test_quant_moe_a8_ws import H, _layer, _ragged_routing  # noqa: E402

for preset, e, fused in (("w8a8-fp8-block128", 19, False), ("w8a8-fp8-channel", 8, True)):
    layers = {p: _layer(preset, e, seed=e, pipeline=p, biases=e == 8, fused=fused) for p in ("standard",
                                                                                           "warp_specialized")}
    for m, top_k in ((1, 2), (7, 8), (128, 8)):
        errs = {p: [] for p in layers}
        for seed in range(24):
            torch.manual_seed(1000 + seed)
            x = torch.randn(m, H, device="cuda").bfloat16()
            x[0, :5] *= 20
            weights, ids = _ragged_routing(m, e, min(top_k, e - 2), drop=0.0)
            for p, (moe, q13, q2, b13, b2) in layers.items():
                out = hg.fused_moe(x, moe, weights, ids)
                errs[p].append(_rel(out, _reference(moe, x, weights, ids, q13, q2, b13, b2)))
        print(f"| {preset} e{e} {'fused' if fused else 'torch'} | M={m} top-{top_k} | " + " | ".join(
            f"{p}: median {statistics.median(v):.4f} max {max(v):.4f}" for p, v in errs.items()) + " |", flush=True)

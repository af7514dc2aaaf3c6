"""Where an eager M = 1 forward call spends its time on the host: the kernels each call launches (torch profiler)
and the Python functions that cost most (cProfile), per format. Companion of eager_gap.py (issue 10: eager within
8 us of the graph time).

    python bench/eager_profile.py [formats] > eager_profile.txt
"""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from humming_gen.bench.timing import print_host_profiles

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("formats", nargs="?",
                    default="w4a16-int4-g128,w8a8-fp8-channel,w8a8-int8-channel,w8a8-fp8-block128",
                    help="comma-separated presets (default: %(default)s)")
FORMATS = parser.parse_args().formats.split(",")
CALLS = 200
torch.manual_seed(0)
for name in FORMATS:
    layer = hg.QuantLinear.from_quantized(hg.scheme(name).quantize(torch.randn(8192, 8192, device="cuda") * 0.02))
    x = torch.randn(1, 8192, device="cuda").bfloat16()
    for _ in range(20):
        layer(x)
    torch.cuda.synchronize()
    print_host_profiles(lambda layer=layer, x=x: layer(x), CALLS, f"{name}, M = 1", rows=14)

"""One warp-specialized launch for Nsight Compute: python ws_profile.py M."""
import argparse

import torch

import humming_gen as hg

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("m", type=int, help="the rows of x (the launch's M)")
m = parser.parse_args().m
qw = hg.QuantScheme("int4", group_size=128).quantize(torch.randn(8192, 8192, device="cuda") * 0.02)
layer = hg.QuantLinear.from_quantized(qw)
x = torch.randn(m, 8192, device="cuda").bfloat16()
for _ in range(3):
    layer(x)
torch.cuda.synchronize()

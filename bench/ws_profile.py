"""One warp-specialized launch for Nsight Compute: python ws_profile.py M."""
import sys

import torch

import humming_gen as hg

m = int(sys.argv[1])
qw = hg.QuantScheme("int4", group_size=128).quantize(torch.randn(8192, 8192, device="cuda") * 0.02)
layer = hg.QuantLinear.from_quantized(qw)
x = torch.randn(m, 8192, device="cuda").bfloat16()
for _ in range(3):
    layer(x)
torch.cuda.synchronize()

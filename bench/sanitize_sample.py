"""A few small layers for compute-sanitizer (memcheck / racecheck): split-K, warp-k reduction, zero points,
bias, odd shapes, group sizes that are not multiples of 16. Prints the max relative error so a sanitizer log also shows the numbers."""

import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm

CASES = [(dict(weight="int4", group_size=128), 1000, 1536, True, (1, 16, 70, 200)),
         (dict(weight="uint4", group_size=64, zero_point="int"), 512, 1024, False, (3, 33)),
         (dict(weight="float8e4m3", scale_dtype="float32"), 256, 520, False, (5,)),
         (dict(weight="int4", group_size=7), 300, 1000, True, (1, 40)),  # odd group: rows past K, pair straddles
         (dict(weight="uint4", group_size=100, zero_point="float"), 256, 1000, False, (2, 130))]

worst = 0.0
for kwargs, n, k, bias_on, ms in CASES:
    qw = hg.QuantScheme(**kwargs).quantize(torch.randn(n, k, device="cuda") * 0.05)
    bias = torch.randn(n, device="cuda").bfloat16() if bias_on else None
    layer = hg.QuantLinear.from_quantized(qw, bias=bias)
    for m in ms:
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = layer(x)
        ref = reference_gemm(x.double(), qw, bias=None if bias is None else bias.double())
        worst = max(worst, ((y.double() - ref).norm() / ref.norm()).item())
torch.cuda.synchronize()
print(f"sanitize sample: max relative error {worst:.2e}")

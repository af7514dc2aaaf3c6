"""A small sample for compute-sanitizer of the newer kernels: QuantMoE with ragged routing (-1 ids, empty experts,
an expert map) across the standard and warp-specialized buckets, 8-bit activations (standard and split-K
warp-specialized, MXFP8 scales) and 8-bit MoE layers on both pipelines. Prints the worst relative error and the pipelines run."""

import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm
from humming_gen.reference.moe import reference_fused_moe

torch.manual_seed(0)
worst, pipelines = 0.0, set()


def rel(y, ref):
    return ((y.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


for scheme, e, top_k, ms in (("w4a16-int4-g128", 8, 2, (5, 300)), ("w4a16-mxfp4", 16, 4, (130,)),
                             ("w8a8-fp8-channel", 8, 2, (40, 300)), ("w8a8-fp8-block128", 8, 2, (300,))):
    s = hg.scheme(scheme)
    q13 = s.quantize(torch.randn(e, 256, 256, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(e, 256, 128, device="cuda") * 0.05)
    moe = hg.QuantMoE.from_quantized(q13, q2)
    for m in ms:
        x = torch.randn(m, 256, device="cuda").bfloat16()
        weights, ids = torch.topk(torch.softmax(torch.randn(m, e, device="cuda"), -1), top_k, dim=-1)
        ids = torch.where(torch.rand(m, top_k, device="cuda") < 0.1, torch.full_like(ids, -1), ids)
        ids = torch.where(ids == 3, torch.full_like(ids, 2), ids).to(torch.int32)  # expert 3 empty
        out = moe(x, weights, ids)
        ref = reference_fused_moe(x.double(), q13.dequantize().double(), q2.dequantize().double(), weights.double(),
                                  ids, activation_scheme=s.activation,
                                  intermediate_dtype=torch.bfloat16 if s.activation else None)
        worst = max(worst, rel(out, ref))
        pipelines.add(f"moe:{moe._kernels[moe.bucket_for(m, top_k)][0].plan.pipeline}")

for scheme, n, k, ms in (("w8a8-fp8-channel", 1024, 2048, (33, 64)), ("w8a8-mxfp8", 576, 2048, (20, 150)),
                         ("w4a8-int4-g128-int8", 640, 1024, (40,))):
    qw = hg.scheme(scheme).quantize(torch.randn(n, k, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw)
    for m in ms:
        pipelines.add(f"{layer.kernel_for(m).plan.pipeline}:split{layer.kernel_for(m).plan.tuning.split_k}")
        x = torch.randn(m, k, device="cuda").bfloat16()
        worst = max(worst, rel(layer(x), reference_gemm(x.double(), qw)))
torch.cuda.synchronize()
print(f"sanitize moe sample: max relative error {worst:.2e}, pipelines {sorted(pipelines)}")

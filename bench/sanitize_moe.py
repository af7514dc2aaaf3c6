"""A small sample for compute-sanitizer of the newer kernels: QuantMoE with ragged routing (-1 ids, empty experts,
an expert map) across the standard and warp-specialized buckets, the grouped down GEMM on compacted rows (row
compaction, weighted top-k sum), 8-bit activations (standard and split-K warp-specialized, MXFP8 scales) and 8-bit
MoE layers (W8A8: the warp-specialized pipeline in every bucket; W4A8: the standard pipeline's 8-bit MoE kernels
below 17 rows per expert). Prints the worst relative error and the pipelines run."""

import argparse

import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm
from humming_gen.reference.moe import reference_fused_moe

argparse.ArgumentParser(description=__doc__).parse_args()  # no options: --help, and refuses stray arguments
torch.manual_seed(0)
worst, pipelines = 0.0, set()


def rel(y, ref):
    return ((y.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# down_gemm None: the heuristics' (the grouped down GEMM on compacted rows in the open bucket, e.g. M = 300 here);
# "grouped_contiguous": in every bucket, the standard pipeline's grouped kernels too
for scheme, e, top_k, ms, down in (("w4a16-int4-g128", 8, 2, (5, 300), None),
                                   ("w4a16-int4-g128", 8, 2, (5, 40), "grouped_contiguous"),
                                   ("w4a16-mxfp4", 16, 4, (8, 130), None),
                                   ("w8a8-fp8-channel", 8, 2, (3, 40, 300), None),
                                   ("w8a8-fp8-block128", 8, 2, (5, 300), None),
                                   ("w4a8-mxfp4-fp8", 8, 2, (5, 40), None)):
    s = hg.scheme(scheme)
    q13 = s.quantize(torch.randn(e, 256, 256, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(e, 256, 128, device="cuda") * 0.05)
    moe = hg.QuantMoE.from_quantized(q13, q2, down_gemm=down)
    for m in ms:
        x = torch.randn(m, 256, device="cuda").bfloat16()
        weights, ids = torch.topk(torch.softmax(torch.randn(m, e, device="cuda"), -1), top_k, dim=-1)
        ids = torch.where(torch.rand(m, top_k, device="cuda") < 0.1, torch.full_like(ids, -1), ids)
        ids = torch.where(ids == 3, torch.full_like(ids, 2), ids).to(torch.int32)  # expert 3 empty
        out = moe(x, weights, ids)
        ref = reference_fused_moe(x.double(), q13.dequantize().double(), q2.dequantize().double(), weights.double(),
                                  ids, activation_scheme=s.activation,
                                  intermediate_dtype=torch.bfloat16 if s.activation else None,
                                  fused_activation=moe.fused_activation)
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
# grouped layouts on the warp-specialized pipeline (16- and 8-bit): ragged contiguous windows with an empty expert,
# masked counts of 0, max_m and past max_m
for scheme in ("w4a16-int4-g128", "w8a8-fp8-block128", "w8a8-fp8-channel", "w4a8-mxfp4-fp8"):
    s = hg.scheme(scheme)
    q13 = s.quantize(torch.randn(8, 256, 256, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(8, 256, 128, device="cuda") * 0.05)
    moe = hg.QuantMoE.from_quantized(q13, q2, fused_activation=False)  # its gate/up GEMM alone
    w13 = q13.dequantize().double()
    counts = torch.tensor([0, 70, 3, 0, 129, 40, 1, 64])
    offsets = torch.zeros(9, dtype=torch.int32)
    offsets[1:] = torch.cumsum(counts, 0)
    a = torch.randn(int(offsets[-1]), 256, device="cuda").bfloat16()
    out = hg.grouped_moe_gemm(a, moe, "w13", offsets.cuda(), layout="grouped_contiguous", pipeline="warp_specialized")
    aq = a.double() if s.activation is None else s.activation.quantize(a).dequantize(torch.float64)
    ref = torch.cat([aq[offsets[j]:offsets[j + 1]] @ w13[j].T for j in range(8)])
    worst = max(worst, rel(out, ref))
    max_m = 96
    am = torch.randn(8, max_m, 256, device="cuda").bfloat16()
    mcounts = torch.tensor([0, max_m, max_m + 7, 5, 33, 0, 64, 1], dtype=torch.int32)
    outm = hg.grouped_moe_gemm(am, moe, "w13", mcounts.cuda(), layout="grouped_masked", pipeline="warp_specialized")
    aqm = (am.double() if s.activation is None else
           s.activation.quantize(am.reshape(-1, 256)).dequantize(torch.float64).reshape(8, max_m, 256))
    for j in range(8):
        c = min(int(mcounts[j]), max_m)
        if c:
            worst = max(worst, rel(outm[j, :c], aqm[j, :c] @ w13[j].T))
    pipelines.add(f"grouped:{scheme}" + ("_fold" if any(moe.fold_scales) else ""))
torch.cuda.synchronize()
print(f"sanitize moe sample: max relative error {worst:.2e}, pipelines {sorted(pipelines)}")

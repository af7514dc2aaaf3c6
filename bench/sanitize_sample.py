"""A few small layers for compute-sanitizer (memcheck / racecheck / synccheck): split-K, warp-k reduction, zero
points, bias, odd shapes, group sizes that are not multiples of 16, and the warp-specialized pipeline (M >= 33 on
sm_90a: split-K, a partial last tile, K not a multiple of 128, fp16, 8-bit codes, a ring whose stages are refilled
(int8 at M = 700), several units per CTA (N = 8192, M = 700) and split-K slices on both sides of a wave of the
persistent grid (more units than SMs)); 8-bit activations on both pipelines, two-CTA clusters sharing weight
stages, group-32 activation scales, tokens on wgmma's M, weights widened into shared memory, W4A4 on the s4
kernels, and activations quantized into bf16 values (fake_quantize_activation; MXFP8's route). Prints the max
relative error and the pipelines that ran, so a sanitizer log also shows them. --clusters-only: the cluster and W4A4 cases alone."""

import argparse

import attrs
import torch

import humming_gen as hg
from humming_gen.heuristics import choose_tunings
from humming_gen.pipelines.base import TuningPlan
from humming_gen.pipelines.warp_specialized.heuristics import (activation_multicast, weight_multicast,
                                                               widened_weight_tunings)
from humming_gen.reference import reference_gemm

CASES = [(dict(weight="int4", group_size=128), 1000, 1536, True, (1, 16, 70, 200)),
         (dict(weight="uint4", group_size=64, zero_point="int"), 512, 1024, False, (3, 33)),
         (dict(weight="float8e4m3", scale_dtype="float32"), 256, 520, False, (5,)),
         (dict(weight="int4", group_size=7), 300, 1000, True, (1, 40)),  # odd group: rows past K, pair straddles
         (dict(weight="uint4", group_size=100, zero_point="float"), 256, 1000, False, (2, 130)),
         (dict(weight="uint4", group_size=64, zero_point="int"), 576, 1000, True, (65, 300)),
         (dict(weight="int8"), 1024, 2048, False, (64, 700)),
         (dict(weight="int4", group_size=128), 8192, 1024, False, (700,)),
         # 8-bit activations: the warp-specialized wgmma k32 kernels from M = 65 on (partial tiles, K % 128 != 0)
         # bf16 float weights in small groups: scales that carry the e2m1 converter's 2^126 (out_scale row factors)
         ("w4a16-mxfp4", 1000, 1536, True, (1, 16, 200)), ("w4a16-nvfp4", 576, 2048, False, (5, 70)),
         ("w8a8-fp8-block128", 1000, 1536, True, (3, 200)), ("w8a8-int8-channel", 1024, 2000, False, (700,)),
         ("w4a8-mxfp4-fp8", 576, 2048, True, (150,)), ("w4a8-int4-g128-int8", 4096, 1024, False, (300,)),
         # codes in the panels layout by one bulk copy and no producer cp.async (full barrier of one arrival)
         ("w8a8-fp8-channel", 1024, 2048, False, (5, 700)),
         # tokens on wgmma's M (block scales from M = 256): 256-row tiles, the last with one valid layout block
         ("w8a8-fp8-block128", 3900, 1024, True, (1500,)),
         # group-32 fp8 activation scales staged with the codes: four promotion groups a stage, in two token halves
         (dict(weight="float4e2m1", group_size=32, scale_dtype="float8e8m0",
               activation=hg.ActivationScheme("float8e4m3", granularity="group", group_size=32)), 576, 1024, True,
          (300,)),
         # MXFP8 as its bf16 values on the 16-bit kernels (dequantize_activations, the default on sm_90a)
         ("w8a8-mxfp8", 1000, 1056, True, (3, 200))]
DTYPES = {5: torch.float16}  # case index -> activation dtype (bf16 otherwise)
DEQUANTIZED = {len(CASES) - 1: None}  # case index -> dequantize_activations (False, the 8-bit kernels, otherwise)
parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--clusters-only", action="store_true", help="the cluster and W4A4 cases alone")
CLUSTERS_ONLY = parser.parse_args().clusters_only

worst = 0.0
pipelines = set()
for i, (kwargs, n, k, bias_on, ms) in enumerate(CASES if not CLUSTERS_ONLY else []):
    dtype = DTYPES.get(i, torch.bfloat16)
    scheme = hg.scheme(kwargs) if isinstance(kwargs, str) else hg.QuantScheme(**kwargs)
    qw = scheme.quantize(torch.randn(n, k, device="cuda") * 0.05)
    bias = torch.randn(n, device="cuda").to(dtype) if bias_on else None
    layer = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype, dequantize_activations=DEQUANTIZED.get(i, False))
    for m in ms:
        pipelines.add(layer.kernel_for(m).plan.pipeline)
        x = torch.randn(m, k, device="cuda").to(dtype)
        y = layer(x)
        ref = reference_gemm(x.double(), qw, bias=None if bias is None else bias.double())
        worst = max(worst, ((y.double() - ref).norm() / ref.norm()).item())

# fake_quantize_activation's kernels alone: group lanes, a thread per group, rows, warp rows; element loads (K = 36)
if not CLUSTERS_ONLY:
    for act in (hg.ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0"),
                hg.ActivationScheme("float8e4m3", granularity="group", group_size=100), hg.ActivationScheme("int8"),
                hg.ActivationScheme("float8e4m3", granularity="tensor")):
        for m, k in ((3, 36), (70, 4096), (2, 20000)):
            x = torch.randn(m, k, device="cuda").bfloat16()
            got = hg.fake_quantize_activation(x, act)
            assert torch.equal(got, act.quantize(x).dequantize(torch.bfloat16)), f"fake quantize {act} {m}x{k}"
    pipelines.add("fake_quantize_activation")


def register_plan(qw) -> TuningPlan:
    """The heuristics' plan with register weights (clusters are generated for those; the default layer of 8-bit
    weights reads them from shared memory)."""
    layer = hg.QuantLinear.from_quantized(qw)
    return choose_tunings(layer.layer_config, layer.target, stored=False, register_weights=True)


# split-K slices that wait for each other across waves of the persistent grid
if not CLUSTERS_ONLY:
    qw = hg.QuantScheme("int4", group_size=128).quantize(torch.randn(1024, 4096, device="cuda") * 0.05)
    tuning = attrs.evolve(hg.QuantLinear.from_quantized(qw).tunings.for_m(600), split_k=8)
    layer = hg.QuantLinear.from_quantized(qw, tunings=TuningPlan(((None, tuning),)))
    x = torch.randn(600, 4096, device="cuda").bfloat16()
    ref = reference_gemm(x.double(), qw)
    worst = max(worst, ((layer(x).double() - ref).norm() / ref.norm()).item())
# two-CTA clusters sharing activation stages (cluster_n=2): each CTA multicasts half the tile's rows (none for the
# second at M = 5), pairs of n tiles, banded, staged block scales beside
for name, n, k in (("w8a8-fp8-channel", 2048, 1024), ("w8a8-fp8-block128", 2048, 1024)):
    qw = hg.scheme(name).quantize(torch.randn(n, k, device="cuda") * 0.05)
    base = register_plan(qw)
    tuning = activation_multicast(attrs.evolve(base.for_m(4096), block_m=128))
    layer = hg.QuantLinear.from_quantized(qw, tunings=TuningPlan(((None, tuning),)))
    for m in (5, 300):
        x = torch.randn(m, k, device="cuda").bfloat16()
        ref = reference_gemm(x.double(), qw)
        worst = max(worst, ((layer(x).double() - ref).norm() / ref.norm()).item())
    pipelines.add(f"{layer.kernel_for(300).plan.pipeline} cluster n {layer.kernel_for(300).plan.launch.cluster}")
# two-CTA clusters sharing weight stages (cluster_m=2): an odd count of m tiles (the last pair's second idle), rings
# refilled across units, folded e8m0 scales and block scales multicast with the weights
for name, n, k in (("w8a8-fp8-channel", 8192, 1000), ("w4a8-mxfp4-fp8", 4096, 1024), ("w8a8-fp8-block128", 2048, 1024)):
    qw = hg.scheme(name).quantize(torch.randn(n, k, device="cuda") * 0.05)
    base = register_plan(qw)
    tuning = weight_multicast(attrs.evolve(base.for_m(4096), block_m=128))
    layer = hg.QuantLinear.from_quantized(qw, tunings=TuningPlan(((None, tuning),)))
    x = torch.randn(300, k, device="cuda").bfloat16()
    ref = reference_gemm(x.double(), qw)
    worst = max(worst, ((layer(x).double() - ref).norm() / ref.norm()).item())
    pipelines.add(f"{layer.kernel_for(300).plan.pipeline} cluster {layer.kernel_for(300).plan.launch.cluster}")
# weights widened into shared memory by the producer warpgroup's warps 1-3 (b_operand='widened'): folded MXFP4 with
# split-K at M = 5 and rings refilled across units at M = 700, the tokens on wgmma's M, int4 x int8; 16-bit
# activations (dequantized panels) from M = 17 (M = 5 runs the standard pipeline), a partial last tile
if not CLUSTERS_ONLY:
    for name, n, k, tokens_m_from in (("w4a8-mxfp4-fp8", 1024, 2048, None), ("w4a8-mxfp4-fp8", 576, 2048, 1),
                                      ("w4a8-int4-channel-int8", 4096, 1024, None),
                                      ("w4a16-int4-g128", 1000, 1536, None), ("w4a16-int4-g128-zp", 4096, 1024, None)):
        qw = hg.scheme(name).quantize(torch.randn(n, k, device="cuda") * 0.05)
        base = hg.QuantLinear.from_quantized(qw)
        plan = widened_weight_tunings(base.layer_config, base.target, tokens_m_from=tokens_m_from)
        layer = hg.QuantLinear.from_quantized(qw, tunings=plan)
        for m in (5, 70, 700):
            x = torch.randn(m, k, device="cuda").bfloat16()
            ref = reference_gemm(x.double(), qw)
            worst = max(worst, ((layer(x).double() - ref).norm() / ref.norm()).item())
            pipelines.add(f"{layer.kernel_for(m).plan.pipeline} {layer.kernel_for(m).plan.tuning.b_operand}")
# W4A4 int4 x int4 on the s4 kernels (strict=True: where ptxas emulates the s4 mma the default runs int8 activations):
# split-K at M = 1, a partial last k tile of packed bytes (K = 2816: 1408 bytes), group-64 activations
for act in (hg.ActivationScheme("int4"), hg.ActivationScheme("int4", granularity="group", group_size=64)):
    qw = hg.QuantScheme("int4", group_size=128, scale_dtype="bfloat16", activation=act).quantize(
        torch.randn(1000, 2816, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw, strict=True)
    for m in (1, 70):
        x = torch.randn(m, 2816, device="cuda").bfloat16()
        ref = reference_gemm(x.double(), qw)
        worst = max(worst, ((layer(x).double() - ref).norm() / ref.norm()).item())
        pipelines.add(f"{layer.kernel_for(m).plan.pipeline} {layer.compute_dtype}")
torch.cuda.synchronize()
print(f"sanitize sample: max relative error {worst:.2e}, pipelines {sorted(pipelines)}")

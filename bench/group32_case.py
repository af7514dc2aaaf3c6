"""Issue 10's group-32 case: MXFP4 weights at M = 4096 with fp8 activations per token, per group of 32 (fp32
scales) and MXFP8 (e8m0 group-32 scales), beside cuBLAS bf16; CUDA-graph us per layer, the activation
quantization included (canonical method: distinct layers rotated, median of replays). With --variants, each
activation also without the overlapped promotion (compose_a8.OVERLAP_PROMOTION=False), with its staged scales read
after the wgmma wait as before 702693c (components.PRELOAD_SCALES_MAX_TOKENS=0), with 128-token tiles, and
MXFP8 with its e8m0 scales read from global memory at each promotion (compose_a8.STAGE_E8M0_SCALES=False; staged with
the codes by default), at 64 and 128 tokens. The group-32 columns run the 8-bit kernels
(QuantLinear(dequantize_activations=False)); "as bf16 values" runs the same scheme's quantized activations as bf16
values on the 16-bit kernels (fake_quantize_activation, then the W4A16 GEMM; the default for both on sm_90a: exact
for MXFP8, rounded to bf16 for fp32 group scales). With --bf16-emulation, MXFP8 also as the torch
probe that preceded that path: x quantized and dequantized in torch ops, then QuantLinear weight_only=True."""

from __future__ import annotations

import argparse

import torch

import humming_gen as hg
from bench_dense import graph_time_us
from humming_gen.bench.timing import cold_layer_count
from humming_gen.pipelines.base import TuningPlan
from humming_gen.pipelines.warp_specialized import compose_a8, components as ws_components
from humming_gen.pipelines.warp_specialized.heuristics import restaged
from humming_gen.reference import reference_gemm
from humming_gen.targets import Target

ACTIVATIONS = {"fp8 per token": hg.ActivationScheme("float8e4m3", granularity="token"),
               "fp8 group-32": hg.ActivationScheme("float8e4m3", granularity="group", group_size=32),
               "MXFP8": hg.ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0")}
parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--variants", action="store_true",
                    help="each activation also without the overlapped promotion, with 128-token tiles and (MXFP8) "
                         "its e8m0 scales read from global memory")
parser.add_argument("--bf16-emulation", action="store_true", help="MXFP8 also as its exact bf16 emulation (a probe)")
args = parser.parse_args()
VARIANTS = ({"": {}, " (one set)": {"overlap": False}, " (scales after the wait)": {"preload": 0},
             " t128": {"block_m": 128},
             " read": {"stage_e8m0": False, "block_m": 64}, " read t128": {"stage_e8m0": False, "block_m": 128}}
            if args.variants else {"": {}})
M = 4096
torch.manual_seed(0)
target = Target.current()


def build(qws, variant: dict) -> list:
    """QuantLinears of `qws`: the heuristics' tunings, or their open-ended bucket's with `variant` applied."""
    defaults = compose_a8.OVERLAP_PROMOTION, compose_a8.STAGE_E8M0_SCALES, ws_components.PRELOAD_SCALES_MAX_TOKENS
    compose_a8.OVERLAP_PROMOTION = variant.get("overlap", defaults[0])
    compose_a8.STAGE_E8M0_SCALES = variant.get("stage_e8m0", defaults[1])
    ws_components.PRELOAD_SCALES_MAX_TOKENS = variant.get("preload", defaults[2])
    try:
        if "block_m" not in variant:
            return [hg.QuantLinear.from_quantized(q, dequantize_activations=False) for q in qws]
        first = hg.QuantLinear.from_quantized(qws[0], dequantize_activations=False)
        plan = first.kernel_for(M).plan
        tuning = restaged(plan.layer, target, plan.tuning, block_m=variant["block_m"])
        return [hg.QuantLinear.from_quantized(q, dequantize_activations=False, tunings=TuningPlan(((None, tuning),)))
                for q in qws]
    finally:
        compose_a8.OVERLAP_PROMOTION, compose_a8.STAGE_E8M0_SCALES, ws_components.PRELOAD_SCALES_MAX_TOKENS = defaults


def applies(act: hg.ActivationScheme, variant: dict) -> bool:
    """Where e8m0 scales are read changes MXFP8's kernels only."""
    return "stage_e8m0" not in variant or act.scale_dtype.name == "float8e8m0"


EMULATE = args.bf16_emulation


def mx_dequantized(x: torch.Tensor, act: hg.ActivationScheme) -> torch.Tensor:
    """bf16 of the MXFP8 values of x (exact: an e4m3 code times 2^(e - 127)), in float32 from the kernel layout:
    QuantizedActivation.dequantize gives the same values (checked below) through float64 and the reference
    layout, too slow to stand for a fused fake-quantize in the timing."""
    m, k = x.shape
    qa = hg.quantize_activation(x, act)
    codes = qa.codes[:, :k].view(torch.float8_e4m3fn).float().view(m, k // 32, 32)
    scales = torch.ldexp(torch.ones((), device=x.device), qa.scales.int() - 127).view(m, k // 32, 1)
    return (codes * scales).view(m, k).bfloat16()


names = [a + v for a, act in ACTIVATIONS.items() for v, variant in VARIANTS.items() if applies(act, variant)]
names += ["fp8 group-32 as bf16 values", "MXFP8 as bf16 values"] + (["MXFP8 as bf16 (torch probe)"] if EMULATE else [])
print("| N x K | cuBLAS bf16 | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names))
for n, k in ((3072, 4096), (14336, 4096)):
    x = torch.randn(M, k, device="cuda").bfloat16()
    count = cold_layer_count(n * k * 2, target.l2_bytes, 4)
    dense = [torch.randn(n, k, device="cuda").bfloat16() * 0.02 for _ in range(count)]
    cells = [f"{graph_time_us([lambda x, w=w: x @ w.t() for w in dense], x):.1f}"]
    del dense
    values = []  # the group-32 activations as bf16 values on the 16-bit kernels
    for name, act in ACTIVATIONS.items():
        scheme = hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", activation=act)
        qws = [scheme.quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(4)]
        ref = reference_gemm(x[:64].double(), qws[0])
        for variant in VARIANTS.values():
            if not applies(act, variant):
                continue
            try:
                layers = build(qws, variant)
            except Exception as e:  # a variant that does not compose (say, spills) is reported, not timed
                cells.append(f"{type(e).__name__}: {' '.join(str(e).split())[:60]}")
                continue
            err = ((layers[0](x[:64]).double() - ref).norm() / ref.norm()).item()
            t = layers[0].kernel_for(M).plan.tuning
            cells.append(f"{graph_time_us(layers, x):.1f} ({t.pipeline[:8]} {t.block_m}, err {err:.1e})")
            del layers
        if act.granularity == "group":
            layers = [hg.QuantLinear.from_quantized(q, dequantize_activations=True) for q in qws]
            err = ((layers[0](x[:64]).double() - ref).norm() / ref.norm()).item()
            values.append(f"{graph_time_us(layers, x):.1f} (err {err:.1e})")
            del layers
        if EMULATE and act.scale_dtype.name == "float8e8m0":
            layers = [hg.QuantLinear.from_quantized(q, weight_only=True) for q in qws]
            assert torch.equal(mx_dequantized(x[:64], act),
                               hg.quantize_activation(x[:64], act).dequantize(torch.bfloat16)), "not MXFP8's values"
            err = ((layers[0](mx_dequantized(x[:64], act)).double() - ref).norm() / ref.norm()).item()
            fns = [lambda x, layer=layer: layer(mx_dequantized(x, act)) for layer in layers]
            emulated = f"{graph_time_us(fns, x):.1f} (err {err:.1e})"
            del layers
        del qws
        torch.cuda.empty_cache()
    cells += values + ([emulated] if EMULATE else [])
    print(f"| {n}x{k} | " + " | ".join(cells) + " |", flush=True)

"""Where the warp-specialized W4A16 kernels spend their time: the same kernels with one part of the work removed
from the generated source (the results are wrong; only the times mean something), timed by the graph method. The
kernels are those whose producer threads cp.async the activations (heuristics.TMA_ACTIVATIONS off while they are
built): the measurement that led to the TMA loads.

Variants: base; no_a (the producer issues no activation copies: its arrivals still complete each stage); no_dequant
(the consumers feed the code words times the group scales to wgmma, one HFMA2 per register instead of the
dequantization chain of four); no_a_dequant (both);
no_store (the epilogue's stores only run for a NaN accumulator, which never happens).
Layers: dense 8192 x 8192 (M = 1024 / 4096 / 8192) and the DeepSeek-V3 per-rank gate-up GEMM (E = 256, top-8,
512 x 7168; indexed as QuantMoE runs it, and grouped-contiguous on pre-gathered rows) at M = 4096.

    python bench/ws_ablation.py [--variants base,no_a,...] [--dense-m 1024,4096,8192] [--moe-m 4096]
"""

from __future__ import annotations

import argparse
import re
import sys

import torch

import humming_gen as hg
import humming_gen.kernel as kernel_module
from humming_gen.bench.timing import graph_time_us
from humming_gen.pipelines.warp_specialized import heuristics

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from moe_bench import MODELS, make_batch, quantize_experts  # noqa: E402

_generate = kernel_module.generate

DEQUANT = re.compile(r"dequant_pair\(extract_code_pair\(words, 4 \* tile \+ r\),\s*r % 2 \? scale_hi_i : scale_lo_i\)")
A_LOAD = re.compile(r"\n\s*load_a_stage\(ring\.stage\(stage\),[^;]*;")
STORE = re.compile(r"\n(\s*)(store_output\(acc,[^;]*;)")


def transform(source: str, variant: str) -> str:
    if "wgmma_m64n" not in source or variant == "base":
        return source
    out = source
    if variant in ("no_a", "no_a_dequant"):
        out, n = A_LOAD.subn("", out)
        assert n >= 1, "no activation load found"
    if variant in ("no_dequant", "no_a_dequant"):
        # one HFMA2 per pair (the word times the group scale) instead of the extract + convert + scale chain
        out, n = DEQUANT.subn("fma2(words[(4 * tile + r) % kChunkWords], r % 2 ? scale_hi_i : scale_lo_i, 0x80008000u)",
                              out)
        assert n == 1, f"dequantization found {n} times"
    if variant == "no_store":
        out, n = STORE.subn(r"\n\1if (acc[0][0][0] != acc[0][0][0]) \2", out)
        assert n >= 1, "no store found"
    return out


def with_variant(variant: str):
    def generate(plan, compiler=None):
        return transform(_generate(plan, compiler), variant)
    return generate


def dense(variant: str, ms: list[int], layers: int = 4) -> dict[int, float]:
    torch.manual_seed(0)
    built = [hg.QuantLinear.from_float(torch.randn(8192, 8192, device="cuda") * 0.02, hg.scheme("w4a16-int4-g128"))
             for _ in range(layers)]
    times = {}
    for m in ms:
        x = torch.randn(m, 8192, device="cuda").bfloat16()
        times[m] = graph_time_us([lambda a, lay=lay: lay(a) for lay in built], x)
    return times


def moe(variant: str, ms: list[int], layers: int = 2) -> dict[tuple[str, int], float]:
    spec = MODELS["deepseek"]
    scheme = hg.scheme("w4a16-int4-g128")
    built = []
    for i in range(layers):
        torch.manual_seed(i)
        q13 = quantize_experts(scheme, spec.experts, 2 * spec.intermediate, spec.hidden)
        q2 = quantize_experts(scheme, spec.experts, spec.hidden, spec.intermediate)
        built.append(hg.QuantMoE.from_quantized(q13, q2, fused_activation=False))
    times = {}
    for m in ms:
        b = make_batch(spec, m, seed=m)
        bm = built[0].block_m(m, spec.top_k)
        routing = hg.moe_align(b.ids, spec.experts, bm)
        out = torch.empty(m * spec.top_k, 2 * spec.intermediate, dtype=torch.bfloat16, device="cuda")

        def indexed(a, layer):
            return hg.moe_gemm(a, layer, "w13", routing.sorted_ids, routing.expert_ids, routing.num_tokens_post_pad,
                               top_k=spec.top_k, block_m=bm, out=out)

        def grouped(a, layer):
            return hg.grouped_moe_gemm(a, layer, "w13", b.offsets, layout="grouped_contiguous", out=out)

        times["indexed", m] = graph_time_us([lambda a, lay=lay: indexed(a, lay) for lay in built], b.x)
        times["grouped", m] = graph_time_us([lambda a, lay=lay: grouped(a, lay) for lay in built], b.a13)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="base,no_a,no_dequant,no_a_dequant,no_store")
    ap.add_argument("--dense-m", default="1024,4096,8192")
    ap.add_argument("--moe-m", default="4096")
    args = ap.parse_args()
    dense_ms = [int(v) for v in args.dense_m.split(",") if v]
    moe_ms = [int(v) for v in args.moe_m.split(",") if v]
    rows = []
    heuristics.TMA_ACTIVATIONS = False
    for variant in args.variants.split(","):
        kernel_module.generate = with_variant(variant)
        d, e = {}, {}
        try:
            d = dense(variant, dense_ms)
            e = moe(variant, moe_ms)
        except Exception as err:  # a variant that does not compile (say ptxas serializing its wgmmas)
            print(f"{variant}: {type(err).__name__}: {str(err)[:400]}", flush=True)
        finally:
            kernel_module.generate = _generate
        rows.append((variant, d, e))
        torch.cuda.empty_cache()
        print(variant, d, e, flush=True)
    heads = [f"dense M={m}" for m in dense_ms] + [f"DeepSeek gate-up {g} M={m}" for m in moe_ms
                                                  for g in ("indexed", "grouped")]
    print("\n| variant | " + " | ".join(heads) + " |\n|---" * 1 + "|---" * len(heads) + "|")
    for variant, d, e in rows:
        cells = ([f"{d[m]:.1f}" if m in d else "-" for m in dense_ms]
                 + [f"{e[g, m]:.1f}" if (g, m) in e else "-" for m in moe_ms for g in ("indexed", "grouped")])
        print(f"| {variant} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

"""MXFP4's e8m0 group scales folded into the e4m3 weights of the warp-specialized 8-bit MoE kernels (QuantMoE,
W4A8 mxfp4 x fp8 on sm_90a): compose, the stacked exponent deltas and row factors rebased per expert, NVRTC
compilation at Qwen3 and gpt-oss shapes, and QuantMoE's per-GEMM decision from every expert's rows. The dense fold
is tests/cpu/test_exponent_fold.py; GPU: tests/gpu/test_quant_moe_fold.py."""

from __future__ import annotations

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build_many, generate
from humming_gen.layer.moe import QuantMoE, expert_weight, prepare_moe_weight
from humming_gen.pipelines.warp_specialized.heuristics import MOE_BUCKETS, choose_moe_tunings
from humming_gen.pipelines.weights import prepare_weight
from humming_gen.targets import get_target
from moe_host import expert_constant, ws_moe_plans

SM90 = get_target("sm_90a")
SCHEME = "w4a8-mxfp4-fp8"
WEIGHTED = ComputeConfig(gemm="indexed", topk_weight=True)


def _layer(n: int, k: int, experts: int = 8, **kw) -> LayerConfig:
    return LayerConfig(n=n, k=k, scheme=SCHEME, num_experts=experts, fold_scales=True, **kw)


def _plans(layer: LayerConfig, compute: ComputeConfig, block_ms: tuple[int, ...] | None = None) -> list:
    return ws_moe_plans(layer, compute, block_ms)


def test_compose_folds_indexed_and_grouped_moe_kernels() -> None:
    """The warp-specialized indexed and grouped kernels read the deltas and row factors instead of the group scales;
    the standard pipeline's MoE kernels read the fp32 group scales of the same packed weight."""
    layer = _layer(1024, 2048, has_bias=True)
    tuning = choose_moe_tunings(layer, SM90).for_m(1000)
    folded = compose(layer, WEIGHTED, tuning, SM90)
    names = [a.name for a in folded.args]
    assert folded.kernel_name.endswith("_moe_topkw_fold")
    assert "b_exponent" in names and "out_scale" in names and "b_scale" not in names
    src = generate(folded)
    for present in ("nibbles_to_a8_folded(v.x", "p.b_exponent = static_cast<const char*>(p.b_exponent) + "
                    "static_cast<long long>(expert) * cfg::kExpertBExponentBytes;",
                    "p.out_scale = static_cast<const char*>(p.out_scale) + static_cast<long long>(expert) * "
                    "cfg::kExpertOutScaleBytes;"):
        assert present in src, present
    for gone in ("nibbles_to_a8(", "load_weight_group_scales", "b_scale"):
        assert gone not in src, gone
    small = attrs.evolve(choose_tunings(layer, SM90, pipeline="standard").for_m(8), split_k=1)
    standard = compose(layer, WEIGHTED, small, SM90)
    assert standard.layout == folded.layout and "b_scale" in [a.name for a in standard.args]
    assert not standard.kernel_name.endswith("_fold")
    for gemm, suffix in (("grouped_masked", "_moe_masked_fold"), ("grouped_contiguous", "_moe_contiguous_fold")):
        grouped = compose(layer, ComputeConfig(gemm=gemm), tuning, SM90)
        assert grouped.kernel_name.endswith(suffix) and grouped.layout == folded.layout
        assert [a.name for a in grouped.args if a.name.startswith(("b", "out_scale"))] == \
            [a.name for a in folded.args if a.name.startswith(("b", "out_scale"))]  # the same weight tensors
        src = generate(grouped)
        assert "nibbles_to_a8_folded(v.x" in src and "b_scale" not in src
        assert ("p.b_exponent = static_cast<const char*>(p.b_exponent) + static_cast<long long>(expert) * "
                "cfg::kExpertBExponentBytes;") in src and "p.m = row_end;" in src
    with pytest.raises(ValueError, match="fold_scales=True: .*e8m0 group scales"):
        LayerConfig(n=1024, k=2048, scheme="w4a8-int4-g128-fp8", num_experts=8, fold_scales=True)


# Qwen3-30B-A3B (gate/up N = 2I = 1536, K = H = 2048; down N = 2048, K = 768) and gpt-oss-120b (N = 5760, K = 2880;
# N = 2880, K = 2880, biases), 128 experts: GEMM1 with the fused gated epilogue, GEMM2 with the router weights
SHAPES = {"qwen3": ((1536, 2048, "silu_mul", False), (2048, 768, None, False)),
          "gpt-oss": ((5760, 2880, "swiglu_oai", True), (2880, 2880, None, True))}


@pytest.mark.parametrize("model", list(SHAPES))
def test_folded_moe_kernels_compile_without_spills(model: str) -> None:
    """Every warp-specialized MoE bucket (token tiles 8 .. 128) of both GEMMs, NVRTC for sm_90a."""
    plans = []
    for n, k, gated, bias in SHAPES[model]:
        compute = ComputeConfig(gemm="indexed", epilogue_activation=gated) if gated else WEIGHTED
        plans += _plans(_layer(n, k, experts=128, has_bias=bias), compute)
    assert [p.tuning.block_m for p in plans] == [bm for _, bm in MOE_BUCKETS] * 2
    for kernel in build_many(plans):
        r = kernel.resources
        assert kernel.name.endswith("_fold"), kernel.name
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)


def _quantized(experts: int, n: int, k: int, seed: int = 0) -> hg.QuantizedWeight:
    """Random MXFP4 experts whose magnitudes differ by 2^(4 e), so each expert's row factors differ."""
    torch.manual_seed(seed)
    w = torch.randn(experts, n, k) * 0.05 * 2.0 ** (4 * torch.arange(experts, dtype=torch.float32))[:, None, None]
    return hg.scheme(SCHEME).quantize(w)


def _deltas(b_exponent: torch.Tensor, n: int, k_pad: int) -> torch.Tensor:
    """b_exponent words [n_pad / 128][k_pad / 128][128 rows] -> deltas (n, k_pad / 32) (exponent_fold layout)."""
    steps = k_pad // 32
    fields = torch.stack([(b_exponent[:, s // 4, :].reshape(-1) >> 8 * (s % 4)) & 0xFF for s in range(steps)], 1)
    d = (fields >> 3).long()
    return torch.where(d >= 8, d - 16, d)[:n]


def test_stacked_exponents_and_row_factors_rebase_per_expert() -> None:
    """Expert e's deltas and row factors lie e x kExpert*Bytes from the stacked tensors' starts (what for_expert
    adds), and with them give back expert e's own group scales."""
    experts, n, k = 3, 300, 640
    plan = _plans(_layer(n, k, experts=experts), WEIGHTED, block_ms=(32,))[0]
    qw = _quantized(experts, n, k)
    stacked = prepare_moe_weight(plan, qw, "cpu")
    consts = {name: value for name, value, _ in plan.constants}
    groups = qw.scales.shape[-1]
    for name in ("b_exponent", "out_scale"):
        per_expert = consts[expert_constant(name)]
        flat = getattr(stacked, name).contiguous().view(torch.uint8).reshape(-1)
        assert flat.numel() == experts * per_expert, name
        for e in range(experts):
            own = getattr(prepare_weight(plan, expert_weight(qw, e), "cpu"), name).contiguous()
            assert torch.equal(flat[e * per_expert:(e + 1) * per_expert], own.view(torch.uint8).reshape(-1)), (name, e)
    for e in range(experts):
        d = _deltas(stacked.b_exponent[e], n, plan.layout.k_pad)
        rebuilt = stacked.out_scale[e, :n, None].double() * torch.ldexp(torch.ones_like(d, dtype=torch.float64), d)
        assert torch.equal(rebuilt[:, :groups].float(), qw.scales[e]), e
    assert len({float(stacked.out_scale[e, 0]) for e in range(experts)}) == experts  # the row factors differ


def _moe(q13: hg.QuantizedWeight, q2: hg.QuantizedWeight, **kw) -> QuantMoE:
    return QuantMoE(q13, q2, target=kw.pop("target", "sm_90a"), device="cpu", **kw)


def test_quant_moe_folds_each_gemm_where_every_experts_rows_allow() -> None:
    """Random MXFP4 experts fold both GEMMs (warp-specialized buckets `_fold`, the standard buckets promote the
    group scales of the same packed weight); one expert row of w2 spanning 12 binades keeps w2 unfolded and w13
    folded; a row 20 binades below the others still folds (rows fold independently)."""
    e, hidden, inter = 8, 256, 128
    q13, q2 = _quantized(e, 2 * inter, hidden, seed=1), _quantized(e, hidden, inter, seed=2)
    moe = _moe(q13, q2, activation="swiglu_oai", gate_up_layout="interleaved", fused_activation=True,
               bias13=torch.randn(e, 2 * inter), bias2=torch.randn(e, hidden))
    assert moe.fold_scales == (True, True) and "fold_scales=(True, True)" in repr(moe)
    for g1, g2 in moe._kernels:
        for kernel in (g1, g2):
            ws = kernel.plan.pipeline == "warp_specialized"
            assert kernel.name.endswith("_fold") == ws, kernel.name
    assert [g1.plan.pipeline for g1, _ in moe._kernels] == ["standard"] * 2 + ["warp_specialized"] * 2
    for w in (moe.w13, moe.w2):
        assert w.b_exponent is not None and w.b_scale is not None and w.out_scale is not None

    scales = q2.scales.clone()
    scales[5, 17, 1] *= 2.0 ** -12  # expert 5, row 17: one group 12 binades below the row's largest
    wide = attrs.evolve(q2, scales=scales)
    fallback = _moe(q13, wide)
    assert fallback.fold_scales == (True, False) and fallback.w2.b_exponent is None
    assert all(not g2.name.endswith("_fold") and g1.name.endswith("_fold") == (g1.plan.pipeline == "warp_specialized")
               for g1, g2 in fallback._kernels)
    low = q2.scales.clone()
    low[3, 40] *= 2.0 ** -20  # a whole row far below the others: its own row factor
    assert _moe(q13, attrs.evolve(q2, scales=low)).fold_scales == (True, True)


def test_quant_moe_folds_only_where_warp_specialized_kernels_run() -> None:
    """No warp-specialized 8-bit MoE kernel, no fold: sm_89, pipeline="standard", weight-only; other formats."""
    q13, q2 = _quantized(4, 256, 256), _quantized(4, 256, 128)
    assert _moe(q13, q2, target="sm_89").fold_scales == (False, False)
    assert _moe(q13, q2, pipeline="standard").fold_scales == (False, False)
    assert _moe(q13, q2, weight_only=True).fold_scales == (False, False)
    forced = _moe(q13, q2, pipeline="warp_specialized")
    assert forced.fold_scales == (True, True) and all(g.name.endswith("_fold") for pair in forced._kernels
                                                       for g in pair)
    int4 = hg.scheme("w4a8-int4-g128-fp8")
    assert _moe(int4.quantize(torch.randn(4, 256, 256)), int4.quantize(torch.randn(4, 256, 128))).fold_scales == (
        False, False)


def test_component_declarations_match_the_folded_moe_source() -> None:
    """Each component of the folded MoE kernels defines and uses exactly the device symbols it declares."""
    from symbols import declaration_mismatches

    plans = (_plans(_layer(1024, 2048, has_bias=True), WEIGHTED, block_ms=(8, 128))
             + _plans(_layer(1024, 2048), ComputeConfig(gemm="indexed", epilogue_activation="swiglu_oai"),
                      block_ms=(64,)))
    wrong = {}
    for plan in plans:
        wrong.update(declaration_mismatches(plan))
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())


def test_grouped_gemms_of_a_folded_layer_read_the_folded_scales() -> None:
    """A folded GEMM's grouped kernels are warp-specialized and folded from 17 rows per expert on (as its indexed
    ones), compile without spills, and bind the layer's one packed weight; pipeline="standard" still forces the
    promotion of the fp32 group scales."""
    torch.manual_seed(5)
    w13, w2 = torch.randn(8, 256, 256) * 0.05, torch.randn(8, 256, 128) * 0.05
    for pipeline in (None, "warp_specialized"):
        moe = QuantMoE.from_float(w13, w2, hg.scheme("w4a8-mxfp4-fp8"), target="sm_90a", device="cpu",
                                  pipeline=pipeline)
        assert moe.fold_scales == (True, True)
        for gemm in ("grouped_masked", "grouped_contiguous"):
            kernel = moe.grouped_launcher("w2", gemm, 100).kernel
            assert kernel.plan.pipeline == "warp_specialized" and kernel.name.endswith("_fold"), kernel.name
            assert kernel.resources["spill_store_bytes"] == 0 and kernel.resources["stack_bytes"] == 0
            forced = moe.grouped_launcher("w2", gemm, 100, pipeline="standard").kernel
            assert forced.plan.pipeline == "standard" and not forced.name.endswith("_fold")

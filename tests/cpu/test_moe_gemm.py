"""MoE (indexed) GEMMs of the standard pipeline on the CPU: what compose accepts and refuses, the generated
source (routing gather, expert rebasing, row-mapped store), compilation for every target without spills, and
the stacked expert weights QuantMoE prepares."""

from __future__ import annotations

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import ComposeError, compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build_many
from humming_gen.layer.moe import QuantMoE, expert_weight, prepare_moe_weight
from humming_gen.targets import get_target

INDEXED = ComputeConfig(gemm="indexed")
WEIGHTED = ComputeConfig(gemm="indexed", topk_weight=True)
SCHEMES = {"int4-g128": "w4a16-int4-g128", "uint4-g128-zp": "w4a16-int4-g128-zp", "int8-channel": "w8a16-int8-channel",
           "mxfp4": "w4a16-mxfp4"}


def _plans(scheme: str, target: str, compute: ComputeConfig = WEIGHTED, bias: bool = True):
    layer = LayerConfig(n=1024, k=2048, scheme=SCHEMES[scheme], num_experts=8, has_bias=bias)
    tgt = get_target(target)
    return [compose(layer, compute, attrs.evolve(t, split_k=1), tgt)
            for _, t in choose_tunings(layer, tgt, pipeline="standard").buckets]


@pytest.mark.parametrize("target", ["sm_80", "sm_89", "sm_90a", "sm_120a"])
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_moe_kernels_compile_without_spills(scheme: str, target: str) -> None:
    for kernel in build_many(_plans(scheme, target)):
        r = kernel.compiled.resources
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)


def test_moe_source_gathers_rebases_and_maps_rows() -> None:
    plan = _plans("uint4-g128-zp", "sm_90a")[0]
    src = hg.kernel.generate(plan, "nvrtc")
    assert "gather_rows(a_rows, p, tc.m0)" in src and "if (tc.expert < 0) return;" in src
    for field in ("b", "b_scale", "b_zero", "bias"):
        assert f"p.{field} = static_cast<const char*>(p.{field}) + static_cast<long long>(expert) * cfg::" in src
    assert "rows[mt][j] = sorted_ids[m_base" in src and "p.topk_weights" in src
    # the wait for the routing comes before the schedule reads it (PDL), and only once
    body = src[src.index("(const Params routed)"):]
    assert body.index("wait_for_previous_grid()") < body.index("tile_coord(routed)")
    assert src.count("wait_for_previous_grid();") == 1
    names = [a.name for a in plan.args]
    assert names[-5:] == ["topk_weights", "m", "lda", "ldc", "top_k"][-5:]
    assert plan.grid(100)[1] == -(-(100 + 8 * (plan.tuning.block_m - 1)) // plan.tuning.block_m)
    unweighted = hg.kernel.generate(_plans("uint4-g128-zp", "sm_90a", INDEXED, bias=False)[0], "nvrtc")
    assert "topk_weights" not in unweighted and "kExpertBiasBytes" not in unweighted


def test_dense_sources_have_no_moe_trace() -> None:
    layer = LayerConfig(n=1024, k=2048, scheme="w4a16-int4-g128")
    tgt = get_target("sm_90a")
    src = hg.kernel.generate(compose(layer, ComputeConfig(), choose_tunings(layer, tgt).for_m(1), tgt), "nvrtc")
    code = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith("//"))
    for word in ("sorted_ids", "expert", "gather_rows", "routed"):
        assert word not in code, word


def test_compose_refuses_what_moe_kernels_do_not_do() -> None:
    tgt = get_target("sm_90a")
    moe_layer = LayerConfig(n=1024, k=2048, scheme="w4a16-int4-g128", num_experts=8)
    tuning = choose_tunings(moe_layer, tgt, pipeline="standard").for_m(1)
    assert tuning.split_k > 1
    compose(moe_layer, INDEXED, tuning, tgt)  # split-K indexed GEMMs: tests/cpu/test_moe_split_k.py
    for gemm in ("grouped_masked", "grouped_contiguous"):
        with pytest.raises(ComposeError, match=f"tuning.split_k={tuning.split_k}: {gemm} MoE kernels take split_k=1"):
            compose(moe_layer, ComputeConfig(gemm=gemm), tuning, tgt)
    with pytest.raises(ComposeError, match="needs compute.gemm='indexed'"):
        compose(moe_layer, ComputeConfig(), attrs.evolve(tuning, split_k=1), tgt)
    with pytest.raises(ComposeError, match="accumulate"):
        compose(moe_layer, ComputeConfig(gemm="indexed", accumulate="float16"), attrs.evolve(tuning, split_k=1), tgt)
    ws = choose_tunings(LayerConfig(n=1024, k=2048, scheme="w4a16-int4-g128"), tgt).for_m(1024)
    assert ws.pipeline == "warp_specialized" and ws.split_k > 1  # (indexed MoE on it: tests/cpu/test_moe_gemm_ws.py)
    with pytest.raises(ComposeError, match="the warp_specialized pipeline's MoE kernels take split_k=1"):
        compose(moe_layer, INDEXED, ws, tgt)


def test_prepared_experts_are_stacked_per_expert() -> None:
    torch.manual_seed(0)
    scheme = hg.QuantScheme("uint4", group_size=128, zero_point="int")
    q = scheme.quantize(torch.randn(4, 256, 512) * 0.05)
    plan = _plans("uint4-g128-zp", "sm_90a", INDEXED, bias=False)[0]
    plan = compose(attrs.evolve(plan.layer, n=256, k=512, num_experts=4), INDEXED, plan.tuning, plan.target)
    stacked = prepare_moe_weight(plan, q, "cpu")
    consts = dict((name, value) for name, value, _ in plan.constants)
    for e in range(4):
        one = hg.layer.weights.prepare_weight(plan, expert_weight(q, e), "cpu")
        assert torch.equal(stacked.b[e], one.b) and torch.equal(stacked.b_scale[e], one.b_scale)
        assert torch.equal(stacked.b_zero[e], one.b_zero)
    # the kernel's per-expert byte strides are the stacked tensors' strides
    assert consts["kExpertBBytes"] == stacked.b[0].numel() * stacked.b.element_size()
    assert consts["kExpertBScaleBytes"] == stacked.b_scale[0].numel() * stacked.b_scale.element_size()
    assert consts["kExpertBZeroBytes"] == stacked.b_zero[0].numel() * stacked.b_zero.element_size()


def test_quant_moe_builds_on_the_cpu_and_refuses_bad_input() -> None:
    torch.manual_seed(1)
    w13, w2 = torch.randn(4, 2 * 128, 256) * 0.05, torch.randn(4, 256, 128) * 0.05
    moe = QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_90a", device="cpu",
                              bias13=torch.randn(4, 256), bias2=torch.randn(4, 256))
    assert moe.w13.b.shape[0] == 4 and moe.bias13.shape == (4, 256)
    assert moe.block_m(1, 8) == 8 and moe.block_m(4096, 8) >= 64  # rows per expert choose the bucket
    x = torch.randn(3, 256).bfloat16()
    ids = torch.randint(0, 4, (3, 2))
    with pytest.raises(ValueError, match="topk_weights must have topk_ids' shape"):
        moe(x, torch.rand(3, 1), ids)
    with pytest.raises(ValueError, match=r"x must be \(M, 256\)"):
        moe(x[:, :128], torch.rand(3, 2), ids)
    q13 = hg.scheme("w4a16-int4-g128").quantize(w13)
    with pytest.raises(ValueError, match="act-order"):
        expert_weight(hg.QuantizedWeight(scheme=q13.scheme, codes=q13.codes, scales=q13.scales,
                                         k_perm=torch.arange(256)), 0)
    with pytest.raises(ValueError, match="multiples of 8"):
        QuantMoE.from_float(torch.randn(2, 2 * 12, 256), torch.randn(2, 256, 12), "w4a16-int4-g128",
                            target="sm_90a", device="cpu")
    launcher = moe._launchers[0][0]
    with pytest.raises(ValueError, match="MoE kernel: launch it with Launcher.moe"):
        launcher(x, torch.empty(3, 256, dtype=torch.bfloat16))


@pytest.mark.parametrize("gemm", ["grouped_masked", "grouped_contiguous"])
def test_grouped_kernels_compile_and_bound_rows_by_expert(gemm: str) -> None:
    plans = _plans("uint4-g128-zp", "sm_90a", ComputeConfig(gemm=gemm))
    for kernel in build_many(plans):
        assert kernel.compiled.resources["spill_store_bytes"] == 0
    src = hg.kernel.generate(plans[0], "nvrtc")
    assert "p.m = row_end;" in src and "gather_rows" not in src and "sorted_ids" not in src
    assert plans[0].kernel_name.endswith("_moe_" + gemm.split("_")[1])
    assert [a.name for a in plans[0].args if a.kind == "routing"] == ["expert_layout"]
    bm = plans[0].tuning.block_m
    if gemm == "grouped_masked":  # E x ceil(max_m / block_m) blocks for m = E x max_m rows
        assert plans[0].grid(8 * 20)[1] == 8 * -(-20 // bm)
    else:  # every segment adds at most one partial block
        assert plans[0].grid(100)[1] == -(-100 // bm) + 8
    with pytest.raises(ComposeError, match="topk_weight"):
        compose(plans[0].layer, ComputeConfig(gemm=gemm, topk_weight=True), plans[0].tuning, plans[0].target)


@pytest.mark.parametrize("activation", ["silu_mul", "gelu_mul", "swiglu_oai"])
def test_gated_epilogue_compiles_and_writes_half_the_columns(activation: str) -> None:
    plans = _plans("int4-g128", "sm_90a", ComputeConfig(gemm="indexed", epilogue_activation=activation))
    for kernel in build_many(plans):
        assert kernel.compiled.resources["spill_store_bytes"] == 0
    src = hg.kernel.generate(plans[0], "nvrtc")
    assert "const int col = (n_base + nt * 16) / 2 + g;" in src and "gated_activation(gate, up)" in src
    assert plans[0].kernel_name.endswith("_moe_" + activation)
    layer = plans[0].layer
    with pytest.raises(ComposeError, match="needs gemm='indexed'"):
        compose(layer, ComputeConfig(gemm="grouped_masked", epilogue_activation=activation), plans[0].tuning,
                plans[0].target)
    with pytest.raises(ComposeError, match="not a multiple of 16"):
        compose(attrs.evolve(layer, n=1000), ComputeConfig(gemm="indexed", epilogue_activation=activation),
                plans[0].tuning, plans[0].target)
    dense = LayerConfig(n=1024, k=2048, scheme="w4a16-int4-g128")
    ws = choose_tunings(dense, get_target("sm_90a")).for_m(1024)  # (gated indexed MoE on it: test_moe_gemm_ws.py)
    with pytest.raises(ComposeError, match="needs gemm='indexed'"):
        compose(dense, ComputeConfig(epilogue_activation=activation), ws, get_target("sm_90a"))


@pytest.mark.parametrize("layout", ["split", "interleaved", "up_first"])
def test_gate_up_tile_order_puts_gate_and_up_of_a_feature_eight_rows_apart(layout: str) -> None:
    from humming_gen.layer.gate_up import gate_up_tile_order, permute_rows
    from humming_gen.reference.moe import gated_activation

    i = 24
    order = gate_up_tile_order(i, layout)
    assert sorted(order.tolist()) == list(range(2 * i))
    h = torch.randn(3, 2 * i, dtype=torch.float64)
    tiled = h[:, order].view(3, -1, 2, 8)  # [tile][gate / up][g]
    expected = gated_activation(h, "silu_mul", layout)
    assert torch.allclose(torch.nn.functional.silu(tiled[:, :, 0]) * tiled[:, :, 1], expected.view(3, -1, 8))
    torch.manual_seed(2)
    q = hg.QuantScheme("uint4", group_size=32, zero_point="int").quantize(torch.randn(2, 2 * i, 64))
    p = permute_rows(q, order)
    assert torch.equal(p.dequantize(), q.dequantize()[:, order])
    with pytest.raises(ValueError, match="block-scaled"):
        permute_rows(hg.QuantScheme("float8e4m3", block_size=(16, 32), scale_dtype="float32").quantize(
            torch.randn(2, 2 * i, 64)), order)


def test_quant_moe_fused_activation_keeps_tile_order_and_refuses_what_it_cannot_fuse() -> None:
    from humming_gen.layer.gate_up import gate_up_tile_order

    torch.manual_seed(4)
    w13, w2 = torch.randn(4, 2 * 128, 256) * 0.05, torch.randn(4, 256, 128) * 0.05
    b13 = torch.randn(4, 256)
    fused = QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_90a", device="cpu", bias13=b13,
                                activation="gelu_mul", gate_up_layout="interleaved", fused_activation=True)
    plain = QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_90a", device="cpu", bias13=b13,
                                activation="gelu_mul", gate_up_layout="interleaved", fused_activation=False)
    order = gate_up_tile_order(128, "interleaved")
    assert torch.equal(fused.bias13, plain.bias13[:, order])
    assert all(g.kernel.plan.compute.epilogue_activation == "gelu_mul" for g, _ in fused._launchers)
    assert all(g.kernel.plan.compute.epilogue_activation is None for g, _ in plain._launchers)
    for refused in (lambda: fused.launcher_for("w13", 8, fused.block_ms[0]),
                    lambda: fused.grouped_launcher("w13", "grouped_contiguous", 8)):
        with pytest.raises(ValueError, match="build the layer with fused_activation=False"):
            refused()
    assert plain.launcher_for("w13", 8, plain.block_ms[0]) is plain._launchers[0][0]
    with pytest.raises(ValueError, match="block scales"):
        QuantMoE.from_float(w13, w2, hg.QuantScheme("float8e4m3", block_size=(128, 128), scale_dtype="float32"),
                            target="sm_90a", device="cpu", fused_activation=True)
    with pytest.raises(ValueError, match="alpha=1.702"):
        QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_90a", device="cpu", activation="swiglu_oai",
                            swiglu_alpha=1.5, fused_activation=True)


def test_quant_moe_fuses_the_activation_by_default_wherever_the_kernels_can() -> None:
    """fused_activation=None (the default) fuses where fused_activation_reasons finds nothing and silently runs the
    torch activation otherwise; True refuses those layers, False never fuses."""
    torch.manual_seed(5)
    w13, w2 = torch.randn(4, 2 * 128, 256) * 0.05, torch.randn(4, 256, 128) * 0.05

    def build(scheme: str, **kwargs) -> QuantMoE:
        return QuantMoE.from_float(w13, w2, scheme, target="sm_90a", device="cpu", **kwargs)

    def gated(moe: QuantMoE) -> set:
        return {g.kernel.plan.compute.epilogue_activation for g, _ in moe._launchers}

    default = build("w4a16-int4-g128")
    assert default.fused_activation is True and gated(default) == {"silu_mul"}
    assert "fused_activation=True" in repr(default)
    unfusable = {"block": ("w8a8-fp8-block128", {}, "block scales"),
                 "alpha": ("w4a16-int4-g128", {"activation": "swiglu_oai", "swiglu_alpha": 1.5}, "alpha=1.702")}
    for scheme, kwargs, reason in unfusable.values():
        moe = build(scheme, **kwargs)
        assert moe.fused_activation is False and gated(moe) == {None}
        with pytest.raises(ValueError, match=f"fused_activation=True: .*{reason}"):
            build(scheme, fused_activation=True, **kwargs)
    for scheme, kwargs in (("w4a16-int4-g128", {}), ("w4a16-int4-g128", {"activation": "swiglu_oai"}),
                           ("w8a8-fp8-block128", {})):
        moe = build(scheme, fused_activation=False, **kwargs)
        assert moe.fused_activation is False and gated(moe) == {None}


def test_quant_moe_refuses_gemms_that_tile_m_differently(monkeypatch) -> None:
    """Both GEMMs read one routing padded to one token tile: a heuristic that tiles w2 otherwise is refused."""
    import humming_gen.heuristics as heuristics
    from humming_gen.pipelines.base import TuningPlan

    real = heuristics.choose_tunings

    def skewed(layer, target, **kwargs):
        plan = real(layer, target, **kwargs)
        if layer.n == 256 and layer.k == 128:  # the down GEMM below
            plan = TuningPlan(tuple((m, attrs.evolve(t, block_m=2 * t.block_m)) for m, t in plan.buckets))
        return plan

    monkeypatch.setattr(heuristics, "choose_tunings", skewed)
    with pytest.raises(ValueError, match="different M buckets or token tiles"):
        QuantMoE.from_float(torch.randn(2, 2 * 128, 256) * 0.05, torch.randn(2, 256, 128) * 0.05,
                            "w4a16-int4-g128", target="sm_90a", device="cpu")

"""MoE GEMMs with 8-bit activations (W8A8, W4A8) on the CPU: compose for the three gemm types, compilation for
sm_90a / sm_89 (int8 also sm_80) without spills, the generated gather of activation rows and of their scales
through the routing, the stacked expert strides, refusals, and QuantMoE's host path (x quantized once, the
intermediate quantized again) with stand-in launchers against reference_fused_moe(activation_scheme=...)."""

from __future__ import annotations

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import ComposeError, compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build, build_many, generate
from helpers import gated_tile_rows
from humming_gen.layer.gate_up import gate_up_tile_order
from humming_gen.layer.moe import QuantMoE, expert_weight, prepare_moe_weight
from moe_host import expert_stride_mismatches
from humming_gen.reference.moe import reference_fused_moe
from humming_gen.schemes.quantize import QuantizedActivation
from humming_gen.targets import get_target

SCHEMES = ("w8a8-fp8-channel", "w8a8-fp8-block128", "w8a8-int8-channel", "w4a8-mxfp4-fp8", "w4a8-int4-g128-int8")
INTEGER = ("w8a8-int8-channel", "w4a8-int4-g128-int8")  # int8 activations: sm_80 too
GEMMS = {"indexed": ComputeConfig(gemm="indexed", topk_weight=True), "grouped_masked": ComputeConfig(
    gemm="grouped_masked"), "grouped_contiguous": ComputeConfig(gemm="grouped_contiguous")}


def _plans(scheme, target: str, compute: ComputeConfig, bias: bool = True, buckets: slice = slice(None),
           n: int = 1024, k: int = 2048, experts: int = 8):
    layer = LayerConfig(n=n, k=k, scheme=scheme, num_experts=experts, has_bias=bias)
    tgt = get_target(target)
    return [compose(layer, compute, attrs.evolve(t, split_k=1), tgt)
            for _, t in choose_tunings(layer, tgt, pipeline="standard").buckets[buckets]]


def _compile_cases():
    for scheme in SCHEMES:
        for target in ("sm_90a", "sm_89") + (("sm_80",) if scheme in INTEGER else ()):
            yield pytest.param(scheme, target, id=f"{scheme}-{target}")


@pytest.mark.parametrize("scheme,target", list(_compile_cases()))
def test_a8_moe_kernels_compile_without_spills(scheme: str, target: str) -> None:
    """Every gemm type; every M bucket on sm_90a, the smallest and largest token tiles elsewhere."""
    buckets = slice(None) if target == "sm_90a" else slice(None, None, 5)
    plans = [p for compute in GEMMS.values() for p in _plans(scheme, target, compute, buckets=buckets)]
    assert {p.tuning.mma for p in plans} == {"m16n8k32"}
    for kernel in build_many(plans):
        r = kernel.compiled.resources
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)


@pytest.mark.parametrize("activation", ["silu_mul", "gelu_mul", "swiglu_oai"])
@pytest.mark.parametrize("scheme,target", [("w8a8-fp8-channel", "sm_90a"), ("w4a8-mxfp4-fp8", "sm_89"),
                                           ("w4a8-int4-g128-int8", "sm_80")])
def test_a8_gated_epilogue_compiles(scheme: str, target: str, activation: str) -> None:
    """The fused gated activation composes with 8-bit activations: the token scale multiplies gate and up."""
    plans = _plans(scheme, target, ComputeConfig(gemm="indexed", epilogue_activation=activation),
                   buckets=slice(None, None, 5))
    for kernel in build_many(plans):
        assert kernel.compiled.resources["spill_store_bytes"] == 0, kernel.name
    src = generate(plans[0], "nvrtc")
    gate_up = next(line for line in src.splitlines() if "const float gate = acc[nt][mt][j]" in line)
    assert gate_up.count("* token_scales[mt][j]") == 2, gate_up
    assert plans[0].kernel_name.endswith(("_moe_" + activation, "_moe_" + activation + "_wss"))


def _source(scheme, gemm: str, bias: bool = False) -> str:
    return generate(_plans(scheme, "sm_90a", GEMMS[gemm], bias=bias, buckets=slice(2, 3))[0], "nvrtc")


def test_indexed_source_gathers_codes_and_token_scales_through_the_routing() -> None:
    src = _source("w8a8-fp8-channel", "indexed")
    # rows of codes and their per-token scales, both through sorted_ids / top_k
    assert "gather_rows(a_rows, p, tc.m0);" in src
    assert "load_a_stage(a_stage(s), static_cast<const unsigned char*>(p.a), p.lda, a_rows, cfg::kK," in src
    assert ("token_scales[mt][j] = rows[mt][j] < p.m ? a_scale[assignment_token(rows[mt][j], p.top_k, top_k_magic)] : "
            "0.0f;") in src  # rows[mt][j] / top_k
    assert "* token_scales[mt][j]) * weights[mt][j]" in src and "a_scale[m]" not in src
    # the routing (and the codes) are waited for before the schedule reads them, once
    body = src[src.index("(const Params routed)"):]
    assert body.index("wait_for_previous_grid()") < body.index("tile_coord(routed)")
    assert src.count("wait_for_previous_grid();") == 1
    assert "p.b = static_cast<const char*>(p.b) + static_cast<long long>(expert) * cfg::kExpertBBytes;" in src


def test_indexed_source_gathers_activation_group_scales() -> None:
    """Per-group activation scales (1 x 128, DeepSeek) are read for the row each token column's assignment reads."""
    src = _source("w8a8-fp8-block128", "indexed")
    assert "activation_scale_rows(a_scale_rows, p, tc.m0 + wm * cfg::kWarpM);" in src
    assert "rows[mt][j] = assignment < p.m ? assignment / p.top_k : -1;" in src
    assert "load_activation_group_scales(a_scale, p, a_scale_rows," in src
    assert "token_scales" not in src  # group scales are applied at promotion, not in the epilogue
    for field in ("b", "b_scale"):
        assert f"p.{field} = static_cast<const char*>(p.{field}) + static_cast<long long>(expert) * cfg::" in src


@pytest.mark.parametrize("gemm", ["grouped_masked", "grouped_contiguous"])
def test_grouped_sources_read_row_windows(gemm: str) -> None:
    for scheme in ("w8a8-int8-channel", "w8a8-fp8-block128"):
        src = _source(scheme, gemm, bias=True)
        assert "p.m = row_end;" in src and "sorted_ids" not in src and "gather_rows" not in src
        assert ("a_scale[m]" in src) == (scheme == "w8a8-int8-channel")
    per_tensor = _source("w8a8-fp8-tensor", gemm)
    assert "const float a_scale = *static_cast<const float*>(p.a_scale);" in per_tensor


def test_dense_a8_sources_have_no_moe_trace() -> None:
    layer = LayerConfig(n=1024, k=2048, scheme="w8a8-fp8-block128")
    tgt = get_target("sm_90a")
    src = generate(compose(layer, ComputeConfig(), choose_tunings(layer, tgt).for_m(64), tgt), "nvrtc")
    code = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith("//"))
    for word in ("sorted_ids", "expert", "gather_rows", "routed", "top_k"):
        assert word not in code, word


def test_component_declarations_match_the_rendered_source() -> None:
    """Each component of the A8 MoE kernels defines and uses exactly the device symbols it declares."""
    from symbols import declaration_mismatches

    computes = list(GEMMS.values()) + [ComputeConfig(gemm="indexed", epilogue_activation="swiglu_oai")]
    wrong = {}
    for scheme in ("w8a8-fp8-block128", "w4a8-mxfp4-fp8", "w8a8-fp8-tensor"):
        for compute in computes:
            for plan in _plans(scheme, "sm_90a", compute, buckets=slice(None, None, 5)):
                wrong.update(declaration_mismatches(plan))
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_stacked_expert_strides_are_the_kernel_constants(scheme: str) -> None:
    torch.manual_seed(0)
    plan = _plans(scheme, "sm_90a", GEMMS["indexed"], n=256, k=512, experts=3, buckets=slice(0, 1))[0]
    q = hg.scheme(scheme).quantize(torch.randn(3, 256, 512) * 0.05)
    stacked = prepare_moe_weight(plan, q, "cpu")
    assert expert_stride_mismatches(plan, stacked) == {}
    one = hg.layer.weights.prepare_weight(plan, expert_weight(q, 2), "cpu")
    assert torch.equal(stacked.b[2], one.b)


def test_compose_refuses_what_a8_moe_kernels_do_not_do() -> None:
    tgt = get_target("sm_90a")
    layer = LayerConfig(n=1024, k=2048, scheme="w8a8-int8-channel", num_experts=8)
    tuning = choose_tunings(layer, tgt, pipeline="standard").for_m(1)
    assert tuning.split_k > 1
    compose(layer, GEMMS["indexed"], tuning, tgt)  # split-K indexed GEMMs: tests/cpu/test_moe_split_k.py
    with pytest.raises(ComposeError, match="grouped_masked MoE kernels take split_k=1"):
        compose(layer, ComputeConfig(gemm="grouped_masked"), tuning, tgt)
    tuning = attrs.evolve(tuning, split_k=1)
    with pytest.raises(ComposeError, match="needs compute.gemm='indexed'"):
        compose(layer, ComputeConfig(), tuning, tgt)
    with pytest.raises(ComposeError, match="topk_weight with gemm='grouped_masked'"):
        compose(layer, ComputeConfig(gemm="grouped_masked", topk_weight=True), tuning, tgt)
    with pytest.raises(ComposeError, match="needs gemm='indexed'"):
        compose(layer, ComputeConfig(gemm="grouped_contiguous", epilogue_activation="silu_mul"), tuning, tgt)
    fp8 = LayerConfig(n=1024, k=2048, scheme="w8a8-fp8-channel", num_experts=8)
    with pytest.raises(ComposeError, match="lacks 'mma_fp8'"):
        compose(fp8, GEMMS["indexed"], tuning, get_target("sm_80"))


def test_launchers_require_activation_scales() -> None:
    torch.manual_seed(1)
    q = hg.scheme("w8a8-int8-channel").quantize(torch.randn(2, 256, 512) * 0.05)
    codes, routing = torch.zeros(4, 512, dtype=torch.uint8), hg.moe_align(torch.zeros(4, 1, dtype=torch.int32), 2, 8)
    for gemm in ("indexed", "grouped_contiguous"):
        plan = _plans("w8a8-int8-channel", "sm_90a", ComputeConfig(gemm=gemm), bias=False, n=256, k=512,
                      experts=2, buckets=slice(0, 1))[0]
        launcher = build(plan, compile=False).bind(prepare_moe_weight(plan, q, "cpu"), None, torch.device("cpu"))
        out = torch.empty(4, 256, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="pass a_scale"):
            if gemm == "indexed":
                launcher.moe(codes, out, routing, 1)
            else:
                launcher.grouped(codes, out, torch.tensor([0, 2, 4], dtype=torch.int32))


# --- QuantMoE ------------------------------------------------------------------------------------------------
E, H, I = 4, 256, 128


def _weights(seed: int = 0):
    torch.manual_seed(seed)
    return torch.randn(E, 2 * I, H) * 0.05, torch.randn(E, H, I) * 0.05


def test_quant_moe_builds_8_bit_activation_kernels_and_refuses_what_the_target_cannot() -> None:
    w13, w2 = _weights()
    for scheme in ("w8a8-fp8-block128", "w4a8-int4-g128-int8"):
        moe = QuantMoE.from_float(w13, w2, scheme, target="sm_90a", device="cpu")
        assert moe.activation_schemes == (hg.scheme(scheme).activation,) * 2
        kernels = [k for pair in moe._kernels for k in pair]
        # W4A8: mma.sync below 17 rows per expert, warp-specialized wgmma from there on; W8A8: wgmma in every bucket
        # (tests/cpu/test_moe_gemm_a8_ws.py)
        mmas = {"wgmma"} if scheme.startswith("w8a8") else {"m16n8k32", "wgmma"}
        assert {k.plan.tuning.mma for k in kernels} == mmas
        assert {k.plan.compute.gemm for k in kernels} == {"indexed"}
        assert moe.compute_dtypes == (hg.scheme(scheme).activation.dtype.name,) * 2
    with pytest.raises(ValueError, match="lacks 'mma_fp8'"):
        QuantMoE.from_float(w13, w2, "w8a8-fp8-channel", target="sm_80", device="cpu", strict=True)
    moe = QuantMoE.from_float(w13, w2, "w8a8-fp8-channel", target="sm_80", device="cpu")  # falls back, logged
    assert moe.compute_dtypes == ("bfloat16", "bfloat16") and moe.activation_schemes == (None, None)
    with pytest.raises(ValueError, match="float4e2m1: kernels with quantized activations") as e:
        QuantMoE.from_float(w13, w2, "w4a4-nvfp4", target="sm_90a", device="cpu", strict=True)
    assert "the scheme quantizes activations" in str(e.value) and "weight_only=True" in str(e.value)
    assert QuantMoE.from_float(w13, w2, "w4a4-nvfp4", target="sm_90a", device="cpu").compute_dtypes == (
        "bfloat16", "bfloat16")
    moe = QuantMoE.from_float(w13, w2, "w4a4-nvfp4", target="sm_90a", device="cpu", weight_only=True)
    assert moe.activation_schemes == (None, None)
    # 16-bit activations: mma.sync below 17 rows per expert, the warp-specialized wgmma kernels from there on
    assert {k.plan.tuning.mma for pair in moe._kernels for k in pair} == {"m16n8k16", "wgmma"}


def test_quant_moe_a8_fused_activation_and_static_scales() -> None:
    w13, w2 = _weights(1)
    fused = QuantMoE.from_float(w13, w2, "w4a8-mxfp4-fp8", target="sm_90a", device="cpu", fused_activation=True,
                                activation="swiglu_oai", gate_up_layout="interleaved")
    assert all(g.kernel.plan.compute.epilogue_activation == "swiglu_oai" for g, _ in fused._launchers)
    with pytest.raises(ValueError, match="block scales cannot follow the tile order"):
        QuantMoE.from_float(w13, w2, "w8a8-fp8-block128", target="sm_90a", device="cpu", fused_activation=True)
    s = hg.scheme("w8a8-fp8-tensor")
    q13, q2 = s.quantize(w13), s.quantize(w2)
    q13.input_scale, q2.input_scale = torch.tensor([0.02]), None
    moe = QuantMoE.from_quantized(q13, q2, target="sm_90a", device="cpu")
    assert moe._static_scales[0].item() == pytest.approx(0.02) and moe._static_scales[1] is None
    q13.input_scale = torch.full((E,), 0.02)
    with pytest.raises(ValueError, match="q13.input_scale has 4 values"):
        QuantMoE.from_quantized(q13, q2, target="sm_90a", device="cpu")
    with pytest.raises(ValueError, match="grouped_masked' with a dynamic per-tensor activation scale"):
        hg.grouped_moe_gemm(torch.zeros(E, 8, I, dtype=torch.bfloat16), moe, "w2",
                            torch.zeros(E, dtype=torch.int32), layout="grouped_masked")


class A8StandIn:
    """Stands in for a bound indexed launcher of 8-bit activations: decodes the codes and scales it is given (the
    reference layout of `fake_quantize`) and computes every routed assignment row in float64 from exactly the
    routing tensors a kernel reads: out[i] = dequant(a)[i // top_k] @ W[e]^T (+ b[e]) (* topk_weights[i]) (a gated
    kernel: act(gate, up) of those rows, W's in tile order)."""

    def __init__(self, kernel, scheme, w: torch.Tensor, bias: torch.Tensor | None):
        self.kernel, self.scheme, self.w, self.bias = kernel, scheme, w, bias

    def moe(self, a, out, routing, top_k, topk_weights=None, a_scale=None):
        assert a.dtype == torch.uint8 and a_scale is not None and a_scale.dtype == torch.float32
        assert (topk_weights is not None) == self.kernel.plan.compute.topk_weight
        ids, rows = self.routed_rows(QuantizedActivation(self.scheme, a, a_scale).dequantize(torch.float64), out,
                                     routing, top_k, topk_weights)
        out[ids] = rows.to(out.dtype)

    def routed_rows(self, x, out, routing, top_k, topk_weights):
        """(assignment ids, their float64 rows) of the routed assignments below out's rows, from activations x."""
        block_m = self.kernel.plan.tuning.block_m
        total = int(routing.num_tokens_post_pad[0])
        ids = routing.sorted_ids[:total].long()
        experts = routing.expert_ids[:total // block_m].long().repeat_interleave(block_m)
        keep = ids < out.shape[0]
        ids, experts = ids[keep], experts[keep]
        rows = torch.zeros(ids.numel(), self.w.shape[1], dtype=torch.float64)
        for e in range(self.w.shape[0]):
            sel = experts == e
            rows[sel] = x[ids[sel] // top_k] @ self.w[e].T
            if self.bias is not None:
                rows[sel] += self.bias[e].double()
        if self.kernel.plan.compute.epilogue_activation:
            rows = gated_tile_rows(rows, self.kernel.plan.compute.epilogue_activation)
        if topk_weights is not None:
            rows *= topk_weights[ids].double()[:, None]
        return ids, rows


def fake_quantize(x, scheme, static_scale=None):
    """humming_gen.quantize_activation on the CPU: the reference quantization (bit-identical to the kernel's)."""
    return scheme.quantize(x) if static_scale is None else hg.schemes.quantize.quantize_activation(scheme, x,
                                                                                                   static_scale)


# Relative Frobenius error of the whole layer against reference_fused_moe(activation_scheme=..., intermediate_dtype=
# bf16): the stand-ins compute in float64, so what remains is the bf16 rounding of GEMM2's rows and of the output
# (about 2.5e-3). The GPU test (tests/gpu/test_quant_moe_a8.py) uses the same bound.
LAYER_TOLERANCE = 1e-2


@pytest.mark.parametrize("fused", [None, False])
@pytest.mark.parametrize("scheme", SCHEMES + ("w8a8-fp8-tensor",))
def test_quant_moe_host_path_quantizes_both_gemm_inputs(scheme: str, fused: bool | None, monkeypatch) -> None:
    """QuantMoE.run with stand-in launchers: x quantized once (rows gathered by the routing), GEMM1, the gated
    activation (GEMM1's epilogue by default, except for block-scaled w13; torch's with fused_activation=False), the
    intermediate quantized for GEMM2 (router weights), the top-k sum; -1 ids and a dropped token."""
    import humming_gen.activation as activation

    monkeypatch.setattr(activation, "quantize_activation", fake_quantize)
    w13, w2 = _weights(2)
    moe = QuantMoE.from_float(w13, w2, scheme, target="sm_90a", device="cpu", bias2=torch.randn(E, H) * 0.1,
                              fused_activation=fused)
    assert moe.fused_activation is (fused is None and scheme != "w8a8-fp8-block128")
    q13, q2 = hg.scheme(scheme).quantize(w13), hg.scheme(scheme).quantize(w2)
    d13, d2 = q13.dequantize(torch.float64), q2.dequantize(torch.float64)
    act = hg.scheme(scheme).activation
    k13 = d13[:, gate_up_tile_order(I)] if moe.fused_activation else d13  # as the layer packs it
    moe._launchers = [(A8StandIn(g1.kernel, act, k13, moe.bias13), A8StandIn(g2.kernel, act, d2, moe.bias2))
                      for g1, g2 in moe._launchers]
    g = torch.Generator().manual_seed(3)
    m, top_k = 37, 2
    x = torch.randn(m, H, generator=g).bfloat16()
    weights, ids = torch.topk(torch.rand(m, E, generator=g), top_k, dim=-1)
    ids = ids.to(torch.int32)
    ids[3] = -1  # every slot dropped: a zero row
    ids[5, 1] = -1
    out = moe(x, weights, ids)
    ref = reference_fused_moe(x.double(), d13, d2, weights.double(), ids, bias2=moe.bias2.double(),
                              activation_scheme=act, intermediate_dtype=torch.bfloat16,
                              fused_activation=moe.fused_activation)
    assert torch.equal(out[3], torch.zeros(H, dtype=torch.bfloat16))
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < LAYER_TOLERANCE, err
    # the reference quantizes both GEMM inputs: without that (16-bit activations) it is off by more than the bound
    plain = reference_fused_moe(x.double(), d13, d2, weights.double(), ids, bias2=moe.bias2.double(),
                                intermediate_dtype=torch.bfloat16, fused_activation=moe.fused_activation)
    assert ((plain - ref).norm() / ref.norm()).item() > LAYER_TOLERANCE


def test_a8_ops_opcheck_and_moe_gemm_quantize_their_input(monkeypatch) -> None:
    """The humming_gen::fused_moe / moe_gemm ops of an A8 layer: opcheck (fakes data-independent) and moe_gemm
    handing the kernel the codes and scales of `a`."""
    import humming_gen.activation as activation

    monkeypatch.setattr(activation, "quantize_activation", fake_quantize)
    w13, w2 = _weights(4)
    scheme = "w8a8-fp8-block128"
    moe = QuantMoE.from_float(w13, w2, scheme, target="sm_90a", device="cpu", fused_activation=False)
    act = hg.scheme(scheme).activation
    d13 = hg.scheme(scheme).quantize(w13).dequantize(torch.float64)
    d2 = hg.scheme(scheme).quantize(w2).dequantize(torch.float64)
    moe._launchers = [(A8StandIn(g1.kernel, act, d13, None), A8StandIn(g2.kernel, act, d2, None))
                      for g1, g2 in moe._launchers]
    m, top_k = 9, 2
    x = torch.randn(m, H, dtype=torch.bfloat16)
    weights, ids = torch.topk(torch.rand(m, E), top_k, dim=-1)
    ids = ids.to(torch.int32)
    result = torch.library.opcheck(torch.ops.humming_gen.fused_moe.default, (x, moe._op_id, weights, ids, None))
    assert set(result.values()) == {"SUCCESS"}, result
    bm = moe.block_m(m, top_k)
    r = hg.moe_align(ids, E, bm)
    h = torch.full((m * top_k, 2 * I), float("nan"), dtype=torch.bfloat16)
    result = torch.library.opcheck(torch.ops.humming_gen.moe_gemm.default,
                                   (x, h, moe._op_id, "w13", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad,
                                    top_k, bm, None))
    assert set(result.values()) == {"SUCCESS"}, result
    h = hg.moe_gemm(x, moe, "w13", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad, top_k=top_k, block_m=bm)
    xq = act.quantize(x).dequantize(torch.float64)
    expert = ids.reshape(-1).long()
    ref = torch.einsum("ak,ank->an", xq[torch.arange(m * top_k) // top_k], d13[expert])
    assert ((h.double() - ref).norm() / ref.norm()).item() < 4e-3

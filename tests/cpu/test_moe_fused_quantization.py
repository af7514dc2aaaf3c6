"""MoE GEMM1's output quantized for GEMM2 in its epilogue (ComputeConfig.epilogue_quantization, QuantMoE(...,
fused_quantization=)) on the CPU: the config's checks and JSON, fused_quantization_reasons, the generated source
(the activation kernels' components in namespace act_quant, nothing of it when the option is off), NVRTC
compilation for sm_89 / sm_90a / sm_100a without spills, the components' symbol declarations, QuantMoE's option
and per-bucket choice, and QuantMoE's host path with stand-in launchers whose fused GEMM1 lays out codes and scales
as the epilogue does (its thread -> row / vector / group mapping, emulated) against the unfused layer, bit for bit.
The GPU test is tests/gpu/test_quant_moe_fused_quant.py."""

from __future__ import annotations

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import ComposeError, compose
from humming_gen.components.epilogue.quantize_output import output_quantization_reasons
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build_many, generate
from humming_gen.layer.gate_up import gate_up_tile_order
from humming_gen.layer.moe import QuantMoE, fused_quantization_reasons
from humming_gen.schemes.quantize import QuantizedActivation
from humming_gen.schemes.scheme import ActivationScheme
from helpers import assert_no_spills
from symbols import declaration_mismatches
from test_moe_gemm_a8 import A8StandIn, fake_quantize
from humming_gen.pipelines.common import missing_symbols
from humming_gen.targets import get_target

E, H = 4, 256
# fusable schemes and the intermediate size at which they fuse on the standard pipeline's 128-row gate/up tiles (64
# features): group 32 (MXFP8) at any I, per-token scales where I <= 64, a static per-tensor scale at any I
FUSABLE = {"w8a8-mxfp8": 256, "w8a8-fp8-channel": 64, "w8a8-int8-channel": 48, "w4a8-int4-g128-fp8": 64,
           "w8a8-fp8-tensor": 256}


def _compute(scheme: str, **kw) -> ComputeConfig:
    a = hg.scheme(scheme).activation
    return ComputeConfig(gemm="indexed", epilogue_activation=kw.pop("activation", "silu_mul"), epilogue_quantization=a,
                         epilogue_static_scale=a.granularity == "tensor", **kw)


def _plans(scheme: str, target: str, i: int | None = None, bias: bool = True, compute=None):
    i = FUSABLE[scheme] if i is None else i
    layer = LayerConfig(n=2 * i, k=H, scheme=scheme, num_experts=E, has_bias=bias)
    tg = get_target(target)
    return [compose(layer, compute or _compute(scheme), attrs.evolve(t, split_k=1), tg)
            for _, t in choose_tunings(layer, tg, pipeline="standard").buckets]


# --- config ------------------------------------------------------------------------------------------------------
def test_compute_config_checks_and_round_trips() -> None:
    c = _compute("w8a8-mxfp8")
    assert ComputeConfig.from_json(c.to_json()) == c and hash(ComputeConfig.from_json(c.to_json())) == hash(c)
    assert "quantize:float8e4m3/float8e8m0/g32" in c.summary()
    assert "epilogue_quantization" not in ComputeConfig(gemm="indexed").to_json()  # unset: the old keys
    a = hg.scheme("w8a8-mxfp8").activation
    with pytest.raises(ValueError, match="needs gemm='indexed' and an epilogue_activation"):
        ComputeConfig(gemm="indexed", epilogue_quantization=a)
    with pytest.raises(ValueError, match="needs granularity 'tensor'"):
        ComputeConfig(gemm="indexed", epilogue_activation="silu_mul", epilogue_quantization=a,
                      epilogue_static_scale=True)
    with pytest.raises(ValueError, match="without an epilogue_quantization"):
        ComputeConfig(gemm="indexed", epilogue_static_scale=True)
    with pytest.raises(TypeError, match="epilogue_quantization"):
        ComputeConfig(gemm="indexed", epilogue_activation="silu_mul", epilogue_quantization="fp8")


# --- reasons -----------------------------------------------------------------------------------------------------
def test_output_quantization_reasons() -> None:
    A = ActivationScheme
    assert output_quantization_reasons(A("float8e4m3", "group", 32, "float8e8m0"), False, 512, 128) == []
    # DeepSeek 1 x 128 groups: a 128-row gate/up tile holds 64 features
    assert "does not divide the 64 features" in " ".join(
        output_quantization_reasons(A("float8e4m3", "group", 128), False, 512, 128))
    assert output_quantization_reasons(A("float8e4m3", "group", 128), False, 512, 256) == []
    assert output_quantization_reasons(A("float8e4m3"), False, 128, 128) == []  # the tile covers the row
    assert "spread over 4 CTAs" in " ".join(output_quantization_reasons(A("float8e4m3"), False, 512, 128))
    assert "amax of every row of the batch" in " ".join(
        output_quantization_reasons(A("float8e4m3", "tensor"), False, 512, 128))
    assert output_quantization_reasons(A("float8e4m3", "tensor"), True, 512, 128) == []
    assert "8-bit codes" in " ".join(output_quantization_reasons(A("int4"), False, 128, 128))
    nvfp4 = A("float4e2m1", "group", 16, "float8e4m3", global_scale=True)
    assert "global scale" in " ".join(output_quantization_reasons(nvfp4, False, 512, 128))


def test_fused_quantization_reasons() -> None:
    fp8 = hg.scheme("w8a8-fp8-channel").activation
    mx = hg.scheme("w8a8-mxfp8").activation
    assert fused_quantization_reasons(mx, mx, False, True, 256) == []
    assert fused_quantization_reasons(fp8, None, False, True, 256) == [
        "GEMM2 reads 16-bit activations: there is nothing to quantize"]
    assert "fused_activation" in " ".join(fused_quantization_reasons(mx, mx, False, False, 256))
    assert "GEMM1 runs 16-bit" in " ".join(fused_quantization_reasons(None, mx, False, True, 256))
    tensor = hg.scheme("w8a8-fp8-tensor").activation
    assert "amax of every row" in " ".join(fused_quantization_reasons(tensor, tensor, False, True, 256))
    assert fused_quantization_reasons(tensor, tensor, True, True, 256) == []
    layer = LayerConfig(n=512, k=H, scheme="w8a8-mxfp8", num_experts=E)
    standard = choose_tunings(layer, get_target("sm_90a"), pipeline="standard").buckets[0][1]
    assert fused_quantization_reasons(mx, mx, False, True, 256, standard) == []
    assert "spread over 4 CTAs" in " ".join(fused_quantization_reasons(fp8, fp8, False, True, 256, standard))
    ws = attrs.evolve(standard, pipeline="warp_specialized")
    assert "warp_specialized pipeline's epilogue does not quantize" in " ".join(
        fused_quantization_reasons(mx, mx, False, True, 256, ws))
    block = hg.scheme("w8a8-fp8-block128").activation
    assert "does not divide the 64 features" in " ".join(fused_quantization_reasons(block, block, False, True, 256,
                                                                                     standard))


# --- source ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", list(FUSABLE))
def test_source_quantizes_with_the_activation_components(scheme: str) -> None:
    plans = _plans(scheme, "sm_90a")
    a = hg.scheme(scheme).activation
    for plan in plans:
        src = generate(plan)
        assert "namespace act_quant {" in src and src.count("void store_output(") == 1
        assert "act_quant::quantize_vector(x, s)" in src and "act_quant::store_codes(" in src
        assert ("p.c_scale" in src) and "c_scale" in [f[0] for f in plan.param_fields]
        if a.granularity == "tensor":
            assert "act_quant::block_scale" not in src and "*static_cast<const float*>(p.c_scale)" in src
        else:
            assert "act_quant::block_scale(act_quant::bits_f32(amax))" in src
        if a.granularity == "group":
            assert f"(cfg::kN / 2 / {a.group_size})" in src
        assert ("epilogue_sync()" in src) == (plan.tuning.warps_k > 1)
        mine = {k: v for k, v in declaration_mismatches(plan).items() if "ActQuantCode" in k or "QuantizeGated" in k}
        assert mine == {}, plan.kernel_name
        assert missing_symbols(plan.components) == []
        assert plan.shared_bytes >= plan.tuning.block_m * (plan.tuning.block_n // 2 + 8) * 2


def test_sources_without_the_option_hold_nothing_of_it() -> None:
    layer = LayerConfig(n=512, k=H, scheme="w8a8-mxfp8", num_experts=E, has_bias=True)
    tg = get_target("sm_90a")
    for _, t in choose_tunings(layer, tg, pipeline="standard").buckets:
        src = generate(compose(layer, ComputeConfig(gemm="indexed", epilogue_activation="silu_mul"),
                               attrs.evolve(t, split_k=1), tg))
        for trace in ("act_quant", "c_scale", "quantize_staged", "epilogue_sync", "kQuant", "quantize:"):
            assert trace not in src, trace


def test_compose_refuses_what_the_epilogue_cannot_quantize() -> None:
    tg = get_target("sm_90a")
    layer = LayerConfig(n=512, k=H, scheme="w8a8-fp8-channel", num_experts=E)
    t = attrs.evolve(choose_tunings(layer, tg, pipeline="standard").buckets[0][1], split_k=1)
    with pytest.raises(ComposeError, match="spread over 4 CTAs"):
        compose(layer, _compute("w8a8-fp8-channel"), t, tg)
    tensor = hg.scheme("w8a8-fp8-tensor").activation
    with pytest.raises(ComposeError, match="amax of every row of the batch"):
        compose(LayerConfig(n=512, k=H, scheme="w8a8-fp8-tensor", num_experts=E),
                ComputeConfig(gemm="indexed", epilogue_activation="silu_mul", epilogue_quantization=tensor), t, tg)
    ws_layer = LayerConfig(n=512, k=H, scheme="w8a8-mxfp8", num_experts=E)
    from humming_gen.pipelines.warp_specialized.heuristics import choose_moe_tunings

    ws = choose_moe_tunings(ws_layer, tg).buckets[-1][1]
    with pytest.raises(ComposeError, match="does not quantize its output"):
        compose(ws_layer, _compute("w8a8-mxfp8"), ws, tg)


# --- compilation -------------------------------------------------------------------------------------------------
def _compile_cases():
    for target in ("sm_89", "sm_90a", "sm_100a"):
        for scheme in FUSABLE:
            yield pytest.param(scheme, target, id=f"{scheme}-{target}")


@pytest.mark.parametrize("scheme,target", list(_compile_cases()))
def test_quantizing_epilogues_compile_without_spills(scheme: str, target: str) -> None:
    """Every bucket's GEMM1 of the standard pipeline (token tiles 8 ... 128, k warps 4 ... 1), with a bias, NVRTC."""
    plans = _plans(scheme, target)
    if scheme == "w8a8-mxfp8":  # and swiglu_oai, fp16, no bias
        layer = LayerConfig(n=512, k=H, scheme=scheme, num_experts=E, dtype="float16")
        tg = get_target(target)
        plans += [compose(layer, _compute(scheme, activation="swiglu_oai"), attrs.evolve(t, split_k=1), tg)
                  for _, t in choose_tunings(layer, tg, pipeline="standard").buckets[-2:]]
    for kernel in build_many(plans):
        assert_no_spills(kernel, kernel.name)


# --- QuantMoE ----------------------------------------------------------------------------------------------------
def _weights(i: int, seed: int = 0):
    torch.manual_seed(seed)
    return torch.randn(E, 2 * i, H) * 0.05, torch.randn(E, H, i) * 0.05


def test_quant_moe_fuses_per_bucket_and_checks_the_option() -> None:
    w13, w2 = _weights(256)
    for bad in (0, "no"):
        with pytest.raises(ValueError, match="fused_quantization="):
            QuantMoE.from_float(w13, w2, "w8a8-mxfp8", target="sm_90a", device="cpu", fused_quantization=bad)
    assert not any(QuantMoE.from_float(w13, w2, "w8a8-mxfp8", target="sm_90a", device="cpu").fused_quantization)
    # 8-bit weights: every bucket warp-specialized on sm_90a (heuristics.choose.ws_moe_from_rows), none fuses
    w8 = QuantMoE.from_float(w13, w2, "w8a8-mxfp8", target="sm_90a", device="cpu", fused_quantization=None)
    assert {g.kernel.plan.tuning.pipeline for g, _ in w8._launchers} == {"warp_specialized"}
    assert not any(w8.fused_quantization)
    # W4A8 (per-token scales: I = 64, one tile covers a row): the standard buckets fuse, the warp-specialized ones
    # keep quantize_activation
    moe = QuantMoE.from_float(*_weights(64), "w4a8-int4-g128-fp8", target="sm_90a", device="cpu",
                              fused_quantization=None)
    pipelines = [g.kernel.plan.tuning.pipeline for g, _ in moe._launchers]
    assert moe.fused_quantization == tuple(p == "standard" for p in pipelines) and "warp_specialized" in pipelines
    for (g1, _), fused in zip(moe._launchers, moe.fused_quantization):
        assert (g1.kernel.plan.compute.epilogue_quantization is not None) == fused
    assert "fused_quantization=(True, True, False, False)" in repr(moe)
    with pytest.raises(ValueError, match="fused_quantization=True: the warp_specialized pipeline's epilogue"):
        QuantMoE.from_float(w13, w2, "w8a8-mxfp8", target="sm_90a", device="cpu", fused_quantization=True)
    std = QuantMoE.from_float(w13, w2, "w8a8-mxfp8", target="sm_90a", device="cpu", fused_quantization=True,
                              pipeline="standard")
    assert all(std.fused_quantization)
    off = QuantMoE.from_float(w13, w2, "w8a8-mxfp8", target="sm_90a", device="cpu", fused_quantization=False,
                              pipeline="standard")
    assert not any(off.fused_quantization) and "fused_quantization" not in repr(off)
    # identical kernels otherwise: GEMM2 and the unfused GEMM1 sources are those of a layer without the option
    assert [g2.kernel.source for _, g2 in std._launchers] == [g2.kernel.source for _, g2 in off._launchers]
    with pytest.raises(ValueError, match="fused_quantization=True: GEMM1 does not apply the gated activation"):
        QuantMoE.from_float(w13, w2, "w8a8-mxfp8", target="sm_90a", device="cpu", fused_activation=False,
                            fused_quantization=True, pipeline="standard")
    # DeepSeek's fp8 block 128: block-scaled w13 does not fuse the activation, and groups of 128 exceed the tile
    with pytest.raises(ValueError, match="fused_activation.*does not divide the 64 features"):
        QuantMoE.from_float(w13, w2, "w8a8-fp8-block128", target="sm_90a", device="cpu", fused_quantization=True,
                            pipeline="standard")
    a16 = QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_90a", device="cpu", fused_quantization=None)
    assert not any(a16.fused_quantization)
    # per-token scales fuse where the tile covers the row (I = 64), a dynamic per-tensor scale never
    w13s, w2s = _weights(64)
    auto = dict(target="sm_89", device="cpu", fused_quantization=None)
    assert all(QuantMoE.from_float(w13s, w2s, "w8a8-fp8-channel", **auto).fused_quantization)
    assert not any(QuantMoE.from_float(w13, w2, "w8a8-fp8-channel", **auto).fused_quantization)
    assert not any(QuantMoE.from_float(w13s, w2s, "w8a8-fp8-tensor", **auto).fused_quantization)


def emulate_epilogue_quantization(act: torch.Tensor, scheme: ActivationScheme, block_n: int, static_scale=None):
    """The codes and scales the quantizing epilogue writes for (R, I) 16-bit act rows, tile by tile of block_n / 2
    features, with the template's mapping (epilogue/quantize_output.cuh.j2: vector v of 8 features of a row, the
    kQuantGroupLanes vectors of a group (or the tile's row) reducing one amax, the group's first lane storing the
    scale at [row][feature / group], codes at [row][feature]); each block quantized by the reference rule. Returns
    (codes (R, I) uint8, scales) in quantize_activation's kernel layout."""
    rows, i = act.shape
    cols = block_n // 2
    vectors = cols // 8
    lanes = {"group": (scheme.group_size or 0) // 8, "token": vectors, "tensor": 1}[scheme.granularity]
    token = attrs.evolve(scheme, granularity="token", group_size=None)  # one block's scale: the token rule
    codes = torch.full((rows, i), 0xAA, dtype=torch.uint8)
    groups = i // scheme.group_size if scheme.granularity == "group" else 1
    scales = None if static_scale is not None else torch.full((rows, groups), -1.0)
    for n0 in range(0, -(-2 * i // block_n) * block_n, block_n):
        for v0 in range(0, vectors, lanes):  # one group: vectors v0 .. v0 + lanes - 1 of every row
            first = n0 // 2 + 8 * v0
            last = min(first + 8 * lanes, i)
            if first >= i:
                continue
            block = act[:, first:last]
            if static_scale is not None:
                q = hg.schemes.quantize.quantize_activation(attrs.evolve(scheme), block, static_scale)
            else:
                q = token.quantize(block)
                column = first // scheme.group_size if scheme.granularity == "group" else 0
                scales[:, column] = q.scales.reshape(rows).float()
            codes[:, first:last] = q.codes
    return codes, scales


@pytest.mark.parametrize("scheme", ["w8a8-mxfp8", "w8a8-fp8-channel", "w8a8-int8-channel", "w8a8-fp8-tensor"])
def test_epilogue_mapping_gives_quantize_activations_codes(scheme: str) -> None:
    """The emulated epilogue (tile by tile, group by group) equals ActivationScheme.quantize of the whole rows."""
    a = hg.scheme(scheme).activation
    i = FUSABLE.get(scheme, 256)
    g = torch.Generator().manual_seed(5)
    act = (torch.randn(37, i, generator=g) * torch.rand(37, 1, generator=g) * 4).bfloat16()
    act[3, :7] *= 50  # outliers: per-group / per-token scales differ
    static = torch.tensor([0.011]) if a.granularity == "tensor" else None
    codes, scales = emulate_epilogue_quantization(act, a, 128, static)
    ref = a.quantize(act) if static is None else hg.schemes.quantize.quantize_activation(a, act, static)
    assert torch.equal(codes, ref.codes)
    if static is None:
        assert torch.equal(scales, ref.scales.reshape(scales.shape).float())


class FusedStandIn(A8StandIn):
    """Stands in for bound indexed launchers (8-bit activations, float64): GEMM1 rows (act(gate, up) where the
    kernel's epilogue applies it) rounded to the layer dtype; a quantizing GEMM1 then writes codes and scales as
    emulate_epilogue_quantization lays them out into `out` / `out_scale`; GEMM2 decodes what it is given."""

    def __init__(self, kernel, scheme, w: torch.Tensor, bias, out_scheme=None, static=None):
        super().__init__(kernel, scheme, w, bias)
        self.out_scheme, self.static = out_scheme, static

    def moe(self, a, out, routing, top_k, topk_weights=None, a_scale=None, out_scale=None):
        compute = self.kernel.plan.compute
        assert (out_scale is not None) == (compute.epilogue_quantization is not None)
        x = QuantizedActivation(self.scheme, a, a_scale.float() if a_scale.dtype != torch.uint8 else a_scale
                                ).dequantize(torch.float64)
        ids, rows = self.routed_rows(x, out, routing, top_k, topk_weights)
        if out_scale is None:
            out[ids] = rows.to(out.dtype)
            return
        assert out.dtype == torch.uint8 and out.stride(0) % 16 == 0
        codes, scales = emulate_epilogue_quantization(rows.bfloat16(), self.out_scheme, self.kernel.plan.tuning.block_n,
                                                      self.static)
        out[ids] = codes
        if self.static is None:
            assert out_scale.dtype == torch.float32
            out_scale[ids] = scales
        else:
            assert out_scale is self.static


@pytest.mark.parametrize("scheme", ["w8a8-fp8-channel", "w8a8-fp8-tensor"])
def test_quant_moe_host_path_fused_equals_unfused(scheme: str, monkeypatch) -> None:
    """QuantMoE.run with stand-in launchers, fused_quantization=None (every bucket fused) against False: the same
    output bits (GEMM2 reads the same codes and scales), -1 ids and a dropped token."""
    import humming_gen.activation as activation

    monkeypatch.setattr(activation, "quantize_activation", fake_quantize)
    i = 64
    w13, w2 = _weights(i, seed=2)
    s = hg.scheme(scheme)
    q13, q2 = s.quantize(w13), s.quantize(w2)
    if s.activation.granularity == "tensor":
        q2.input_scale = torch.tensor([0.004])
    outs = []
    g = torch.Generator().manual_seed(3)
    m, top_k = 37, 2
    x = torch.randn(m, H, generator=g).bfloat16()
    weights, ids = torch.topk(torch.rand(m, E, generator=g), top_k, dim=-1)
    ids = ids.to(torch.int32)
    ids[3] = -1
    ids[5, 1] = -1
    bias2 = torch.randn(E, H, generator=g) * 0.1
    for fused in (None, False):
        moe = QuantMoE.from_quantized(q13, q2, target="sm_89", device="cpu", bias2=bias2, fused_quantization=fused)
        assert all(moe.fused_quantization) is (fused is None)
        d13, d2 = q13.dequantize(torch.float64), q2.dequantize(torch.float64)
        k13 = d13[:, gate_up_tile_order(i)]
        act = s.activation
        moe._launchers = [(FusedStandIn(g1.kernel, act, k13, moe.bias13, act, moe._static_scales[1]),
                           FusedStandIn(g2.kernel, act, d2, moe.bias2)) for g1, g2 in moe._launchers]
        outs.append(moe(x, weights, ids))
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0][3], torch.zeros(H, dtype=torch.bfloat16))

"""b_operand='shared': the 8-bit warp-specialized kernels whose wgmma reads the weights from shared memory
(WgmmaSS8) in BLayoutSw128 panels. Composition, the packed weight, compilation without spills for sm_90a, and the
refusals."""

from __future__ import annotations

import re

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.kernel import build
from humming_gen.pipelines.base import ComposeError
from humming_gen.heuristics import choose_tunings
from humming_gen.pipelines.warp_specialized import heuristics as heuristics_mod
from humming_gen.pipelines.warp_specialized.heuristics import shared_weight_tunings
from humming_gen.pipelines.weights import prepare_weight
from humming_gen.schemes.packing import BLayoutSw128, unpack_codes_sw128
from humming_gen.targets import get_target
from helpers import assert_no_spills

SCHEMES = ("w8a8-fp8-channel", "w8a8-int8-channel", "w8a8-fp8-block128", "w8a8-mxfp8")


def _layer(scheme: str, **kw) -> LayerConfig:
    return LayerConfig(n=4000, k=3072, scheme=scheme, **kw)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_bucket_compiles_without_spills(scheme: str) -> None:
    layer = _layer(scheme, has_bias=True)
    tgt = get_target("sm_90a")
    plans = shared_weight_tunings(layer, tgt)
    seen = set()
    for m_max, t in plans.buckets:
        assert (t.pipeline, t.mma, t.b_operand) == ("warp_specialized", "wgmma", "shared"), m_max
        if (t.block_m, t.split_k > 1) in seen:
            continue
        seen.add((t.block_m, t.split_k > 1))
        plan = compose(layer, ComputeConfig(), t, tgt)
        assert plan.kernel_name.endswith("_ss") and isinstance(plan.layout.b_layout, BLayoutSw128)
        kernel = build(plan)
        if not (scheme == "w8a8-mxfp8" and t.block_m > 64):  # (the register-weight kernels' own spill bound)
            assert_no_spills(kernel, plan.kernel_name)
        src = kernel.source
        assert "weight_descriptor(stage, step)" in src and "load_fragment" not in src and "frag[" not in src


def test_register_weight_kernels_hold_none_of_it() -> None:
    layer = _layer("w8a8-fp8-channel")
    plan = choose_tunings(layer, get_target("sm_90a"), stored=False, register_weights=True)
    # the shared-weight plan is the heuristics' own with the weights' source changed
    assert [(m, attrs.evolve(t, b_operand="shared")) for m, t in plan.buckets] == list(
        shared_weight_tunings(layer, get_target("sm_90a")).buckets)
    t = plan.for_m(4096)
    assert t.b_operand == "registers" and "b_operand" not in t.to_dict()  # keys of existing tunings unchanged
    assert "tokens_on" not in attrs.evolve(t, b_operand="shared").to_dict()
    src = build(compose(layer, ComputeConfig(), t, get_target("sm_90a")), compile=False).source
    assert "weight_descriptor" not in src and "kBPanelBytes" not in src and "load_fragment" in src


@pytest.mark.parametrize("scheme,shared,tokens_m", [
    ("w8a8-fp8-channel", True, False), ("w8a8-int8-channel", True, False), ("w8a8-fp8-tensor", True, False),
    ("w8a8-fp8-block128", True, True), ("w8a8-mxfp8", False, False), ("w4a8-mxfp4-fp8", False, False),
    ("w4a8-int4-g128-int8", False, False)])
def test_default_plans_read_8bit_weights_from_shared_memory(scheme: str, shared: bool, tokens_m: bool) -> None:
    """heuristics.shared_weights_default: dense 8-bit weights with channel / tensor scales or 128-row blocks, the
    block-scaled ones with the tokens on wgmma's M from the 256 bucket; register_weights=True (quantize_in_gemm
    layers) keeps the register plan."""
    from humming_gen.pipelines.warp_specialized.heuristics import TOKENS_M_FROM

    layer = LayerConfig(n=8192, k=8192, scheme=scheme)
    tgt = get_target("sm_90a")
    plan = choose_tunings(layer, tgt, stored=False)
    for m_max, t in plan.buckets:
        assert t.b_operand == ("shared" if shared else "registers"), (m_max, t.summary())
        large = m_max is None or m_max >= TOKENS_M_FROM
        assert t.tokens_on == ("m" if tokens_m and large else "n"), (m_max, t.summary())
    assert {t.b_operand for t in choose_tunings(layer, tgt, stored=False, register_weights=True).tunings()} == {
        "registers"}
    moe = LayerConfig(n=1024, k=2048, scheme=scheme, num_experts=8, top_k=2)
    assert not heuristics_mod.shared_weights_default(moe)


def test_prepared_weight_is_the_panels_of_the_codes() -> None:
    layer = _layer("w8a8-fp8-channel")
    tgt = get_target("sm_90a")
    plan = compose(layer, ComputeConfig(), shared_weight_tunings(layer, tgt).for_m(4096), tgt)
    w = torch.randn(layer.n, layer.k, generator=torch.Generator().manual_seed(3)) * 0.05
    qw = hg.scheme("w8a8-fp8-channel").quantize(w)
    prepared = prepare_weight(plan, qw, "cpu")
    lay = plan.layout
    assert tuple(prepared.b.shape) == (lay.n_pad // 128, lay.k_pad // 128, 128 * 128)
    codes = unpack_codes_sw128(prepared.b, lay.b_layout, lay.n_pad, lay.k_pad)
    assert torch.equal(codes[: layer.n, : layer.k], qw.codes.view(torch.uint8))
    assert not codes[layer.n:].any() and not codes[:, layer.k:].any()  # padding holds zero codes


@pytest.mark.parametrize("scheme,gemm,change,needle", [
    ("w4a8-mxfp4-fp8", "dense", {}, "the shared-memory operand is the stored 8-bit codes"),
    ("w8a8-fp8-channel", "indexed", {}, "MoE GEMMs read the weights from registers"),
    ("w8a8-fp8-channel", "dense", dict(cluster_m=2, b_load="tma_multicast", split_k=1, raster="n_major"),
     "generated without clusters"),
    ("w4a16-int4-g128", "dense", {}, "with 16-bit activations the weights are dequantized")])
def test_refusals_name_the_reason(scheme: str, gemm: str, change: dict, needle: str) -> None:
    tgt = get_target("sm_90a")
    moe = gemm != "dense"
    layer = LayerConfig(n=4096, k=4096, scheme=scheme, num_experts=8 if moe else 1, top_k=2 if moe else 1)
    base = shared_weight_tunings(_layer("w8a8-fp8-channel"), tgt).for_m(4096)
    with pytest.raises(ComposeError, match=re.escape(needle)):
        compose(layer, ComputeConfig(gemm=gemm, topk_weight=moe), attrs.evolve(base, **change), tgt)


def test_tuning_field_is_checked() -> None:
    with pytest.raises(ValueError, match="b_operand"):
        TuningConfig(b_operand="global")
    with pytest.raises(ValueError, match="needs mma='wgmma'"):
        TuningConfig(b_operand="shared")  # the default mma is mma.sync m16n8k16


TOKENS_M_SCHEMES = ("w8a8-fp8-channel", "w8a8-int8-channel", "w8a8-fp8-block128", "w8a8-fp8-tensor")


@pytest.mark.parametrize("scheme", TOKENS_M_SCHEMES)
@pytest.mark.parametrize("block_n", [128, 256])
def test_tokens_on_m_compiles_without_spills(scheme: str, block_n: int) -> None:
    """tokens_on='m': the tokens wgmma's A operand (64 a consumer warpgroup), the weight panel B; the store writes
    token rows. fp8 and group scales promote 128-row tiles in one m64n128 set and 256-row tiles in two 128-row parts
    one after the other; int8 with channel scales keeps one set of s32 sums over the tile."""
    layer = _layer(scheme, has_bias=True)
    tgt = get_target("sm_90a")
    t = shared_weight_tunings(layer, tgt, tokens_m_from=256, tokens_m_block_n=block_n).for_m(4096)
    assert (t.tokens_on, t.block_m, t.block_n, t.split_k) == ("m", 128, block_n, 1)
    assert shared_weight_tunings(layer, tgt, tokens_m_from=256).for_m(128).tokens_on == "n"
    plan = compose(layer, ComputeConfig(), t, tgt)
    assert plan.kernel_name.endswith("_ss_tm") and f"x{block_n}x128s" in plan.kernel_name
    kernel = build(plan)
    assert_no_spills(kernel, plan.kernel_name)
    src = kernel.source
    assert "token_descriptor(a_stage, step)" in src and "store_output(acc, p, tc.n0, tc.m0 + row)" in src
    integer_channel = scheme == "w8a8-int8-channel"
    mma_n = block_n if integer_channel else 128
    assert f"wgmma_m64n{mma_n}k32(part" in src and src.count("wgmma_m64n") == src.count(f"wgmma_m64n{mma_n}k32")
    assert ("row_scales(" in src) == (scheme == "w8a8-fp8-block128")
    a = "s8" if integer_channel else "e4m3"
    assert f".{'s32' if integer_channel else 'f32'}.{a}.{a} " in src


def test_tokens_on_m_instruction_types_are_a_then_b() -> None:
    """e5m2 activations x e4m3 weights: with the tokens as A the instruction names the activation's type first."""
    from humming_gen.components.mma.wgmma import WgmmaSS8

    ctx = WgmmaSS8(weight="float8e4m3", activation="float8e5m2", n=64, tokens_a=True).context()
    assert ctx["shape"] == "f32.e5m2.e4m3"
    assert WgmmaSS8(weight="float8e4m3", activation="float8e5m2", n=64).context()["shape"] == "f32.e4m3.e5m2"


@pytest.mark.parametrize("scheme,change,needle", [
    ("w8a8-mxfp8", {}, "weight scales per group of 32 k and 1 row(s)"),
    ("w8a8-fp8-channel", dict(block_m=64), "two consumer warpgroups of 64 tokens (block_m=128)"),
    ("w8a8-fp8-channel", dict(split_k=2, raster="n_major"), "whole tiles (split_k=1)")])
def test_tokens_on_m_refusals_name_the_reason(scheme: str, change: dict, needle: str) -> None:
    tgt = get_target("sm_90a")
    layer = LayerConfig(n=4096, k=4096, scheme=scheme)
    base = shared_weight_tunings(_layer("w8a8-fp8-channel"), tgt, tokens_m_from=1).for_m(4096)
    with pytest.raises(ComposeError, match=re.escape(needle)):
        compose(layer, ComputeConfig(), attrs.evolve(base, **change), tgt)


def test_tokens_on_m_needs_shared_weights() -> None:
    with pytest.raises(ValueError, match="tokens_on='m'.*needs b_operand='shared'"):
        TuningConfig(pipeline="warp_specialized", mma="wgmma", tokens_on="m")
    with pytest.raises(ValueError, match="tokens_on"):
        TuningConfig(tokens_on="k")


@pytest.mark.parametrize("scheme", ["w8a8-fp8-block128", "w8a8-fp8-channel"])
def test_tokens_on_m_halves_of_128_rows(scheme: str, monkeypatch) -> None:
    """compose_a8.TOKENS_M_OVERLAP=True: a 128-row tokens-on-M tile promotes two overlapped 64-row halves (m64n64
    wgmmas), where the default promotes one m64n128 set."""
    from humming_gen.pipelines.warp_specialized import compose_a8

    layer = _layer(scheme, has_bias=True)
    tgt = get_target("sm_90a")
    tuning = shared_weight_tunings(layer, tgt, 256, 128).for_m(4096)
    default = build(compose(layer, ComputeConfig(), tuning, tgt)).source
    assert "wgmma_m64n128k32(part, token_descriptor" in default and "part[2]" not in default
    monkeypatch.setattr(compose_a8, "TOKENS_M_OVERLAP", True)
    plan = compose(layer, ComputeConfig(), tuning, tgt)
    kernel = build(plan)
    assert_no_spills(kernel, plan.kernel_name)
    assert "wgmma_m64n64k32(part[" in kernel.source and "wgmma_m64n128k32" not in kernel.source

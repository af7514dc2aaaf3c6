"""QuantMoE with 8-bit activations on the warp-specialized pipeline (sm_90a: wgmma k32 indexed MoE GEMMs) on the GPU
against the float64 references, for w8a8-fp8-channel, w8a8-fp8-block128 (DeepSeek: 1 x 128 activation groups, 128 x
128 weight blocks), w4a8-mxfp4-fp8, w8a8-int8-channel, w8a8-fp8-tensor (one dynamic per-tensor activation scale
per GEMM input; static ones: test_quant_moe_a8.py) and w8a8-mxfp8 (e8m0 scales per 1 x 32 group, token tiles of
at most 32): every bucket forced onto the pipeline
(pipeline="warp_specialized", token tiles 8 .. 128), and the default choice (W4A8: the standard pipeline below 17 rows
per expert, this one from there on; W8A8: this one in every bucket, heuristics.choose.ws_moe_from_rows).

Routing is ragged (softmax top-k with -1 slots), some experts get no token, an expert_map sends half the global
experts to another rank (-1). Every output the test owns is poisoned (NaN) before launch. Tolerances and
references are tests/gpu/test_quant_moe_a8.py's (the standard pipeline's 8-bit MoE): the references quantize both
GEMM inputs with the scheme's ActivationScheme, as QuantMoE does.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from moe_cases import w8a8
from test_quant_moe import _rel, _routing, capture_without_sync
from test_quant_moe_a8 import (LAYER_TOLERANCE, _reference, build_layer, check_expert_map,
                               check_routed_gemms)

pytestmark = pytest.mark.gpu

PRESETS = ("w8a8-fp8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8", "w8a8-int8-channel", "w8a8-fp8-tensor",
           "w8a8-mxfp8")
M_VALUES = (1, 7, 128, 1000)
EXPERTS = (8, 19)
H, I = 512, 256  # multiples of 128: the block128 activation groups tile both GEMMs' K
PIPELINES = ("warp_specialized", None)  # forced onto every bucket, and the default choice
# The whole layer at M < 16 (a few output rows): GEMM2's input is GEMM1's output quantized again, and wgmma's fp8
# accumulation (promoted every 128 k) lands a few more of its codes one e4m3 step (6-12 %) from the float64
# reference's than the standard pipeline's fp32 mma.sync sums do. On one or a few tokens a couple of such codes move
# the error past LAYER_TOLERANCE: bench/moe_a8_flips.py, 24 seeds on the H200, warp-specialized median / max 0.0032 /
# 0.0242 (M = 1, top-2) and 0.0042 / 0.0165 (M = 7, top-8), standard 0.0024 / 0.0027; from M = 128 on 0.0054 / 0.0091
# (under LAYER_TOLERANCE). The single GEMMs are held to the dense bounds
# (test_a8_ws_gemms_write_exactly_the_routed_rows).
SMALL_M = 16
SMALL_M_LAYER_TOLERANCE = 3e-2
# w8a8-fp8-tensor: GEMM2's one dynamic per-tensor scale is the amax of GEMM1's whole output, so a single bf16 ulp of
# difference at that element (another accumulation order) moves every code of GEMM2's input. A float64 emulation
# (a 2000 x 256 intermediate, its amax one ulp up) moves the layer's output by 1.6-2.5 %; the H200 measured
# 2.2-2.8 % at some (M, top-k). The layer is held to this bound, its GEMMs alone to the dense ones
# (test_a8_ws_gemms_write_exactly_the_routed_rows), static per-tensor scales to LAYER_TOLERANCE (test_quant_moe_a8.py).
PER_TENSOR_LAYER_TOLERANCE = 4e-2


def _layer(preset: str, e: int, *, seed: int, pipeline: str | None, **kwargs):
    """build_layer (test_quant_moe_a8.py) with the pipelines it asserts: `pipeline` on every bucket, or by default
    W8A8's warp-specialized buckets, W4A8's standard pipeline in its two smallest buckets, then the
    warp-specialized ones."""
    moe, q13, q2, b13, b2 = build_layer(preset, e, seed=seed, pipeline=pipeline, **kwargs)
    pipelines = [g.kernel.plan.pipeline for pair in moe._launchers for g in pair]
    if pipeline is not None or w8a8(preset):  # forced onto every bucket, or W8A8's default
        assert set(pipelines) == {pipeline or "warp_specialized"}, preset
    else:  # a split-K first bucket where the heuristic splits (standard), the standard pipeline's two smallest
        # unsplit buckets, then the warp-specialized ones
        split = [any(k > 1 for k in pair) for pair in moe.split_ks]
        assert split == sorted(split, reverse=True), (preset, moe.split_ks)
        assert pipelines[: 2 * sum(split)] == ["standard"] * 2 * sum(split), (preset, pipelines)
        unsplit = pipelines[2 * sum(split):]
        assert unsplit == ["standard"] * 4 + ["warp_specialized"] * 4, (preset, pipelines, moe.split_ks)
    return moe, q13, q2, b13, b2


def _ragged_routing(m: int, e: int, top_k: int, drop: float):
    """Router weights and ids over experts 0 .. e - 3 only (the last two get no token), one crowded expert (a
    quarter of the tokens send their first slot to expert 0), and a fraction `drop` of -1 slots."""
    weights, ids = _routing(m, e - 2, top_k, drop=drop)
    crowded = torch.rand(m, device="cuda") < 0.25
    ids[:, 0] = torch.where(crowded & (ids[:, 0] >= 0) & (ids != 0).all(dim=1), torch.zeros_like(ids[:, 0]),
                            ids[:, 0])
    return weights, ids


def _pipelines_of(moe, m: int, top_k: int) -> tuple[str, str]:
    g1, g2 = moe._launchers[moe.bucket_for(m, top_k)]
    return g1.kernel.plan.pipeline, g2.kernel.plan.pipeline


def layer_errors(moe, q13, q2, b13, b2) -> tuple[dict, set]:
    """fused_moe into a poisoned (M, H) output for M in M_VALUES and top-k 2 and 8 (E = 8 at top-8: every expert;
    else ragged routing with empty experts), dropped slots, an outlier token (per-token scales differ by an order
    of magnitude): (m, top_k) -> relative error against the float64 reference, and the (GEMM1, GEMM2) pipelines
    the batches took."""
    e = moe.num_experts
    errors, seen = {}, set()
    for m in M_VALUES:
        for top_k in (2, 8):
            x = torch.randn(m, H, device="cuda").to(moe.dtype)
            x[0, :5] *= 20
            if top_k == 8 and e == 8:
                weights, ids = _routing(m, e, top_k, drop=0.1 if m > 1 else 0.0)
            else:
                weights, ids = _ragged_routing(m, e, min(top_k, e - 2), drop=0.1 if m > 1 else 0.0)
            out = torch.full((m, H), float("nan"), dtype=moe.dtype, device="cuda")
            assert hg.fused_moe(x, moe, weights, ids, output=out) is out
            assert torch.isfinite(out).all(), f"m={m} top_k={top_k}: rows left unwritten or non-finite"
            errors[(m, top_k)] = _rel(out, _reference(moe, x, weights, ids, q13, q2, b13, b2))
            seen.add(_pipelines_of(moe, m, ids.shape[1]))
    return errors, seen


def _layer_cases():
    for preset in PRESETS:
        for e in EXPERTS:
            for pipeline in PIPELINES:
                for fused in (False, True):
                    if fused and preset == "w8a8-fp8-block128":
                        continue  # refused: w13's block scales cannot follow the gate/up tile order
                    yield pytest.param(preset, e, pipeline, fused,
                                       id=f"{preset}-e{e}-{pipeline or 'default'}-{'fused' if fused else 'torch'}")


@pytest.mark.parametrize("preset,e,pipeline,fused", list(_layer_cases()))
def test_quant_moe_a8_ws_matches_reference(preset: str, e: int, pipeline: str | None, fused: bool) -> None:
    """fused_moe into a poisoned (M, H) output for M in M_VALUES and top-k 2 and 8 (E = 8: every expert), ragged
    routing with empty experts and dropped slots, an outlier token."""
    activation, layout = ("swiglu_oai", "interleaved") if preset == "w4a8-mxfp4-fp8" else ("silu_mul", "split")
    moe, q13, q2, b13, b2 = _layer(preset, e, seed=e, pipeline=pipeline, biases=e == 8, fused=fused,
                                   activation=activation, layout=layout)
    tolerance = LAYER_TOLERANCE[moe.activation_schemes[0].dtype.name]
    small_m_tolerance = SMALL_M_LAYER_TOLERANCE
    if preset == "w8a8-fp8-tensor":
        tolerance = small_m_tolerance = PER_TENSOR_LAYER_TOLERANCE
    errors, seen = layer_errors(moe, q13, q2, b13, b2)
    if pipeline is None and not w8a8(preset):  # the batches span both pipelines' buckets
        assert seen == {("standard", "standard"), ("warp_specialized", "warp_specialized")}, seen
    bad = {k: err for k, err in errors.items()
           if not err < (small_m_tolerance if k[0] < SMALL_M else tolerance)}
    assert not bad, f"{preset}: relative error above the bound at (m, top_k) {bad} (all {errors})"


@pytest.mark.parametrize("preset", PRESETS)
def test_a8_ws_gemms_write_exactly_the_routed_rows(preset: str) -> None:
    """check_routed_gemms on every bucket forced onto the warp-specialized pipeline, with ragged routing; M = 300
    and 400 give 32 and 43 rows per expert over 19 experts (the 64-token tile; MXFP8 caps its tiles at 32 tokens,
    its group-32 activation scales)."""
    moe, q13, q2, b13, b2 = _layer(preset, 19, seed=7, pipeline="warp_specialized", biases=True, fused=False)
    tiles = check_routed_gemms(moe, q13, q2, b13, b2, M_VALUES + (300, 400), _ragged_routing, preset)
    assert tiles == ({8, 16, 32} if preset == "w8a8-mxfp8" else {8, 16, 64, 128}), tiles


def test_a8_ws_staged_e8m0_gemms_write_exactly_the_routed_rows(monkeypatch) -> None:
    """compose_a8.STAGE_E8M0_SCALES (the default): MXFP8's e8m0 scales staged through the routing's rows (indexed;
    8-token tiles of 256-k stages, 8 bytes a token), check_routed_gemms on every bucket forced onto the
    warp-specialized pipeline, with ragged routing; and switched off (read from global memory at each promotion)."""
    from humming_gen.pipelines.warp_specialized import compose_a8

    monkeypatch.setattr(compose_a8, "STAGE_E8M0_SCALES", False)
    moe, q13, q2, b13, b2 = _layer("w8a8-mxfp8", 19, seed=9, pipeline="warp_specialized", biases=True, fused=False)
    assert all(g.kernel.a_scale_alignment == 1 for pair in moe._launchers for g in pair), "the global loads run"
    check_routed_gemms(moe, q13, q2, b13, b2, (1, 64, 300), _ragged_routing, "w8a8-mxfp8 unstaged")
    monkeypatch.setattr(compose_a8, "STAGE_E8M0_SCALES", True)
    moe, q13, q2, b13, b2 = _layer("w8a8-mxfp8", 19, seed=8, pipeline="warp_specialized", biases=True, fused=False)
    assert all(g.kernel.a_scale_alignment == 4 for pair in moe._launchers for g in pair), "the staged kernels run"
    tiles = check_routed_gemms(moe, q13, q2, b13, b2, M_VALUES + (300, 400), _ragged_routing, "w8a8-mxfp8 staged")
    assert tiles == {8, 16, 32}, tiles


@pytest.mark.parametrize("pipeline", PIPELINES, ids=["forced", "default"])
@pytest.mark.parametrize("preset", PRESETS)
def test_a8_ws_fp16_expert_map_and_dropped_tokens(preset: str, pipeline: str | None) -> None:
    """check_expert_map through fused_moe into a poisoned output, fp16 with biases."""
    moe, q13, q2, b13, b2 = _layer(preset, 19, seed=31, pipeline=pipeline, dtype=torch.float16, biases=True)
    check_expert_map(moe, q13, q2, b13, b2, poisoned=True)


@pytest.mark.parametrize("preset", ["w8a8-fp8-channel", "w8a8-int8-channel"])
def test_a8_ws_code_rows_ending_inside_a_16_byte_chunk(preset: str) -> None:
    """I = 200: GEMM2's code rows end 8 bytes into a 16-byte chunk (the producer copies it in part, the rest of
    the tile is zero-filled); gate/up N = 400 is no multiple of the 128-row tile. Every bucket warp-specialized."""
    moe, q13, q2, b13, b2 = _layer(preset, 8, seed=5, pipeline="warp_specialized", biases=True, i=200)
    tolerance = LAYER_TOLERANCE[moe.activation_schemes[0].dtype.name]
    for m in M_VALUES:
        x = torch.randn(m, H, device="cuda").bfloat16()
        weights, ids = _ragged_routing(m, 8, 2, drop=0.1 if m > 1 else 0.0)
        out = torch.full((m, H), float("nan"), dtype=torch.bfloat16, device="cuda")
        hg.fused_moe(x, moe, weights, ids, output=out)
        assert torch.isfinite(out).all(), f"m={m}"
        err = _rel(out, _reference(moe, x, weights, ids, q13, q2, b13, b2))
        assert err < tolerance, f"m={m}: relative error {err:.3g}"


def test_a8_ws_deepseek_rank_shapes() -> None:
    """DeepSeek-V3 per rank under EP8: 32 of 256 global experts (expert_map), top-8, gate/up N = 512 K = 7168, down
    N = 7168 K = 256, fp8 block128; the default pipeline choice (M = 512 and 2048 take warp-specialized buckets:
    M x 8 / 32 expected rows per local expert)."""
    e, h, i = 32, 7168, 256
    moe, q13, q2, b13, b2 = _layer("w8a8-fp8-block128", e, seed=41, pipeline=None, h=h, i=i)
    expert_map = torch.full((256,), -1, dtype=torch.int32, device="cuda")
    expert_map[64:96] = torch.arange(e, dtype=torch.int32, device="cuda")
    for m in (512, 2048):
        x = torch.randn(m, h, device="cuda").bfloat16()
        logits = torch.randn(m, 256, device="cuda")
        logits[:, 64:96] += 1.0  # about a third of the slots local
        weights, ids = torch.topk(torch.softmax(logits, -1), 8, dim=-1)
        ids = ids.to(torch.int32)
        out = torch.full((m, h), float("nan"), dtype=torch.bfloat16, device="cuda")
        hg.fused_moe(x, moe, weights, ids, expert_map=expert_map, output=out)
        assert torch.isfinite(out).all(), f"m={m}"
        ref = _reference(moe, x, weights, ids, q13, q2, b13, b2, expert_map=expert_map)
        err = _rel(out, ref)
        assert err < LAYER_TOLERANCE["float8e4m3"], f"m={m}: relative error {err:.3g}"


def test_a8_ws_cuda_graph_replay_with_new_routing_and_no_host_sync() -> None:
    """A warp-specialized bucket: quantizing x and the intermediate adds no host sync, and a captured forward
    replays with a new routing (a crowded expert: more m blocks than the captured one had)."""
    e = 19
    moe, q13, q2, b13, b2 = _layer("w8a8-fp8-block128", e, seed=19, pipeline=None)
    m, top_k = 1000, 2
    assert _pipelines_of(moe, m, top_k) == ("warp_specialized", "warp_specialized")
    x = torch.randn(m, H, device="cuda").bfloat16()
    weights, ids = _routing(m, e, top_k)
    graph, out = capture_without_sync(moe, x, weights, ids)
    new_weights, new_ids = _routing(m, e, top_k, drop=0.3)
    new_ids[: m // 2, 0] = 0
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    x.copy_(torch.randn(m, H, device="cuda").bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    ref = _reference(moe, x, weights, ids, q13, q2, b13, b2)
    assert _rel(out, ref) < LAYER_TOLERANCE["float8e4m3"]

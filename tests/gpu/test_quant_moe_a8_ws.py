"""QuantMoE with 8-bit activations on the warp-specialized pipeline (sm_90a: wgmma k32 indexed MoE GEMMs) on the GPU
against the float64 references, for w8a8-fp8-channel, w8a8-fp8-block128 (DeepSeek: 1 x 128 activation groups, 128 x
128 weight blocks), w4a8-mxfp4-fp8 and w8a8-int8-channel: every bucket forced onto the pipeline
(pipeline="warp_specialized", token tiles 8 .. 128), and the default choice (the standard pipeline below 17 rows per
expert, this one from there on).

Routing is ragged (softmax top-k with -1 slots), some experts get no token, an expert_map sends half the global
experts to another rank (-1). Every output the test owns is poisoned (NaN) before launch. Tolerances and
references are tests/gpu/test_quant_moe_a8.py's (the standard pipeline's 8-bit MoE): the references quantize both
GEMM inputs with the scheme's ActivationScheme, as QuantMoE does.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import local_experts
from test_quant_moe import _rel, _routing
from test_quant_moe_a8 import LAYER_TOLERANCE, _check_rows, _per_expert, _reference

pytestmark = pytest.mark.gpu

PRESETS = ("w8a8-fp8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8", "w8a8-int8-channel")
M_VALUES = (1, 7, 128, 1000)
EXPERTS = (8, 19)
H, I = 512, 256  # multiples of 128: the block128 activation groups tile both GEMMs' K
PIPELINES = ("warp_specialized", None)  # forced onto every bucket, and the default choice
# The whole layer at M < 16 (a few output rows): GEMM2's input is GEMM1's output quantized again, and wgmma's fp8
# accumulation (promoted every 128 k) lands a few more of its codes one e4m3 step (6-12 %) from the float64
# reference's than the standard pipeline's fp32 mma.sync sums do. On one or a few tokens a couple of such codes move
# the error past LAYER_TOLERANCE: bench/moe_a8_flips.py, 24 seeds on the H200, warp-specialized median / max 0.0032 /
# 0.0242 (M = 1, top-2) and 0.0042 / 0.0165 (M = 7, top-8), standard 0.0024 / 0.0027; from M = 128 on 0.0054 / 0.0091
# (under LAYER_TOLERANCE). The single GEMMs are held to the dense bounds (test_a8_ws_gemms_write_exactly_the_routed_rows).
SMALL_M = 16
SMALL_M_LAYER_TOLERANCE = 3e-2


def _layer(preset: str, e: int, *, seed: int, pipeline: str | None, dtype=torch.bfloat16, biases: bool = False,
           fused: bool = False, activation: str = "silu_mul", layout: str = "split", h: int = H, i: int = I):
    torch.manual_seed(seed)
    s = hg.scheme(preset)
    q13 = s.quantize(torch.randn(e, 2 * i, h, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(e, h, i, device="cuda") * 0.05)
    b13 = (torch.randn(e, 2 * i, device="cuda") * 0.1).to(dtype) if biases else None
    b2 = (torch.randn(e, h, device="cuda") * 0.1).to(dtype) if biases else None
    moe = hg.QuantMoE.from_quantized(q13, q2, activation=activation, gate_up_layout=layout, bias13=b13, bias2=b2,
                                     dtype=dtype, fused_activation=fused, pipeline=pipeline)
    pipelines = [g.kernel.plan.pipeline for pair in moe._launchers for g in pair]
    if pipeline is not None:  # forced onto every bucket
        assert set(pipelines) == {pipeline}, preset
    else:  # the standard pipeline's two smallest buckets, then the warp-specialized ones
        assert pipelines == ["standard"] * 4 + ["warp_specialized"] * 4, (preset, pipelines)
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
    errors, seen = {}, set()
    for m in M_VALUES:
        for top_k in (2, 8):
            x = torch.randn(m, H, device="cuda").to(moe.dtype)
            x[0, :5] *= 20  # an outlier token: per-token scales differ by an order of magnitude
            if top_k == 8 and e == 8:
                weights, ids = _routing(m, e, top_k, drop=0.1 if m > 1 else 0.0)
            else:
                weights, ids = _ragged_routing(m, e, min(top_k, e - 2), drop=0.1 if m > 1 else 0.0)
            out = torch.full((m, H), float("nan"), dtype=moe.dtype, device="cuda")
            assert hg.fused_moe(x, moe, weights, ids, output=out) is out
            assert torch.isfinite(out).all(), f"m={m} top_k={top_k}: rows left unwritten or non-finite"
            ref = _reference(moe, x, weights, ids, q13, q2, b13, b2)
            errors[(m, top_k)] = _rel(out, ref)
            seen.add(_pipelines_of(moe, m, ids.shape[1]))
    if pipeline is None:  # the batches span both pipelines' buckets
        assert seen == {("standard", "standard"), ("warp_specialized", "warp_specialized")}, seen
    bad = {k: err for k, err in errors.items()
           if not err < (SMALL_M_LAYER_TOLERANCE if k[0] < SMALL_M else tolerance)}
    assert not bad, f"{preset}: relative error above the bound at (m, top_k) {bad} (all {errors})"


@pytest.mark.parametrize("preset", PRESETS)
def test_a8_ws_gemms_write_exactly_the_routed_rows(preset: str) -> None:
    """moe_gemm of every warp-specialized bucket on moe_align's routing into poisoned outputs: GEMM1 row i =
    q(x)[i // top_k] @ w13_e^T + b13_e, GEMM2 row i = (q(a)[i] @ w2_e^T + b2_e) * topk_weight[i] (q: the scheme's
    activation quantization of the whole input, as the layer does); rows of dropped slots stay NaN."""
    e = 19
    moe, q13, q2, b13, b2 = _layer(preset, e, seed=7, pipeline="warp_specialized", biases=True)
    act = moe.activation_schemes[0]
    w13, w2 = q13.dequantize().double(), q2.dequantize().double()
    tiles = set()
    for m in M_VALUES + (300, 400):  # M x top-2 / 19 experts rows per expert: 300 -> 32, 400 -> 43 (tile 64)
        top_k = 2
        x = torch.randn(m, H, device="cuda").bfloat16()
        weights, ids = _ragged_routing(m, e, top_k, drop=0.2 if m > 1 else 0.0)
        bm = moe.block_m(m, top_k)
        tiles.add(bm)
        r = hg.moe_align(ids, e, bm)
        h = torch.full((m * top_k, 2 * I), float("nan"), dtype=torch.bfloat16, device="cuda")
        hg.moe_gemm(x, moe, "w13", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad, top_k=top_k, block_m=bm,
                    out=h)
        expert = local_experts(ids, e).reshape(-1)
        routed = expert >= 0
        rows = (torch.arange(m * top_k, device="cuda") // top_k)[routed]
        xq = act.quantize(x).dequantize(torch.float64)
        ref = _per_expert(xq[rows], expert[routed], w13) + b13.double()[expert[routed]]
        assert torch.isnan(h[~routed]).all(), f"m={m}: a dropped assignment's row was written"
        _check_rows(h[routed], ref, torch.bfloat16, f"{preset} w13 m={m} block_m={bm}")
        a = torch.randn(m * top_k, I, device="cuda").bfloat16()
        y = torch.full((m * top_k, H), float("nan"), dtype=torch.bfloat16, device="cuda")
        hg.moe_gemm(a, moe, "w2", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad, top_k=1, block_m=bm,
                    topk_weights=weights.reshape(-1), out=y)
        aq = act.quantize(a).dequantize(torch.float64)
        ref2 = ((_per_expert(aq[routed], expert[routed], w2) + b2.double()[expert[routed]])
                * weights.reshape(-1).double()[routed, None])
        assert torch.isnan(y[~routed]).all(), f"m={m}: a dropped assignment's row was written (w2)"
        _check_rows(y[routed], ref2, torch.bfloat16, f"{preset} w2 m={m} block_m={bm}")
    assert tiles == {8, 16, 64, 128}, tiles


@pytest.mark.parametrize("pipeline", PIPELINES, ids=["forced", "default"])
@pytest.mark.parametrize("preset", PRESETS)
def test_a8_ws_fp16_expert_map_and_dropped_tokens(preset: str, pipeline: str | None) -> None:
    """fp16 layer with biases, expert parallelism: ids are global over 2E experts, expert_map sends the lower half
    to -1; a token whose slots are all elsewhere gets a zero row."""
    e = 19
    moe, q13, q2, b13, b2 = _layer(preset, e, seed=31, pipeline=pipeline, dtype=torch.float16, biases=True)
    expert_map = torch.full((2 * e,), -1, dtype=torch.int32, device="cuda")
    expert_map[e:] = torch.arange(e, dtype=torch.int32, device="cuda")
    for m in M_VALUES:
        x = torch.randn(m, H, device="cuda").half()
        weights = torch.rand(m, 4, device="cuda")
        ids = torch.randint(0, 2 * e, (m, 4), device="cuda", dtype=torch.int32)
        ids[0] = torch.tensor([0, 1, -1, 5], device="cuda")  # every slot elsewhere or dropped
        if m > 1:
            ids[1, 2] = -1
        out = torch.full((m, H), float("nan"), dtype=torch.float16, device="cuda")
        hg.fused_moe(x, moe, weights, ids, expert_map=expert_map, output=out)
        ref = _reference(moe, x, weights, ids, q13, q2, b13, b2, expert_map=expert_map)
        assert torch.equal(out[0], torch.zeros_like(out[0])), f"m={m}: a token with no local slot"
        if m > 1:
            assert torch.isfinite(out).all(), f"m={m}: rows left unwritten or non-finite"
            err = _rel(out, ref)
            assert err < LAYER_TOLERANCE[moe.activation_schemes[0].dtype.name], f"m={m}: relative error {err:.3g}"


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
    moe(x, weights, ids)  # warm up (kernels load, moe_align and the quantize kernels compile)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        moe(x, weights, ids)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        moe(x, weights, ids)
        with torch.cuda.graph(graph, stream=stream):
            out = moe(x, weights, ids)
    torch.cuda.current_stream().wait_stream(stream)
    new_weights, new_ids = _routing(m, e, top_k, drop=0.3)
    new_ids[: m // 2, 0] = 0
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    x.copy_(torch.randn(m, H, device="cuda").bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    ref = _reference(moe, x, weights, ids, q13, q2, b13, b2)
    assert _rel(out, ref) < LAYER_TOLERANCE["float8e4m3"]

"""The MoE ops on the GPU: opcheck of humming_gen::fused_moe / fused_moe_out / moe_gemm, torch.compile (inductor,
fullgraph, dynamic M: one graph, outputs bitwise equal to eager), CUDA-graph replay through torch.compile
(mode="reduce-overhead") with new routing, no host sync in fused_moe and moe_gemm, moe_gemm on vLLM-sized routing
buffers, and fused_moe's vLLM arguments against the float64 reference."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import reference_fused_moe

pytestmark = pytest.mark.gpu

E, H, I, TOP_K = 8, 512, 256, 2
TOLERANCE = 2e-2  # bf16, as tests/gpu/test_quant_moe.py


def _build(**kwargs):
    torch.manual_seed(0)
    scheme = hg.QuantScheme("int4", group_size=128)
    q13 = scheme.quantize(torch.randn(E, 2 * I, H, device="cuda") * 0.05)
    q2 = scheme.quantize(torch.randn(E, H, I, device="cuda") * 0.05)
    moe = hg.QuantMoE.from_quantized(q13, q2, dtype=torch.bfloat16, **kwargs)
    return moe, q13.dequantize().double(), q2.dequantize().double()


@pytest.fixture(scope="module")
def built():
    """The default layer: GEMM1 applies the gated activation in its epilogue."""
    layer = _build()
    assert layer[0].fused_activation
    return layer


@pytest.fixture(scope="module")
def unfused():
    """fused_activation=False: the gate/up GEMM runs alone (moe_gemm "w13")."""
    return _build(fused_activation=False)


def _routing(m: int, top_k: int = TOP_K, seed: int = 1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    weights, ids = torch.topk(torch.softmax(torch.randn(m, E, device="cuda", generator=g), -1), top_k, dim=-1)
    return weights, ids.to(torch.int32)


def _rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def test_opcheck_on_the_gpu(built, unfused):
    moe, _, _ = built
    x = torch.randn(33, H, device="cuda", dtype=torch.bfloat16)
    weights, ids = _routing(33)
    emap = torch.full((2 * E,), -1, dtype=torch.int32, device="cuda")
    emap[E:] = torch.arange(E, dtype=torch.int32, device="cuda")
    gids = torch.randint(0, 2 * E, (33, TOP_K), dtype=torch.int32, device="cuda")
    for args in ((x, moe._op_id, weights, ids, None), (x, moe._op_id, weights, gids, emap)):
        result = torch.library.opcheck(torch.ops.humming_gen.fused_moe.default, args)
        assert set(result.values()) == {"SUCCESS"}, result
    out = torch.empty(33, H, device="cuda", dtype=torch.bfloat16)
    result = torch.library.opcheck(torch.ops.humming_gen.fused_moe_out.default,
                                   (x, out, moe._op_id, weights, ids, None))
    assert set(result.values()) == {"SUCCESS"}, result
    moe, _, _ = unfused
    bm = moe.block_m(33, TOP_K)
    r = hg.moe_align(ids, E, bm)
    h = torch.zeros(33 * TOP_K, 2 * I, device="cuda", dtype=torch.bfloat16)
    result = torch.library.opcheck(torch.ops.humming_gen.moe_gemm.default,
                                   (x, h, moe._op_id, "w13", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad,
                                    TOP_K, bm, None))
    assert set(result.values()) == {"SUCCESS"}, result


def test_compile_inductor_fullgraph_dynamic_m(built):
    from torch._inductor.compile_fx import compile_fx

    moe, _, _ = built
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return compile_fx(gm, example_inputs)

    def layer(x, weights, ids):
        return hg.fused_moe(x * 2, moe, weights, ids, routed_scaling_factor=1.5)  # * 2: exact, so bitwise equal

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend=backend)
    for m in (3, 17, 300):
        x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
        weights, ids = _routing(m, seed=m)
        assert torch.equal(compiled(x, weights, ids), layer(x, weights, ids)), f"m={m}"
    assert len(graphs) == 1, f"{len(graphs)} graphs for three row counts"
    torch._dynamo.reset()


def test_cuda_graph_through_torch_compile_replays_new_routing(built):
    moe, w13, w2 = built
    m = 40
    x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(lambda x, w, i: moe(x, w, i), fullgraph=True, mode="reduce-overhead")
    for seed in range(4):  # warm-up, recording, then replays with new routing each time
        weights, ids = _routing(m, seed=seed)
        out = compiled(x, weights, ids).clone()
        ref = reference_fused_moe(x.double(), w13, w2, weights.double(), ids)
        assert _rel(out, ref) < TOLERANCE, f"call {seed}"
    assert counters["inductor"]["cudagraph_skips"] == 0, "inductor ran the graph without CUDA graphs"
    torch._dynamo.reset()


def test_no_host_sync(built, unfused):
    moe, _, _ = built
    alone, _, _ = unfused  # moe_gemm "w13"
    m = 64
    x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
    weights, ids = _routing(m)
    bm = moe.block_m(m, TOP_K)
    assert alone.block_m(m, TOP_K) == bm
    hg.fused_moe(x, moe, weights, ids)
    hg.fused_moe(x, alone, weights, ids)
    r = hg.moe_align(ids, E, bm)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        hg.fused_moe(x, moe, weights, ids, routed_scaling_factor=2.0)
        hg.moe_gemm(x, alone, "w13", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad, top_k=TOP_K, block_m=bm)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_moe_gemm_on_vllm_sized_routing_equals_forward(unfused):
    """Both GEMMs on buffers sized as vLLM's moe_align_block_size sizes them, garbage past the padded total, equal
    the (unfused) layer's forward bit for bit; rows of skipped assignments stay NaN."""
    moe, _, _ = unfused
    m = 123
    x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
    weights, ids = _routing(m)
    ids[5, 0] = -1
    bm = moe.block_m(m, TOP_K)
    r = hg.moe_align(ids, E, bm)
    size = ids.numel() + E * (bm - 1)
    sorted_ids = torch.full((size,), 1 << 30, dtype=torch.int32, device="cuda")
    expert_ids = torch.full((-(-size // bm),), 12345, dtype=torch.int32, device="cuda")
    total = int(r.num_tokens_post_pad)
    sorted_ids[:total] = r.sorted_ids[:total]
    expert_ids[:total // bm] = r.expert_ids[:total // bm]
    h = torch.full((m * TOP_K, 2 * I), float("nan"), device="cuda", dtype=torch.bfloat16)
    hg.moe_gemm(x, moe, "w13", sorted_ids, expert_ids, r.num_tokens_post_pad, top_k=TOP_K, block_m=bm, out=h)
    dropped = torch.zeros(m * TOP_K, dtype=torch.bool, device="cuda")
    dropped[5 * TOP_K] = True
    assert torch.isnan(h[dropped]).all() and torch.isfinite(h[~dropped]).all()
    act = (torch.nn.functional.silu(h[:, :I].float()) * h[:, I:].float()).to(torch.bfloat16)
    y = torch.zeros(m * TOP_K, H, device="cuda", dtype=torch.bfloat16)
    hg.moe_gemm(act, moe, "w2", sorted_ids, expert_ids, r.num_tokens_post_pad, top_k=1, block_m=bm,
                topk_weights=weights.reshape(-1), out=y)
    summed = torch.sum(y.view(m, TOP_K, H), dim=1, dtype=torch.float32).to(torch.bfloat16)
    assert torch.equal(summed, moe(x, weights, ids))


def test_fused_moe_vllm_arguments(built):
    moe, w13, w2 = built
    m = 77
    x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
    weights, ids = _routing(m)
    out = hg.fused_moe(x, moe, weights, ids, routed_scaling_factor=2.5)
    assert _rel(out, reference_fused_moe(x.double(), w13, w2, 2.5 * weights.double(), ids)) < TOLERANCE
    w1, ids1 = _routing(m, top_k=1)
    out = torch.full((m, H), float("nan"), device="cuda", dtype=torch.bfloat16)
    hg.fused_moe(x, moe, w1, ids1, apply_router_weight_on_input=True, output=out)
    ref = reference_fused_moe((x * w1.to(torch.bfloat16)).double(), w13, w2, torch.ones_like(w1).double(), ids1)
    assert _rel(out, ref) < TOLERANCE

"""QuantMoE's host path without a GPU: the `humming_gen::fused_moe` / `fused_moe_out` / `moe_gemm` ops
(registration, data-independent fakes, opcheck, torch.compile with dynamic M in one graph), `humming_gen.fused_moe`'s
vLLM arguments and `humming_gen.moe_gemm` on a caller's routing.

The layer is built for sm_90a on the CPU; its launchers are replaced by stand-ins that compute each routed
assignment row in float64 from exactly the routing tensors a kernel would read (sorted ids below the padded total,
expert per block, sentinel rows skipped; GEMM1 of a fused layer applies the gated activation to its rows in tile
order), and moe_align runs its CPU reference.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from helpers import gated_tile_rows
from humming_gen.layer.gate_up import gate_up_tile_order
from humming_gen.reference.moe import reference_fused_moe

E, H, I, TOP_K = 4, 256, 128, 2


class MoeStandIn:
    """Stands in for a bound indexed launcher: out[i] = a[i // top_k] @ W[e]^T (+ b[e]) (* topk_weights[i]) for
    each assignment i that sorted_ids lists below num_tokens_post_pad, e the expert of its block (a gated kernel:
    act(gate, up) of those rows, W's in tile order)."""

    def __init__(self, kernel, w: torch.Tensor, bias: torch.Tensor | None):
        self.kernel, self.w, self.bias = kernel, w, bias
        self.calls = 0

    def moe(self, a, out, routing, top_k, topk_weights=None, a_scale=None, out_top_k=None):
        assert a_scale is None  # 16-bit activations
        atomic = self.kernel.plan.compute.topk_reduce == "atomic"
        assert (out_top_k is not None) == atomic
        self.calls += 1
        weighted = self.kernel.plan.compute.topk_weight
        assert (topk_weights is not None) == weighted
        block_m = self.kernel.plan.tuning.block_m
        total = int(routing.num_tokens_post_pad[0])
        assert total % block_m == 0
        ids = routing.sorted_ids[:total].long()
        experts = routing.expert_ids[:total // block_m].long().repeat_interleave(block_m)
        keep = ids < out.shape[0] * (out_top_k or 1)
        ids, experts = ids[keep], experts[keep]
        rows = torch.zeros(ids.numel(), self.w.shape[1], dtype=torch.float64)
        for e in range(self.w.shape[0]):
            sel = experts == e
            rows[sel] = a[ids[sel] // top_k].double() @ self.w[e].T
            if self.bias is not None:
                rows[sel] += self.bias[e].double()
        if self.kernel.plan.compute.epilogue_activation:
            rows = gated_tile_rows(rows, self.kernel.plan.compute.epilogue_activation)
        if weighted:
            rows *= topk_weights[ids].double()[:, None]
        if atomic:  # the epilogue's red.global.add.f32 of each fp32 row into its token's row (in some order)
            assert out.dtype == torch.float32
            out.index_add_(0, ids // out_top_k, rows.float())
            return
        out[ids] = rows.to(out.dtype)


def make_layer(seed: int = 0, **kwargs) -> tuple[hg.QuantMoE, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    scheme = hg.QuantScheme("int4", group_size=128)
    q13, q2 = scheme.quantize(torch.randn(E, 2 * I, H) * 0.05), scheme.quantize(torch.randn(E, H, I) * 0.05)
    moe = hg.QuantMoE.from_quantized(q13, q2, target="sm_90a", device="cpu", **kwargs)
    w13, w2 = q13.dequantize(torch.float64), q2.dequantize(torch.float64)
    kernel_w13 = w13[:, gate_up_tile_order(I)] if moe.fused_activation else w13  # as the layer packs it
    moe._launchers = [(MoeStandIn(g1.kernel, kernel_w13, moe.bias13), MoeStandIn(g2.kernel, w2, moe.bias2))
                      for g1, g2 in moe._launchers]
    return moe, w13, w2


@pytest.fixture(scope="module")
def built():
    """Unfused: the gate/up GEMM runs alone (moe_gemm "w13")."""
    return make_layer(fused_activation=False)


@pytest.fixture(scope="module")
def fused():
    """The default: GEMM1 applies silu_mul in its epilogue."""
    moe, w13, w2 = make_layer()
    assert moe.fused_activation
    return moe, w13, w2


def routing(m: int, top_k: int = TOP_K, seed: int = 1, num_ids: int = E) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    weights, ids = torch.topk(torch.rand(m, num_ids, generator=g), top_k, dim=-1)
    return weights, ids.to(torch.int32)


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("layer", ["built", "fused"])
def test_forward_goes_through_the_op_and_matches_the_reference(layer, request):
    moe, w13, w2 = request.getfixturevalue(layer)
    x = torch.randn(37, H, dtype=torch.bfloat16)
    weights, ids = routing(37)
    ids[3] = -1  # a token with every slot dropped gives a zero row
    graph = torch.fx.experimental.proxy_tensor.make_fx(moe, tracing_mode="symbolic")(x, weights, ids)
    assert [n.target for n in graph.graph.nodes if n.op == "call_function"] == [
        torch.ops.humming_gen.fused_moe.default]
    out = moe(x, weights, ids)
    ref = reference_fused_moe(x.double(), w13, w2, weights.double(), ids)
    assert out.shape == (37, H) and out.dtype == torch.bfloat16
    assert torch.equal(out[3], torch.zeros(H, dtype=torch.bfloat16))
    assert rel(out, ref) < 2e-2
    result = torch.library.opcheck(torch.ops.humming_gen.fused_moe.default, (x, moe._op_id, weights, ids, None))
    assert set(result.values()) == {"SUCCESS"}, result


def test_fakes_give_data_independent_shapes(built):
    from torch._subclasses.fake_tensor import FakeTensorMode

    moe, _, _ = built
    with FakeTensorMode():
        for m in (0, 1, 5000):
            x = torch.empty(m, H, dtype=torch.bfloat16)
            w, ids = torch.empty(m, 3), torch.empty(m, 3, dtype=torch.int64)
            y = torch.ops.humming_gen.fused_moe(x, moe._op_id, w, ids, None)
            assert tuple(y.shape) == (m, H) and y.dtype == torch.bfloat16
        with pytest.raises(ValueError, match=r"x must be \(M, 256\)"):
            torch.ops.humming_gen.fused_moe(torch.empty(4, H + 8, dtype=torch.bfloat16), moe._op_id, w[:4],
                                            ids[:4], None)


def test_opcheck_passes(built):
    moe, _, _ = built
    x = torch.randn(9, H, dtype=torch.bfloat16)
    weights, ids = routing(9)
    emap = torch.tensor([-1, 0, 1, -1, 2, 3], dtype=torch.int32)
    gids = torch.randint(0, 6, (9, TOP_K), dtype=torch.int32)
    for args in ((x, moe._op_id, weights, ids, None), (x, moe._op_id, weights, gids, emap)):
        result = torch.library.opcheck(torch.ops.humming_gen.fused_moe.default, args)
        assert set(result.values()) == {"SUCCESS"}, result
    out = torch.empty(9, H, dtype=torch.bfloat16)
    result = torch.library.opcheck(torch.ops.humming_gen.fused_moe_out.default,
                                   (x, out, moe._op_id, weights, ids, None))
    assert set(result.values()) == {"SUCCESS"}, result
    bm = moe.block_m(9, TOP_K)
    r = hg.moe_align(ids, E, bm)
    h = torch.zeros(9 * TOP_K, 2 * I, dtype=torch.bfloat16)
    result = torch.library.opcheck(torch.ops.humming_gen.moe_gemm.default,
                                   (x, h, moe._op_id, "w13", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad,
                                    TOP_K, bm, None))
    assert set(result.values()) == {"SUCCESS"}, result


def test_compile_fullgraph_dynamic_m_has_one_graph(built):
    moe, _, _ = built
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def layer(x, weights, ids):
        return torch.relu(hg.fused_moe(x, moe, weights, ids, routed_scaling_factor=2.0))

    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend=backend)
    for m in (3, 17, 100):
        x = torch.randn(m, H, dtype=torch.bfloat16)
        weights, ids = routing(m, seed=m)
        torch.testing.assert_close(compiled(x, weights, ids), layer(x, weights, ids), rtol=0, atol=0)
    assert len(graphs) == 1, f"{len(graphs)} graphs for three row counts"
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.ops.humming_gen.fused_moe.default in targets or torch.ops.humming_gen.fused_moe in targets, targets
    torch._dynamo.reset()


def test_fused_moe_vllm_arguments(built):
    moe, w13, w2 = built
    m = 21
    x = torch.randn(m, H, dtype=torch.bfloat16)
    weights, ids = routing(m)
    base = hg.fused_moe(x, moe, weights, ids)
    assert torch.equal(base, moe(x, weights, ids))
    # routed_scaling_factor scales the router weights
    scaled = hg.fused_moe(x, moe, weights, ids, routed_scaling_factor=2.5)
    ref = reference_fused_moe(x.double(), w13, w2, 2.5 * weights.double(), ids)
    assert rel(scaled, ref) < 2e-2 and rel(scaled, 2.5 * base.double()) < 1e-2
    # output= receives the result
    out = torch.full((m, H), float("nan"), dtype=torch.bfloat16)
    assert hg.fused_moe(x, moe, weights, ids, output=out) is out and torch.equal(out, base)
    # expert parallelism: global ids through the map; global_num_experts = len(map)
    emap = torch.tensor([2, -1, 0, -1, 1, 3, -1, -1], dtype=torch.int32)
    gids = torch.randint(0, 8, (m, TOP_K), dtype=torch.int32)
    ep = hg.fused_moe(x, moe, weights, gids, expert_map=emap, global_num_experts=8)
    ref = reference_fused_moe(x.double(), w13, w2, weights.double(), gids, expert_map=emap)
    assert rel(ep, ref) < 2e-2
    with pytest.raises(ValueError, match=r"global_num_experts=4; allowed: -1 or 8"):
        hg.fused_moe(x, moe, weights, gids, expert_map=emap, global_num_experts=4)
    with pytest.raises(ValueError, match=r"global_num_experts=8; allowed: -1 or 4"):
        hg.fused_moe(x, moe, weights, ids, global_num_experts=8)
    # router weight on the input: x * w before GEMM1, top_k 1 only
    w1, ids1 = routing(m, top_k=1)
    on_input = hg.fused_moe(x, moe, w1, ids1, apply_router_weight_on_input=True)
    x_scaled = (x * w1.to(torch.bfloat16)).double()
    ref = reference_fused_moe(x_scaled, w13, w2, torch.ones_like(w1, dtype=torch.float64), ids1)
    assert rel(on_input, ref) < 2e-2
    assert rel(on_input, reference_fused_moe(x.double(), w13, w2, w1.double(), ids1)) > 1e-2  # they differ
    with pytest.raises(ValueError, match="apply_router_weight_on_input=True needs top_k == 1"):
        hg.fused_moe(x, moe, weights, ids, apply_router_weight_on_input=True)
    with pytest.raises(TypeError, match="layer must be a humming_gen.QuantMoE"):
        hg.fused_moe(x, object(), weights, ids)


def test_moe_gemm_on_caller_routing_writes_only_routed_rows(built):
    """Both GEMMs on vLLM-style routing (buffers sized numel + E (block_m - 1), garbage past the total) equal the
    layer's own forward; skipped rows stay untouched."""
    moe, w13, w2 = built
    m = 30
    x = torch.randn(m, H, dtype=torch.bfloat16)
    weights, ids = routing(m)
    ids[0, 1] = -1
    bm = moe.block_m(m, TOP_K)
    r = hg.moe_align(ids, E, bm)
    size = ids.numel() + E * (bm - 1)  # vLLM's max_num_tokens_padded
    sorted_ids = torch.full((size,), 12345, dtype=torch.int32)
    expert_ids = torch.full((-(-size // bm),), 77, dtype=torch.int32)
    total = int(r.num_tokens_post_pad)
    sorted_ids[:total] = r.sorted_ids[:total]
    expert_ids[:total // bm] = r.expert_ids[:total // bm]
    h = torch.full((m * TOP_K, 2 * I), float("nan"), dtype=torch.bfloat16)
    assert hg.moe_gemm(x, moe, "w13", sorted_ids, expert_ids, r.num_tokens_post_pad, top_k=TOP_K, block_m=bm,
                       out=h) is h
    assert torch.isnan(h[1]).all() and torch.isfinite(h[torch.arange(m * TOP_K) != 1]).all()
    act = torch.nn.functional.silu(h[:, :I].float()) * h[:, I:].float()
    y = hg.moe_gemm(act.to(torch.bfloat16), moe, "w2", sorted_ids, expert_ids, r.num_tokens_post_pad, top_k=1,
                    block_m=bm, topk_weights=weights.reshape(-1))
    y[1] = 0
    assert torch.equal(y.view(m, TOP_K, H).sum(1, dtype=torch.float32).to(torch.bfloat16), moe(x, weights, ids))


def test_moe_gemm_refusals(built):
    moe, _, _ = built
    x = torch.randn(4, H, dtype=torch.bfloat16)
    _, ids = routing(4)
    bm = moe.block_m(4, TOP_K)
    r = hg.moe_align(ids, E, bm)
    args = (r.sorted_ids, r.expert_ids, r.num_tokens_post_pad)
    for layout in ("grouped_contiguous", "grouped_masked"):
        with pytest.raises(ValueError, match=f"call humming_gen.grouped_moe_gemm.*layout='{layout}'"):
            hg.moe_gemm(x, moe, "w13", *args, top_k=TOP_K, block_m=bm, layout=layout)
    counts = torch.zeros(E, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"a must be \(E=.*grouped_masked"):
        hg.grouped_moe_gemm(x, moe, "w13", counts, layout="grouped_masked")
    with pytest.raises(ValueError, match=rf"expert_layout must be a contiguous int32 tensor of shape \({E + 1},\)"):
        hg.grouped_moe_gemm(x, moe, "w13", counts, layout="grouped_contiguous")
    with pytest.raises(ValueError, match="allowed: 'grouped_masked', 'grouped_contiguous'"):
        hg.grouped_moe_gemm(x, moe, "w13", counts, layout="indexed")
    with pytest.raises(ValueError, match="layout='scatter'; allowed"):
        hg.moe_gemm(x, moe, "w13", *args, top_k=TOP_K, block_m=bm, layout="scatter")
    with pytest.raises(ValueError, match="weight='w1'; allowed"):
        hg.moe_gemm(x, moe, "w1", *args, top_k=TOP_K, block_m=bm)
    with pytest.raises(ValueError, match=r"block_m=3: this layer's kernels tile \[8, 16, 64, 128\]"):
        hg.moe_gemm(x, moe, "w13", *args, top_k=TOP_K, block_m=3)
    with pytest.raises(ValueError, match="sorted_ids has 1 entries; routing 8 assignments to 4 experts"):
        hg.moe_gemm(x, moe, "w13", r.sorted_ids[:1], r.expert_ids, r.num_tokens_post_pad, top_k=TOP_K, block_m=bm)
    with pytest.raises(ValueError, match="sorted_ids must be a contiguous 1-D int32"):
        hg.moe_gemm(x, moe, "w13", r.sorted_ids.long(), r.expert_ids, r.num_tokens_post_pad, top_k=TOP_K,
                    block_m=bm)
    with pytest.raises(ValueError, match="does not multiply by router weights"):
        hg.moe_gemm(x, moe, "w13", *args, top_k=TOP_K, block_m=bm, topk_weights=torch.ones(8))
    with pytest.raises(ValueError, match=r"a must be \(rows, 128\)"):
        hg.moe_gemm(x, moe, "w2", *args, top_k=TOP_K, block_m=bm)


def test_fused_layer_refuses_the_gate_up_gemm_alone(fused):
    """Its w13 rows are in tile order and its GEMM1 writes act(gate, up): refused even for no rows, and traced."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    moe, _, _ = fused
    x = torch.randn(4, H, dtype=torch.bfloat16)
    _, ids = routing(4)
    bm = moe.block_m(4, TOP_K)
    r = hg.moe_align(ids, E, bm)
    args = (r.sorted_ids, r.expert_ids, r.num_tokens_post_pad)
    for rows in (x, x[:0]):
        with pytest.raises(ValueError, match="build the layer with fused_activation=False"):
            hg.moe_gemm(rows, moe, "w13", *args, top_k=TOP_K, block_m=bm)
    with FakeTensorMode(), pytest.raises(ValueError, match="build the layer with fused_activation=False"):
        torch.ops.humming_gen.moe_gemm(torch.empty(4, H, dtype=torch.bfloat16),
                                       torch.empty(4 * TOP_K, 2 * I, dtype=torch.bfloat16), moe._op_id, "w13",
                                       *(torch.empty(t.shape, dtype=torch.int32) for t in args), TOP_K, bm, None)
    for layout, layout_rows in (("grouped_masked", torch.zeros(E, dtype=torch.int32)),
                                ("grouped_contiguous", torch.zeros(E + 1, dtype=torch.int32))):
        a = x.new_zeros((E, 0, H) if layout == "grouped_masked" else (0, H))
        with pytest.raises(ValueError, match="build the layer with fused_activation=False"):
            hg.grouped_moe_gemm(a, moe, "w13", layout_rows, layout=layout)


def test_dropped_layer_id_is_refused():
    import gc

    moe, _, _ = make_layer(seed=3)
    layer_id = moe._op_id
    del moe
    gc.collect()
    with pytest.raises(ValueError, match=f"layer_id {layer_id} names no live QuantMoE"):
        torch.ops.humming_gen.fused_moe(torch.empty(1, H, dtype=torch.bfloat16), layer_id, torch.ones(1, 1),
                                        torch.zeros(1, 1, dtype=torch.int32), None)

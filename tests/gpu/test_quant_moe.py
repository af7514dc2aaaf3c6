"""QuantMoE and its indexed GEMMs on the GPU against float64 references from the dequantized experts.

Outputs are poisoned (NaN) before launch where the test owns them: a GEMM must write exactly the routed assignment
rows. Tolerances are relative Frobenius errors: bf16 activations, and QuantMoE rounds GEMM1's output and the
gated activation to bf16 / fp16 before GEMM2, as every bf16 MoE does.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import local_experts, reference_fused_moe, routed_rows_gemm

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 8e-3}
SCHEMES = {
    "int4-g128": dict(weight="int4", group_size=128),
    "uint4-g64-zp": dict(weight="uint4", group_size=64, zero_point="int"),
    "int8-channel": dict(weight="int8"),
    "mxfp4": dict(weight="float4e2m1", group_size=32, scale_dtype="float8e8m0"),
    "fp8-channel": dict(weight="float8e4m3", scale_dtype="float32"),
}
# (id, scheme, dtype, experts, hidden, intermediate, top_k, activation, gate_up_layout, biases)
CASES = [
    ("int4-e8-silu", "int4-g128", torch.bfloat16, 8, 512, 256, 2, "silu_mul", "split", False),
    ("uint4zp-e16-gelu-upfirst-bias", "uint4-g64-zp", torch.bfloat16, 16, 256, 384, 4, "gelu_mul", "up_first", True),
    ("int8-e4-silu-fp16", "int8-channel", torch.float16, 4, 512, 128, 1, "silu_mul", "split", True),
    ("mxfp4-e32-swiglu-interleaved-bias", "mxfp4", torch.bfloat16, 32, 256, 256, 4, "swiglu_oai", "interleaved", True),
    ("fp8-e64-silu", "fp8-channel", torch.bfloat16, 64, 384, 128, 8, "silu_mul", "split", False),
]


def quantized_experts(scheme: str, dtype: torch.dtype, e: int, h: int, i: int, biases: bool, seed: int):
    """Random experts of SCHEMES[scheme], quantized: w13 (E, 2I, H), w2 (E, H, I), and their biases or None."""
    torch.manual_seed(seed)
    s = hg.QuantScheme(**SCHEMES[scheme])
    q13 = s.quantize(torch.randn(e, 2 * i, h, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(e, h, i, device="cuda") * 0.05)
    b13 = (torch.randn(e, 2 * i, device="cuda") * 0.1).to(dtype) if biases else None
    b2 = (torch.randn(e, h, device="cuda") * 0.1).to(dtype) if biases else None
    return q13, q2, b13, b2


def _layer(case, seed=0, fused=None):
    cid, scheme, dtype, e, h, i, top_k, act, layout, biases = case
    q13, q2, b13, b2 = quantized_experts(scheme, dtype, e, h, i, biases, seed)
    moe = hg.QuantMoE.from_quantized(q13, q2, activation=act, gate_up_layout=layout, bias13=b13, bias2=b2,
                                     dtype=dtype, fused_activation=fused)
    return moe, q13, q2, b13, b2


def _routing(m, e, top_k, drop=0.0):
    logits = torch.randn(m, e, device="cuda")
    weights, ids = torch.topk(torch.softmax(logits, -1), top_k, dim=-1)
    if drop:
        ids = torch.where(torch.rand(m, top_k, device="cuda") < drop, torch.full_like(ids, -1), ids)
    return weights, ids.to(torch.int32)


def capture_without_sync(moe, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor):
    """Warm up (kernels load, moe_align and any quantize kernels compile), run forward once more under
    torch.cuda.set_sync_debug_mode("error") (no host synchronisation), then capture forward in a CUDA graph on a
    side stream. Returns (graph, out): replaying the graph rewrites out from the tensors' current contents."""
    moe(x, weights, ids)
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
    return graph, out


def _rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("fused", [False, True], ids=["torch-activation", "fused-activation"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_quant_moe_matches_reference(case, fused):
    moe, q13, q2, b13, b2 = _layer(case, fused=fused)
    dtype, top_k = case[2], case[6]
    w13, w2 = q13.dequantize().double(), q2.dequantize().double()
    errors = {}
    for m in (1, 7, 64, 300):
        x = (torch.randn(m, moe.hidden, device="cuda")).to(dtype)
        weights, ids = _routing(m, moe.num_experts, top_k, drop=0.1 if m > 1 else 0.0)
        out = moe(x, weights, ids)
        ref = reference_fused_moe(x.double(), w13, w2, weights.double(), ids, activation=moe.activation,
                                  gate_up_layout=moe.gate_up_layout, bias13=None if b13 is None else b13.double(),
                                  bias2=None if b2 is None else b2.double())
        assert out.shape == (m, moe.hidden) and torch.isfinite(out).all(), f"m={m}: non-finite output"
        errors[m] = _rel(out, ref)
    bad = {m: err for m, err in errors.items() if not err < TOLERANCE[dtype]}
    assert not bad, f"{case[0]}: relative error above {TOLERANCE[dtype]} at {bad} (all {errors})"


@pytest.mark.parametrize("case", CASES[:2], ids=[c[0] for c in CASES[:2]])
def test_indexed_gemm_writes_exactly_the_routed_rows(case):
    """GEMM1 alone, into a NaN-poisoned output: every routed assignment row i holds x[i // top_k] @ W_e^T (+ b_e)
    of its expert e; rows of dropped assignments stay untouched."""
    moe, q13, _, b13, _ = _layer(case, seed=3, fused=False)  # a fused GEMM1 writes act(gate, up)
    dtype, top_k = case[2], case[6]
    m = 333
    x = torch.randn(m, moe.hidden, device="cuda").to(dtype)
    _, ids = _routing(m, moe.num_experts, top_k, drop=0.2)
    gemm1 = moe._launchers[moe.bucket_for(m, top_k)][0]
    routing = hg.moe_align(ids, moe.num_experts, gemm1.kernel.plan.tuning.block_m)
    h = torch.full((m * top_k, 2 * moe.intermediate), float("nan"), dtype=dtype, device="cuda")
    gemm1.moe(x, h, routing, top_k)
    expert = local_experts(ids, moe.num_experts).reshape(-1)
    routed = expert >= 0
    ref = routed_rows_gemm(x[torch.arange(m * top_k, device="cuda") // top_k][routed], q13.dequantize(),
                           expert[routed], b13)
    assert torch.isfinite(h[routed]).all(), "a routed row was not written"
    assert torch.isnan(h[~routed]).all(), "a dropped assignment's row was written"
    assert _rel(h[routed], ref) < TOLERANCE[dtype]


def test_expert_map_and_all_dropped_tokens():
    """Expert parallelism: ids are global, expert_map sends other ranks' experts to -1; a token whose slots are all
    elsewhere gets a zero row."""
    case = CASES[0]
    moe, q13, q2, _, _ = _layer(case, seed=5)
    e = moe.num_experts
    global_experts = 2 * e
    expert_map = torch.full((global_experts,), -1, dtype=torch.int32, device="cuda")
    expert_map[e:] = torch.arange(e, dtype=torch.int32, device="cuda")  # this rank holds the upper half
    m, top_k = 50, 2
    x = torch.randn(m, moe.hidden, device="cuda").bfloat16()
    weights = torch.rand(m, top_k, device="cuda")
    ids = torch.randint(0, global_experts, (m, top_k), device="cuda", dtype=torch.int32)
    ids[0] = torch.tensor([0, 1], device="cuda")  # both slots on another rank
    out = moe(x, weights, ids, expert_map=expert_map)
    ref = reference_fused_moe(x.double(), q13.dequantize().double(), q2.dequantize().double(), weights.double(), ids,
                              expert_map=expert_map)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert _rel(out, ref) < TOLERANCE[torch.bfloat16]


def test_cuda_graph_replay_with_new_routing_and_no_host_sync():
    case = CASES[0]
    moe, q13, q2, _, _ = _layer(case, seed=7)
    m, top_k = 40, case[6]
    x = torch.randn(m, moe.hidden, device="cuda").bfloat16()
    weights, ids = _routing(m, moe.num_experts, top_k)
    graph, out = capture_without_sync(moe, x, weights, ids)
    new_weights, new_ids = _routing(m, moe.num_experts, top_k)
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    graph.replay()
    torch.cuda.synchronize()
    ref = reference_fused_moe(x.double(), q13.dequantize().double(), q2.dequantize().double(), weights.double(), ids)
    assert _rel(out, ref) < TOLERANCE[torch.bfloat16]


def _grouped_launcher(q, gemm, dtype=torch.bfloat16, bias=None, rows=64):
    """A grouped MoE kernel of the standard pipeline for `q` (E, N, K), with its stacked weights bound."""
    import attrs

    from humming_gen.codegen import compose
    from humming_gen.config import ComputeConfig, LayerConfig
    from humming_gen.heuristics import choose_tunings
    from humming_gen.kernel import build_many
    from humming_gen.layer.moe import prepare_moe_weight

    layer = LayerConfig(n=q.n, k=q.k, scheme=q.scheme, num_experts=q.num_experts, has_bias=bias is not None,
                        dtype="bfloat16" if dtype == torch.bfloat16 else "float16")
    target = hg.Target.current()
    tuning = attrs.evolve(choose_tunings(layer, target, pipeline="standard").for_m(rows), split_k=1)
    plan = compose(layer, ComputeConfig(gemm=gemm), tuning, target)
    kernel = build_many([plan])[0]
    weight = prepare_moe_weight(plan, q, "cuda")
    return kernel.bind(weight, bias, torch.device("cuda"), None)


@pytest.mark.parametrize("rows", [5, 64, 200])
def test_grouped_masked_rows_per_expert(rows):
    """DeepEP low-latency layout: a (E, max_m, K), counts (E,); rows past an expert's count stay untouched."""
    torch.manual_seed(rows)
    e, n, k, max_m = 8, 512, 1024, 256
    q = hg.QuantScheme("uint4", group_size=128, zero_point="int").quantize(torch.randn(e, n, k, device="cuda") * 0.05)
    bias = (torch.randn(e, n, device="cuda") * 0.1).bfloat16()
    launcher = _grouped_launcher(q, "grouped_masked", bias=bias, rows=rows)
    a = torch.randn(e, max_m, k, device="cuda").bfloat16()
    counts = torch.randint(0, rows + 1, (e,), device="cuda", dtype=torch.int32)
    counts[0], counts[1] = 0, max_m if rows == 200 else rows  # an idle expert and a full one
    out = torch.full((e, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    launcher.grouped(a.view(e * max_m, k), out.view(e * max_m, n), counts)
    w = q.dequantize().double()
    for j in range(e):
        c = int(counts[j])
        ref = a[j, :c].double() @ w[j].T + bias[j].double()
        assert torch.isnan(out[j, c:]).all(), f"expert {j}: rows past its count were written"
        if c:
            assert torch.isfinite(out[j, :c]).all()
            assert _rel(out[j, :c], ref) < TOLERANCE[torch.bfloat16], f"expert {j}"


def test_grouped_contiguous_segments():
    """Rows already permuted into per-expert segments of any length (empty ones too)."""
    torch.manual_seed(9)
    e, n, k = 16, 256, 512
    q = hg.QuantScheme("int4", group_size=128).quantize(torch.randn(e, n, k, device="cuda") * 0.05)
    counts = torch.randint(0, 40, (e,))
    counts[3] = 0
    offsets = torch.zeros(e + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(counts, 0)
    m = int(offsets[-1])
    launcher = _grouped_launcher(q, "grouped_contiguous", rows=m)
    a = torch.randn(m, k, device="cuda").bfloat16()
    out = torch.full((m + 7, n), float("nan"), dtype=torch.bfloat16, device="cuda")  # rows past m stay untouched
    launcher.grouped(a, out[:m], offsets.cuda())
    w = q.dequantize().double()
    ref = torch.cat([a[offsets[j]:offsets[j + 1]].double() @ w[j].T for j in range(e)])
    assert torch.isfinite(out[:m]).all() and torch.isnan(out[m:]).all()
    assert _rel(out[:m], ref) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("activation, layout", [("silu_mul", "split"), ("gelu_mul", "up_first"),
                                                ("swiglu_oai", "interleaved")])
def test_fused_gated_epilogue(activation, layout):
    """GEMM1 with the gated activation in its epilogue: w13 rows put in tile order (gate and up of a feature 8 rows
    apart), output (M * top_k, I) poisoned; routed rows match act(x @ w13_e^T + b13_e) in float64, others stay NaN."""
    import attrs

    from humming_gen.codegen import compose
    from humming_gen.config import ComputeConfig, LayerConfig
    from humming_gen.heuristics import choose_tunings
    from humming_gen.kernel import build_many
    from humming_gen.layer.gate_up import gate_up_tile_order, permute_rows
    from humming_gen.layer.moe import prepare_moe_weight
    from humming_gen.reference.moe import gated_activation

    torch.manual_seed(21)
    e, i, h, top_k, m = 8, 256, 512, 2, 150
    q13 = hg.QuantScheme("int4", group_size=128).quantize(torch.randn(e, 2 * i, h, device="cuda") * 0.05)
    b13 = (torch.randn(e, 2 * i, device="cuda") * 0.5).bfloat16()
    order = gate_up_tile_order(i, layout).cuda()
    layer = LayerConfig(n=2 * i, k=h, scheme=q13.scheme, num_experts=e, has_bias=True)
    target = hg.Target.current()
    tuning = attrs.evolve(choose_tunings(layer, target, pipeline="standard").for_m(m * top_k // e), split_k=1)
    plan = compose(layer, ComputeConfig(gemm="indexed", epilogue_activation=activation), tuning, target)
    launcher = build_many([plan])[0].bind(prepare_moe_weight(plan, permute_rows(q13, order), "cuda"),
                                          b13[:, order].contiguous(), torch.device("cuda"), None)
    x = torch.randn(m, h, device="cuda").bfloat16() * 4  # large enough for swiglu's clamps to act
    _, ids = _routing(m, e, top_k, drop=0.2)
    routing = hg.moe_align(ids, e, tuning.block_m)
    out = torch.full((m * top_k, i), float("nan"), dtype=torch.bfloat16, device="cuda")
    launcher.moe(x, out, routing, top_k)
    expert = local_experts(ids, e).reshape(-1)
    routed = expert >= 0
    rows = (torch.arange(m * top_k, device="cuda") // top_k)[routed]
    ref = gated_activation(routed_rows_gemm(x[rows], q13.dequantize(), expert[routed], b13), activation, layout)
    assert torch.isfinite(out[routed]).all() and torch.isnan(out[~routed]).all()
    assert _rel(out[routed], ref) < TOLERANCE[torch.bfloat16]


def test_grouped_moe_gemm_through_the_layer():
    """humming_gen.grouped_moe_gemm on a QuantMoE's own weights: masked (E, max_m, K) with counts for w13, contiguous
    segments for w2, each against the float64 per-expert product (+ bias)."""
    case = CASES[1]
    moe, q13, q2, b13, b2 = _layer(case, seed=13, fused=False)  # a fused layer has no w13 GEMM alone
    e, dtype = moe.num_experts, case[2]
    max_m = 24
    counts = torch.randint(0, max_m + 1, (e,), device="cuda", dtype=torch.int32)
    counts[2] = 0
    a = torch.randn(e, max_m, moe.hidden, device="cuda").to(dtype)
    out = hg.grouped_moe_gemm(a, moe, "w13", counts, layout="grouped_masked")
    w13, w2 = q13.dequantize().double(), q2.dequantize().double()
    for j in range(e):
        c = int(counts[j])
        if c:
            ref = a[j, :c].double() @ w13[j].T + b13[j].double()
            assert _rel(out[j, :c], ref) < TOLERANCE[dtype], f"masked expert {j}"
    offsets = torch.zeros(e + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(counts.cpu(), 0)
    rows = int(offsets[-1])
    a2 = torch.randn(rows, moe.intermediate, device="cuda").to(dtype)
    out2 = hg.grouped_moe_gemm(a2, moe, "w2", offsets.cuda(), layout="grouped_contiguous")
    ref2 = torch.cat([a2[offsets[j]:offsets[j + 1]].double() @ w2[j].T + b2[j].double() for j in range(e)])
    assert _rel(out2, ref2) < TOLERANCE[dtype]


def test_tensor_parallel_shards_sum_to_the_layer():
    """Two QuantMoE shards (humming_gen.shard_moe) on one GPU: their outputs summed (the all-reduce of tensor
    parallelism) match the unsharded layer."""
    case = CASES[3]  # mxfp4, swiglu, interleaved gate/up, biases
    moe, q13, q2, b13, b2 = _layer(case, seed=17)
    m, top_k = 37, case[6]
    x = torch.randn(m, moe.hidden, device="cuda").bfloat16()
    weights, ids = _routing(m, moe.num_experts, top_k)
    total = torch.zeros(m, moe.hidden, dtype=torch.float64, device="cuda")
    for rank in range(2):
        s = hg.shard_moe(q13, q2, rank, 2, gate_up_layout=moe.gate_up_layout, bias13=b13, bias2=b2)
        part = hg.QuantMoE.from_quantized(s.q13, s.q2, activation=moe.activation, gate_up_layout=moe.gate_up_layout,
                                          bias13=s.bias13, bias2=s.bias2)
        total += part(x, weights, ids).double()
    ref = reference_fused_moe(x.double(), q13.dequantize().double(), q2.dequantize().double(), weights.double(), ids,
                              activation=moe.activation, gate_up_layout=moe.gate_up_layout, bias13=b13.double(),
                              bias2=b2.double())
    assert _rel(total, ref) < TOLERANCE[torch.bfloat16]
    assert _rel(moe(x, weights, ids), ref) < TOLERANCE[torch.bfloat16]

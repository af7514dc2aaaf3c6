"""QuantMoE's grouped down GEMM (down_gemm="grouped_contiguous") on the GPU: GEMM1's rows copied into per-expert
windows (humming_gen.moe.compact), the grouped kernel on dense windows, and the router weight applied by the weighted
top-k reduction (humming_gen.moe.reduce.weighted_topk_reduce).

- each step bit for bit against its torch reference (compact_rows_reference, weighted_topk_sum_reference), into
  poisoned outputs: the compaction writes exactly the windows, the reduction reads no skipped slot's row;
- the whole layer against the float64 reference MoE for 16-bit and 8-bit schemes, every bucket forced grouped (the
  standard pipeline's grouped kernels in the small ones, the warp-specialized ones above), beside the indexed
  layer on the same weights; -1 ids, expert_map, tokens with every slot dropped, one expert, top_k = E;
- the default (down_gemm=None) takes the grouped path where humming_gen.heuristics.moe_down_gemms says;
- batch invariance within a bucket, and a CUDA graph replayed with new routing without a host sync.
Tolerances are those of the indexed layer's tests (test_quant_moe.py, test_quant_moe_a8.py).
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.moe import moe_align
from humming_gen.moe.compact import compact_offsets, compact_rows, compact_rows_reference
from humming_gen.moe.reduce import weighted_topk_reduce
from humming_gen.reference.moe import reference_fused_moe, weighted_topk_sum_reference
from humming_gen.targets import Target
from moe_cases import expert_map, random_ids
from test_quant_moe import _rel, _routing, capture_without_sync
from test_quant_moe_a8 import LAYER_TOLERANCE
from test_quant_moe_a8_ws import PER_TENSOR_LAYER_TOLERANCE, SMALL_M_LAYER_TOLERANCE

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 8e-3}
GROUPED = "grouped_contiguous"


# --- the steps, bit for bit ------------------------------------------------------------------------------------
@pytest.mark.parametrize("m, top_k, e, block_m, width", [(1, 1, 1, 8, 8), (7, 2, 3, 16, 264), (300, 8, 64, 64, 256),
                                                         (4096, 8, 256, 128, 256), (1000, 4, 19, 128, 2880)])
@pytest.mark.parametrize("mapped", [False, True], ids=["ids", "expert-map"])
def test_compact_rows_fill_exactly_the_windows(m, top_k, e, block_m, width, mapped):
    seed = m + 7 * e + block_m
    table = expert_map(2 * e, e, 1, seed=seed).cuda() if mapped else None
    ids = random_ids(m, top_k, 2 * e if mapped else e, seed, dropped=0.1, dtype=torch.int32).cuda()
    routing = moe_align(ids, e, block_m, table)
    src = torch.randn(m * top_k, width, device="cuda").bfloat16()
    offsets = compact_offsets(routing.expert_counts)
    assert offsets[0].item() == 0 and torch.equal(offsets[1:].cpu(), routing.expert_counts.cpu().cumsum(0).int())
    got = torch.full_like(src, float("nan"))
    rows = compact_rows(src, routing, block_m, offsets, got, Target.current())
    want = torch.full_like(src, float("nan"))
    want_rows = compact_rows_reference(src, routing.inverse, routing.expert_ids, routing.expert_offsets, offsets,
                                       block_m, want)
    assert torch.equal(rows, want_rows)
    used = offsets[-1].item()
    assert torch.equal(got[:used].view(torch.int16), want[:used].view(torch.int16))
    assert torch.isnan(got[used:].float()).all(), "rows past the windows must stay unwritten"
    kept = routing.inverse >= 0
    assert torch.equal(rows[kept].sort().values.cpu(), torch.arange(used, dtype=torch.int32)), "one row each"
    assert (rows[~kept] == -1).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m, top_k, h", [(1, 1, 8), (7, 2, 2880), (300, 9, 264), (4096, 8, 7168)])
def test_weighted_reduce_bitwise_and_skips_rows(m, top_k, h, dtype):
    g = torch.Generator(device="cuda").manual_seed(m + h)
    rows_total = m * top_k
    scale = torch.exp2(torch.randint(-10, 10, (rows_total, 1), generator=g, device="cuda").float())
    y = (torch.randn(rows_total, h, generator=g, device="cuda") * scale).to(dtype)
    rows = torch.randperm(rows_total, generator=g, device="cuda").int()
    dropped = torch.rand(rows_total, generator=g, device="cuda") < 0.15
    y[rows[dropped].long()] = float("nan")  # a skipped slot's row must not be read
    rows = torch.where(dropped, torch.full_like(rows, -1), rows)
    weights = torch.rand(rows_total, generator=g, device="cuda")
    out = torch.full((m, h), float("nan"), dtype=dtype, device="cuda")
    assert weighted_topk_reduce(y, rows, weights, top_k, out) is out
    want = weighted_topk_sum_reference(y, rows, weights, top_k, dtype)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.isfinite(out).all()


# --- the whole layer -------------------------------------------------------------------------------------------
# (id, preset or weight kwargs, dtype, E, H, I, top_k, activation, gate_up_layout, biases)
CASES = [
    ("int4-e8-top2-silu-split", dict(weight="int4", group_size=128), torch.bfloat16, 8, 512, 256, 2, "silu_mul",
     "split", False),
    ("mxfp4-e64-top8-swiglu-interleaved-bias", dict(weight="float4e2m1", group_size=32, scale_dtype="float8e8m0"),
     torch.bfloat16, 64, 512, 256, 8, "swiglu_oai", "interleaved", True),
    ("int8-e8-top2-gelu-upfirst-bias-fp16", dict(weight="int8"), torch.float16, 8, 384, 384, 2, "gelu_mul",
     "up_first", True),
    ("w4a8-mxfp4-fp8-e16-top4", "w4a8-mxfp4-fp8", torch.bfloat16, 16, 512, 256, 4, "silu_mul", "split", False),
    ("w8a8-fp8-block128-e16-top4", "w8a8-fp8-block128", torch.bfloat16, 16, 512, 256, 4, "silu_mul", "split", False),
    ("w8a8-fp8-tensor-e16-top4", "w8a8-fp8-tensor", torch.bfloat16, 16, 512, 256, 4, "silu_mul", "split", False),
]
# rows per expert M * top_k / E from below one to several hundred: every bucket of each layer
MS = (1, 7, 100, 300, 4096)


def _weights(case, seed=0):
    _, scheme, dtype, e, h, i, _, _, _, biases = case
    torch.manual_seed(seed)
    s = hg.scheme(scheme) if isinstance(scheme, str) else hg.QuantScheme(**scheme)
    q13 = s.quantize(torch.randn(e, 2 * i, h, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(e, h, i, device="cuda") * 0.05)
    b13 = (torch.randn(e, 2 * i, device="cuda") * 0.1).to(dtype) if biases else None
    b2 = (torch.randn(e, h, device="cuda") * 0.1).to(dtype) if biases else None
    return q13, q2, b13, b2


def _layer(case, weights, down_gemm):
    q13, q2, b13, b2 = weights
    return hg.QuantMoE.from_quantized(q13, q2, activation=case[7], gate_up_layout=case[8], bias13=b13, bias2=b2,
                                      dtype=case[2], down_gemm=down_gemm)


def _reference(moe, weights, x, topk_weights, ids, table=None):
    q13, q2, b13, b2 = weights
    return reference_fused_moe(x.double(), q13.dequantize().double(), q2.dequantize().double(),
                               topk_weights.double(), ids, activation=moe.activation,
                               gate_up_layout=moe.gate_up_layout, expert_map=table,
                               bias13=None if b13 is None else b13.double(),
                               bias2=None if b2 is None else b2.double(), intermediate_dtype=moe.dtype,
                               fused_activation=moe.fused_activation, activation_scheme=moe.activation_schemes[1])


def _tolerance(moe, m):
    act = moe.activation_schemes[0]
    if act is None:
        return TOLERANCE[moe.dtype]
    if act.granularity == "tensor":
        return PER_TENSOR_LAYER_TOLERANCE
    return SMALL_M_LAYER_TOLERANCE if m < 128 else LAYER_TOLERANCE[act.dtype.name]


def _run(moe, x, topk_weights, ids, table=None):
    out = torch.full((x.shape[0], moe.hidden), float("nan"), dtype=moe.dtype, device="cuda")
    assert hg.fused_moe(x, moe, topk_weights, ids, expert_map=table, output=out) is out
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_grouped_down_matches_reference_and_the_indexed_layer(case):
    weights = _weights(case)
    grouped, indexed = _layer(case, weights, GROUPED), _layer(case, weights, "indexed")
    assert set(grouped.down_gemms) == {GROUPED} and set(indexed.down_gemms) == {"indexed"}
    top_k, errors = case[6], {}
    for m in MS:
        x = torch.randn(m, grouped.hidden, device="cuda").to(case[2])
        topk_weights, ids = _routing(m, grouped.num_experts, top_k, drop=0.1 if m > 1 else 0.0)
        ref = _reference(grouped, weights, x, topk_weights, ids)
        got, other = _run(grouped, x, topk_weights, ids), _run(indexed, x, topk_weights, ids)
        assert torch.isfinite(got).all(), f"M={m}: rows left unwritten or non-finite"
        tol = _tolerance(grouped, m)
        errors[m] = (_rel(got, ref), _rel(other, ref))
        assert errors[m][0] < tol, f"M={m}: grouped {errors[m][0]:.3g} (indexed {errors[m][1]:.3g}), bound {tol}"
        assert errors[m][1] < tol, f"M={m}: indexed {errors[m][1]:.3g}, bound {tol}"
        # the two paths differ only in where the router weight is rounded (and A8 schemes' rows in quantization ties)
        assert _rel(got, other) < tol, f"M={m}: grouped vs indexed {_rel(got, other):.3g}, bound {tol}"
    for bucket in {grouped.bucket_for(m, top_k) for m in MS}:  # each bucket's grouped kernel on its pipeline
        assert grouped._grouped_down[bucket].kernel.plan.pipeline == \
            grouped._launchers[bucket][1].kernel.plan.pipeline


@pytest.mark.parametrize("m", [7, 1000])
def test_grouped_forward_is_its_steps_bits(m):
    """Forward against its steps run by hand into fresh buffers: GEMM1, the compaction's torch reference, the grouped
    GEMM into NaN rows, the weighted sum's torch reference: the same bits (no step depends on another's leftovers)."""
    case = CASES[0]
    moe = _layer(case, _weights(case, seed=m), GROUPED)
    assert moe.fused_activation, "GEMM1 must write the activated rows that the steps below compact"
    top_k = case[6]
    x = torch.randn(m, moe.hidden, device="cuda").bfloat16()
    topk_weights, ids = _routing(m, moe.num_experts, top_k, drop=0.1)
    got = moe(x, topk_weights, ids)
    bucket = moe.bucket_for(m, top_k)
    gemm1, block_m = moe._launchers[bucket][0], moe.block_ms[bucket]
    routing = moe_align(ids, moe.num_experts, block_m)
    act = torch.empty(m * top_k, moe.intermediate, dtype=torch.bfloat16, device="cuda")
    gemm1.moe(x, act, routing, top_k)
    offsets = compact_offsets(routing.expert_counts)
    windows = torch.full_like(act, float("nan"))
    rows = compact_rows_reference(act, routing.inverse, routing.expert_ids, routing.expert_offsets, offsets, block_m,
                                  windows)
    y = torch.full((m * top_k, moe.hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    moe._grouped_down[bucket].grouped(windows, y, offsets)
    want = weighted_topk_sum_reference(y, rows, topk_weights.float().reshape(-1), top_k, torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_default_takes_the_grouped_down_gemm_where_the_heuristics_say():
    """H = 2 I: the open-ended warp-specialized bucket only; H = 8 I: every warp-specialized bucket; an atomic
    top-k reduction: none. The wide layer runs its grouped buckets correctly too."""
    case = CASES[0]
    moe = _layer(case, _weights(case), None)
    ws = [g2.kernel.plan.pipeline == "warp_specialized" for _, g2 in moe._launchers]
    assert moe.down_gemms == tuple(GROUPED if w and i == len(ws) - 1 else "indexed" for i, w in enumerate(ws))
    wide_case = case[:4] + (1024, 128) + case[6:]
    weights = _weights(wide_case, seed=1)
    wide = _layer(wide_case, weights, None)
    ws = [g2.kernel.plan.pipeline == "warp_specialized" for _, g2 in wide._launchers]
    assert sum(ws) >= 2 and wide.down_gemms == tuple(GROUPED if w else "indexed" for w in ws)
    for m in (200, 1000):  # 50 and 250 rows per expert: both warp-specialized buckets
        x = torch.randn(m, wide.hidden, device="cuda").bfloat16()
        topk_weights, ids = _routing(m, wide.num_experts, case[6], drop=0.1)
        assert _rel(_run(wide, x, topk_weights, ids), _reference(wide, weights, x, topk_weights, ids)) < \
            TOLERANCE[torch.bfloat16]
    atomic = hg.QuantMoE.from_quantized(*_weights(case)[:2], topk_reduce="atomic")
    assert set(atomic.down_gemms) == {"indexed"}


def test_expert_map_dropped_tokens_one_expert_and_top_k_all():
    case = CASES[1]
    weights = _weights(case, seed=3)
    moe = _layer(case, weights, GROUPED)
    e = moe.num_experts
    # expert_map: this rank holds experts 64..127 of 128 global ones; token 0 has every slot elsewhere
    table = torch.full((2 * e,), -1, dtype=torch.int32, device="cuda")
    table[e:] = torch.arange(e, dtype=torch.int32, device="cuda")
    m = 600
    x = torch.randn(m, moe.hidden, device="cuda").bfloat16()
    topk_weights, ids = _routing(m, 2 * e, 8, drop=0.05)
    ids[0] = torch.arange(8, dtype=torch.int32, device="cuda")  # all on other ranks
    out = _run(moe, x, topk_weights, ids, table)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert _rel(out, _reference(moe, weights, x, topk_weights, ids, table)) < TOLERANCE[torch.bfloat16]
    # every token to one expert, then top_k = E on a 3-expert layer
    ids = torch.full((m, 8), 5, dtype=torch.int32, device="cuda")
    ids[:, 1:] = -1
    out = _run(moe, x, topk_weights, ids)
    assert _rel(out, _reference(moe, weights, x, topk_weights, ids)) < TOLERANCE[torch.bfloat16]
    small = (case[0], case[1], case[2], 3, 256, 128, 3) + case[7:]
    weights = _weights(small, seed=4)
    moe = _layer(small, weights, GROUPED)
    for m in (0, 1, 500):
        x = torch.randn(m, moe.hidden, device="cuda").bfloat16()
        topk_weights, ids = _routing(m, 3, 3)
        out = _run(moe, x, topk_weights, ids)
        if m:
            assert _rel(out, _reference(moe, weights, x, topk_weights, ids)) < TOLERANCE[torch.bfloat16]


def test_batch_invariance_within_the_grouped_bucket():
    case = CASES[0]
    moe = _layer(case, _weights(case, seed=5), None)
    m, top_k = 1000, case[6]  # 250 rows per expert: the open bucket, grouped
    assert moe.down_gemms[moe.bucket_for(m, top_k)] == GROUPED
    x = torch.randn(m, moe.hidden, device="cuda").bfloat16()
    topk_weights, ids = _routing(m, moe.num_experts, top_k, drop=0.1)
    full = _run(moe, x, topk_weights, ids)
    pick = torch.randperm(m, device="cuda")[:700]
    assert moe.bucket_for(700, top_k) == moe.bucket_for(m, top_k)
    part = _run(moe, x[pick], topk_weights[pick], ids[pick])
    assert torch.equal(part.view(torch.int16), full[pick].view(torch.int16))


def test_cuda_graph_replay_with_new_routing():
    case = CASES[0]
    weights = _weights(case, seed=6)
    moe = _layer(case, weights, GROUPED)
    m = 2000
    x = torch.randn(m, moe.hidden, device="cuda").bfloat16()
    topk_weights, ids = _routing(m, moe.num_experts, case[6], drop=0.1)
    graph, out = capture_without_sync(moe, x, topk_weights, ids)
    new_weights, new_ids = _routing(m, moe.num_experts, case[6], drop=0.2)
    x.copy_(torch.randn_like(x))
    topk_weights.copy_(new_weights)
    ids.copy_(new_ids)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel(out, _reference(moe, weights, x, topk_weights, ids)) < TOLERANCE[torch.bfloat16]

"""QuantMoE's grouped down GEMM (down_gemm="grouped_contiguous") on the host, without a GPU: the heuristic's choice
per bucket (humming_gen.heuristics.moe_down_gemms), argument errors, and the forward's orchestration on the CPU with
stand-in launchers (test_moe_ops.MoeStandIn for the indexed GEMM1; GroupedStandIn for the grouped down GEMM, which
computes exactly the rows of the windows expert_layout gives) beside the CPU references of moe_align, the row
compaction and the weighted top-k sum, against the float64 reference MoE, through the humming_gen::fused_moe op."""

from __future__ import annotations

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.heuristics import moe_down_gemms
from humming_gen.reference.moe import reference_fused_moe
from test_moe_ops import E, H, I, TOP_K, make_layer, rel, routing

GROUPED = "grouped_contiguous"


class GroupedStandIn:
    """Stands in for a bound grouped_contiguous launcher: out[r] = a[r] @ W[e]^T (+ b[e]) for the rows r of expert
    e's window [expert_layout[e], expert_layout[e + 1]); other rows untouched."""

    def __init__(self, kernel, w: torch.Tensor, bias: torch.Tensor | None):
        self.kernel, self.w, self.bias = kernel, w, bias
        self.calls = 0

    def grouped(self, a, out, expert_layout, a_scale=None):
        assert a_scale is None and self.kernel.plan.compute.gemm == GROUPED
        self.calls += 1
        bounds = expert_layout.tolist()
        assert bounds[0] == 0 and bounds == sorted(bounds) and bounds[-1] <= a.shape[0]
        for e in range(self.w.shape[0]):
            rows = slice(bounds[e], bounds[e + 1])
            value = a[rows].double() @ self.w[e].T
            out[rows] = (value + (self.bias[e].double() if self.bias is not None else 0)).to(out.dtype)


def grouped_layer(**kwargs):
    moe, w13, w2 = make_layer(down_gemm=GROUPED, **kwargs)
    moe._grouped_down = [GroupedStandIn(g.kernel, w2, moe.bias2) for g in moe._grouped_down]
    return moe, w13, w2


def test_forward_runs_compaction_grouped_gemm_and_weighted_sum():
    moe, w13, w2 = grouped_layer()
    assert set(moe.down_gemms) == {GROUPED} and "down_gemms=" in repr(moe)
    for m in (2, 37, 300):  # a standard bucket and the warp-specialized ones
        x = torch.randn(m, H, dtype=torch.bfloat16)
        weights, ids = routing(m, seed=m)
        ids[0] = -1  # a token with every slot dropped gives a zero row
        bucket = moe.bucket_for(m, TOP_K)
        calls = [g.calls for g in moe._grouped_down]
        out = moe(x, weights, ids)
        assert torch.equal(out[0], torch.zeros(H, dtype=torch.bfloat16))
        assert rel(out, reference_fused_moe(x.double(), w13, w2, weights.double(), ids)) < 2e-2
        # this batch's bucket ran its grouped launcher once, no other bucket's, and no indexed down GEMM
        assert [g.calls - c for g, c in zip(moe._grouped_down, calls)] == [int(b == bucket) for b in range(len(calls))]
        assert moe._launchers[bucket][1].calls == 0


def test_default_choice_per_bucket():
    narrow, _, _ = make_layer()  # H = 2 I: the open bucket only
    ws = [t.pipeline == "warp_specialized" for t in (g.kernel.plan.tuning for g, _ in narrow._launchers)]
    assert narrow.down_gemms == tuple(GROUPED if w and i == len(ws) - 1 else "indexed" for i, w in enumerate(ws))
    scheme = hg.QuantScheme("int4", group_size=128)
    q13, q2 = scheme.quantize(torch.randn(4, 128, 512) * 0.05), scheme.quantize(torch.randn(4, 512, 64) * 0.05)
    wide = hg.QuantMoE.from_quantized(q13, q2, target="sm_90a", device="cpu")  # H = 8 I
    ws = [t.pipeline == "warp_specialized" for t in (g.kernel.plan.tuning for g, _ in wide._launchers)]
    assert any(ws) and wide.down_gemms == tuple(GROUPED if w else "indexed" for w in ws)
    atomic, _, _ = make_layer(topk_reduce="atomic")
    assert set(atomic.down_gemms) == {"indexed"} and atomic._grouped_down == [None] * len(atomic.buckets)
    indexed, _, _ = make_layer(down_gemm="indexed")
    assert set(indexed.down_gemms) == {"indexed"}


def test_moe_down_gemms_requests():
    moe, _, _ = make_layer()
    plan = type("Plan", (), {"buckets": [(m, g.kernel.plan.tuning) for m, (_, g) in zip(moe.buckets,
                                                                                            moe._launchers)]})()
    layer = moe._layer_configs[1]
    n = len(moe.buckets)
    assert moe_down_gemms(GROUPED, layer, plan, (False,) * n, "deterministic") == (GROUPED,) * n
    assert moe_down_gemms(None, layer, plan, (False,) * n, "atomic") == ("indexed",) * n
    with pytest.raises(ValueError, match="topk_reduce='atomic' needs the indexed down GEMM"):
        moe_down_gemms(GROUPED, layer, plan, (False,) * n, "atomic")
    fused = (False,) * (n - 1) + (True,)
    assert moe_down_gemms(None, layer, plan, fused, "deterministic")[-1] == "indexed"
    with pytest.raises(ValueError, match=r"buckets of rows per expert open \(fused_quantization\)"):
        moe_down_gemms(GROUPED, layer, plan, fused, "deterministic")
    # W8A8-like buckets, every one warp-specialized: a wide down GEMM (H >= 4 I) groups from the bucket bound 32 on,
    # a narrow one only the open-ended bucket
    ws = type("Tuning", (), {"pipeline": "warp_specialized"})()
    plan = type("Plan", (), {"buckets": [(8, ws), (16, ws), (64, ws), (None, ws)]})()
    wide, narrow = attrs.evolve(layer, n=8 * layer.k), attrs.evolve(layer, n=2 * layer.k)
    assert moe_down_gemms(None, wide, plan, (False,) * 4, "deterministic") == ("indexed", "indexed", GROUPED, GROUPED)
    assert moe_down_gemms(None, narrow, plan, (False,) * 4, "deterministic") == ("indexed",) * 3 + (GROUPED,)


@pytest.mark.parametrize("kwargs, message", [
    ({"down_gemm": "grouped"}, "down_gemm='grouped'; allowed: (None, 'indexed', 'grouped_contiguous')"),
    ({"down_gemm": GROUPED, "topk_reduce": "atomic"}, "topk_reduce='atomic' needs the indexed down GEMM"),
])
def test_errors_name_the_argument(kwargs, message):
    scheme = hg.QuantScheme("int4", group_size=128)
    q13, q2 = scheme.quantize(torch.randn(E, 2 * I, H) * 0.05), scheme.quantize(torch.randn(E, H, I) * 0.05)
    with pytest.raises(ValueError) as info:
        hg.QuantMoE.from_quantized(q13, q2, target="sm_90a", device="cpu", **kwargs)
    assert message in str(info.value)

"""QuantMoE(topk_reduce="atomic") without a GPU: argument validation, the ComputeConfig field (listed only when
set), the GEMM2 kernels of both pipelines (the atomic store in place of the row store: red.global.add.f32 into the
token's fp32 row, no trace of it elsewhere; NVRTC compile without spills, 16-bit and 8-bit activations), the
launcher's out_top_k, and the layer's host path with a stand-in GEMM that adds rows as the epilogue does
(test_moe_ops.MoeStandIn) against the float64 reference, dropped slots and expert maps included. The numerics of the
real kernels: tests/gpu/test_quant_moe_topk_atomic.py."""

from __future__ import annotations

import attrs
import pytest
import torch

import humming_gen as hg
from helpers import assert_no_spills
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build_many
from humming_gen.pipelines.warp_specialized.heuristics import choose_moe_tunings
from humming_gen.reference.moe import reference_fused_moe
from humming_gen.targets import get_target
from test_moe_ops import E, H, I, make_layer, rel, routing

ATOMIC = ComputeConfig(gemm="indexed", topk_weight=True, topk_reduce="atomic")
WEIGHTED = ComputeConfig(gemm="indexed", topk_weight=True)


def _code(src: str) -> str:
    return "\n".join(line.split("//", 1)[0] for line in src.split("namespace hg {", 1)[1].splitlines())


@pytest.mark.parametrize("value", ["atomics", None, True, "Deterministic"])
def test_quant_moe_refuses_other_topk_reduce_values(value):
    scheme = hg.QuantScheme("int4", group_size=128)
    q13, q2 = scheme.quantize(torch.randn(E, 2 * I, H)), scheme.quantize(torch.randn(E, H, I))
    with pytest.raises(ValueError) as info:
        hg.QuantMoE.from_quantized(q13, q2, target="sm_90a", device="cpu", topk_reduce=value)
    assert f"topk_reduce={value!r}; allowed: ('deterministic', 'atomic')" in str(info.value)


def test_compute_config_field_is_listed_only_when_set_and_checked():
    assert "topk_reduce" not in WEIGHTED.to_dict() and ATOMIC.to_dict()["topk_reduce"] == "atomic"
    assert ComputeConfig.from_json(ATOMIC.to_json()) == ATOMIC and "topk_reduce_atomic" in ATOMIC.summary()
    with pytest.raises(ValueError, match="topk_reduce"):
        ComputeConfig(gemm="indexed", topk_reduce="sum")
    for bad in (dict(gemm="indexed"), dict(gemm="grouped_masked", topk_weight=True),
                dict(gemm="indexed", topk_weight=True, epilogue_activation="silu_mul")):
        with pytest.raises(ValueError, match="topk_reduce='atomic' needs gemm='indexed' with topk_weight=True"):
            ComputeConfig(topk_reduce="atomic", **bad)


def _plans(scheme: str, target: str, compute: ComputeConfig, bias: bool = True):
    layer = LayerConfig(n=512, k=256, scheme=scheme, num_experts=8, has_bias=bias)
    tg = get_target(target)
    plans = []
    for pipeline in ("standard", "warp_specialized") if target == "sm_90a" else ("standard",):
        # (the warp-specialized MoE buckets QuantMoE runs, from 32 rows per expert: heuristics.moe_tunings)
        buckets = (choose_moe_tunings(layer, tg).buckets if pipeline == "warp_specialized"
                   else choose_tunings(layer, tg, pipeline=pipeline, stored=False).buckets)
        for m_max, t in buckets:
            if t.pipeline != pipeline or (m_max is not None and m_max < 32 and pipeline == "warp_specialized"):
                continue
            plans.append(compose(layer, compute, attrs.evolve(t, split_k=1), tg))
    return plans


@pytest.mark.parametrize("scheme", ["w4a16-int4-g128", "w8a8-fp8-channel", "w8a8-int8-channel"])
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_atomic_gemm2_kernels_compile_and_add_into_token_rows(scheme, target):
    if scheme == "w8a8-fp8-channel" and target == "sm_80":
        pytest.skip("fp8 activations need sm_89+")
    plans = _plans(scheme, target, ATOMIC)
    assert {p.tuning.pipeline for p in plans} == ({"standard", "warp_specialized"} if target == "sm_90a"
                                                  else {"standard"})
    for kernel in build_many(plans):
        src, code = kernel.source, _code(kernel.source)
        assert kernel.name.endswith("_moe_topkw_atomic"), kernel.name
        assert "epilogue.StoreOutputAtomic(" in src and "red.global.add.f32" in code
        assert "assignment_token(row, p.out_top_k, out_top_k_magic)" in code and "int out_top_k;" in src
        assert "from_float" not in code and "stmatrix" not in code and "kStagingBytes" not in code
        assert "bias" in code  # (bias: scaled by the router weight, once per assignment, as the row store does)
        assert [a.name for a in kernel.plan.args][-2:] == ["top_k", "out_top_k"]
        assert_no_spills(kernel.compiled, kernel.name)


def test_other_kernels_hold_no_trace_of_the_atomic_store():
    for kernel in build_many(_plans("w4a16-int4-g128", "sm_90a", WEIGHTED)):
        code = _code(kernel.source)
        assert "red.global.add" not in code and "out_top_k" not in kernel.source and "Atomic" not in kernel.source


@pytest.fixture(scope="module")
def atomic():
    moe, w13, w2 = make_layer(topk_reduce="atomic")
    assert moe.topk_reduce == "atomic" and "topk_reduce=atomic" in repr(moe)
    return moe, w13, w2


@pytest.mark.parametrize("m", [0, 1, 7, 128])
def test_atomic_layer_matches_the_reference(atomic, m):
    moe, w13, w2 = atomic
    weights, ids = routing(m, seed=m)
    if m > 1:
        ids[::3, 0] = -1  # dropped slots add nothing
        ids[1] = -1       # a token with every slot dropped: a zero row
    x = torch.randn(m, H).bfloat16()
    out = moe(x, weights, ids)
    ref = reference_fused_moe(x.double(), w13, w2, weights.double(), ids, intermediate_dtype=torch.bfloat16)
    assert out.shape == (m, H) and out.dtype == torch.bfloat16
    if m:
        assert rel(out, ref) < 2e-2
    if m > 1:
        assert (out[1] == 0).all()
    buf = torch.full((m, H + 8), float("nan")).bfloat16()
    assert hg.fused_moe(x, moe, weights, ids, output=buf[:, :H]) is not None and torch.equal(buf[:, :H], out)


def test_atomic_layer_with_an_expert_map(atomic):
    moe, w13, w2 = atomic
    table = torch.full((2 * E,), -1, dtype=torch.int32)
    table[E:] = torch.arange(E, dtype=torch.int32)  # this rank holds the upper half of the global experts
    weights, ids = routing(33, num_ids=2 * E, seed=4)
    x = torch.randn(33, H).bfloat16()
    out = moe(x, weights, ids, table)
    ref = reference_fused_moe(x.double(), w13, w2, weights.double(), ids, expert_map=table,
                              intermediate_dtype=torch.bfloat16)
    assert rel(out, ref) < 2e-2
    elsewhere = (table[ids.long()] < 0).all(dim=1)
    assert elsewhere.any() and (out[elsewhere] == 0).all()


def test_atomic_layer_has_no_down_gemm_alone(atomic):
    moe = atomic[0]
    with pytest.raises(ValueError, match="topk_reduce='atomic'"):
        moe.launcher_for("w2", 16, moe.block_ms[0])
    with pytest.raises(ValueError, match="topk_reduce='atomic'"):  # what moe_gemm's fake checks while tracing
        moe.gemm_index("w2")


def test_launcher_requires_out_top_k_exactly_for_atomic_kernels():
    tg = get_target("sm_90a")
    layer = LayerConfig(n=256, k=128, scheme="w4a16-int4-g128", num_experts=E)
    t = attrs.evolve(choose_tunings(layer, tg, pipeline="standard", stored=False).buckets[0][1], split_k=1)
    atomic_kernel, plain = build_many([compose(layer, ATOMIC, t, tg), compose(layer, WEIGHTED, t, tg)])
    moe = make_layer()[0]
    for kernel, kwargs, message in ((atomic_kernel, {}, "pass out_top_k"),
                                    (plain, {"out_top_k": 2}, "out_top_k given")):
        launcher = kernel.bind(moe.w2, None, torch.device("cpu"), None)
        r = hg.moe_align(torch.zeros(3, 2, dtype=torch.int32), E, t.block_m)
        with pytest.raises(ValueError, match=message):
            launcher.moe(torch.zeros(6, I).bfloat16(), torch.zeros(3, H), r, 1, torch.ones(6), **kwargs)

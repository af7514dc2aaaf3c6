"""The warp-specialized 8-bit kernels' prefetched loop (compose_a8.PREFETCH_FRAGMENTS, skeleton_a8's
prefetched_loop): which kernels take it, the order of its waits, wgmmas and fragment loads in the rendered source,
and that its kernels compile without spills or ptxas's wgmma serialization warnings (fatal in the build). The GPU
suites (tests/gpu/test_linear_w8a8.py, test_linear_w4a8*.py, test_quant_moe_a8_ws.py) check its results."""

from __future__ import annotations

import re

import attrs
import pytest

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build_many, generate
from humming_gen.pipelines.warp_specialized import compose_a8
from humming_gen.pipelines.warp_specialized.heuristics import moe_tuning_for
from humming_gen.targets import get_target

SM90 = get_target("sm_90a")


def _plan(scheme: str, m: int, n: int = 4000, k: int = 3072, fold: bool = False, overlap_off: bool = False, **tuning):
    layer = LayerConfig(n=n, k=k, scheme=hg.scheme(scheme), fold_scales=fold)
    t = choose_tunings(layer, SM90, stored=False).for_m(m)
    old = compose_a8.OVERLAP_PROMOTION
    compose_a8.OVERLAP_PROMOTION = not overlap_off and old
    try:
        return compose(layer, ComputeConfig(), attrs.evolve(t, **tuning), SM90)
    finally:
        compose_a8.OVERLAP_PROMOTION = old


def _prefetch(plan) -> bool:
    return next(c for c in plan.components if type(c).__name__ == "WarpSpecializedA8Pipeline").prefetch


@pytest.mark.parametrize("scheme, m, fold, expected", [
    ("w8a8-fp8-channel", 1, False, True), ("w8a8-int8-channel", 16, False, True), ("w8a8-fp8-block128", 1, False, True),
    ("w4a8-mxfp4-fp8", 64, True, True), ("w4a8-mxfp4-fp8", 256, True, True),
    ("w4a8-int4-g128-int8", 32, False, True),
    ("w8a8-fp8-channel", 64, False, False),  # promoted in overlapped token halves (8-bit weights from 16 tokens)
    ("w8a8-fp8-block128", 16, False, False),
    ("w8a8-mxfp8", 64, False, False),  # four promotions a stage (group-32 activation scales)
])
def test_which_kernels_prefetch(scheme: str, m: int, fold: bool, expected: bool) -> None:
    assert _prefetch(_plan(scheme, m, fold=fold)) is expected


def test_shared_weights_and_the_switch_keep_the_single_set_loop(monkeypatch) -> None:
    assert not _prefetch(_plan("w8a8-fp8-channel", 64, b_operand="shared"))
    monkeypatch.setattr(compose_a8, "PREFETCH_FRAGMENTS", False)
    assert not _prefetch(_plan("w8a8-fp8-channel", 64))


def _k_loop(source: str) -> str:
    """The consumer's prefetched k loop, from its comment to the stage advance."""
    start = source.index("// A stage's k32 steps in two halves")
    return source[start:source.index("stage = next;", start)]


@pytest.mark.parametrize("scheme, m, fold", [("w4a8-mxfp4-fp8", 64, True), ("w8a8-fp8-block128", 1, False),
                                             ("w8a8-int8-channel", 64, False)])
def test_loop_order(scheme: str, m: int, fold: bool) -> None:
    loop = _k_loop(generate(_plan(scheme, m, fold=fold)))
    body = loop[loop.index("for (int kt = tc.kt_begin"):]
    order = [body.index(s) for s in (
        "if (more) wait_stage(next",  # the next stage's barrier, before anything is in flight
        "wgmma_m64n",  # the halves' wgmmas
        "load_fragment(frag[1][ks], stage, kHalfSteps + ks)",  # the second half's registers, as the first runs
        "wgmma_wait<1>()",  # the first half retired ...
        "load_fragment(frag[0][ks], next, ks)",  # ... so its registers take the next stage's first half
        "wgmma_wait<0>()")]  # both retired before the promotion and the release
    assert order == sorted(order), order
    assert body.count("mbarrier_wait") == 0 and body.count("wait_stage(") == 1  # no barrier wait with wgmmas in flight
    release = body.index("mbarrier_arrive(ring.empty_bars + 8 * stage)")
    assert release > body.index("wgmma_wait<0>()")
    # the unit's first stage: waited and its first half loaded before the loop
    prologue = loop[:loop.index("for (int kt = tc.kt_begin")]
    assert "wait_stage(stage, phase)" in prologue and "load_fragment(frag[0][ks], stage, ks)" in prologue


def test_prefetched_kernels_compile_without_spills() -> None:
    plans = [_plan("w8a8-fp8-channel", 1), _plan("w8a8-fp8-channel", 64, overlap_off=True),
             _plan("w8a8-int8-channel", 128), _plan("w8a8-fp8-block128", 1), _plan("w4a8-mxfp4-fp8", 64, fold=True),
             _plan("w4a8-mxfp4-fp8", 1, n=8192, k=8192, fold=True), _plan("w4a8-mxfp4-fp8", 128, fold=True),
             _plan("w4a8-int4-g128-int8", 32)]
    for scheme, gemm in (("w4a8-mxfp4-fp8", "indexed"), ("w4a8-int4-g128-int8", "grouped_contiguous")):
        layer = LayerConfig(n=1024, k=2048, scheme=hg.scheme(scheme), num_experts=8, fold_scales=scheme.endswith("fp8"))
        compute = ComputeConfig(gemm=gemm, topk_weight=gemm == "indexed")
        plans.append(compose(layer, compute, moe_tuning_for(layer, SM90, 64), SM90))
    assert [p.kernel_name for p in plans if not _prefetch(p)] == []
    for kernel in build_many(plans):  # ptxas warnings (wgmma serialization among them) fail the build
        r = kernel.compiled.resources
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)

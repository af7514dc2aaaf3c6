"""Components declare the device symbols they provide and need (Component.provides / needs); compose checks that
every need is met by a component rendered before it. These tests keep the declarations true to the rendered
templates, and show that the check catches a missing provider."""

from __future__ import annotations

import pytest

from codegen_cases import CASES
from humming_gen.codegen.compose import ComposeError, compose
from humming_gen.components.numeric.scale_apply import SubtractOffsetScale
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.pipelines.common import missing_symbols
from humming_gen.targets import get_target
from symbols import declaration_mismatches


def _plans():
    plans = []
    for case in CASES:
        for target in ("sm_80", "sm_90a"):
            try:
                plans.append(case.plan(target))
            except ComposeError:
                pass
    for scheme in ("w4a16-int4-g128", "w8a16-int8-channel", "w3a16-int3-g128", "w4a16-int4-g128-zp",
                   "w4a16-mxfp4", "w4a16-nvfp4", "w8a16-fp8-channel"):
        for dtype in ("bfloat16", "float16"):
            layer = LayerConfig(4096, 4096, scheme, dtype=dtype, has_bias=True, out_dtype="float32")
            plans += [compose(layer, ComputeConfig(), t, get_target("sm_90a"))
                      for t in choose_tunings(layer, get_target("sm_90a")).tunings()]
    for scheme in ("w8a8-int8-channel", "w8a8-fp8-channel", "w8a8-fp8-block128", "w8a8-fp8-tensor", "w8a8-mxfp8"):
        layer = LayerConfig(4096, 4096, scheme, has_bias=True)  # 8-bit activations
        # sm_90a's own plan (warp-specialized at every M) and the standard pipeline's (other targets' kernels)
        for pipeline in (None, "standard"):
            plans += [compose(layer, ComputeConfig(), t, get_target("sm_90a"))
                      for t in choose_tunings(layer, get_target("sm_90a"), pipeline=pipeline).tunings()]
    return plans


PLANS = _plans()


def test_plans_cover_both_pipelines() -> None:
    assert {p.pipeline for p in PLANS} == {"standard", "warp_specialized"} and len(PLANS) > 60


def test_declarations_match_the_rendered_source() -> None:
    wrong = {}
    for plan in PLANS:
        wrong.update(declaration_mismatches(plan))
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())


def test_every_plan_meets_its_needs_in_order() -> None:
    for plan in PLANS:
        assert missing_symbols(plan.components) == [], plan.kernel_name


def test_a_missing_provider_is_named() -> None:
    plan = PLANS[0]
    without = tuple(c for c in plan.components if "dequant_pair" not in c.provides)
    reasons = missing_symbols(without)
    assert any("`dequant_pair`" in r and "no component before it provides" in r for r in reasons), reasons
    # order matters too: a provider after its user does not count
    apply = next(c for c in plan.components if "dequant_pair" in c.provides)
    late = tuple(c for c in plan.components if c is not apply) + (apply,)
    assert any("`dequant_pair`" in r for r in missing_symbols(late))


def test_compose_refuses_an_unmet_need(monkeypatch) -> None:
    """A component whose needs nothing provides stops compose with the symbol named (here: a scale step that
    claims to call a wrapper no component renders)."""
    monkeypatch.setattr(SubtractOffsetScale, "needs", property(lambda self: frozenset({"fma2", "no_such_symbol"})))
    layer = LayerConfig(4096, 4096, "w4a16-int4-g128")
    with pytest.raises(ComposeError, match="no_such_symbol"):
        compose(layer, ComputeConfig(), choose_tunings(layer, get_target("sm_90a")).for_m(1024), get_target("sm_90a"))

"""choose_tunings: the TuningPlan a layer compiles, from the heuristics of the pipelines that serve it.

Where the warp-specialized pipeline serves the layer (sm_90a, 16-bit activations, group sizes that are multiples
of 16), it takes its buckets from the one ending at ws_from_m(layer) tokens on (M >= 17; M >= 9 for layers of at
most SKINNY_N rows) and the standard pipeline keeps the buckets that end below it; both read one packed weight.
Elsewhere the standard pipeline takes every bucket.
"""

from __future__ import annotations

from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.pipelines.base import TuningPlan
from humming_gen.pipelines.standard import STANDARD
from humming_gen.pipelines.warp_specialized import WARP_SPECIALIZED
from humming_gen.targets import Target, get_target

# The warp-specialized buckets start with the one ending at ws_from_m(layer) tokens; the standard pipeline keeps the
# buckets that end below it. Measured on the H200 (bench/split_sweep.py, W4A16, graph us per layer), standard
# against warp-specialized:
# - M = 32: 8192 x 8192 26.8 / 22.2, 4096 x 14336 25.2 / 20.3, 14336 x 4096 23.7 / 22.5, 4096 x 4096 13.3 / 9.5,
#   2880 x 2880 16.2 / 8.6, 576 x 7168 14.1 / 7.9.
# - M = 16: 8192 x 8192 19.0 / 20.4, 14336 x 4096 16.3 / 20.4, 4096 x 14336 18.1 / 19.0, 4096 x 4096 8.7 / 8.7,
#   but 2880 x 2880 10.3 / 7.8 and 576 x 7168 8.8 / 7.2: few weight rows leave the standard pipeline's split-K short
#   of the SMs, so layers of at most SKINNY_N rows take the warp-specialized pipeline from M = 9.
WS_FROM_M = 32
SKINNY_N = 3072


# 8-bit activations: the warp-specialized kernels do not split K, so they start at the first bucket whose tiles fill
# the SMs (pipelines.warp_specialized.heuristics.A8_BUCKETS).
WS_A8_FROM_M = 128


def ws_from_m(layer: LayerConfig) -> int:
    """The largest M of the first bucket the warp-specialized pipeline takes for this layer."""
    if layer.scheme.activation is not None:
        return WS_A8_FROM_M
    return 16 if layer.n <= SKINNY_N else WS_FROM_M


PIPELINE_CHOICES = (None, "standard", "warp_specialized")


def choose_tunings(layer: LayerConfig, target: Target | str, *, pipeline: str | None = None,
                   batch_invariant: bool = False, stored: bool = True, **overrides) -> TuningPlan:
    """One TuningConfig per M bucket for `layer` on `target`: the built-in heuristics (`heuristic_tunings`), with
    the buckets `humming_gen.autotune` stored for this GPU and driver in their place (pipeline None, no
    overrides, `stored`; humming_gen/tuning/store.py), or one K summation order for every M with
    `batch_invariant` (humming_gen/heuristics/batch_invariant.py; pipeline None means standard)."""
    target = get_target(target)
    if batch_invariant:
        if overrides:
            raise ValueError(f"batch_invariant=True takes no TuningConfig overrides, got {sorted(overrides)}")
        from humming_gen.heuristics.batch_invariant import batch_invariant_tunings

        return batch_invariant_tunings(layer, target, pipeline)
    plan = heuristic_tunings(layer, target, pipeline=pipeline, **overrides)
    if stored and pipeline is None and not overrides:
        from humming_gen.tuning.store import with_stored

        plan = with_stored(layer, target, plan)
    return plan


def heuristic_tunings(layer: LayerConfig, target: Target, *, pipeline: str | None = None, **overrides) -> TuningPlan:
    """One TuningConfig per M bucket for `layer` on `target`, from the built-in heuristics.

    pipeline: None (the measured choice per bucket), "standard" or "warp_specialized" (every bucket it can
    take; the standard pipeline keeps the buckets below ws_from_m(layer)). `overrides` replace TuningConfig fields in
    every standard-pipeline bucket (for experiments and autotuning) and imply pipeline="standard"."""
    if pipeline not in PIPELINE_CHOICES:
        raise ValueError(f"pipeline={pipeline!r}; allowed: {PIPELINE_CHOICES}")
    standard = STANDARD.choose_tunings(layer, target, **overrides)
    if pipeline == "standard" or overrides:
        return standard
    reasons = WARP_SPECIALIZED.supports(layer, ComputeConfig(), target)
    if reasons:
        if pipeline == "warp_specialized":
            raise ValueError("the warp-specialized pipeline cannot serve this layer:\n  - " + "\n  - ".join(reasons))
        return standard
    start = ws_from_m(layer)
    small = [(m, t) for m, t in standard.buckets if m is not None and m < start]
    ws = [(m, t) for m, t in WARP_SPECIALIZED.choose_tunings(layer, target).buckets if m is None or m >= start]
    return TuningPlan(tuple(small + ws))

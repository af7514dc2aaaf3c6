"""choose_tunings: the TuningPlan a layer compiles, from the heuristics of the pipelines that serve it.

Where the warp-specialized pipeline serves the layer (sm_90a, 16-bit activations, group sizes that are multiples
of 16), it takes its buckets from the one ending at WS_FROM_M tokens on (so M >= 33) and the standard pipeline
keeps the buckets that end below it (M <= 32); both read one packed weight. Elsewhere the standard pipeline takes
every bucket.
"""

from __future__ import annotations

from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.pipelines.base import TuningPlan
from humming_gen.pipelines.standard import STANDARD
from humming_gen.pipelines.warp_specialized import WARP_SPECIALIZED
from humming_gen.targets import Target

# The standard pipeline keeps its buckets that end below this M (8, 16, 32); the warp-specialized buckets start
# with the one ending here, so they serve M = 33.. (H200, W4A16 8192 x 8192 at M = 64: 26.6 us against the
# standard pipeline's 38.4; at M = 32 the standard pipeline's 24.9 stays).
WS_FROM_M = 64
PIPELINE_CHOICES = (None, "standard", "warp_specialized")


def choose_tunings(layer: LayerConfig, target: Target, *, pipeline: str | None = None, **overrides) -> TuningPlan:
    """One TuningConfig per M bucket for `layer` on `target`.

    pipeline: None (the measured choice per bucket), "standard" or "warp_specialized" (every bucket it can
    take; the standard pipeline keeps the buckets below WS_FROM_M). `overrides` replace TuningConfig fields in
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
    small = [(m, t) for m, t in standard.buckets if m is not None and m < WS_FROM_M]
    return TuningPlan(tuple(small) + WARP_SPECIALIZED.choose_tunings(layer, target).buckets)

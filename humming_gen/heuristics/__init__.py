"""Per-target choice of TuningConfig per M range."""

from humming_gen.heuristics.standard import TuningPlan, choose_tunings

__all__ = ["TuningPlan", "choose_tunings"]

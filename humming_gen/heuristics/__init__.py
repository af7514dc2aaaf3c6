"""Per-target choice of TuningConfig per M range: each pipeline's own heuristics, combined where several serve."""

from humming_gen.heuristics.choose import (choose_tunings, grouped_moe_tuning, heuristic_tunings, moe_down_gemms,
                                          moe_tunings)
from humming_gen.pipelines.base import TuningPlan

__all__ = ["TuningPlan", "choose_tunings", "grouped_moe_tuning", "heuristic_tunings", "moe_down_gemms", "moe_tunings"]

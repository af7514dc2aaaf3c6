"""compose(): (LayerConfig, ComputeConfig, TuningConfig, Target) -> a KernelPlan, by the pipeline the tuning names.

Each pipeline package (humming_gen.pipelines.<name>) makes its own choices; this is the one entry point.
"""

from __future__ import annotations

from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.pipelines.base import SECTION_ORDER, ComposeError, KernelPlan
from humming_gen.pipelines.registry import get_pipeline
from humming_gen.targets import Target

__all__ = ["SECTION_ORDER", "ComposeError", "KernelPlan", "compose"]


def compose(layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig, target: Target) -> KernelPlan:
    """Choose and parametrise the components of one kernel; ComposeError lists everything that is off."""
    return get_pipeline(tuning.pipeline).compose(layer, compute, tuning, target)

"""The warp-specialized pipeline (sm_90a): a producer warpgroup filling an mbarrier ring with bulk copies and
cp.async, consumer warpgroups dequantizing in registers into wgmma's register A operand; persistent grid with
split-K. The heuristics give it the buckets from 17 tokens on (9 for layers of at most 3072 rows), where it beats
the standard pipeline (humming_gen.heuristics.choose)."""

from __future__ import annotations

from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.pipelines import weights as _weights
from humming_gen.pipelines.common import common_reasons, lacking
from humming_gen.pipelines.warp_specialized import compose as _compose
from humming_gen.pipelines.warp_specialized import heuristics as _heuristics
from humming_gen.pipelines.warp_specialized.components import WarpSpecializedPipeline
from humming_gen.targets import Target


class WarpSpecialized:
    name = "warp_specialized"
    compose = staticmethod(_compose.compose)
    shared_memory = staticmethod(_compose.shared_memory)
    choose_tunings = staticmethod(_heuristics.choose_tunings)
    prepare_weight = staticmethod(_weights.prepare_weight)  # the shared layout: one packed copy for both

    @staticmethod
    def supports(layer: LayerConfig, compute: ComputeConfig, target: Target) -> list[str]:
        return (common_reasons(layer, compute, target) + _compose.layout_reasons(layer)
                + lacking(target, WarpSpecializedPipeline.requires, "warp-specialized pipeline"))


WARP_SPECIALIZED = WarpSpecialized()

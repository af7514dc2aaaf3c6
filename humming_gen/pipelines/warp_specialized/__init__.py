"""The warp-specialized pipeline (sm_90a): a producer warpgroup filling an mbarrier ring with bulk copies and
cp.async, consumer warpgroups dequantizing in registers into wgmma's register A operand; persistent grid with
split-K. Faster than the standard pipeline from M = 64 tokens on."""

from __future__ import annotations

from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.pipelines.common import common_reasons
from humming_gen.pipelines.standard import weights as _weights
from humming_gen.pipelines.warp_specialized import compose as _compose
from humming_gen.pipelines.warp_specialized import heuristics as _heuristics
from humming_gen.pipelines.warp_specialized.components import WarpSpecializedPipeline
from humming_gen.targets import Target


class WarpSpecialized:
    name = "warp_specialized"
    compose = staticmethod(_compose.compose)
    shared_memory = staticmethod(_compose.shared_memory)
    choose_tunings = staticmethod(_heuristics.choose_tunings)
    prepare_weight = staticmethod(_weights.prepare_weight)  # the standard layout: one packed copy for both

    @staticmethod
    def supports(layer: LayerConfig, compute: ComputeConfig, target: Target) -> list[str]:
        return common_reasons(layer, compute, target) + _compose.layout_reasons(layer) + [
            f"target {target.name} lacks '{f}', which the warp-specialized pipeline needs"
            for f in sorted(WarpSpecializedPipeline.requires) if not target.has(f)]


WARP_SPECIALIZED = WarpSpecialized()

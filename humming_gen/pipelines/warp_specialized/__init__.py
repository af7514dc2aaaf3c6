"""The warp-specialized pipeline (sm_90a): a producer warpgroup filling an mbarrier ring with bulk copies and
cp.async, consumer warpgroups dequantizing in registers into wgmma's register A operand; persistent grid with
split-K. The heuristics give it the buckets from 17 tokens on (9 for layers of at most 3072 rows), where it beats
the standard pipeline (humming_gen.heuristics.choose). It also generates MoE GEMMs (indexed, grouped_contiguous,
grouped_masked), with 16-bit or 8-bit activations (QuantMoE's buckets from 17 rows per expert on, W8A8 layers' all:
humming_gen.heuristics.choose.moe_tunings, grouped_moe_tuning)."""

from __future__ import annotations

from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.pipelines import weights as _weights
from humming_gen.pipelines.common import common_reasons, lacking
from humming_gen.pipelines.standard import compose_a8 as _standard_a8
from humming_gen.pipelines.warp_specialized import compose as _compose
from humming_gen.pipelines.warp_specialized import compose_a8 as _compose_a8
from humming_gen.pipelines.warp_specialized import heuristics as _heuristics
from humming_gen.pipelines.warp_specialized.components import WarpSpecializedPipeline
from humming_gen.targets import Target


class WarpSpecialized:
    name = "warp_specialized"

    @staticmethod
    def compose(layer: LayerConfig, compute: ComputeConfig, tuning, target: Target):
        if layer.scheme.activation is not None:
            return _compose_a8.compose(layer, compute, tuning, target)
        return _compose.compose(layer, compute, tuning, target)

    @staticmethod
    def shared_memory(layer: LayerConfig, tuning):
        if layer.scheme.activation is not None:
            return _compose_a8.shared_memory(layer, tuning)
        return _compose.shared_memory(layer, tuning)

    choose_tunings = staticmethod(_heuristics.choose_tunings)
    prepare_weight = staticmethod(_weights.prepare_weight)  # the shared layout: one packed copy for both

    @staticmethod
    def supports(layer: LayerConfig, compute: ComputeConfig, target: Target) -> list[str]:
        if layer.scheme.activation is not None:
            return (common_reasons(layer, compute, target, quantized_activations=True, moe_gemms=_compose.MOE_GEMMS)
                    + _standard_a8.scheme_reasons(layer) + _compose_a8.operand_reasons(layer)
                    + lacking(target, WarpSpecializedPipeline.requires, "warp-specialized pipeline"))
        return (common_reasons(layer, compute, target, moe_gemms=_compose.MOE_GEMMS) + _compose.layout_reasons(layer)
                + lacking(target, WarpSpecializedPipeline.requires, "warp-specialized pipeline"))


WARP_SPECIALIZED = WarpSpecialized()

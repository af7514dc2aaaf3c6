"""The standard pipeline: a cp.async multi-stage ring, ldmatrix, in-register dequantization and mma.sync, with
split-K. Every target from sm_80 on; the fastest at small M (decode)."""

from __future__ import annotations

from humming_gen.components.mma.mma_sync import MmaSyncM16N8K32, MmaSyncM16N8K64S4
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.pipelines import weights as _weights
from humming_gen.pipelines.common import common_reasons, lacking
from humming_gen.pipelines.standard import compose as _compose
from humming_gen.pipelines.standard import compose_a8 as _compose_a8
from humming_gen.pipelines.standard import heuristics as _heuristics
from humming_gen.pipelines.standard.loaders import ATileCpAsync
from humming_gen.pipelines.standard.skeleton import StandardPipeline
from humming_gen.targets import Target


class Standard:
    name = "standard"
    compose = staticmethod(_compose.compose)
    shared_memory = staticmethod(_compose.shared_memory)
    choose_tunings = staticmethod(_heuristics.choose_tunings)
    prepare_weight = staticmethod(_weights.prepare_weight)

    @staticmethod
    def supports(layer: LayerConfig, compute: ComputeConfig, target: Target) -> list[str]:
        needs = StandardPipeline.requires | ATileCpAsync.requires
        if layer.scheme.activation is not None:
            scheme_reasons = _compose_a8.scheme_reasons(layer)
            if _compose_a8.s4_native(layer):  # int4 x int4: mma.sync m16n8k64 s4, dense GEMMs
                needs = needs | MmaSyncM16N8K64S4.requires
                if compute.gemm in _compose.MOE_GEMMS:
                    scheme_reasons.append(f"gemm={compute.gemm!r} with int4 activations: MoE GEMMs are generated for "
                                          f"8-bit activations")
            elif not scheme_reasons:  # the 8-bit mma.sync of these operand types
                needs = needs | MmaSyncM16N8K32(weight=_compose_a8.weight_operand(layer),
                                                activation=layer.scheme.activation.dtype.name).requires
            return (common_reasons(layer, compute, target, quantized_activations=True, moe_gemms=_compose.MOE_GEMMS,
                                   quantized_output=True)
                    + scheme_reasons + lacking(target, needs, "standard pipeline"))
        return (common_reasons(layer, compute, target, moe_gemms=_compose.MOE_GEMMS)
                + lacking(target, needs, "standard pipeline"))


STANDARD = Standard()

"""`ComputeConfig`: how the product is computed (GEMM kind, accumulation, fused epilogue).

Unlike TuningConfig, these choices can change results (f16 accumulation, fused activation), so they are part
of what the caller asks for rather than something a heuristic may pick.
"""

from __future__ import annotations

from typing import Any

import attrs

from humming_gen.config.validate import JsonConfig, check_bool, check_choice, fail, raise_reasons

# dense: one weight. indexed: MoE, each token row gathers its experts' weights through an index list.
# grouped_contiguous: MoE with rows already sorted into per-expert segments. grouped_masked: MoE with a fixed
# (E, max_m, K) activation buffer and a per-expert valid-row count.
GEMMS = ("dense", "indexed", "grouped_contiguous", "grouped_masked")
MOE_GEMMS = GEMMS[1:]
ACCUMULATES = ("float32", "float16")
INPUT_SCALE_LAYOUTS = ("row_major", "column_major")
# Gated activations: the layer's N output columns hold gate and up halves; the epilogue writes N/2 columns.
EPILOGUE_ACTIVATIONS = (None, "silu_mul", "gelu_mul", "swiglu_oai")
# MoE GEMM2's top-k reduction in its epilogue: None, one output row per assignment (a separate, deterministic
# reduction sums them); "atomic", each assignment's router-weighted row added into its token's fp32 row with
# red.global.add (the order of the adds varies from run to run: not deterministic).
TOPK_REDUCES = (None, "atomic")


@attrs.frozen(kw_only=True, hash=False)
class ComputeConfig(JsonConfig):
    """GEMM kind and epilogue of one kernel.

    gemm: "dense" | "indexed" | "grouped_contiguous" | "grouped_masked".
    batch_invariant: results of a row do not depend on the batch size M (no M-dependent split-K choice).
    accumulate: "float32" or "float16" (faster on some parts, less accurate).
    input_scale_layout: memory order of per-token / per-group activation scales.
    epilogue_activation: fused gated activation, or None.
    topk_weight: multiply each output row by its router weight (MoE only).
    topk_reduce: None, or "atomic": add each assignment's row into row assignment / top_k of an fp32 output with
        atomic adds (indexed MoE GEMM2 with topk_weight; non-deterministic summation order).
    epilogue_quantization: MoE GEMM1 with a gated epilogue_activation writes its output quantized for GEMM2 (an
        ActivationScheme or its dict form: codes and scales in quantize_activation's layout), or None.
    epilogue_static_scale: that scheme's per-tensor scale is static (read from the c_scale argument).
    """

    gemm: str = "dense"
    batch_invariant: bool = False
    accumulate: str = "float32"
    input_scale_layout: str = "row_major"
    epilogue_activation: str | None = None
    topk_weight: bool = False
    # (listed only when set: configs without them keep their JSON, keys and generated sources)
    topk_reduce: str | None = attrs.field(default=None, metadata={"listed_when_set": True})
    epilogue_quantization: Any = attrs.field(default=None, converter=lambda v: _activation_scheme(v),
                                             metadata={"listed_when_set": True})
    epilogue_static_scale: bool = attrs.field(default=False, metadata={"listed_when_set": True})
    _key_cache: str | None = attrs.field(init=False, default=None, eq=False, repr=False)

    __hash__ = JsonConfig.__hash__

    def __attrs_post_init__(self) -> None:
        o = "ComputeConfig"
        check_choice(o, "gemm", self.gemm, GEMMS)
        check_bool(o, "batch_invariant", self.batch_invariant)
        check_choice(o, "accumulate", self.accumulate, ACCUMULATES)
        check_choice(o, "input_scale_layout", self.input_scale_layout, INPUT_SCALE_LAYOUTS)
        check_choice(o, "epilogue_activation", self.epilogue_activation, EPILOGUE_ACTIVATIONS)
        check_bool(o, "topk_weight", self.topk_weight)
        check_choice(o, "topk_reduce", self.topk_reduce, TOPK_REDUCES)
        check_bool(o, "epilogue_static_scale", self.epilogue_static_scale)
        reasons = []
        if self.topk_reduce is not None and (self.gemm != "indexed" or not self.topk_weight
                                             or self.epilogue_activation is not None):
            reasons.append(f"topk_reduce={self.topk_reduce!r} needs gemm='indexed' with topk_weight=True and no "
                           f"epilogue_activation (MoE GEMM2), got gemm={self.gemm!r}, topk_weight={self.topk_weight}, "
                           f"epilogue_activation={self.epilogue_activation!r}")
        if self.topk_weight and self.gemm not in MOE_GEMMS:
            reasons.append(f"topk_weight=True needs an MoE gemm {MOE_GEMMS}, got gemm={self.gemm!r}")
        q = self.epilogue_quantization
        if q is not None:
            from humming_gen.schemes.scheme import ActivationScheme

            if not isinstance(q, ActivationScheme):
                fail(o, "epilogue_quantization", q, "an ActivationScheme, its dict form or None", TypeError)
            if self.gemm != "indexed" or self.epilogue_activation is None:
                reasons.append(f"epilogue_quantization quantizes MoE GEMM1's gated output: it needs gemm='indexed' "
                               f"and an epilogue_activation, got gemm={self.gemm!r}, "
                               f"epilogue_activation={self.epilogue_activation!r}")
            if self.topk_weight:
                reasons.append("epilogue_quantization is GEMM1's (no router weight), got topk_weight=True")
            if self.epilogue_static_scale and q.granularity != "tensor":
                reasons.append(f"epilogue_static_scale needs granularity 'tensor', got {q.granularity!r}")
        elif self.epilogue_static_scale:
            reasons.append("epilogue_static_scale=True without an epilogue_quantization")
        raise_reasons(o, reasons)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if self.epilogue_quantization is not None:
            d["epilogue_quantization"] = self.epilogue_quantization.to_dict()
        return d

    @property
    def is_moe(self) -> bool:
        return self.gemm in MOE_GEMMS

    def summary(self) -> str:
        """One line for the generated source's header; holds every field."""
        epilogue = [e for e in (self.epilogue_activation, "topk_weight" if self.topk_weight else None,
                                f"topk_reduce_{self.topk_reduce}" if self.topk_reduce else None) if e]
        q = self.epilogue_quantization
        if q is not None:
            gran = f"g{q.group_size}" if q.granularity == "group" else q.granularity
            epilogue.append(f"quantize:{q.dtype.name}/{q.scale_dtype.name}/{gran}"
                            + ("/static" if self.epilogue_static_scale else ""))
        return (f"compute gemm={self.gemm} batch_invariant={'yes' if self.batch_invariant else 'no'} "
                f"accum={self.accumulate} input_scale={self.input_scale_layout} epilogue=[{','.join(epilogue)}]")


def _activation_scheme(value: Any) -> Any:
    """Accept an ActivationScheme or its to_dict() form (JSON round trip); anything else is left for the check."""
    if isinstance(value, dict):
        from humming_gen.schemes.scheme import ActivationScheme

        return ActivationScheme.from_dict(value)
    return value

"""`ComputeConfig`: how the product is computed (GEMM kind, accumulation, fused epilogue).

Unlike TuningConfig, these choices can change results (f16 accumulation, fused activation), so they are part
of what the caller asks for rather than something a heuristic may pick.
"""

from __future__ import annotations

import attrs

from humming_gen.config.validate import JsonConfig, check_bool, check_choice, raise_reasons

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
    """

    gemm: str = "dense"
    batch_invariant: bool = False
    accumulate: str = "float32"
    input_scale_layout: str = "row_major"
    epilogue_activation: str | None = None
    topk_weight: bool = False
    # (listed only when set: configs without it keep their JSON, keys and generated sources)
    topk_reduce: str | None = attrs.field(default=None, metadata={"listed_when_set": True})
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
        reasons = []
        if self.topk_reduce is not None and (self.gemm != "indexed" or not self.topk_weight
                                             or self.epilogue_activation is not None):
            reasons.append(f"topk_reduce={self.topk_reduce!r} needs gemm='indexed' with topk_weight=True and no "
                           f"epilogue_activation (MoE GEMM2), got gemm={self.gemm!r}, topk_weight={self.topk_weight}, "
                           f"epilogue_activation={self.epilogue_activation!r}")
        if self.topk_weight and self.gemm not in MOE_GEMMS:
            reasons.append(f"topk_weight=True needs an MoE gemm {MOE_GEMMS}, got gemm={self.gemm!r}")
        raise_reasons(o, reasons)

    @property
    def is_moe(self) -> bool:
        return self.gemm in MOE_GEMMS

    def summary(self) -> str:
        """One line for the generated source's header; holds every field."""
        epilogue = [e for e in (self.epilogue_activation, "topk_weight" if self.topk_weight else None,
                                f"topk_reduce_{self.topk_reduce}" if self.topk_reduce else None) if e]
        return (f"compute gemm={self.gemm} batch_invariant={'yes' if self.batch_invariant else 'no'} "
                f"accum={self.accumulate} input_scale={self.input_scale_layout} epilogue=[{','.join(epilogue)}]")

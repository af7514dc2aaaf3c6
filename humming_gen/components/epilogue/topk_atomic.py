"""The output store of MoE GEMM2 with its top-k reduction fused (ComputeConfig.topk_reduce="atomic"): each
assignment's router-weighted row is added into its token's row of an fp32 output with red.global.add, instead of
being written as a row of its own for a separate reduction. Kept apart from StoreOutput's template so that kernels
without it render exactly as before."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.epilogue.output import StoreOutput


@attrs.frozen
class StoreOutputAtomic(StoreOutput):
    """StoreOutput's column scale, bias, token scale and router weight, then red.global.add.f32 into row
    assignment / out_top_k of the fp32 output (which the caller zeroed). The rows, router weights and token scales
    are looked up one chunk of m tiles at a time (StoreOutput.tile_rows' lookups), for either pipeline's warps.
    Not deterministic: the adds into one element come in any order."""

    template: ClassVar[str] = "epilogue/store_output_atomic.cuh.j2"

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if not (self.row_map and self.topk_weight and self.tile_rows):
            raise ValueError("StoreOutputAtomic needs row_map, topk_weight and tile_rows (MoE GEMM2's routed rows)")
        if self.gated or self.fragment_store:
            raise ValueError("StoreOutputAtomic stores whole tiles of GEMM2: no gated activation, no fragment_store")
        if self.out_dtype != "float32":
            raise ValueError(f"StoreOutputAtomic adds into an fp32 output, got out_dtype={self.out_dtype!r}")

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"store_output", "red_add", "assignment_token", "assignment_token_magic"})

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("cvt_scalar",) if self.bias else ()


def fused_topk_store(compute, store: StoreOutput) -> StoreOutput:
    """The output store a compose chose for GEMM2, or, where compute.topk_reduce is "atomic", StoreOutputAtomic
    with the same factors (column scale, bias, token scale, accumulator order)."""
    if compute.topk_reduce != "atomic":
        return store
    return StoreOutputAtomic(dtype=store.dtype, out_dtype="float32", out_scale=store.out_scale, bias=store.bias,
                             atom=store.atom, token_scale=store.token_scale, row_map=True, topk_weight=True,
                             tile_rows=True)


def output_dtype(layer, compute) -> str:
    """The element type of c: fp32 for an atomic top-k reduction, else the layer's out_dtype."""
    return "float32" if compute.topk_reduce == "atomic" else layer.out_dtype

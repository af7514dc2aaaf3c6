"""Epilogue components every pipeline uses: the cross-CTA split-K reduction and the output store."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component, option_field
from humming_gen.components.mma.atoms import MMA_SYNC_M16N8K16, MmaAtom


@attrs.frozen
class SplitKReduce(Component):
    """Last-arriving CTA sums the split-K partials from the workspace."""

    template: ClassVar[str] = "epilogue/split_k_reduce.cuh.j2"
    family: ClassVar[str] = "epilogue"
    ptx: ClassVar[tuple[str, ...]] = ("global_sync",)
    provides: ClassVar[frozenset[str]] = frozenset({"kSplitAccPerThread", "split_k_reduce"})
    split_k: int
    # Who takes part: every thread of the CTA (standard), or the consumer warps alone (warp-specialized), which
    # synchronise on a named barrier and whose first thread counts the arrival.
    sync: str = option_field("__syncthreads()")
    leader: str = option_field("threadIdx.x == 0")

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        named = {"consumer_sync"} if "consumer_sync" in self.sync else set()
        return frozenset({"arrive_and_count", "reset_counter", "fence_gpu", "load_cg"} | named)


@attrs.frozen
class SplitKParallelReduce(Component):
    """Every slice of a tile sums its share of the split-K partials (a persistent grid whose CTAs are all
    resident), so no CTA reads kSplitK partial tiles alone: the mid-M cliff of skinny layers."""

    template: ClassVar[str] = "epilogue/split_k_reduce_parallel.cuh.j2"
    family: ClassVar[str] = "epilogue"
    ptx: ClassVar[tuple[str, ...]] = ("global_sync", "global_wait")
    provides: ClassVar[frozenset[str]] = frozenset({"kSplitAccPerThread", "kSplitFragments", "split_k_tile",
                                                   "split_k_publish", "split_k_share_begin", "kSplitLoadBatch",
                                                   "split_k_sum",
                                                   "split_k_depart"})
    split_k: int
    sync: str
    leader: str

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        named = {"consumer_sync"} if "consumer_sync" in self.sync else set()
        return frozenset({"arrive_and_count", "reset_counter", "fence_gpu", "load_cg", "wait_count"} | named)


SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # gpt-oss's swiglu, the one the fused epilogue computes
_OUT_CTYPE = {"bfloat16": "u16", "float16": "u16", "float32": "float"}


@attrs.frozen
class StoreOutput(Component):
    """Per-column fp32 scale, bias, conversion, masked store; the accumulator fragment order is the MMA atom's."""

    template: ClassVar[str] = "epilogue/store_output.cuh.j2"
    family: ClassVar[str] = "epilogue"
    dtype: str
    out_dtype: str
    out_scale: bool
    bias: bool
    atom: MmaAtom = attrs.field(default=MMA_SYNC_M16N8K16, metadata={"listed_when_set": True})
    # store_fragment (one accumulator fragment from values in hand: a split-K share) instead of store_output
    fragment_store: bool = option_field()
    # Quantized activations: their scale multiplies the output too, per token ("token": p.a_scale[m]) or one per
    # tensor ("tensor": p.a_scale[0]); "" without.
    token_scale: str = option_field("")
    # Per-token scales computed in the kernel (a_load='quantize'): read from shared memory (TokenScalesSmem)
    # instead of p.a_scale.
    token_scale_smem: bool = option_field()
    # MoE (indexed): tile row m is assignment sorted_ids[m], the row of c it writes (padding rows are skipped), and
    # its per-token activation scale is that of row sorted_ids[m] / top_k of a; topk_weight: times the assignment's
    # router weight.
    row_map: bool = option_field()
    topk_weight: bool = option_field()
    # MoE GEMM1: gate and up rows interleaved by 8 in each 16-row tile; the store writes act(gate, up) (N / 2 columns)
    gated: str = option_field("")
    # MoE: the rows of c (and router weights, per-token activation scales) are looked up one 8-token m tile at a time
    # inside the store loop, the column scales and biases read once before it, instead of every tile's rows first: a
    # warp-specialized consumer holds up to 16 m tiles beside its accumulators, whose 64 more live registers would
    # spill
    tile_rows: bool = option_field()
    # Dense: the thread's column scales and biases come from column_factors(), which the pipeline calls before its
    # reductions (split-K: before the hand-off), so their loads overlap it instead of following the last slice's
    # workspace reads one (n tile, half) after another (a load after a store to c waits for it)
    preload_factors: bool = option_field()

    def __attrs_post_init__(self) -> None:
        if self.preload_factors and (self.row_map or self.fragment_store or self.tile_rows or self.gated):
            raise ValueError("StoreOutput.preload_factors is the dense store's: no row_map, fragment_store, "
                             "tile_rows or gated")
        if self.row_map and self.fragment_store:
            raise ValueError("StoreOutput.row_map (MoE) is not combined with fragment_store")
        if self.gated not in ("", "silu_mul", "gelu_mul", "swiglu_oai"):
            raise ValueError(f"StoreOutput.gated={self.gated!r}; allowed: '', 'silu_mul', 'gelu_mul', 'swiglu_oai'")
        c_order = (self.atom.m, self.atom.c_row_expr) == (MMA_SYNC_M16N8K16.m, MMA_SYNC_M16N8K16.c_row_expr)
        if self.gated and (not self.row_map or not c_order):
            raise ValueError("StoreOutput.gated needs row_map (MoE GEMM1) and the mma.sync accumulator order (rows g "
                             "and g + 8 of a 16-row tile)")
        if self.topk_weight and not self.row_map:
            raise ValueError("StoreOutput.topk_weight needs row_map (an MoE kernel)")
        if self.token_scale not in ("", "token", "tensor"):
            raise ValueError(f"StoreOutput.token_scale must be '', 'token' or 'tensor', got {self.token_scale!r}")
        if self.token_scale_smem and (self.token_scale != "token" or self.row_map):
            raise ValueError("StoreOutput.token_scale_smem needs token_scale='token' and no row_map (dense)")
        if self.tile_rows and not self.row_map:
            raise ValueError("StoreOutput.tile_rows needs row_map (MoE)")

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        token = ({"assignment_token", "assignment_token_magic"} if self.row_map and self.token_scale == "token"
                 else set())
        return frozenset({"store_fragment" if self.fragment_store else "store_output"}
                         | ({"gated_activation"} if self.gated else set()) | token
                         | ({"ColumnFactors", "column_factors"} if self.preload_factors else set()))

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("cvt_scalar",) if (self.bias or self.out_dtype != "float32") else ()

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"Params"} | ({"TokenScalesSmem"} if self.token_scale_smem else set())
                         | ({"from_float"} if self.out_dtype != "float32" else set())
                         | ({"to_float"} if self.bias else set()))

    def extra_context(self) -> dict:
        # row-mapped per-token scales are looked up once per token column, beside the rows (token_scales[mt][j])
        row_token_scale = self.row_map and self.token_scale == "token"
        token = {"": "", "token": " * a_scale[m]", "tensor": " * a_scale"}[self.token_scale]
        fragment_suffix = (" * scale" if self.out_scale else "") + token + (" + bias" if self.bias else "")
        if self.token_scale == "token":  # whole tiles: loaded beside the rows, or all before the stores
            token = " * token_scales[mt][j]"
        suffix = (" * scale" if self.out_scale else "") + token + (" + bias" if self.bias else "")
        decl = {"": "", "token": "const float* a_scale = static_cast<const float*>(p.a_scale);  // [m]",
                "tensor": "const float a_scale = *static_cast<const float*>(p.a_scale);"}[self.token_scale]
        if self.token_scale_smem:
            decl = "const TokenScalesSmem a_scale{};  // [m]: the scales the loader computed, in shared memory"
        value = "acc[nt][mt][2 * half + j]" + suffix
        gated_value = "gated_activation(gate, up)"
        if self.topk_weight:
            value = f"({value}) * weights[mt][j]"
            gated_value += " * weights[mt][j]"
        gate_suffix = (" * scale_gate" if self.out_scale else "") + token + (" + bias_gate" if self.bias else "")
        up_suffix = (" * scale_up" if self.out_scale else "") + token + (" + bias_up" if self.bias else "")
        if self.tile_rows:  # per (n tile, half) column scales and biases; a row, its router weight and token scale
            token = {"": "", "token": " * token_scale", "tensor": " * a_scale"}[self.token_scale]
            value = ("acc[nt][mt][2 * half + j]" + (" * scales[nt][half]" if self.out_scale else "") + token
                     + (" + biases[nt][half]" if self.bias else ""))
            value = f"({value}) * weight" if self.topk_weight else value
            gated_value = "gated_activation(gate, up)" + (" * weight" if self.topk_weight else "")
            gate_suffix = ((" * scale_gate[nt]" if self.out_scale else "") + token
                           + (" + bias_gate[nt]" if self.bias else ""))
            up_suffix = (" * scale_up[nt]" if self.out_scale else "") + token + (" + bias_up[nt]" if self.bias else "")
        if self.preload_factors:
            value = ("acc[nt][mt][2 * half + j]" + (" * f.scales[nt][half]" if self.out_scale else "") + token
                     + (" + f.biases[nt][half]" if self.bias else ""))
        return {"out_ctype": _OUT_CTYPE[self.out_dtype], "value_expr": value,
                "fragment_value_expr": "v[2 * half + j]" + fragment_suffix, "c_row": self.atom.c_row_expr,
                "c_col": self.atom.c_col_expr, "atom_rows": self.atom.m,
                "out_convert": "" if self.out_dtype == "float32" else "from_float", "a_scale_decl": decl,
                "row_token_scale": row_token_scale, "gated_value": gated_value, "gate_suffix": gate_suffix,
                "up_suffix": up_suffix, "swiglu_alpha": SWIGLU_ALPHA, "swiglu_limit": SWIGLU_LIMIT}


@attrs.frozen
class StoreOutputStaged(StoreOutput):
    """StoreOutput through the warp's staging buffer in shared memory: stmatrix.trans lays its fragments out as
    token rows, then 16-byte stores write them (one store per 8 values instead of one per value). For the
    warp-specialized consumers' whole tiles of 16-bit outputs (tile_rows' chunked lookups for MoE;
    pipelines.warp_specialized.compose.staged_store says which)."""

    template: ClassVar[str] = "epilogue/store_output_staged.cuh.j2"
    # routed rows: each chunk's assignment rows and factors are read one chunk ahead, before the previous chunk's
    # stores to c, behind which they would wait in program order (pipelines.warp_specialized.compose.
    # PREFETCH_CHUNK_ROWS)
    prefetch_rows: bool = option_field()

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.fragment_store:
            raise ValueError("StoreOutputStaged stores whole tiles: fragment_store is StoreOutput's")
        if self.prefetch_rows and not self.row_map:
            raise ValueError("StoreOutputStaged.prefetch_rows reads routed rows ahead: it needs row_map")
        if self.out_dtype not in ("bfloat16", "float16"):
            raise ValueError(f"StoreOutputStaged stages 16-bit outputs, not out_dtype={self.out_dtype!r}")

    def extra_context(self) -> dict:
        context = super().extra_context()
        # a routed chunk's lookups beyond its rows of c: router weights and / or per-token scales of the rows read
        row_factors = self.topk_weight or context["row_token_scale"]
        # the lane's token column pair (t): the chunk lookups and per-token scales read it
        lane_t = (self.row_map and (row_factors or not self.prefetch_rows)) or self.token_scale == "token"
        return {**context, "row_factors": row_factors, "lane_t": lane_t}

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return super().ptx + ("stmatrix_x1" if self.gated else "stmatrix_x2",)

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return super().needs | {"stmatrix_x1_trans" if self.gated else "stmatrix_x2_trans"}


@attrs.frozen
class StoreOutputRows(Component):
    """The store of accumulators whose rows are tokens (wgmma with the tokens on M, TuningConfig.tokens_on='m'):
    adjacent columns of a row sit in one thread, so a pair of outputs is one store and a token's scale one value per
    row. Dense, whole tiles: per-column fp32 scale, per-token or per-tensor activation scale, bias."""

    template: ClassVar[str] = "epilogue/store_output_rows.cuh.j2"
    family: ClassVar[str] = "epilogue"
    provides: ClassVar[frozenset[str]] = frozenset({"store_output"})
    dtype: str
    out_dtype: str
    out_scale: bool
    bias: bool
    token_scale: str = ""  # "token" (p.a_scale[m]), "tensor" (p.a_scale[0]) or "" (group scales: promoted)

    def __attrs_post_init__(self) -> None:
        if self.token_scale not in ("", "token", "tensor"):
            raise ValueError(f"StoreOutputRows.token_scale must be '', 'token' or 'tensor', got {self.token_scale!r}")

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("cvt_scalar",) if (self.bias or self.out_dtype != "float32") else ()

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"Params"} | ({"from_float"} if self.out_dtype != "float32" else set())
                         | ({"to_float"} if self.bias else set()))

    def extra_context(self) -> dict:
        token = {"": "", "token": " * token[h]", "tensor": " * a_scale"}[self.token_scale]
        value = ("acc[j][2 * h + e]" + (" * scale[jc][e]" if self.out_scale else "") + token
                 + (" + bias[jc][e]" if self.bias else ""))
        return {"out_ctype": _OUT_CTYPE[self.out_dtype], "value_expr": value,
                "out_convert": "" if self.out_dtype == "float32" else "from_float"}

"""The MoE torch.library ops (`humming_gen::fused_moe`, `fused_moe_out`, `moe_gemm`) and their Python entry points
`humming_gen.fused_moe` (vLLM `fused_experts` style) and `humming_gen.moe_gemm` (one GEMM on a caller's routing).

As for `humming_gen::gemm` (layer/ops.py), an op names its QuantMoE by an int id in the process-wide registry of
weak references: the layer's kernels, launchers and the bucket choice (token tile from M, top_k and E, as SGLang
wraps its whole MoE so that the tile choice stays out of the traced graph) cannot be op arguments. The fake
implementations give shapes from M, top_k and the layer alone, so torch.compile traces one graph for every M, and
the real ones never read device data on the host (CUDA graphs replay with new routing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from humming_gen.layer.eager import direct_call
from humming_gen.layer.ops import _LAYERS

if TYPE_CHECKING:
    from humming_gen.layer.moe import QuantMoE

LAYOUTS = ("indexed", "grouped_contiguous", "grouped_masked")


class _Routing(NamedTuple):
    """The three routing tensors an indexed kernel reads (a MoeAlignment's first three fields)."""

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_tokens_post_pad: torch.Tensor


def get_moe(layer_id: int) -> "QuantMoE":
    """The live QuantMoE registered under `layer_id`, or a ValueError naming the id."""
    from humming_gen.layer.moe import QuantMoE

    ref = _LAYERS.get(layer_id)
    layer = ref() if ref is not None else None
    if not isinstance(layer, QuantMoE):
        raise ValueError(f"humming_gen MoE op: layer_id {layer_id} names no live QuantMoE in this process (ids come "
                         f"from QuantMoE construction and end with the layer)")
    return layer


# --- the whole layer -----------------------------------------------------------------------------------------
@torch.library.custom_op("humming_gen::fused_moe", mutates_args=())
def _fused_moe_op(x: torch.Tensor, layer_id: int, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  expert_map: torch.Tensor | None) -> torch.Tensor:
    """(M, H) output of QuantMoE `layer_id`: routing, both GEMMs, activation and the top-k sum."""
    return get_moe(layer_id).run(x, topk_weights, topk_ids, expert_map)


@_fused_moe_op.register_fake
def _fused_moe_fake(x: torch.Tensor, layer_id: int, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                    expert_map: torch.Tensor | None) -> torch.Tensor:
    layer = get_moe(layer_id)
    layer.check_input(x, topk_weights, topk_ids, expert_map)
    return x.new_empty(x.shape[0], layer.hidden)


@torch.library.custom_op("humming_gen::fused_moe_out", mutates_args=("out",))
def _fused_moe_out_op(x: torch.Tensor, out: torch.Tensor, layer_id: int, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, expert_map: torch.Tensor | None) -> None:
    """fused_moe written into a caller's (M, H) tensor."""
    layer = get_moe(layer_id)
    layer.check_out(x, out)
    layer.run(x, topk_weights, topk_ids, expert_map, out=out)


@_fused_moe_out_op.register_fake
def _fused_moe_out_fake(x: torch.Tensor, out: torch.Tensor, layer_id: int, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor, expert_map: torch.Tensor | None) -> None:
    layer = get_moe(layer_id)
    layer.check_input(x, topk_weights, topk_ids, expert_map)
    layer.check_out(x, out)


def fused_moe(x: torch.Tensor, layer: "QuantMoE", topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
              expert_map: torch.Tensor | None = None, apply_router_weight_on_input: bool = False,
              global_num_experts: int = -1, routed_scaling_factor: float | None = None,
              output: torch.Tensor | None = None) -> torch.Tensor:
    """A whole MoE layer with the arguments of vLLM's `fused_experts` where they mean the same thing.

    x: (M, H) hidden states of the layer's dtype. layer: a QuantMoE (its weights, activation and gate/up layout
    stand in for vLLM's w1 / w2 / activation). topk_weights, topk_ids: (M, top_k) from the router.
    expert_map: (global_num_experts,) global id -> local expert, -1 for experts of other ranks (ids are then
        global). Skipped assignments (-1 ids, other ranks' experts) add nothing; a token with none left gives 0.
    apply_router_weight_on_input: scale x by the router weight before GEMM1 instead of the down GEMM's output
        (top_k must be 1, as in vLLM; the activation is not linear, so the two differ).
    global_num_experts: vLLM's meaning; -1 = the layer's experts (no map) or len(expert_map). Only checked.
    routed_scaling_factor: multiplies the router weights (DeepSeek's routed_scaling_factor).
    output: optional (M, H) tensor of the layer's dtype to write into (vLLM's inplace=True passes x here).
    Returns the (M, H) output (`output` when given). Not served (and not arguments): vLLM's quant_config (the
    layer's scheme decides), activation (the layer's), w1_zp, a1_scale / a2_scale (a layer whose scheme quantizes
    activations quantizes x and the intermediate itself, with its weights' input_scale where static).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    _check_layer(layer)
    layer.check_input(x, topk_weights, topk_ids, expert_map)
    if not isinstance(global_num_experts, int) or isinstance(global_num_experts, bool):
        raise TypeError(f"global_num_experts must be an int, got {type(global_num_experts).__name__}")
    expected = layer.num_experts if expert_map is None else expert_map.shape[0]
    if global_num_experts not in (-1, expected):
        where = "len(expert_map)" if expert_map is not None else "the layer's local experts (no expert_map)"
        raise ValueError(f"global_num_experts={global_num_experts}; allowed: -1 or {expected} ({where})")
    if apply_router_weight_on_input:
        if topk_ids.shape[1] != 1:
            raise ValueError(f"apply_router_weight_on_input=True needs top_k == 1 (as in vLLM), got top_k = "
                             f"{topk_ids.shape[1]}")
        x = (x * topk_weights.to(x.dtype)).to(x.dtype)
        topk_weights = torch.ones_like(topk_weights, dtype=torch.float32)
    if routed_scaling_factor is not None:
        if not isinstance(routed_scaling_factor, (int, float)) or isinstance(routed_scaling_factor, bool):
            raise TypeError(f"routed_scaling_factor must be a float or None, got {routed_scaling_factor!r}")
        topk_weights = topk_weights.to(torch.float32) * float(routed_scaling_factor)
    if direct_call(x, topk_weights, topk_ids, expert_map, output):  # the op's body without its dispatch
        if output is not None:
            layer.check_out(x, output)
        return layer.run(x, topk_weights, topk_ids, expert_map, out=output)
    if output is None:
        return torch.ops.humming_gen.fused_moe(x, layer._op_id, topk_weights, topk_ids, expert_map)
    torch.ops.humming_gen.fused_moe_out(x, output, layer._op_id, topk_weights, topk_ids, expert_map)
    return output


# --- one GEMM on a caller's routing --------------------------------------------------------------------------
@torch.library.custom_op("humming_gen::moe_gemm", mutates_args=("out",))
def _moe_gemm_op(a: torch.Tensor, out: torch.Tensor, layer_id: int, weight: str, sorted_ids: torch.Tensor,
                 expert_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor, top_k: int, block_m: int,
                 topk_weights: torch.Tensor | None) -> None:
    """Indexed GEMM `weight` of QuantMoE `layer_id` into `out`; only the routed assignment rows are written."""
    layer = get_moe(layer_id)
    _check_gemm(layer, a, out, weight, sorted_ids, expert_ids, num_tokens_post_pad, top_k, block_m, topk_weights)
    if out.shape[0] == 0:
        return
    if a.stride(1) != 1 or a.stride(0) % 8 or a.data_ptr() % 16:
        a = a.contiguous()  # the kernel reads rows in 16-byte pieces
    launcher = layer.launcher_for(weight, out.shape[0], block_m)
    if weight == "w2":
        topk_weights = (torch.ones(out.shape[0], dtype=torch.float32, device=out.device) if topk_weights is None
                        else topk_weights.to(torch.float32).contiguous().reshape(-1))
    a, a_scale = layer.gemm_input(a, layer.gemm_index(weight))  # codes and scales where the scheme quantizes a
    launcher.moe(a, out, _Routing(sorted_ids, expert_ids, num_tokens_post_pad), top_k, topk_weights, a_scale=a_scale)


@_moe_gemm_op.register_fake
def _moe_gemm_fake(a: torch.Tensor, out: torch.Tensor, layer_id: int, weight: str, sorted_ids: torch.Tensor,
                   expert_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor, top_k: int, block_m: int,
                   topk_weights: torch.Tensor | None) -> None:
    _check_gemm(get_moe(layer_id), a, out, weight, sorted_ids, expert_ids, num_tokens_post_pad, top_k, block_m,
                topk_weights)


def _check_layer(layer: object) -> None:
    from humming_gen.layer.moe import QuantMoE

    if not isinstance(layer, QuantMoE):
        raise TypeError(f"layer must be a humming_gen.QuantMoE, got {type(layer).__name__}")


def _check_gemm(layer: "QuantMoE", a: torch.Tensor, out: torch.Tensor, weight: str, sorted_ids: torch.Tensor,
                expert_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor, top_k: int, block_m: int,
                topk_weights: torch.Tensor | None) -> None:
    """Shapes, dtypes and devices only (fake tensors pass): the sizes the kernel's grid reads must exist."""
    layer.gemm_index(weight)  # a known GEMM the layer runs alone
    n, k = (2 * layer.intermediate, layer.hidden) if weight == "w13" else (layer.hidden, layer.intermediate)
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
    if block_m not in layer.block_ms:
        raise ValueError(f"block_m={block_m}: this layer's kernels tile {sorted(set(layer.block_ms))} rows; pad the "
                         f"routing to one of them (layer.block_m(M, top_k) gives the one for a batch)")
    if a.dim() != 2 or a.shape[1] != k or a.dtype != layer.dtype or a.device != layer.device:
        raise ValueError(f"a must be (rows, {k}) {layer.dtype} on {layer.device} for weight {weight!r}, got "
                         f"{tuple(a.shape)} {a.dtype} on {a.device}")
    numel = out.shape[0] if out.dim() == 2 else -1
    if out.dim() != 2 or out.shape[1] != n or out.stride(1) != 1 or out.dtype != layer.dtype or \
            out.device != layer.device:
        raise ValueError(f"out must be (assignments, {n}) {layer.dtype} on {layer.device} with unit column stride "
                         f"for weight {weight!r}, got {tuple(out.shape)} {out.dtype} on {out.device}, strides "
                         f"{out.stride()}")
    if a.shape[0] * top_k != numel:
        raise ValueError(f"out has {numel} rows; expected a.shape[0] * top_k = {a.shape[0]} * {top_k} (one row per "
                         f"assignment m * top_k + j)")
    # the largest padded total any routing can reach (the kernel reads no entry at or past the total it finds)
    need = (numel + min(layer.num_experts, numel) * (block_m - 1)) // block_m * block_m
    for name, t, size in (("sorted_ids", sorted_ids, need), ("expert_ids", expert_ids, need // block_m),
                          ("num_tokens_post_pad", num_tokens_post_pad, 1)):
        if t.dtype != torch.int32 or t.dim() != 1 or not t.is_contiguous() or t.device != layer.device:
            raise ValueError(f"{name} must be a contiguous 1-D int32 tensor on {layer.device}, got {t.dtype} "
                             f"{tuple(t.shape)} on {t.device}")
        if t.shape[0] < size:
            raise ValueError(f"{name} has {t.shape[0]} entries; routing {numel} assignments to {layer.num_experts} "
                             f"experts in tiles of {block_m} can fill {size}")
    if weight == "w13" and topk_weights is not None:
        raise ValueError("topk_weights: the gate/up GEMM (w13) does not multiply by router weights; pass None")
    if topk_weights is not None:
        if not topk_weights.is_floating_point() or topk_weights.numel() != numel or \
                topk_weights.device != layer.device:
            raise ValueError(f"topk_weights must be a float tensor of {numel} elements (one per assignment) on "
                             f"{layer.device}, got {topk_weights.dtype} {tuple(topk_weights.shape)} on "
                             f"{topk_weights.device}")


def moe_gemm(a: torch.Tensor, layer: "QuantMoE", weight: str, sorted_ids: torch.Tensor, expert_ids: torch.Tensor,
             num_tokens_post_pad: torch.Tensor, *, top_k: int, block_m: int,
             topk_weights: torch.Tensor | None = None, out: torch.Tensor | None = None,
             layout: str = "indexed") -> torch.Tensor:
    """One MoE GEMM of `layer` on routing the caller brings (vLLM's moe_align_block_size or humming_gen.moe_align
    outputs): for every assignment i listed in sorted_ids below num_tokens_post_pad, in a block of expert e,
    out[i] = a[i // top_k] @ W[e]^T (+ bias[e]), times topk_weights[i] for the down GEMM.

    weight: "w13" (gate/up, (E, 2I, H); a layer built with fused_activation=False) or "w2" (down, (E, H, I); it
        always multiplies by the router weight: topk_weights None means 1). a: (M, K) rows, read through the
        routing. out: (M * top_k, N), allocated when None; rows of skipped assignments are not written.
    sorted_ids / expert_ids / num_tokens_post_pad: int32, padded per expert to `block_m`, which must be one of the
        layer's tiles (`layer.block_m(M, top_k)` is the one its own forward uses); sentinel entries hold
        M * top_k; at least M * top_k + min(E, M * top_k) * (block_m - 1) (floored to block_m) entries, as vLLM's
        moe_align_block_size allocates; entries at or past the total are not read.
    A layer whose scheme quantizes activations quantizes `a` first (per row; a dynamic per-tensor scale is the
    amax of every row of `a`, so rows the routing skips should hold zeros or real values).
    layout: "indexed"; the grouped layouts (pre-permuted segments, DeepEP's [E, max_m, K]) take no sorted ids:
        use `grouped_moe_gemm`.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; allowed: {LAYOUTS}")
    if layout != "indexed":
        raise ValueError(f"layout={layout!r} takes per-expert counts or offsets, not sorted ids: call "
                         f"humming_gen.grouped_moe_gemm(a, layer, weight, expert_layout, layout={layout!r})")
    _check_layer(layer)
    for name, t in (("a", a), ("sorted_ids", sorted_ids), ("expert_ids", expert_ids),
                    ("num_tokens_post_pad", num_tokens_post_pad)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
    layer.gemm_index(weight)
    if out is None:
        out = a.new_empty(a.shape[0] * top_k, 2 * layer.intermediate if weight == "w13" else layer.hidden)
    torch.ops.humming_gen.moe_gemm(a, out, layer._op_id, weight, sorted_ids, expert_ids, num_tokens_post_pad,
                                   top_k, block_m, topk_weights)
    return out


def grouped_moe_gemm(a: torch.Tensor, layer: "QuantMoE", weight: str, expert_layout: torch.Tensor, *, layout: str,
                     out: torch.Tensor | None = None, pipeline: str | None = None,
                     expected_m: int | None = None) -> torch.Tensor:
    """One MoE GEMM of `layer` on rows already grouped by expert (no router weights: the caller's combine applies
    them). Eager only; its kernel compiles on the first call of each (weight, layout, tile).

    layout="grouped_masked": a (E, max_m, K) (DeepEP low-latency dispatch), expert_layout (E,) int32 rows in use per
        expert; out (E, max_m, N), rows past an expert's count not written.
    layout="grouped_contiguous": a (R, K) with expert e's rows [expert_layout[e], expert_layout[e + 1]) (E + 1
        int32 offsets, DeepGEMM's contiguous layout without padding); out (R, N). The offsets must start at 0 and
        never decrease, the last at most R: they stay on the GPU (no host sync), so they are not checked, and
        overlapping windows would have two experts write the same rows (the warp-specialized kernels clamp every
        window to [0, R]; the standard ones take the offsets as given).
    weight: "w13" (N = 2I; a layer built with fused_activation=False) or "w2" (N = H).
    A layer whose scheme quantizes activations quantizes the rows of `a` first (a dynamic per-tensor scale is
    refused for grouped_masked: its amax would read the rows past the counts).
    pipeline: None (the layer's pipeline=, else warp-specialized on sm_90a from 17 rows per expert, W8A8 layers at
    any count), "standard" or "warp_specialized" (QuantMoE.grouped_launcher).
    expected_m: the rows per expert expected in use (DeepGEMM's m_grouped_*_masked hint); it picks the token tile
        and pipeline. None: max_m (grouped_masked) or R / E (grouped_contiguous), the buffer's rows, as the counts
        and offsets stay on the GPU; a buffer sized for the worst case but mostly empty then gets the largest tile.
        Only a hint: every kernel walks all m blocks of each expert's rows up to its count, so any value gives the
        same result.
    """
    if layout not in ("grouped_masked", "grouped_contiguous"):
        raise ValueError(f"layout={layout!r}; allowed: 'grouped_masked', 'grouped_contiguous' (sorted ids: moe_gemm)")
    if expected_m is not None and (not isinstance(expected_m, int) or isinstance(expected_m, bool) or expected_m < 1):
        raise ValueError(f"expected_m={expected_m!r}; allowed: None or an int >= 1 (the rows per expert expected in "
                         f"use, which picks the token tile)")
    _check_layer(layer)
    index = layer.gemm_index(weight)
    e = layer.num_experts
    n, k = (2 * layer.intermediate, layer.hidden) if weight == "w13" else (layer.hidden, layer.intermediate)
    for name, t in (("a", a), ("expert_layout", expert_layout)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != layer.device:
            raise ValueError(f"{name} is on {t.device}; the layer is on {layer.device}")
    if a.dtype != layer.dtype or not a.is_contiguous():
        raise ValueError(f"a must be a contiguous {layer.dtype} tensor, got {a.dtype} with strides {a.stride()}")
    want = (e,) if layout == "grouped_masked" else (e + 1,)
    if expert_layout.dtype != torch.int32 or tuple(expert_layout.shape) != want or not expert_layout.is_contiguous():
        raise ValueError(f"expert_layout must be a contiguous int32 tensor of shape {want} for {layout}, got "
                         f"{expert_layout.dtype} {tuple(expert_layout.shape)}")
    if layout == "grouped_masked":
        if a.dim() != 3 or a.shape[0] != e or a.shape[2] != k:
            raise ValueError(f"a must be (E={e}, max_m, K={k}) for grouped_masked, got {tuple(a.shape)}")
        rows, per_expert = a.shape[0] * a.shape[1], a.shape[1]
        shape = (e, a.shape[1], n)
    else:
        if a.dim() != 2 or a.shape[1] != k:
            raise ValueError(f"a must be (R, K={k}) for grouped_contiguous, got {tuple(a.shape)}")
        rows, per_expert = a.shape[0], -(-a.shape[0] // e)
        shape = (a.shape[0], n)
    if out is None:
        out = a.new_empty(shape)
    elif tuple(out.shape) != shape or out.dtype != layer.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {layer.dtype} tensor of shape {shape}, got {out.dtype} "
                         f"{tuple(out.shape)}")
    act = layer.activation_schemes[index]
    if layout == "grouped_masked" and act is not None and act.granularity == "tensor" and \
            layer._static_scales[index] is None:
        raise ValueError(f"layout='grouped_masked' with a dynamic per-tensor activation scale ({act.dtype.name}): "
                         f"its amax would read the rows past each expert's count; use grouped_contiguous or a "
                         f"static input_scale")
    if rows:
        launcher = layer.grouped_launcher(weight, layout, per_expert if expected_m is None else expected_m, pipeline)
        codes, a_scale = layer.gemm_input(a.reshape(rows, k), index)
        launcher.grouped(codes, out.view(rows, n), expert_layout, a_scale=a_scale)
    return out

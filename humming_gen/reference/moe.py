"""References of the MoE path: routing (`moe_align_reference`, integer, the exact outputs of the moe_align kernels)
and a float64 MoE forward (`reference_fused_moe`: two expert GEMMs, a gated activation, the weighted top-k sum)."""

from __future__ import annotations

from typing import NamedTuple

import torch

ACTIVATIONS = ("silu_mul", "gelu_mul", "swiglu_oai")
GATE_UP_LAYOUTS = ("split", "interleaved", "up_first")


class MoeAlignment(NamedTuple):
    """Routing of M x topk assignments (index i = m * topk + j) to experts, padded per expert to block_m rows.

    sorted_ids (max_padded,) int32: assignment indices grouped by local expert, in assignment order within an
        expert, each expert's run padded to a multiple of block_m with numel = M * topk; numel past the total too.
    expert_ids (max_padded / block_m,) int32: the local expert of each block of block_m entries, -1 past the total.
    num_tokens_post_pad (1,) int32: the padded total (the used length of sorted_ids).
    expert_offsets (E + 1,) int32: padded start of each expert's run; expert_offsets[E] = the padded total.
    expert_counts (E,) int32: assignments per local expert (unpadded).
    inverse (numel,) int32: position of each assignment in sorted_ids; -1 for skipped assignments.
    """

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_tokens_post_pad: torch.Tensor
    expert_offsets: torch.Tensor
    expert_counts: torch.Tensor
    inverse: torch.Tensor


def max_padded_size(numel: int, num_experts: int, block_m: int) -> int:
    """Length of sorted_ids for any routing: every used expert adds at most block_m - 1 padding rows, and at most
    min(E, numel) experts are used; rounded up to whole blocks."""
    # integer ops only: M may be symbolic (torch.sym_min for a SymInt; min, cheaper, for ints)
    used = min(num_experts, numel) if type(numel) is int else torch.sym_min(num_experts, numel)
    bound = numel + used * (block_m - 1)
    return (bound + block_m - 1) // block_m * block_m


def local_experts(topk_ids: torch.Tensor, num_experts: int, expert_map: torch.Tensor | None = None) -> torch.Tensor:
    """(numel,) int64 local expert of each assignment, -1 where skipped: an id outside [0, num_ids) (num_ids =
    len(expert_map) with a map, else num_experts), or a map entry outside [0, num_experts)."""
    ids = topk_ids.reshape(-1).long()
    num_ids = expert_map.numel() if expert_map is not None else num_experts
    valid = (ids >= 0) & (ids < num_ids)
    local = ids.clamp(0, max(num_ids - 1, 0))
    if expert_map is not None:
        local = expert_map.long().to(ids.device)[local] if num_ids else local
        valid &= (local >= 0) & (local < num_experts)
    return torch.where(valid, local, torch.full_like(local, -1))


def moe_align_reference(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                        expert_map: torch.Tensor | None = None) -> MoeAlignment:
    """The outputs of humming_gen.moe_align, in torch (any device; it syncs, so tests only)."""
    numel = topk_ids.numel()
    device = topk_ids.device
    local = local_experts(topk_ids, num_experts, expert_map)
    valid = local >= 0
    counts = torch.bincount(local[valid], minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    offsets[1:] = torch.cumsum(padded, 0)
    starts = torch.cumsum(counts, 0) - counts  # unpadded start of each expert among the kept assignments
    key = torch.where(valid, local, torch.full_like(local, num_experts))
    order = torch.sort(key, stable=True).indices[: int(valid.sum())]  # kept assignments by expert, in order
    experts = local[order]
    positions = offsets[experts] + torch.arange(order.numel(), device=device) - starts[experts]
    max_padded = max_padded_size(numel, num_experts, block_m)
    sorted_ids = torch.full((max_padded,), numel, dtype=torch.int64, device=device)
    sorted_ids[positions] = order
    inverse = torch.full((numel,), -1, dtype=torch.int64, device=device)
    inverse[order] = positions
    total = offsets[-1]
    block_starts = torch.arange(max_padded // block_m, device=device) * block_m
    expert_ids = torch.searchsorted(offsets, block_starts, right=True) - 1
    expert_ids = torch.where(block_starts < total, expert_ids, torch.full_like(expert_ids, -1))
    i32 = torch.int32
    return MoeAlignment(sorted_ids.to(i32), expert_ids.to(i32), total.reshape(1).to(i32), offsets.to(i32),
                        counts.to(i32), inverse.to(i32))


TOPK_SUM_ACCUMULATORS = 4  # torch.sum's CUDA reduction: vt0 = 4 accumulators per thread (ATen/native/cuda/Reduce.cuh)


def topk_sum_reference(y: torch.Tensor, inverse: torch.Tensor, top_k: int, dtype: torch.dtype,
                       accumulators: int = TOPK_SUM_ACCUMULATORS) -> torch.Tensor:
    """(M, H) `dtype`: each token's top_k rows of y ((M * top_k, H), assignment i = m * top_k + j) summed in fp32
    in the order of QuantMoE's top-k reduction, slots whose assignment was skipped (inverse[i] < 0, moe_align's
    mark) left out, then rounded to `dtype`; the rows of skipped slots are never read (any value, NaN included).

    The order, bit for bit, is that of torch.sum(y.view(M, top_k, H), dim=1, dtype=torch.float32) on CUDA over
    rows where skipped slots hold zeros (the torch path QuantMoE took before its reduction kernel): slot j adds
    into accumulator j % `accumulators` (each starting at +0.0, the sum's identity), and the accumulators are added
    in order at the end, (((a0 + a1) + a2) + a3). For top_k <= 4 that is plain slot order. Leaving a zero row out
    changes no bit: an accumulator that starts at +0.0 is never -0.0, and x + 0.0 == x for every other x.
    Elementwise fp32 adds only, so the result is the same on any device (tests compare the kernel with it)."""
    m = inverse.numel() // top_k if top_k else 0
    rows = y.reshape(m, top_k, y.shape[-1])
    keep = (inverse.reshape(m, top_k) >= 0).to(rows.device)
    zero = torch.zeros((), dtype=torch.float32, device=rows.device)
    acc = [torch.zeros(m, y.shape[-1], dtype=torch.float32, device=rows.device) for _ in range(max(accumulators, 1))]
    for j in range(top_k):
        term = torch.where(keep[:, j, None], rows[:, j].float(), zero)
        acc[j % accumulators] = acc[j % accumulators] + term
    total = acc[0]
    for a in acc[1:]:
        total = total + a
    return total.to(dtype)


def weighted_topk_sum_reference(y: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, top_k: int,
                                dtype: torch.dtype, accumulators: int = TOPK_SUM_ACCUMULATORS) -> torch.Tensor:
    """(M, H) `dtype`: slot j of token m adds weights[i] * y[rows[i]] (i = m * top_k + j; the product in fp32,
    rounded), in topk_sum_reference's order; slots with rows[i] < 0 left out (no row read). The bits of QuantMoE's
    weighted top-k reduction (humming_gen.moe.reduce.weighted_topk_reduce), on any device."""
    m = rows.numel() // top_k if top_k else 0
    index = rows.reshape(m, top_k).long().to(y.device)
    keep = index >= 0
    w = weights.reshape(m, top_k).to(device=y.device, dtype=torch.float32)
    zero = torch.zeros((), dtype=torch.float32, device=y.device)
    acc = [torch.zeros(m, y.shape[-1], dtype=torch.float32, device=y.device) for _ in range(max(accumulators, 1))]
    if not y.shape[0]:  # every slot skipped: nothing to read
        y = torch.zeros(1, y.shape[-1], dtype=y.dtype, device=y.device)
    for j in range(top_k):
        term = torch.where(keep[:, j, None], w[:, j, None] * y[index[:, j].clamp(min=0)].float(), zero)
        acc[j % accumulators] = acc[j % accumulators] + term
    total = acc[0]
    for a in acc[1:]:
        total = total + a
    return total.to(dtype)


def gated_activation(h: torch.Tensor, activation: str = "silu_mul", gate_up_layout: str = "split",
                     swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0) -> torch.Tensor:
    """(..., 2I) -> (..., I): gate and up taken from h as `gate_up_layout` stores them ("split": [gate; up],
    vLLM's w13 order; "interleaved": g0, u0, g1, u1, ... as gpt-oss checkpoints; "up_first": [up; gate]), then
    silu(gate) * up, gelu(gate) * up (erf form), or gpt-oss's swiglu: gate clamped to <= limit, up to
    [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: got {activation!r}; allowed: {ACTIVATIONS}")
    if gate_up_layout not in GATE_UP_LAYOUTS:
        raise ValueError(f"gate_up_layout: got {gate_up_layout!r}; allowed: {GATE_UP_LAYOUTS}")
    if h.shape[-1] % 2:
        raise ValueError(f"gated activation needs an even width (gate and up), got {h.shape[-1]}")
    half = h.shape[-1] // 2
    if gate_up_layout == "split":
        gate, up = h[..., :half], h[..., half:]
    elif gate_up_layout == "up_first":
        up, gate = h[..., :half], h[..., half:]
    else:
        gate, up = h[..., 0::2], h[..., 1::2]
    if activation == "silu_mul":
        return torch.nn.functional.silu(gate) * up
    if activation == "gelu_mul":
        return torch.nn.functional.gelu(gate) * up
    gate = gate.clamp(max=swiglu_limit)
    up = up.clamp(-swiglu_limit, swiglu_limit)
    return (up + 1) * gate * torch.sigmoid(swiglu_alpha * gate)


def routed_rows_gemm(a: torch.Tensor, w: torch.Tensor, experts: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """Row i of the result is a[i] @ w[experts[i]]^T (+ bias[experts[i]]) in float64: a (R, K), w (E, N, K), experts
    (R,) local expert ids in [0, E), bias (E, N). One matmul per used expert, so memory stays that of the inputs and
    the (R, N) result (gathering w per row would take R x N x K x 8 bytes: 20 GiB for a 10k-row test case)."""
    if a.dim() != 2 or w.dim() != 3 or experts.shape != (a.shape[0],) or a.shape[1] != w.shape[2]:
        raise ValueError(f"routed_rows_gemm: a (R, K), w (E, N, K), experts (R,); got {tuple(a.shape)}, "
                         f"{tuple(w.shape)}, {tuple(experts.shape)}")
    used = torch.unique(experts).tolist()
    if used and not 0 <= used[0] <= used[-1] < w.shape[0]:
        raise ValueError(f"routed_rows_gemm: experts must lie in [0, {w.shape[0]}) (drop skipped rows first), got "
                         f"ids from {used[0]} to {used[-1]}")
    f64 = torch.float64
    out = torch.empty(a.shape[0], w.shape[1], dtype=f64, device=a.device)
    for e in used:
        rows = torch.nonzero(experts == e, as_tuple=True)[0]
        y = a[rows].to(f64) @ w[e].to(f64).T
        out[rows] = y if bias is None else y + bias[e].to(f64)
    return out


def reference_fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor, *, activation: str = "silu_mul", gate_up_layout: str = "split",
                        expert_map: torch.Tensor | None = None, bias13: torch.Tensor | None = None,
                        bias2: torch.Tensor | None = None, swiglu_alpha: float = 1.702,
                        swiglu_limit: float = 7.0, activation_scheme=None,
                        intermediate_dtype: torch.dtype | None = None, fused_activation: bool = False,
                        activation_static_scales: tuple | None = None) -> torch.Tensor:
    """A whole MoE layer in float64: (M, H) = sum_j topk_weights[m, j] * expert(x[m]) over the kept slots j.

    x (M, H); w13 (E, 2I, H) (gate / up rows as `gate_up_layout` says); w2 (E, H, I); bias13 (E, 2I), bias2
    (E, H); topk_weights, topk_ids (M, topk). expert(x) = act(x @ w13[e]^T + bias13[e]) @ w2[e]^T + bias2[e] with
    e the local expert: topk_ids index expert_map (global -> local, -1 for other ranks' experts) when given, else
    w13 directly. Skipped slots (id -1, out of range, or mapped to -1) add nothing: a token whose slots are all
    skipped gives a zero row. Float weights: quantize them first (QuantizedWeight.dequantize) to check a kernel.
    activation_scheme: an ActivationScheme (quantized activations, W8A8 / W4A8): both GEMM inputs go through
    `activation_scheme.quantize(.).dequantize()`, x as (M, H) and the gated activations as the (M * topk, I) rows
    of every assignment (zero rows for skipped slots, which a per-tensor scale therefore ignores).
    activation_static_scales: (GEMM1's, GEMM2's) static per-tensor activation scale, a checkpoint's input_scale
    (QuantMoE keeps them as `_static_scales`), each None for a dynamic scale: that GEMM's input is quantized with
    `quantize_activation(activation_scheme, ., static_scale)` (granularity "tensor"; saturating at the format's
    largest value).
    intermediate_dtype: the dtype a pipeline stores between its kernels (QuantMoE: the layer's): GEMM1's output
    (unless fused_activation: the activation is applied to it in the epilogue) and the gated activation are
    rounded to it, so that quantizing GEMM2's input sees the values the kernels see. None: float64 throughout.
    """
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"reference_fused_moe: x (M, H), w13 (E, 2I, H), w2 (E, H, I); got {tuple(x.shape)}, "
                         f"{tuple(w13.shape)}, {tuple(w2.shape)}")
    num_experts, two_i, hidden = w13.shape
    if x.shape[1] != hidden or w2.shape != (num_experts, hidden, two_i // 2):
        raise ValueError(f"reference_fused_moe: shapes disagree: x {tuple(x.shape)}, w13 {tuple(w13.shape)}, "
                         f"w2 {tuple(w2.shape)} (want w2 = (E, H, I) with 2I = {two_i})")
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"reference_fused_moe: topk_ids and topk_weights must both be (M, topk) with M = "
                         f"{x.shape[0]}, got {tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
    f64 = torch.float64
    static = tuple(activation_static_scales) if activation_static_scales is not None else (None, None)
    if len(static) != 2 or (any(s is not None for s in static) and activation_scheme is None):
        raise ValueError(f"reference_fused_moe: activation_static_scales must be (GEMM1's, GEMM2's), each a scale or "
                         f"None, with an activation_scheme; got {activation_static_scales!r}")

    def quantized(a: torch.Tensor, gemm: int) -> torch.Tensor:
        from humming_gen.schemes.quantize import quantize_activation

        return quantize_activation(activation_scheme, a, static[gemm]).dequantize(f64)

    local = local_experts(topk_ids, num_experts, expert_map).reshape(topk_ids.shape)
    xd = x.to(f64)
    if activation_scheme is not None:
        xd = quantized(xd, 0)
    m, j = torch.nonzero(local >= 0, as_tuple=True)  # the kept assignments, each with its token and slot
    experts = local[m, j]
    h = routed_rows_gemm(xd[m], w13, experts, bias13)  # GEMM1 and the gated activation per assignment
    if intermediate_dtype is not None and not fused_activation:
        h = h.to(intermediate_dtype).to(f64)
    act = torch.zeros(*topk_ids.shape, two_i // 2, dtype=f64, device=x.device)  # per assignment (m, j)
    act[m, j] = gated_activation(h, activation, gate_up_layout, swiglu_alpha, swiglu_limit)
    if intermediate_dtype is not None:
        act = act.to(intermediate_dtype).to(f64)
    if activation_scheme is not None:
        act = quantized(act.reshape(-1, two_i // 2), 1).reshape(act.shape)
    y = routed_rows_gemm(act[m, j], w2, experts, bias2)  # GEMM2 and the weighted sum
    out = torch.zeros(x.shape[0], hidden, dtype=f64, device=x.device)
    out.index_add_(0, m, topk_weights.to(f64)[m, j, None] * y)
    return out

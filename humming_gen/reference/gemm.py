"""The float64 GEMM oracle: quantized activations x dequantized weights (+ bias), in float64.

Every GPU numerics test compares a kernel against `reference_gemm` / `reference_moe`. The only rounding in
here is the quantization itself (activations by their scheme, weights already quantized); the products and
sums are float64, so the result is the exact value a perfect kernel would produce up to accumulation order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from humming_gen.schemes.quantize import quantize_activation
from humming_gen.schemes.scheme import ActivationScheme, QuantizedWeight

__all__ = ["reference_gemm", "reference_moe", "reference_activation"]


def reference_activation(x: torch.Tensor, qweight: QuantizedWeight, activation: ActivationScheme | None = None,
                         quantize_input: bool = True) -> torch.Tensor:
    """The float64 values a kernel multiplies: x quantized by `activation` (default: the weight scheme's) and
    dequantized, or x itself for 16-bit activations. A checkpoint `input_scale` on `qweight` is used as the
    static scale when the scheme can take one (global scale, or granularity "tensor")."""
    ascheme = activation if activation is not None else qweight.scheme.activation
    if ascheme is None or not quantize_input:
        return x.to(torch.float64)
    static = qweight.input_scale
    if static is not None and not (ascheme.global_scale or ascheme.granularity == "tensor"):
        static = None
    return quantize_activation(ascheme, x, static_scale=static).dequantize(torch.float64)


def _check_k(x: torch.Tensor, k: int, what: str) -> None:
    if x.shape[-1] != k:
        raise ValueError(f"{what} has K = {x.shape[-1]}, the weight has K = {k}")


def reference_gemm(x: "torch.Tensor | Sequence[torch.Tensor]", qweight: QuantizedWeight,
                   bias: torch.Tensor | None = None, activation: ActivationScheme | None = None,
                   quantize_input: bool = True) -> "torch.Tensor | list[torch.Tensor]":
    """y = Q(x) . W^T + bias in float64.

    Dense: x (M, K), qweight (N, K), bias (N,) -> (M, N).
    MoE (qweight (E, N, K), bias (E, N)): x (E, M, K) -> (E, M, N), or a list of E per-expert inputs (M_e, K)
    -> list of (M_e, N). Each expert's input is quantized on its own (matters only for per-tensor scales).
    activation: overrides qweight.scheme.activation (e.g. a target's fallback precision);
    quantize_input=False skips activation quantization (16-bit activations).
    Raises ValueError when K or the expert count disagree.
    """
    w = qweight.dequantize(torch.float64)
    if w.dim() == 2:
        if not isinstance(x, torch.Tensor):
            raise ValueError("reference_gemm: a dense weight takes one (M, K) tensor")
        _check_k(x, qweight.k, "x")
        y = reference_activation(x, qweight, activation, quantize_input) @ w.T
        return y if bias is None else y + bias.to(torch.float64)
    e = w.shape[0]
    if len(x) != e:
        raise ValueError(f"reference_gemm: {len(x)} expert inputs for a weight with {e} experts")
    outs = []
    for i in range(e):
        _check_k(x[i], qweight.k, f"x[{i}]")
        y = reference_activation(x[i], qweight, activation, quantize_input) @ w[i].T
        outs.append(y if bias is None else y + bias[i].to(torch.float64))
    return torch.stack(outs) if isinstance(x, torch.Tensor) else outs


def reference_moe(x: torch.Tensor, qweight: QuantizedWeight, topk_ids: torch.Tensor,
                  topk_weights: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                  activation: ActivationScheme | None = None, quantize_input: bool = True) -> torch.Tensor:
    """Token-routed MoE GEMM in float64.

    x (M, K) is quantized once for all tokens (as a fused MoE kernel does); token m meets experts
    topk_ids[m, j]. Returns sum_j topk_weights[m, j] * (Q(x[m]) . W[e]^T + bias[e]) as (M, N), or, with
    topk_weights=None, the unreduced per-slot outputs (M, topk, N) (what an indexed MoE GEMM writes).
    """
    if qweight.codes.dim() != 3:
        raise ValueError("reference_moe needs an (E, N, K) weight")
    _check_k(x, qweight.k, "x")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"reference_moe: topk_ids must be (M, topk) with M = {x.shape[0]}, "
                         f"got {tuple(topk_ids.shape)}")
    ids = topk_ids.long()
    if ids.numel() and (ids.min() < 0 or ids.max() >= qweight.num_experts):
        raise ValueError(f"reference_moe: topk_ids must lie in [0, {qweight.num_experts}), "
                         f"got range [{int(ids.min())}, {int(ids.max())}]")
    xa = reference_activation(x, qweight, activation, quantize_input)
    w = qweight.dequantize(torch.float64)
    y = torch.zeros(*ids.shape, qweight.n, dtype=torch.float64, device=xa.device)
    for e in torch.unique(ids).tolist():  # one GEMM per used expert: memory stays O(M * topk * N)
        m, j = torch.nonzero(ids == e, as_tuple=True)
        y[m, j] = xa[m] @ w[e].T
        if bias is not None:
            y[m, j] += bias[e].to(torch.float64)
    if topk_weights is None:
        return y
    return (y * topk_weights.to(torch.float64)[..., None]).sum(dim=1)

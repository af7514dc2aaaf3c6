"""reference_fused_moe (float64 MoE layer) against a token-by-token loop; gate/up layouts agree; gpt-oss swiglu's
clamps; expert_map and -1 ids skip their slots (a token with every slot skipped is a zero row)."""

from __future__ import annotations

import math

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import gated_activation
from moe_cases import expert_map, random_ids

M, H, I, E, TOPK = 9, 24, 10, 6, 3


def _weights(seed: int, num_experts: int = E):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(M, H, generator=g), torch.randn(num_experts, 2 * I, H, generator=g) / 4,
            torch.randn(num_experts, H, I, generator=g) / 3, torch.randn(num_experts, 2 * I, generator=g),
            torch.randn(num_experts, H, generator=g), torch.rand(M, TOPK, generator=g))


def _loop(x, w13, w2, weights, ids, table, activation, bias13, bias2, quantize_x=None, quantize_act=None):
    """One token and one slot at a time, split layout, straight from the formula; quantize_x / quantize_act (when
    given) replace x and each gated activation with their quantized values."""
    if quantize_x is not None:
        x = quantize_x(x.double())
    out = torch.zeros(M, H, dtype=torch.float64)
    for m in range(M):
        for j in range(TOPK):
            gid = int(ids[m, j])
            if gid < 0:
                continue
            e = int(table[gid]) if table is not None else gid
            if e < 0:
                continue
            h = w13[e].double() @ x[m].double() + bias13[e].double()
            gate, up = h[:I], h[I:]
            if activation == "silu_mul":
                a = gate / (1 + torch.exp(-gate)) * up
            elif activation == "gelu_mul":
                a = 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2))) * up
            else:
                gc, uc = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
                a = (uc + 1) * gc / (1 + torch.exp(-1.702 * gc))
            if quantize_act is not None:
                a = quantize_act(a)
            out[m] += float(weights[m, j]) * (w2[e].double() @ a + bias2[e].double())
    return out


@pytest.mark.parametrize("activation", ["silu_mul", "gelu_mul", "swiglu_oai"])
@pytest.mark.parametrize("mapped", [False, True])
def test_matches_token_loop(activation, mapped):
    x, w13, w2, b13, b2, weights = _weights(1)
    if activation == "swiglu_oai":
        w13 = w13 * 8  # pre-activations well past the clamp at 7
    table = expert_map(2 * E, E, 1, seed=3) if mapped else None
    ids = random_ids(M, TOPK, 2 * E if mapped else E, seed=4, dropped=0.2)
    ids[2] = -1  # every slot of token 2 dropped: a zero row
    got = hg.reference_fused_moe(x, w13, w2, weights, ids, activation=activation, expert_map=table, bias13=b13,
                                 bias2=b2)
    want = _loop(x, w13, w2, weights, ids, table, activation, b13, b2)
    assert got.dtype == torch.float64 and torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert torch.all(got[2] == 0)


@pytest.mark.parametrize("activation", ["silu_mul", "gelu_mul", "swiglu_oai"])
def test_gate_up_layouts_agree(activation):
    x, w13, w2, b13, b2, weights = _weights(2)
    ids = random_ids(M, TOPK, E, seed=5)
    split = hg.reference_fused_moe(x, w13, w2, weights, ids, activation=activation, bias13=b13, bias2=b2)
    # the same experts stored with up first, and with gate / up rows interleaved (gpt-oss checkpoints)
    up_first = torch.cat([w13[:, I:], w13[:, :I]], dim=1), torch.cat([b13[:, I:], b13[:, :I]], dim=1)
    interleaved = (torch.stack([w13[:, :I], w13[:, I:]], dim=2).reshape(E, 2 * I, H),
                   torch.stack([b13[:, :I], b13[:, I:]], dim=2).reshape(E, 2 * I))
    for layout, (w, b) in (("up_first", up_first), ("interleaved", interleaved)):
        other = hg.reference_fused_moe(x, w, w2, weights, ids, activation=activation, gate_up_layout=layout,
                                       bias13=b, bias2=b2)
        # float64 to the last bits: BLAS may block the reordered rows' products differently (bitwise on one host,
        # not on another)
        assert torch.allclose(other, split, rtol=1e-12, atol=1e-12), layout


def test_swiglu_clamps_gate_above_and_up_both_ways():
    h = torch.tensor([[10.0, -3.0, -10.0, 9.0]], dtype=torch.float64)  # split: gate (10, -3), up (-10, 9)
    got = gated_activation(h, "swiglu_oai")
    sig = lambda v: 1 / (1 + math.exp(-1.702 * v))  # noqa: E731
    want = [(-7 + 1) * 7 * sig(7), (7 + 1) * -3 * sig(-3)]
    assert torch.allclose(got, torch.tensor([want], dtype=torch.float64), rtol=1e-14)


def test_static_per_tensor_activation_scales():
    """activation_static_scales quantizes each GEMM's input with its own fixed per-tensor scale, saturating at e4m3's
    448 (an independent cast to torch.float8_e4m3fn here; scales are powers of two, exact in fp32); small enough
    that part of x and of the gated activations clip. None keeps that GEMM's scale dynamic."""
    x, w13, w2, b13, b2, weights = _weights(5)
    x[0, :3] *= 30  # outliers past 448 * s1
    ids = random_ids(M, TOPK, E, seed=6, dropped=0.2)
    act = hg.scheme("w8a8-fp8-tensor").activation
    s1, s2 = 2.0 ** -7, 2.0 ** -6

    def e4m3(t: torch.Tensor, s: float) -> torch.Tensor:
        return (t / s).clamp(-448, 448).to(torch.float8_e4m3fn).double() * s

    assert (x.abs() > 448 * s1).any()
    got = hg.reference_fused_moe(x, w13, w2, weights, ids, bias13=b13, bias2=b2, activation_scheme=act,
                                 activation_static_scales=(s1, torch.tensor([s2])))
    want = _loop(x, w13, w2, weights, ids, None, "silu_mul", b13, b2, quantize_x=lambda t: e4m3(t, s1),
                 quantize_act=lambda a: e4m3(a, s2))
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    dynamic = hg.reference_fused_moe(x, w13, w2, weights, ids, bias13=b13, bias2=b2, activation_scheme=act)
    assert torch.equal(hg.reference_fused_moe(x, w13, w2, weights, ids, bias13=b13, bias2=b2, activation_scheme=act,
                                              activation_static_scales=(None, None)), dynamic)
    assert not torch.allclose(got, dynamic, rtol=1e-2)
    with pytest.raises(ValueError, match="activation_static_scales must be"):
        hg.reference_fused_moe(x, w13, w2, weights, ids, activation_static_scales=(s1, s2))


@pytest.mark.parametrize("kwargs, message", [
    ({"activation": "relu"}, "activation: got 'relu'"),
    ({"gate_up_layout": "stacked"}, "gate_up_layout: got 'stacked'"),
])
def test_errors(kwargs, message):
    x, w13, w2, _, _, weights = _weights(3)
    ids = random_ids(M, TOPK, E, seed=6)
    with pytest.raises(ValueError, match=message):
        hg.reference_fused_moe(x, w13, w2, weights, ids, **kwargs)
    with pytest.raises(ValueError, match="shapes disagree"):
        hg.reference_fused_moe(x, w13, w2[:, :, :-1], weights, ids)
    with pytest.raises(ValueError, match="must both be"):
        hg.reference_fused_moe(x, w13, w2, weights[:, :2], ids)


def test_routed_rows_gemm_matches_the_gathered_einsum() -> None:
    """One matmul per expert, the same rows as gathering each row's expert weight (what the GPU tests did before,
    at R x N x K x 8 bytes)."""
    from humming_gen.reference.moe import routed_rows_gemm

    g = torch.Generator().manual_seed(5)
    a = torch.randn(37, 24, generator=g).bfloat16()
    w = torch.randn(5, 16, 24, generator=g)
    bias = torch.randn(5, 16, generator=g)
    experts = torch.randint(0, 5, (37,), generator=g)
    experts[:3] = 4  # unsorted, repeated, one expert unused at most by chance
    want = torch.einsum("ak,ank->an", a.double(), w.double()[experts]) + bias.double()[experts]
    got = routed_rows_gemm(a, w, experts, bias)
    assert got.dtype == torch.float64 and torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert torch.allclose(routed_rows_gemm(a, w, experts), want - bias.double()[experts], rtol=1e-12, atol=1e-12)
    assert routed_rows_gemm(a[:0], w, experts[:0]).shape == (0, 16)
    with pytest.raises(ValueError, match=r"experts must lie in \[0, 5\)"):
        routed_rows_gemm(a, w, torch.where(experts == 2, -1, experts))
    with pytest.raises(ValueError, match="a \\(R, K\\), w \\(E, N, K\\)"):
        routed_rows_gemm(a, w[:, :, :8], experts)

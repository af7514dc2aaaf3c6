"""The float64 GEMM oracle against plain float64 matmuls of independently dequantized tensors."""

from __future__ import annotations

import pytest
import torch

from humming_gen.reference import reference_gemm, reference_moe
from humming_gen.schemes.presets import list_presets, preset
from humming_gen.schemes.quantize import quantize_activation
from humming_gen.schemes.scheme import ActivationScheme, QuantScheme
from helpers import random_weight

M, N, K = 7, 37, 300


def _dequant_by_hand(q) -> torch.Tensor:
    """Weight values from codes, scales, zero points and global scale, by explicit loops over scale blocks."""
    s = q.scheme
    v = s.weight.decode(q.codes).double()
    n, k = q.n, q.k
    out = torch.empty(n, k, dtype=torch.float64)
    for i in range(n):
        for j in range(k):
            if s.granularity == "channel":
                a, b = i, 0
            elif s.granularity == "group":
                a, b = i, j // s.group_size
            elif s.granularity == "block":
                a, b = i // s.block_size[0], j // s.block_size[1]
            else:
                a, b = 0, 0
            z = 0.0 if q.zero_points is None else float(q.zero_points[a, b])
            out[i, j] = (float(v[i, j]) - z) * float(q.scales[a, b])
    if q.global_scale is not None:
        out *= float(q.global_scale)
    return out


@pytest.mark.parametrize("name", ["w4a16-int4-g128-zp", "w8a8-fp8-block128", "w4a4-nvfp4"])
def test_dequantize_matches_explicit_loops(name: str) -> None:
    q = preset(name).quantize(random_weight(9, 300, seed=1))
    assert torch.equal(q.dequantize(torch.float64), _dequant_by_hand(q))


@pytest.mark.parametrize("name", list_presets())
def test_reference_gemm_is_plain_matmul_of_dequantized(name: str) -> None:
    scheme = preset(name)
    w = random_weight(N, K, seed=2)
    x = random_weight(M, K, seed=3).to(torch.bfloat16)
    bias = torch.randn(N, dtype=torch.float32)
    q = scheme.quantize(w)
    y = reference_gemm(x, q, bias)
    assert y.dtype == torch.float64 and y.shape == (M, N)
    xa = x.double() if scheme.activation is None else scheme.activation.quantize(x).dequantize(torch.float64)
    expect = xa @ q.dequantize(torch.float64).T + bias.double()
    torch.testing.assert_close(y, expect, rtol=1e-12, atol=1e-12)
    # And it approximates the unquantized product (sanity: the oracle computes the right thing).
    exact = x.double() @ w.double().T + bias.double()
    assert float((y - exact).norm() / exact.norm()) < 0.5


def test_reference_gemm_activation_override_and_16_bit() -> None:
    q = preset("w4a4-nvfp4").quantize(random_weight(N, K, seed=4))
    x = random_weight(M, K, seed=5)
    fp8 = ActivationScheme("float8e4m3")
    y8 = reference_gemm(x, q, activation=fp8)
    torch.testing.assert_close(y8, fp8.quantize(x).dequantize(torch.float64) @ q.dequantize(torch.float64).T,
                               rtol=1e-12, atol=0)
    y16 = reference_gemm(x, q, quantize_input=False)
    torch.testing.assert_close(y16, x.double() @ q.dequantize(torch.float64).T, rtol=1e-12, atol=0)
    assert not torch.equal(y16, reference_gemm(x, q))


def test_reference_gemm_uses_static_input_scale() -> None:
    scheme = QuantScheme("float8e4m3", granularity="tensor", scale_dtype="float32",
                         activation=ActivationScheme("float8e4m3", granularity="tensor"))
    q = scheme.quantize(random_weight(N, K, seed=6))
    q.input_scale = torch.tensor(0.02)
    x = random_weight(M, K, seed=7)
    expect = quantize_activation(scheme.activation, x, static_scale=torch.tensor(0.02)).dequantize(torch.float64)
    torch.testing.assert_close(reference_gemm(x, q), expect @ q.dequantize(torch.float64).T, rtol=1e-12, atol=0)


def test_reference_gemm_k_mismatch() -> None:
    q = preset("w4a16-int4-g128").quantize(random_weight(N, K, seed=8))
    with pytest.raises(ValueError, match="K"):
        reference_gemm(torch.zeros(2, K + 1), q)


def test_reference_gemm_moe_list_and_batched() -> None:
    scheme = preset("w8a8-fp8-channel")
    w = torch.stack([random_weight(N, K, seed=10 + e) for e in range(3)])
    q = scheme.quantize(w)
    bias = torch.randn(3, N)
    xs = [random_weight(m, K, seed=20 + m) for m in (1, 4, 0)]
    ys = reference_gemm(xs, q, bias)
    assert isinstance(ys, list) and [tuple(y.shape) for y in ys] == [(1, N), (4, N), (0, N)]
    dq = q.dequantize(torch.float64)
    for e in range(3):
        xa = scheme.activation.quantize(xs[e]).dequantize(torch.float64)
        torch.testing.assert_close(ys[e], xa @ dq[e].T + bias[e].double(), rtol=1e-12, atol=1e-12)
    xb = torch.stack([random_weight(5, K, seed=30 + e) for e in range(3)])
    yb = reference_gemm(xb, q)
    assert yb.shape == (3, 5, N)
    torch.testing.assert_close(yb[1], reference_gemm(xb[1], scheme.quantize(w[1])), rtol=0, atol=0)
    with pytest.raises(ValueError, match="experts"):
        reference_gemm(xs[:2], q)


@pytest.mark.parametrize("name", ["w4a16-int4-g128", "w4a8-mxfp4-fp8", "w4a4-nvfp4"])
def test_reference_moe_weighted_top_k(name: str) -> None:
    scheme = preset(name)
    e_count, topk = 4, 2
    w = torch.stack([random_weight(N, K, seed=40 + e) for e in range(e_count)])
    q = scheme.quantize(w)
    bias = torch.randn(e_count, N)
    x = random_weight(M, K, seed=50)
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(e_count, generator=g)[:topk] for _ in range(M)])
    weights = torch.softmax(torch.randn(M, topk, generator=g), dim=-1)
    y = reference_moe(x, q, ids, weights, bias)
    assert y.shape == (M, N) and y.dtype == torch.float64
    dq = q.dequantize(torch.float64)
    xa = x.double() if scheme.activation is None else scheme.activation.quantize(x).dequantize(torch.float64)
    for m in range(M):
        expect = sum(float(weights[m, j]) * (xa[m] @ dq[ids[m, j]].T + bias[ids[m, j]].double())
                     for j in range(topk))
        torch.testing.assert_close(y[m], expect, rtol=1e-12, atol=1e-12)
    per_slot = reference_moe(x, q, ids, bias=bias)
    assert per_slot.shape == (M, topk, N)
    torch.testing.assert_close((per_slot * weights.double()[..., None]).sum(1), y, rtol=1e-12, atol=1e-12)


def test_reference_moe_errors() -> None:
    q = preset("w4a16-int4-g128").quantize(torch.stack([random_weight(N, K, seed=e) for e in range(2)]))
    x = random_weight(M, K, seed=9)
    with pytest.raises(ValueError, match="topk_ids"):
        reference_moe(x, q, torch.zeros(M + 1, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="topk_ids"):
        reference_moe(x, q, torch.full((M, 2), 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="E, N, K"):
        reference_moe(x, preset("w4a16-int4-g128").quantize(random_weight(N, K)), torch.zeros(M, 1))

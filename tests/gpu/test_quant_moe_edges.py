"""QuantMoE edge cases from issue 11's correctness list, against the float64 reference MoE: no tokens, one expert,
top-k = E, 257 experts, every token to one expert, over 64k tokens x top-8 (both pipelines: the buckets of many
rows per expert take the warp-specialized kernels on sm_90a), and determinism (the same batch twice gives the same
bits; the top-k sum runs in slot order). Outputs of the layer are fresh per call; GEMM rows are checked elsewhere
(test_quant_moe.py poisons them)."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import reference_fused_moe

pytestmark = pytest.mark.gpu

TOLERANCE = 2e-2  # bf16 activations and intermediates, as test_quant_moe.py


def _layer(e: int, h: int, i: int, scheme: str = "w4a16-int4-g128", seed: int = 0):
    torch.manual_seed(seed)
    s = hg.scheme(scheme)
    q13 = s.quantize(torch.randn(e, 2 * i, h, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(e, h, i, device="cuda") * 0.05)
    return hg.QuantMoE.from_quantized(q13, q2), q13, q2


def _check(moe, q13, q2, x, weights, ids, what: str) -> torch.Tensor:
    out = moe(x, weights, ids)
    assert out.shape == (x.shape[0], moe.hidden) and torch.isfinite(out).all(), what
    ref = reference_fused_moe(x.double(), q13.dequantize().double(), q2.dequantize().double(), weights.double(), ids)
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < TOLERANCE, f"{what}: relative error {err:.3g}"
    return out


def _routing(m: int, e: int, top_k: int):
    weights, ids = torch.topk(torch.softmax(torch.randn(m, e, device="cuda"), -1), top_k, dim=-1)
    return weights, ids.to(torch.int32)


def test_no_tokens() -> None:
    moe, _, _ = _layer(8, 256, 128)
    x = torch.empty(0, 256, device="cuda").bfloat16()
    out = moe(x, torch.empty(0, 2, device="cuda"), torch.empty(0, 2, device="cuda", dtype=torch.int32))
    assert out.shape == (0, 256)


@pytest.mark.parametrize("e,top_k,m", [(1, 1, 300), (3, 3, 128), (257, 8, 128), (19, 2, 4096)])
def test_expert_counts_and_top_k_equal_to_e(e: int, top_k: int, m: int) -> None:
    moe, q13, q2 = _layer(e, 256, 128, seed=e)
    x = torch.randn(m, 256, device="cuda").bfloat16()
    _check(moe, q13, q2, x, *_routing(m, e, top_k), f"E={e} top-{top_k} M={m}")


@pytest.mark.parametrize("m", [7, 4096])
@pytest.mark.parametrize("experts", [(5,), (5, 11)], ids=["one-expert", "the-same-two-experts"])
def test_every_token_to_the_same_experts(m: int, experts: tuple[int, ...]) -> None:
    """All rows go to one expert (top-1) or the same two (top-2); the others are empty: the busy experts' m blocks
    run back to back (the warp-specialized buckets at M = 4096), the rest are skipped."""
    moe, q13, q2 = _layer(16, 256, 256, scheme="w4a16-mxfp4", seed=3)
    x = torch.randn(m, 256, device="cuda").bfloat16()
    ids = torch.stack([torch.full((m,), e) for e in experts], dim=1).to(torch.int32).cuda()
    weights = torch.softmax(torch.randn(m, len(experts), device="cuda"), -1)
    _check(moe, q13, q2, x, weights, ids, f"experts {experts}, M={m}")


def test_over_64k_tokens_top_8_and_determinism() -> None:
    m, e, top_k = 65600, 128, 8
    moe, q13, q2 = _layer(e, 256, 128, seed=5)
    x = torch.randn(m, 256, device="cuda").bfloat16()
    weights, ids = _routing(m, e, top_k)
    out = _check(moe, q13, q2, x, weights, ids, f"M={m} top-{top_k}")
    assert torch.equal(out, moe(x, weights, ids)), "the same batch twice gave different bits"

"""QuantMoE edge cases from issue 11's correctness list, against the float64 reference MoE: no tokens, one expert,
top-k = E, 256 and 257 experts, every token to one expert, over 64k tokens x top-8 (both pipelines: the buckets of
many rows per expert take the warp-specialized kernels on sm_90a), determinism (the same batch twice gives the same
bits; the top-k sum runs in slot order), and the two 64-bit offsets of the MoE kernels: output rows x N past 2^31
elements, and an expert's weights past 2^31 bytes from the first expert's. Outputs of the layer are fresh per
call, or NaN-poisoned where a test passes one (fused_moe(output=)); GEMM rows are checked elsewhere
(test_quant_moe.py poisons them)."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.layer.moe import expert_weight
from humming_gen.reference.moe import reference_fused_moe
from humming_gen.schemes import QuantizedWeight

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


# E = 256 (DeepSeek's experts) at M = 128 (4 rows per expert: the standard buckets) and M = 4096 (128 rows per
# expert: the warp-specialized ones on sm_90a)
@pytest.mark.parametrize("e,top_k,m", [(1, 1, 300), (3, 3, 128), (256, 8, 128), (256, 8, 4096), (257, 8, 128),
                                       (19, 2, 4096)])
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


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("pipeline", ["standard", None], ids=["standard", "default"])
def test_output_rows_times_n_past_2_31_elements(pipeline: str | None) -> None:
    """64-bit output offsets. GEMM2 writes assignment row i of its (M * top_k, H) output at element i * ldc
    (epilogue/store_output.cuh.j2 and store_output_staged.cuh.j2: `static_cast<long long>(row) * p.ldc`, row and
    ldc are ints); with H = 8192 and M * top_k = 266240 rows, rows from 262144 on (tokens from 32768 on, top-8)
    start 2^31 elements or more into the buffer, where a 32-bit product wraps negative. The cheapest such case:
    GEMM2's K = I = 128 keeps both GEMMs at about 1.7 TFLOP, and the layer holds the 4.4 GB bf16 GEMM2 buffer, x,
    the fp32 top-k sum and the output (about 7 GB in all). pipeline="standard" on every bucket, and the default
    (warp-specialized on sm_90a at these 16640 rows per expert): both epilogues' stores. The float64 reference runs
    on the first 64 tokens and the last 640 (rows 261120 on), each part checked on its own."""
    e, h, i, top_k = 16, 8192, 128, 8
    m = (2 ** 31 // h + 4096) // top_k  # 33280 tokens: their last 512 write only rows past 2^31 elements
    assert (m * top_k - 1) * h >= 2 ** 31 + 4095 * h
    torch.manual_seed(11)
    s = hg.scheme("w4a16-int4-g128")
    q13 = s.quantize(torch.randn(e, 2 * i, h, device="cuda") * 0.02)
    q2 = s.quantize(torch.randn(e, h, i, device="cuda") * 0.05)
    moe = hg.QuantMoE.from_quantized(q13, q2, pipeline=pipeline)
    x = torch.randn(m, h, device="cuda").bfloat16()
    weights, ids = _routing(m, e, top_k)
    out = torch.full((m, h), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert hg.fused_moe(x, moe, weights, ids, output=out) is out
    assert torch.isfinite(out).all(), "rows left unwritten or non-finite"
    w13, w2 = q13.dequantize().double(), q2.dequantize().double()
    past = 2 ** 31 // h // top_k  # the first token whose rows all lie 2^31 elements or more into the buffer
    for what, first in (("the first tokens", 0), ("the tokens around and past 2^31 elements", past - 128)):
        tokens = slice(first, 64 if first == 0 else m)
        ref = reference_fused_moe(x[tokens].double(), w13, w2, weights[tokens].double(), ids[tokens],
                                  intermediate_dtype=moe.dtype, fused_activation=moe.fused_activation)
        err = _rel(out[tokens], ref)
        assert err < TOLERANCE, f"{what}: relative error {err:.3g}"
    late = (out[past:].double() - ref[128:]).norm(dim=1) / ref[128:].norm(dim=1)
    assert late.max().item() < 5 * TOLERANCE, f"a token past 2^31 elements: relative error {late.max().item():.3g}"


def test_expert_weights_past_2_31_bytes() -> None:
    """64-bit expert offsets. A CTA rebases the stacked weight tensors to its expert (for_expert,
    pipelines/moe_for_expert.cuh.j2: `static_cast<long long>(expert) * cfg::kExpertBBytes`, the constant an int of
    one expert's bytes). int8 gate/up weights of 8192 x 4096 are 32 MiB per expert: experts 64 and 65 of 66 start at
    2^31 bytes and past, where a 32-bit product wraps. Codes are drawn directly (no float copy): w13 2.2 GB and w2
    1.1 GB, plus the tile-ordered and packed copies (about 11 GB at the peak of construction; 10.5 GB of host memory
    when built for sm_90a on the CPU). Tokens go to experts 0, 1, 64 and 65 only; the float64 reference dequantizes
    just those. M = 8 (1 row per expert expected: the standard buckets) and M = 1024 (32 rows per expert expected:
    warp-specialized on sm_90a, 64-token tiles)."""
    e, h, i, top_k = 66, 4096, 4096, 2
    torch.manual_seed(12)
    s = hg.scheme("w8a16-int8-channel")

    def int8_weight(n: int, k: int) -> QuantizedWeight:  # weights uniform in about +-0.05, bf16 channel scales
        codes = torch.randint(-127, 128, (e, n, k), dtype=torch.int8, device="cuda").view(torch.uint8)
        scales = (torch.rand(e, n, 1, device="cuda") * 2e-4 + 3e-4).bfloat16().float()
        return QuantizedWeight(scheme=s, codes=codes, scales=scales)

    q13, q2 = int8_weight(2 * i, h), int8_weight(h, i)
    moe = hg.QuantMoE.from_quantized(q13, q2)
    for gemm1, _ in moe._launchers:  # experts 64 and 65 start at or past 2^31 bytes in every kernel of GEMM1
        expert_bytes = dict((name, value) for name, value, _ in gemm1.kernel.plan.constants)["kExpertBBytes"]
        assert (e - 2) * expert_bytes >= 2 ** 31, expert_bytes
    used = torch.tensor([0, 1, 64, 65], device="cuda")
    w13 = torch.stack([expert_weight(q13, j).dequantize() for j in used.tolist()]).double()
    w2 = torch.stack([expert_weight(q2, j).dequantize() for j in used.tolist()]).double()
    for m in (8, 1024):
        x = torch.randn(m, h, device="cuda").bfloat16()
        slots = torch.argsort(torch.rand(m, used.numel(), device="cuda"), dim=1)[:, :top_k]  # two distinct experts
        slots[0] = torch.tensor([2, 3], device="cuda")  # a token of experts 64 and 65 only
        ids = used[slots].to(torch.int32)
        weights = torch.softmax(torch.randn(m, top_k, device="cuda"), -1)
        out = torch.full((m, h), float("nan"), dtype=torch.bfloat16, device="cuda")
        hg.fused_moe(x, moe, weights, ids, output=out)
        assert torch.isfinite(out).all(), f"m={m}: rows left unwritten or non-finite"
        ref = reference_fused_moe(x.double(), w13, w2, weights.double(), slots, intermediate_dtype=moe.dtype,
                                  fused_activation=moe.fused_activation)
        err = _rel(out, ref)
        assert err < TOLERANCE, f"m={m} (bucket {moe.bucket_for(m, top_k)}): relative error {err:.3g}"
        far = (slots >= 2).all(dim=1)  # tokens whose experts both lie past 2^31 bytes
        assert far.any() and _rel(out[far], ref[far]) < TOLERANCE, f"m={m}: tokens of experts 64 and 65"

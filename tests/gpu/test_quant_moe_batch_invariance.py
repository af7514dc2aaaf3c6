"""QuantMoE's batch invariance within one bucket, on the GPU: a token's output row is bitwise the same in a batch
of M tokens and in any other batch whose M takes the same bucket (QuantMoE.bucket_for: the same two kernels),
whatever the other tokens are and wherever the token sits. Each sub-batch is a random subset of the batch in random
order, so a token lands in other m blocks, at other rows of its tiles, beside other tokens of its experts; the
bucket that serves M = 1 also compares tokens run alone.

Why it holds by construction (the QuantMoE docstring and README say what is promised): every MoE kernel runs
split_k = 1, and computes each assignment row from its own activation row and its expert's weights with a K
summation order fixed by the kernel (pipeline, MMA, block_k, warps_k, token tile: humming_gen/heuristics/
batch_invariant.py); per-token, per-group and static per-tensor activation quantization reads only the row (and is
exact); the gated activation and the router weight apply per row; the top-k sum is torch.sum over the (M, top_k, H)
view, each output summed by one thread in an order set by top_k. Across buckets the kernels differ (token tile,
pipeline, MMA), and a dynamic per-tensor activation scale is the amax of the whole batch: neither is promised, nor
tested here. The full batch of each bucket is also checked against the float64 reference (a layer that wrote the
same wrong bits for every batch would pass the invariance alone).
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import reference_fused_moe
from test_quant_moe import _rel, _routing
from test_quant_moe_a8 import LAYER_TOLERANCE, static_scales
from test_quant_moe_a8_ws import SMALL_M_LAYER_TOLERANCE

pytestmark = pytest.mark.gpu

E, H, I = 16, 512, 256
TOLERANCE = 2e-2  # 16-bit activations (test_quant_moe.py); 8-bit ones: LAYER_TOLERANCE
PRESETS = ("w4a16-int4-g128", "w8a8-fp8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8", "w8a8-fp8-tensor-static")


def _layer(preset: str, pipeline: str | None, seed: int):
    """A QuantMoE of E random experts; "w8a8-fp8-tensor-static": w8a8-fp8-tensor with calibrated static input
    scales on both GEMMs (a dynamic per-tensor scale reads every row: no invariance)."""
    static = preset.endswith("-static")
    name = preset.removesuffix("-static")
    scales = static_scales(name, E, seed=seed, shrink=1.0) if static else None
    torch.manual_seed(seed)
    s = hg.scheme(name)
    q13 = s.quantize(torch.randn(E, 2 * I, H, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(E, H, I, device="cuda") * 0.05)
    if static:
        q13.input_scale = torch.tensor([scales[0]], device="cuda")
        q2.input_scale = torch.tensor([scales[1]], device="cuda")
    moe = hg.QuantMoE.from_quantized(q13, q2, pipeline=pipeline)
    assert all(a is None or a.granularity != "tensor" or s is not None
               for a, s in zip(moe.activation_schemes, moe._static_scales)), "a dynamic per-tensor scale"
    return moe, q13, q2


def _tolerance(moe, bucket: int, m: int) -> float:
    """The float64 reference's bound for a batch of m tokens in `bucket`. Warp-specialized 8-bit buckets below 128
    tokens take test_quant_moe_a8_ws.py's small-M bound: wgmma's fp8 sums move a few more of GEMM2's input codes by
    one e4m3 step than mma.sync's, and on few tokens those weigh more (W8A8 fp8 static per-tensor, M = 32, top-8,
    16-token tiles: 0.0184 on the H200, 2026-12-02)."""
    act = moe.activation_schemes[0]
    if act is None:
        return TOLERANCE
    ws = moe._launchers[bucket][0].kernel.plan.pipeline == "warp_specialized"
    return SMALL_M_LAYER_TOLERANCE if ws and m < 128 else LAYER_TOLERANCE[act.dtype.name]


def _run(moe, x, weights, ids) -> torch.Tensor:
    out = torch.full((x.shape[0], H), float("nan"), dtype=moe.dtype, device="cuda")
    assert hg.fused_moe(x, moe, weights, ids, output=out) is out
    assert torch.isfinite(out).all(), f"M={x.shape[0]}: rows left unwritten or non-finite"
    return out


def bucket_sizes(moe, top_k: int) -> dict[int, list[int]]:
    """bucket -> the batch sizes M it serves at top_k (the open-ended last bucket: from its first M to 5/4 of it)."""
    ms: dict[int, list[int]] = {}
    m, last = 1, len(moe.buckets) - 1
    while moe.bucket_for(m, top_k) < last:
        ms.setdefault(moe.bucket_for(m, top_k), []).append(m)
        m += 1
    ms[last] = list(range(m, m * 5 // 4 + 1))
    return ms


@pytest.mark.parametrize("top_k", [2, 8])
@pytest.mark.parametrize("pipeline", ["standard", None], ids=["standard", "default"])
@pytest.mark.parametrize("preset", PRESETS)
def test_rows_are_bitwise_equal_within_a_bucket(preset: str, pipeline: str | None, top_k: int) -> None:
    """For every bucket: the largest M it serves (the last bucket: 5/4 of its first) against its smallest M and an
    M between (random subsets in random order), the tokens of a subset beside other tokens (the rest of the batch
    redrawn), and in the bucket of M = 1 eight tokens alone. Top-2 and top-8 (the top-k sum adds 8 rows, whose
    order matters). Routing with dropped slots; outputs poisoned."""
    moe, q13, q2 = _layer(preset, pipeline, seed=23)
    act = moe.activation_schemes[0]
    ms = bucket_sizes(moe, top_k)
    assert sorted(ms) == list(range(len(moe.buckets))), (moe.buckets, ms)
    for bucket, sizes in sorted(ms.items()):
        big, small = max(sizes), min(sizes)
        what = f"bucket {bucket} (M {small}..{big}, token tile {moe.block_ms[bucket]})"
        x = torch.randn(big, H, device="cuda").bfloat16()
        x[0, :5] *= 20  # an outlier token: per-token / per-group scales differ from the others
        weights, ids = _routing(big, E, top_k, drop=0.1)
        full = _run(moe, x, weights, ids)
        ref = reference_fused_moe(x.double(), q13.dequantize().double(), q2.dequantize().double(), weights.double(),
                                  ids, activation_scheme=act, intermediate_dtype=moe.dtype,
                                  fused_activation=moe.fused_activation, activation_static_scales=moe._static_scales)
        err = _rel(full, ref)
        assert err < _tolerance(moe, bucket, big), f"{what}: relative error {err:.3g}"
        for size in sorted({small, (small + big) // 2} - {big}):  # the bucket's smallest M, and one between
            pick = torch.randperm(big, device="cuda")[:size]  # a random subset of the batch, shuffled
            assert moe.bucket_for(size, top_k) == bucket
            sub = _run(moe, x[pick], weights[pick], ids[pick])
            same = (sub == full[pick]).all(dim=1)
            assert same.all(), f"{what}: {int((~same).sum())} of {size} tokens differ from the batch of {big}"
        if small < big:  # the tokens of the last subset beside other tokens: the rest of the batch redrawn
            other = torch.ones(big, dtype=torch.bool, device="cuda")
            other[pick] = False
            x2, weights2, ids2 = x.clone(), weights.clone(), ids.clone()
            x2[other] = (torch.randn(int(other.sum()), H, device="cuda") * 3).bfloat16()
            weights2[other], ids2[other] = _routing(int(other.sum()), E, top_k, drop=0.1)
            beside = _run(moe, x2, weights2, ids2)
            assert torch.equal(beside[pick], full[pick]), f"{what}: rows changed with the other tokens of the batch"
        if bucket == moe.bucket_for(1, top_k):
            for r in torch.randperm(big)[:8].tolist():
                alone = _run(moe, x[r:r + 1], weights[r:r + 1], ids[r:r + 1])
                assert torch.equal(alone[0], full[r]), f"{what}: token {r} alone differs from the batch of {big}"

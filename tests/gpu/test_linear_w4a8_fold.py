"""w4a8-mxfp4-fp8 through QuantLinear with folded e8m0 group scales (the warp-specialized kernels widen e2m1 codes to
e4m3 times 2^d, the rows' 2^r multiplies the output; humming_gen.components.numeric.exponent_fold) and with the
fallback that promotes partial sums with the group scales, against the float64 reference.

Weights: Gaussian times a power of two per (row, group) drawn from 2^-4 .. 2^4, so the deltas differ from group to
group and row to row (a delta read for the wrong row, k step or sign shows as a large error); built on the CPU from
a seed, so whether a case folds is known (asserted). The fallback plants one group 2^-12 below the rest of its row.
Checked by test_linear_w8a8._check: the dequantized weights times the quantized activations in float64, plus bias;
fresh random activations with an outlier row, outputs poisoned (NaN) before every launch. The fold is exact, so the
tolerances are W8A8's (the output type's rounding and fp8 accumulation over 128 k).
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from test_linear_w8a8 import TOLERANCE, _check

pytestmark = pytest.mark.gpu

SCHEME = "w4a8-mxfp4-fp8"
M_VALUES = (1, 16, 17, 64, 1000, 4096)  # every bucket warp-specialized (8- and 16-token tiles at 1 and 16)
SHAPES = ((8192, 8192), (4000, 3072), (576, 7168))  # (N, K)


def _weight(n: int, k: int, seed: int, fold: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w *= 2.0 ** torch.randint(-4, 5, (n, k // 32), generator=g).repeat_interleave(32, dim=1)
    if not fold:
        w[5, 64:96] = w[5, 64:96].abs().clamp(min=0.01) * 2.0 ** -16  # 12+ binades below the row's other groups
    return w


def _cases():
    for fold in (True, False):
        for n, k in SHAPES:
            for dtype in (torch.bfloat16, torch.float16):
                if dtype == torch.float16 and n == 8192:
                    continue
                dt = "bf16" if dtype == torch.bfloat16 else "fp16"
                yield pytest.param(fold, n, k, dtype, id=f"{'fold' if fold else 'fallback'}-n{n}-k{k}-{dt}")


@pytest.mark.parametrize("fold,n,k,dtype", list(_cases()))
def test_mxfp4_fp8_fold_and_fallback(fold: bool, n: int, k: int, dtype: torch.dtype) -> None:
    qw = hg.scheme(SCHEME).quantize(_weight(n, k, seed=n + k, fold=fold).cuda())
    bias = torch.randn(n, device="cuda").to(dtype) if dtype == torch.bfloat16 else None
    layer = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype)
    assert layer.fold_scales == fold
    for m in M_VALUES:
        kernel = layer.kernel_for(m)
        assert kernel.plan.pipeline == "warp_specialized", (m, kernel.name)
        assert kernel.name.endswith("_fold") == fold, kernel.name
        _check(layer, qw, bias, dtype, m, kernel.name)


def test_fold_with_fp32_output_and_partial_k_tile() -> None:
    """K = 3104 (a partial last 128-k tile: its k32 steps past K take the last group's delta on zero codes) and an
    fp32 output, folded."""
    n, k = 1000, 3104
    qw = hg.scheme(SCHEME).quantize(_weight(n, k, seed=3, fold=True).cuda())
    layer = hg.QuantLinear.from_quantized(qw, dtype=torch.bfloat16, out_dtype=torch.float32)
    assert layer.fold_scales
    for m in (17, 200, 1000):
        assert layer.kernel_for(m).name.endswith("_fold")
        _check(layer, qw, None, torch.bfloat16, m, f"fp32 out m={m}")


def test_fold_matches_fallback_closely() -> None:
    """The same weights and activation codes through the folded kernel and the promoting one composed from the same
    tuning with fold_scales=False (it reads the fp32 group scales the prepared weight keeps for the standard
    pipeline): both near the reference and near each other."""
    import attrs

    from humming_gen.codegen import compose
    from humming_gen.kernel import build

    n, k, m = 4096, 4096, 1000
    qw = hg.scheme(SCHEME).quantize(_weight(n, k, seed=9, fold=True).cuda())
    layer = hg.QuantLinear.from_quantized(qw, dtype=torch.bfloat16)
    assert layer.fold_scales
    folded = layer.kernel_for(m)
    plain_plan = compose(attrs.evolve(layer.layer_config, fold_scales=False), layer.compute_config,
                         folded.plan.tuning, layer.target)
    plain = build(plain_plan)
    x = torch.randn(m, k, device="cuda").bfloat16()
    assert plain.activation_layout == folded.activation_layout  # (panels where K % 128 == 0: a_load='tma')
    qa = hg.quantize_activation(x, qw.scheme.activation, layout=folded.activation_layout)
    outs = []
    for kern in (folded, plain):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        kern.launch(qa.codes, layer.weight, out, None, a_scale=qa.scales)
        outs.append(out.double())
    ref = qw.scheme.activation.quantize(x.double()).dequantize(torch.float64) @ qw.dequantize(torch.float64).T
    for y in outs:
        assert torch.isfinite(y).all() and ((y - ref).norm() / ref.norm()).item() < TOLERANCE[torch.bfloat16]
    assert ((outs[0] - outs[1]).norm() / ref.norm()).item() < TOLERANCE[torch.bfloat16]

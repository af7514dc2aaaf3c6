"""Converted checkpoints that quantize activations run end to end through QuantLinear's 8-bit-activation kernels:
FP8 per tensor with a static input scale, DeepSeek FP8 128 x 128 blocks, compressed-tensors W8A8 int8 and
FP8_DYNAMIC; outputs poisoned, compared with reference_gemm (which quantizes x as the scheme says)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu"))
from test_checkpoints_quantized_activations import W8A8  # noqa: E402  (the checkpoints of the CPU test)

pytestmark = pytest.mark.gpu

TOLERANCE = 8e-3  # relative Frobenius, bf16 outputs (tests/gpu/test_linear_w8a8.py)


@pytest.mark.parametrize("name", sorted(W8A8))
def test_converted_w8a8_checkpoint_runs(name: str) -> None:
    if name.startswith("ct-"):
        pytest.importorskip("compressed_tensors")
    torch.manual_seed(3)
    qw = W8A8[name]().to("cuda")
    layer = hg.QuantLinear.from_quantized(qw, dtype=torch.bfloat16)
    assert {k.plan.tuning.mma for k in layer.kernels} <= {"m16n8k32", "wgmma"}
    for m in (1, 33, 300):
        x = torch.randn(m, qw.k, device="cuda").bfloat16()
        out = torch.full((m, qw.n), float("nan"), device="cuda", dtype=torch.bfloat16)
        layer(x, out=out)
        ref = reference_gemm(x.double(), qw)
        assert torch.isfinite(out).all(), f"{name} m={m}: unwritten or non-finite outputs"
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < TOLERANCE, f"{name} m={m}: relative error {err:.3g}"

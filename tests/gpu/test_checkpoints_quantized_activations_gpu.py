"""Converted checkpoints that quantize activations run end to end through QuantLinear's 8-bit-activation kernels:
FP8 per tensor with a static input scale (plain and ModelOpt FP8), DeepSeek FP8 128 x 128 blocks, compressed-tensors
W8A8 int8 and FP8_DYNAMIC; outputs poisoned, compared with reference_gemm (which quantizes x as the scheme says).
A ModelOpt NVFP4 checkpoint with its input_scale (W4A4) runs the compute type the target falls back to."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu"))
from test_checkpoints_quantized_activations import W8A8, _modelopt_nvfp4  # noqa: E402  (the CPU test's checkpoints)

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


def test_modelopt_nvfp4_with_input_scale_runs_its_fallback(caplog) -> None:
    """W4A4 NVFP4 with a static input_scale, not weight_only: where the target has no fp4 MMA the layer falls back
    (fp4 -> fp8 per token where the weights' scales allow, else 16-bit; on sm_90a the group-16 e4m3 weight scales
    keep the 8-bit kernels out: bfloat16), logs it once and runs exactly that: the reference quantizes x as the
    compute type that runs does (the input_scale only as an NVFP4 global scale), and the fp4-activation product,
    about 9 % away, must not pass for it."""
    from humming_gen.layer import compute_type

    torch.manual_seed(4)
    qw = _modelopt_nvfp4().to("cuda")
    assert qw.input_scale is not None and qw.scheme.activation.dtype.name == "float4e2m1"
    compute_type._LOGGED.clear()  # "once" is per process: start from a clean slate
    with caplog.at_level("WARNING", logger="humming_gen"):
        layer = hg.QuantLinear.from_quantized(qw, dtype=torch.bfloat16)
        hg.QuantLinear.from_quantized(qw, dtype=torch.bfloat16)
    logs = [r for r in caplog.records if "float4e2m1 activations" in r.getMessage()]
    runs = layer.activation_scheme  # the activation scheme the kernels quantize x with; None: 16-bit activations
    assert layer.compute_dtype == (runs.dtype.name if runs is not None else "bfloat16")
    if layer.target.name == "sm_90a":
        assert layer.compute_dtype == "bfloat16" and runs is None and layer._static_scale is None
    if layer.compute_dtype != "float4e2m1":
        assert layer.fallback_reasons and len(logs) == 1, [r.getMessage() for r in logs]
        assert layer.compute_dtype in logs[0].getMessage()
    for m in (1, 33, 300):
        x = torch.randn(m, qw.k, device="cuda").bfloat16()
        out = torch.full((m, qw.n), float("nan"), device="cuda", dtype=torch.bfloat16)
        layer(x, out=out)
        ref = reference_gemm(x.double(), qw, activation=runs, quantize_input=runs is not None)
        assert torch.isfinite(out).all(), f"m={m}: unwritten or non-finite outputs"
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < TOLERANCE, f"{layer.compute_dtype} m={m}: relative error {err:.3g}"
        if runs is None or runs != qw.scheme.activation:
            fp4 = reference_gemm(x.double(), qw)
            assert ((out.double() - fp4).norm() / fp4.norm()).item() > 4 * TOLERANCE, "the fp4 product passes too"

"""Kernels the heuristics never pick, and converted checkpoints, on the GPU, under the per-element bound.

1. Every explicit tuning of the codegen matrix (tests/cpu/codegen_cases.py: split-K with k warps, warps_m = 2 and
   4, block_m = 24, block_n 64 and 256, a 128-wide warp k) and its float32-output case, through QuantLinear with
   that tuning as its only bucket.
2. Checkpoints written by the converters' to_checkpoint (AWQ, GPTQ act-order v2, GPTQ v1, gpt-oss MXFP4,
   ModelOpt NVFP4), read back with load_layer and run through QuantLinear.

Outputs are poisoned (NaN) before each launch, inputs are fresh, the reference is float64; each case also runs
the negative control: one scale entry doubled in a copy of the prepared weight must fail the same bound.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import humming_gen as hg
from humming_gen.heuristics import TuningPlan
from humming_gen.reference import reference_gemm
from humming_gen.schemes.converters import awq, gptq, modelopt, mxfp4
from humming_gen.targets import Target
from numerics_check import check_elementwise, elementwise_bound, emulate_prepared_weight, plant_wrong_scale

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu"))
from codegen_cases import CASES  # noqa: E402
from converter_fixtures import write_checkpoint  # noqa: E402

pytestmark = pytest.mark.gpu

TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
M_VALUES = (1, 5, 24, 127, 1000)


def check_layer(layer: hg.QuantLinear, qw, bias, m_values=M_VALUES) -> None:
    """Poisoned launches of the layer's kernels at every m, the per-element bound, forward() agreement, then the
    negative control at the largest m."""
    dtype, out_dtype = layer.dtype, layer.out_dtype
    n, k = qw.n, qw.k
    home = qw.codes.device  # the reference runs where the QuantizedWeight lives
    w_ref = qw.dequantize(torch.float64).cuda()
    w_kernel = emulate_prepared_weight(layer.kernel_for(1).plan, qw, layer.weight).cuda()
    bias64 = None if bias is None else bias.double().cuda()
    for m in m_values:
        x = torch.randn(m, k, device="cuda").to(dtype)
        a = x if layer.weight.k_perm is None else x[:, layer.weight.k_perm]
        if k % 8:
            a = torch.nn.functional.pad(a, (0, (-k) % 8))
        a = a.contiguous()
        kernel = layer.kernel_for(m)
        out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
        kernel.launch(a, layer.weight, out, layer.bias)
        ref = reference_gemm(x.double().to(home), qw, bias=None if bias is None else bias.double().to(home),
                             quantize_input=False).cuda()
        bound = elementwise_bound(x, w_ref, w_kernel, ref, dtype, out_dtype, bias64)
        report = check_elementwise(out, ref, bound)
        assert report.ok, f"m={m}: {report}"
        assert torch.equal(layer(x), out), f"m={m}: forward() and a direct launch disagree"
    planted = plant_wrong_scale(layer.weight)
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
    kernel.launch(a, planted, out, layer.bias)
    assert not check_elementwise(out, ref, bound).ok, "negative control: a doubled scale entry passes the bound"


EXPLICIT = [c for c in CASES if c.tuning is not None or c.layer.out_dtype == "float32"]


def test_explicit_cases_cover_the_tunings_the_heuristics_skip() -> None:
    tunings = [c.tuning for c in EXPLICIT if c.tuning is not None]
    assert any(t.warps_m == 4 for t in tunings) and any(t.block_m == 24 for t in tunings)
    assert {64, 256} <= {t.block_n for t in tunings}
    assert any(c.layer.out_dtype == "float32" for c in EXPLICIT)


@pytest.mark.parametrize("case", EXPLICIT, ids=[c.id for c in EXPLICIT])
def test_explicit_tuning_matches_reference(case) -> None:
    lc = case.layer
    torch.manual_seed(17)
    qw = lc.scheme.quantize(torch.randn(lc.n, lc.k, device="cuda") * 0.05)
    bias = (torch.randn(lc.n, device="cuda") * 0.1).to(TORCH[lc.dtype]) if lc.has_bias else None
    tuning = case.tuning_for(Target.current())
    layer = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=TORCH[lc.dtype], out_dtype=TORCH[lc.out_dtype],
                                          tunings=TuningPlan(((None, tuning),)))
    assert layer.kernel_for(1).plan.tuning == tuning
    check_layer(layer, qw, bias)


def _awq(qw):
    return awq.to_checkpoint(qw, PREFIX)


def _gptq_act_order(qw):
    qw.k_perm = torch.argsort(torch.randperm(qw.k) // qw.scheme.group_size, stable=True)
    return gptq.to_checkpoint(qw, PREFIX)


def _gptq_v1(qw):
    qw.zero_points.clamp_(min=1)  # v1 cannot store a zero point of 0
    return gptq.to_checkpoint(qw, PREFIX, checkpoint_format="gptq")


PREFIX = "model.layers.0.mlp.down_proj"
CHECKPOINTS = [
    ("awq-uint4-g128", hg.QuantScheme("uint4", group_size=128, scale_dtype="float16", zero_point="int"), _awq,
     "config.json", torch.float16),
    ("gptq-int4-g128-act-order", hg.QuantScheme("int4", group_size=128, scale_dtype="float16"), _gptq_act_order,
     "config.json", torch.float16),
    ("gptq-v1-uint4-g128", hg.QuantScheme("uint4", group_size=128, scale_dtype="float16", zero_point="int"),
     _gptq_v1, "config.json", torch.bfloat16),
    ("gpt-oss-mxfp4", hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0"),
     lambda qw: mxfp4.to_checkpoint(qw, PREFIX), "config.json", torch.bfloat16),
    ("modelopt-nvfp4", hg.QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True),
     lambda qw: modelopt.to_checkpoint(qw, PREFIX), "hf_quant_config.json", torch.bfloat16),
]


@pytest.mark.parametrize("case", CHECKPOINTS, ids=[c[0] for c in CHECKPOINTS])
def test_converted_checkpoint_matches_reference(case, tmp_path) -> None:
    _, scheme, write, config_name, dtype = case
    torch.manual_seed(23)
    n, k = 768, 2048
    qw = scheme.quantize(torch.randn(n, k) * 0.05)
    tensors, cfg = write(qw)
    write_checkpoint(tmp_path, tensors, cfg, config_name=config_name)
    loaded = hg.load_layer(tmp_path, PREFIX)
    assert loaded.scheme.weight == scheme.weight and (loaded.k_perm is None) == (qw.k_perm is None)
    assert torch.equal(loaded.dequantize(torch.float64), qw.dequantize(torch.float64))
    layer = hg.QuantLinear.from_quantized(loaded, dtype=dtype, weight_only=loaded.scheme.activation is not None)
    check_layer(layer, loaded, None)

"""The per-element output bound of the GPU tests (numerics_check.elementwise_bound), shown tight enough on the CPU.

The GPU tests' former relative-Frobenius tolerance passed a kernel with one group-scale entry doubled, the last
k column not accumulated (K = 8192) or one output column zeroed (N = 8192). Here each defect is injected into a
float64 output of the same layer (int4 g128, the GPU tests' shapes), and the bound the GPU tests use must reject
it; a correct kernel's arithmetic, emulated on the CPU (16-bit inputs, fp32 accumulation, one rounding of the
output), must pass it.
"""

from __future__ import annotations

import pytest
import torch

from numerics_check import (check_elementwise, compose, elementwise_bound, emulate_kernel_output,
                            emulate_prepared_weight, plant_wrong_scale, prepare_weight)
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.schemes import QuantScheme
from humming_gen.targets import get_target

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _layer(n: int, k: int, dtype: str, m: int = 16):
    torch.manual_seed(n * 7 + k)
    scheme = QuantScheme("int4", group_size=128)
    qw = scheme.quantize(torch.randn(n, k) * 0.05)  # the GPU tests' weights
    layer = LayerConfig(n, k, scheme, dtype=dtype)
    target = get_target("sm_90a")
    plan = compose(layer, ComputeConfig(), choose_tunings(layer, target).for_m(m), target)
    pw = prepare_weight(plan, qw, "cpu")
    w_ref = qw.dequantize(torch.float64)
    w_kernel = emulate_prepared_weight(plan, qw, pw)
    x = torch.randn(m, k).to(DTYPES[dtype])
    y_ref = x.double() @ w_ref.t()
    bound = elementwise_bound(x, w_ref, w_kernel, y_ref, DTYPES[dtype], DTYPES[dtype])
    return plan, qw, pw, x, w_ref, w_kernel, y_ref, bound


@pytest.mark.parametrize("defect, n, k, dtype", [
    ("scale-entry-doubled", 1024, 2048, "bfloat16"), ("scale-entry-doubled", 1024, 2048, "float16"),
    ("last-k-column-dropped", 2048, 8192, "bfloat16"), ("output-column-zeroed", 8192, 2048, "bfloat16")])
def test_bound_passes_a_correct_kernel_and_fails_each_defect(defect: str, n: int, k: int, dtype: str) -> None:
    plan, qw, pw, x, w_ref, w_kernel, y_ref, bound = _layer(n, k, dtype)
    correct = emulate_kernel_output(x, w_kernel, DTYPES[dtype])
    report = check_elementwise(correct, y_ref, bound)
    assert report.ok, f"a correct kernel's emulated output fails the bound: {report}"
    if defect == "scale-entry-doubled":  # b_scale[0, 0] (row 0, first group) doubled; reference recomputed
        w_bad = emulate_prepared_weight(plan, qw, plant_wrong_scale(pw))
        assert (w_bad != w_kernel).sum() > 100
        y_bad = x.double() @ w_bad.t()
    elif defect == "last-k-column-dropped":
        y_bad = x.double()[:, :-1] @ w_ref[:, :-1].t()
    else:
        y_bad = y_ref.clone()
        y_bad[:, n // 2] = 0
    bad = check_elementwise(y_bad, y_ref, bound)
    assert not bad.ok, f"{defect} passes the per-element bound (worst {bad.worst_ratio:.3g}x)"


def test_non_finite_output_fails() -> None:
    y_ref = torch.ones(2, 3, dtype=torch.float64)
    bound = torch.full((2, 3), 0.1, dtype=torch.float64)
    y = y_ref.clone()
    assert check_elementwise(y, y_ref, bound).ok
    y[1, 2] = float("nan")
    report = check_elementwise(y, y_ref, bound)
    assert not report.ok and report.violations == 1 and report.worst_at == (1, 2)

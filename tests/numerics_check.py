"""Shared numerics checks of the CPU and GPU tests (importable as `numerics_check` from tests/cpu and tests/gpu).

1. `emulate_prepared_weight`: the (N, K) float64 weight a standard-pipeline kernel computes with, rebuilt from the
   prepared tensors alone (packed codes, group scales / zero points, per-column out_scale that carries channel,
   tensor and global scales) with the kernel's dequantization math, in original column order. Compared
   elementwise with `QuantizedWeight.dequantize()`, it catches a scale dropped or misplaced while preparing.
2. `elementwise_bound` / `check_elementwise`: a per-element bound on a kernel's output y against the float64
   reference y_ref = x @ W_ref^T (+ bias),

       |y - y_ref| <= u(out) |y_ref| + |x| @ |W_kernel - W_ref|^T + c eps(dtype) (|x| @ |W_ref|^T + |bias|) + tiny(out)

   u(out): unit roundoff of the output type (the final rounding); |x| @ |W_kernel - W_ref|^T: the weights the
   kernel computes with (emulated from the correct prepared weight, rounded to the 16-bit compute type as the
   in-register scale step does) against the reference's, per element, i.e. c eps |x| |W| with a per-weight c <= 1
   (0 where dequantization is exact); c = C_ACCUMULATE = 2^-6 for fp32 accumulation, the fp32 epilogue scale
   and bias, against at most 3e-5 measured on the CPU emulation (emulate_kernel_output) of the GPU test cases.
   tests/cpu/test_elementwise_bound.py shows, on the CPU, that a correct kernel's emulated output passes this
   bound and that a doubled group-scale entry, a dropped last k column and a zeroed output column fail it.

Internal names of the library are imported here only, so a move (compose may go to humming_gen.pipelines) is one
edit.
"""

from __future__ import annotations

import attrs
import torch

from humming_gen.codegen.compose import KernelPlan, compose  # noqa: F401  (re-exported for the tests)
from humming_gen.components.numeric.convert import select_converter
from humming_gen.layer.weights import PreparedWeight, prepare_weight  # noqa: F401
from humming_gen.schemes import QuantizedWeight
from humming_gen.schemes.packing import permute_group_rows, unpack_codes

TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
EPS = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}  # machine epsilon of the compute type
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}
C_ACCUMULATE = 2.0 ** -6


# --- 1. the prepared weight, dequantized as the kernel does ---------------------------------------------------
def _unpermute_columns(t: torch.Tensor) -> torch.Tensor:
    """Inverse of packing.permute_group_rows along the last dim."""
    idx = permute_group_rows(torch.arange(t.shape[-1], device=t.device))
    return t[..., torch.argsort(idx)]


def emulate_prepared_weight(plan: KernelPlan, qw: QuantizedWeight, pw: PreparedWeight) -> torch.Tensor:
    """(N, K) float64: what a kernel of `plan` multiplies with, from `pw` only (`qw` gives shape and k_perm).

    Per element: the converter's value of the stored kernel code (its Python model, checked against the rendered
    template by test_numeric_templates_host.py), minus what the scale step subtracts (converter bias + code
    offset, or the zero-point term), times the group scale of kernel row k // group_size, rounded once to the
    compute type (the packed fma), then times the fp32 per-column out_scale of the epilogue."""
    dt = plan.layer.dtype
    n, k = qw.n, qw.k
    # the plan's converter where it renders one (its group scales may carry the converter's power of two:
    # scale_carries_exponent), else the one merged into the extraction
    conv = next((c for c in plan.components if "convert_pair" in c.provides), select_converter(qw.scheme.weight, dt))
    bits = qw.scheme.weight.bits
    codes = unpack_codes(pw.b, plan.layout.b_layout, plan.layout.n_pad, plan.layout.k_pad)[:n, :k].long()
    table = torch.tensor([conv.emulate(c) for c in range(1 << bits)], dtype=torch.float64, device=codes.device)
    x = table[codes]
    bias = plan.layout.converter_bias
    g = plan.group
    if g is None:
        assert pw.b_scale is None and pw.b_zero is None
        w = x - (bias + plan.layout.code_offset)
    else:
        rows = torch.arange(k, device=codes.device) // g.group_size
        assert tuple(pw.b_scale.shape) == (g.rows, plan.layout.n_pad)
        scale = _unpermute_columns(pw.b_scale.double())[rows, :n].t()
        if plan.layout.zero_point is None:
            assert pw.b_zero is None
            w = (x - (bias + plan.layout.code_offset)) * scale
        else:
            zero = _unpermute_columns(pw.b_zero.double())[rows, :n].t()
            if plan.layout.zero_point == "int":  # zero holds -(bias + z)
                w = (x + zero) * scale
            else:  # float: zero holds -z * scale
                w = (x - bias) * scale + zero
        w = w.to(TORCH[dt]).double()  # one rounding (fma) to the compute type
    if plan.layout.out_scale:
        assert tuple(pw.out_scale.shape) == (plan.layout.n_pad,) and pw.out_scale.dtype == torch.float32
        w = w * pw.out_scale.double()[:n, None]
    else:
        assert pw.out_scale is None
    if qw.k_perm is not None:
        out = torch.empty_like(w)
        out[:, qw.k_perm.long().to(w.device)] = w
        w = out
    return w


def plant_wrong_scale(pw: PreparedWeight, factor: float = 2.0) -> PreparedWeight:
    """A copy of `pw` with one scale entry multiplied by `factor`: the group scale of output row 0 in the first
    group (b_scale[0, 0] holds n = 0: permute_group_rows keeps column 0), or out_scale[0] without group scales."""
    if pw.b_scale is not None:
        b_scale = pw.b_scale.clone()
        b_scale[0, 0] *= factor
        return attrs.evolve(pw, b_scale=b_scale)
    out_scale = pw.out_scale.clone()
    out_scale[0] *= factor
    return attrs.evolve(pw, out_scale=out_scale)


# --- 2. the per-element output bound --------------------------------------------------------------------------
def elementwise_bound(x: torch.Tensor, w_ref: torch.Tensor, w_kernel: torch.Tensor, y_ref: torch.Tensor,
                      dtype: torch.dtype, out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """(M, N) float64 bound on |y - y_ref| (see the module docstring). x: activations (M, K) in original column
    order; w_ref: the reference weight (N, K) float64 (QuantizedWeight.dequantize); w_kernel: the weight the
    kernel should compute with (`emulate_prepared_weight` of a correct prepared weight, never of a planted one);
    y_ref: float64 reference output."""
    xa = x.double().abs()
    mag = xa @ w_ref.double().abs().t()
    if bias is not None:
        mag = mag + bias.double().abs()
    rounding = xa @ (w_kernel.double() - w_ref.double()).abs().t()
    return UNIT_ROUNDOFF[out_dtype] * y_ref.abs() + rounding + C_ACCUMULATE * EPS[dtype] * mag \
        + torch.finfo(out_dtype).tiny


@attrs.frozen
class BoundReport:
    ok: bool
    violations: int
    worst_ratio: float  # max |y - y_ref| / bound
    worst_at: tuple[int, int]

    def __str__(self) -> str:
        return (f"{self.violations} element(s) outside the per-element bound, worst {self.worst_ratio:.3g}x the "
                f"bound at {self.worst_at}")


def check_elementwise(y: torch.Tensor, y_ref: torch.Tensor, bound: torch.Tensor) -> BoundReport:
    """Compare an output with its reference under `bound`; non-finite outputs always violate."""
    err = (y.double() - y_ref).abs()
    ratio = torch.where(torch.isfinite(err), err / bound, torch.full_like(err, float("inf")))
    bad = int((~(ratio <= 1.0)).sum())
    flat = int(torch.argmax(ratio))
    worst = float(ratio.reshape(-1)[flat])
    return BoundReport(ok=bad == 0, violations=bad, worst_ratio=worst, worst_at=divmod(flat, ratio.shape[1]))


def emulate_kernel_output(x: torch.Tensor, w_kernel: torch.Tensor, out_dtype: torch.dtype,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
    """A correct kernel's arithmetic on the CPU: 16-bit x times the kernel's weights (products exact in fp32),
    fp32 accumulation, fp32 bias, one rounding to the output type."""
    acc = x.float() @ w_kernel.float().t()
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(out_dtype)

"""QuantizedWeight (standard form) -> the tensors a standard-pipeline kernel reads, on the target device."""

from __future__ import annotations

import attrs
import torch

from humming_gen.codegen.compose import KernelPlan
from humming_gen.components.numeric.halfbits import TORCH_DTYPE
from humming_gen.schemes import QuantizedWeight
from humming_gen.schemes.packing import pack_codes, pad_to, permute_group_rows


@attrs.define
class PreparedWeight:
    """Kernel-layout tensors. Every kernel whose plan has the same `layout_key` can read them."""

    layout_key: tuple
    b: torch.Tensor
    b_scale: torch.Tensor | None
    b_zero: torch.Tensor | None
    out_scale: torch.Tensor | None
    k_perm: torch.Tensor | None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.b, self.b_scale, self.b_zero, self.out_scale)
                   if t is not None)


def layout_key(plan: KernelPlan) -> tuple:
    g = plan.group
    return (plan.b_layout, plan.n_pad, plan.k_pad, g.group_size if g else None, g.rows if g else None,
            plan.out_scale, plan.code_offset, plan.converter_bias, plan.zero_point, plan.layer.dtype)


def _scales_per_element_row(qw: QuantizedWeight, values: torch.Tensor, group_size: int, rows: int) -> torch.Tensor:
    """Scheme-shaped (a, b) scale-like tensor -> (rows, N) for kernel groups of `group_size` along K: the scheme's
    own group (any size, also one that is not a multiple of 16) or a divisor of it, whose rows repeat its values.
    Rows past the scheme's last group (K padded to k_pad) repeat the last one."""
    s = qw.scheme
    n = qw.n
    if s.granularity == "block":
        bn, bk = s.block_size
        values = values.repeat_interleave(bn, dim=0)[:n]
        src_group = bk
    elif s.granularity == "group":
        src_group = s.group_size
    else:  # channel (with zero point): one kernel group spans K
        return values.reshape(n, 1).t().expand(rows, n)
    first_k = torch.arange(rows, device=values.device) * group_size
    idx = (first_k // src_group).clamp(max=values.shape[1] - 1)
    return values[:, idx].t()


def prepare_weight(plan: KernelPlan, qw: QuantizedWeight, device: torch.device | str) -> PreparedWeight:
    """Pad, repack and convert a dense QuantizedWeight for `plan`'s kernels; work happens on `device`."""
    s = qw.scheme
    layer = plan.layer
    if qw.codes.dim() != 2:
        raise ValueError(f"the dense kernel takes a (N, K) weight, got codes of shape {tuple(qw.codes.shape)}")
    if (qw.n, qw.k) != (layer.n, layer.k):
        raise ValueError(f"weight shape ({qw.n}, {qw.k}) does not match the layer (n={layer.n}, k={layer.k})")
    if s.weight != layer.scheme.weight or s.granularity != layer.scheme.granularity:
        raise ValueError(f"weight scheme ({s.summary()}) does not match the layer ({layer.scheme.summary()})")
    dt = TORCH_DTYPE[layer.dtype]
    mask = (1 << s.weight.bits) - 1
    codes = (qw.codes.to(device).to(torch.int32) ^ plan.code_offset) & mask
    codes = pad_to(codes.to(torch.uint8), {0: plan.n_pad, 1: plan.k_pad})
    b = pack_codes(codes, plan.b_layout).contiguous()

    scales = qw.scales.to(device, torch.float32)
    extra = None  # per-row factor that is not in the out_scale path
    if qw.channel_scale is not None:
        extra = qw.channel_scale.to(device, torch.float32)

    b_scale = b_zero = out_scale = None
    g = plan.group
    if g is not None:
        sc = _scales_per_element_row(qw, scales, g.group_size, g.rows)
        if extra is not None and not plan.out_scale:
            sc = sc * extra[None, :]
        sc_dt = sc.to(dt)
        if not torch.isfinite(sc_dt).all() or bool(((sc_dt == 0) & (sc != 0)).any()):
            raise ValueError(f"weight scales span [{sc.abs().min().item():.3g}, {sc.abs().max().item():.3g}], "
                             f"beyond what {layer.dtype} group scales can hold; use bfloat16 activations")
        b_scale = permute_group_rows(pad_to(sc_dt, {1: plan.n_pad})).contiguous()
        if plan.zero_point is not None:
            z = _scales_per_element_row(qw, qw.zero_points.to(device, torch.float32), g.group_size, g.rows)
            if plan.zero_point == "int":
                zero = -(z + plan.converter_bias)
            else:
                zero = -(z * sc)
            b_zero = permute_group_rows(pad_to(zero.to(dt), {1: plan.n_pad})).contiguous()
    if plan.out_scale:
        col = torch.ones(qw.n, device=device, dtype=torch.float32)
        if g is None:
            col = col * scales.reshape(-1)[: qw.n] if s.granularity == "channel" else col * scales.reshape(())
        if qw.global_scale is not None:
            col = col * qw.global_scale.to(device, torch.float32).reshape(())
        if extra is not None:
            col = col * extra
        out_scale = pad_to(col, {0: plan.n_pad}).contiguous()
    elif qw.global_scale is not None:
        raise ValueError("a global scale needs the out_scale epilogue (scheme.global_scale=True)")
    k_perm = None if qw.k_perm is None else qw.k_perm.to(device, torch.long)
    return PreparedWeight(layout_key=layout_key(plan), b=b, b_scale=b_scale, b_zero=b_zero, out_scale=out_scale,
                          k_perm=k_perm)

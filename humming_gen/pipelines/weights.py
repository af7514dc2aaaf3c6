"""QuantizedWeight (standard form) -> the tensors of the shared bit-plane weight layout (humming_gen.schemes.packing,
pipelines.common.SHARED_LAYOUT) on the target device. Both pipelines read it: the warp-specialized one maps a
warp's 64-row slice onto its wgmma rows, so a layer's kernels of either pipeline share one packed copy."""

from __future__ import annotations

import torch

from humming_gen.components.numeric.halfbits import BIAS, TORCH_DTYPE
from humming_gen.components.numeric.exponent_fold import (ExponentFold, empty_groups, fold_exponents,
                                                           pack_exponents)
from humming_gen.layer.weights import PreparedWeight
from humming_gen.pipelines.base import KernelPlan
from humming_gen.schemes import QuantizedWeight
from humming_gen.schemes.packing import (BLayout8, BLayoutNibble8, BLayoutS4, BLayoutSw128, pack_codes, pack_codes8,
                                         pack_codes_sw128, pack_nibbles8, pack_s4, pad_to, permute_group_rows)


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
    """Pad, repack and convert a dense QuantizedWeight for `plan`'s kernels (its WeightLayout); work happens on
    `device`."""
    s = qw.scheme
    layer = plan.layer
    lay = plan.layout
    if qw.codes.dim() != 2:
        raise ValueError(f"the dense kernel takes a (N, K) weight, got codes of shape {tuple(qw.codes.shape)}")
    if (qw.n, qw.k) != (layer.n, layer.k):
        raise ValueError(f"weight shape ({qw.n}, {qw.k}) does not match the layer (n={layer.n}, k={layer.k})")
    if s.weight != layer.scheme.weight or s.granularity != layer.scheme.granularity:
        raise ValueError(f"weight scheme ({s.summary()}) does not match the layer ({layer.scheme.summary()})")
    mask = (1 << s.weight.bits) - 1
    codes = (qw.codes.to(device).to(torch.int32) ^ lay.code_offset) & mask
    codes = pad_to(codes.to(torch.uint8), {0: lay.n_pad, 1: lay.k_pad})
    if isinstance(lay.b_layout, (BLayout8, BLayoutSw128)):
        return _prepare_weight8(lay, qw, codes, device)
    if isinstance(lay.b_layout, BLayoutNibble8):
        return _prepare_weight_nibbles(lay, qw, codes, device)
    if isinstance(lay.b_layout, BLayoutS4):  # int4 codes as they are (two's complement nibbles), two per byte
        return _prepare_weight8(lay, qw, codes, device)
    dt = TORCH_DTYPE[layer.dtype]
    b = pack_codes(codes, lay.b_layout).contiguous()

    scales = qw.scales.to(device, torch.float32)
    extra = None  # per-row factor that is not in the out_scale path
    if qw.channel_scale is not None:
        extra = qw.channel_scale.to(device, torch.float32)

    b_scale = b_zero = None
    row_exponent = None  # each row's power of two in out_scale, where the group scales carry the converter's
    if lay.group_size is not None:
        sc = _scales_per_element_row(qw, scales, lay.group_size, lay.group_rows)
        if extra is not None and not lay.out_scale:
            sc = sc * extra[None, :]
        held = sc  # (the scales as the scheme gives them, for the message below)
        if lay.scale_exponent:
            sc, row_exponent = _carry_exponent(sc, lay.scale_exponent, layer.dtype)
        sc_dt = sc.to(dt)
        if not torch.isfinite(sc_dt).all() or bool(((sc_dt == 0) & (sc != 0)).any()):
            hint = ("; use bfloat16 activations (8 exponent bits)" if layer.dtype == "float16"
                    else "; rescale the weights (a global scale can carry the common factor)")
            raise ValueError(f"weight scales span [{held.abs().min().item():.3g}, {held.abs().max().item():.3g}], "
                             f"beyond what {layer.dtype} group scales can hold{hint}")
        b_scale = permute_group_rows(pad_to(sc_dt, {1: lay.n_pad})).contiguous()
        if lay.zero_point is not None:
            z = _scales_per_element_row(qw, qw.zero_points.to(device, torch.float32), lay.group_size, lay.group_rows)
            if lay.zero_point == "int":
                zero = -(z + lay.converter_bias)
            else:
                zero = -(z * sc)
            b_zero = permute_group_rows(pad_to(zero.to(dt), {1: lay.n_pad})).contiguous()
    return PreparedWeight(layout_key=lay, b=b, b_scale=b_scale, b_zero=b_zero,
                          out_scale=_out_scale(lay, qw, scales, extra, device, row_exponent),
                          k_perm=_k_perm(qw, device))


def _carry_exponent(sc: torch.Tensor, exponent: int, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(group scales times 2^(exponent - r[n]), r[n]): the float converter's 2^exponent carried by the scales
    (pipelines.common.scale_exponent), less each row's r >= 0 that keeps its largest scale finite in `dtype`; the
    output scale multiplies row n by 2^r[n]. Powers of two, so exact wherever the scale itself is: the scales only
    grow (r <= exponent, as every stored scale is at most the type's largest)."""
    largest = sc.abs().amax(dim=0)
    _, top = torch.frexp(largest)  # largest scale of each row < 2^top
    r = (top + exponent - (BIAS[dtype] + 1)).clamp(min=0, max=exponent)  # (a finite value's largest exponent: BIAS)
    # a largest scale the 16-bit type does not hold (fp32 / fp16 scale dtypes) may round up to 2^top in it, which
    # is 2^(max exponent + 1) once carried: those rows keep one more power of two in out_scale
    carried = torch.ldexp(largest, (exponent - r).to(largest.dtype)).to(TORCH_DTYPE[dtype])
    r = torch.where(torch.isinf(carried) & (r < exponent), r + 1, r)
    return torch.ldexp(sc, (exponent - r)[None, :].to(sc.dtype)), r.to(torch.float32)


def _k_perm(qw: QuantizedWeight, device: torch.device | str) -> torch.Tensor | None:
    return None if qw.k_perm is None else qw.k_perm.to(device, torch.long)


def _out_scale(lay, qw: QuantizedWeight, scales: torch.Tensor, extra: torch.Tensor | None,
               device: torch.device | str, row_exponent: torch.Tensor | None = None) -> torch.Tensor | None:
    """The per-column fp32 factor of the epilogue: channel / tensor scales (without group parameters), the global
    scale, a channel scale that the group scales do not carry, and 2^row_exponent (_carry_exponent)."""
    s = qw.scheme
    out_scale = None
    if lay.out_scale:
        col = torch.ones(qw.n, device=device, dtype=torch.float32)
        if lay.group_size is None:
            col = col * scales.reshape(-1)[: qw.n] if s.granularity == "channel" else col * scales.reshape(())
        if qw.global_scale is not None:
            col = col * qw.global_scale.to(device, torch.float32).reshape(())
        if extra is not None:
            col = col * extra
        if row_exponent is not None:
            col = torch.ldexp(col, row_exponent)
        out_scale = pad_to(col, {0: lay.n_pad}).contiguous()
    elif qw.global_scale is not None:
        raise ValueError("a global scale needs the out_scale epilogue (scheme.global_scale=True)")
    return out_scale


def _prepare_weight8(lay, qw: QuantizedWeight, codes: torch.Tensor, device: torch.device | str,
                     code_scale: float = 1.0) -> PreparedWeight:
    """8-bit codes as they are (the mma multiplies them) in BLayout8 (or BLayoutSw128 panels); group / block scales as fp32 [group][n_pad]
    (read per warp k slice when partial sums are promoted), the rest folded into the fp32 out_scale. `code_scale`:
    what the mma operand is multiplied by to give the code's value (1/16 for nibbles widened to int8), folded into
    whichever scale the kernel reads (a power of two, so exact)."""
    scales = qw.scales.to(device, torch.float32) * code_scale
    extra = None if qw.channel_scale is None else qw.channel_scale.to(device, torch.float32)
    b_scale = None
    if lay.group_size is not None:
        sc = _scales_per_element_row(qw, scales, lay.group_size, lay.group_rows)
        if extra is not None and not lay.out_scale:
            sc = sc * extra[None, :]
        b_scale = pad_to(sc, {1: lay.n_pad}).contiguous()
    b = (pack_codes8(codes, lay.b_layout) if isinstance(lay.b_layout, BLayout8)
         else pack_codes_sw128(codes, lay.b_layout) if isinstance(lay.b_layout, BLayoutSw128)
         else pack_s4(codes, lay.b_layout) if isinstance(lay.b_layout, BLayoutS4)
         else pack_nibbles8(codes, lay.b_layout))
    out_scale = _out_scale(lay, qw, scales, extra, device)
    b_exponent = None
    if lay.fold_scales:
        b_exponent, out_scale = _fold_scales(lay, qw, extra, device)
    return PreparedWeight(layout_key=lay, b=b.contiguous(), b_scale=b_scale, b_zero=None, out_scale=out_scale,
                          k_perm=_k_perm(qw, device), b_exponent=b_exponent)


def _fold_scales(lay, qw: QuantizedWeight, extra: torch.Tensor | None, device: torch.device | str
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(b_exponent, out_scale) of the folded e8m0 group scales (components.numeric.exponent_fold): the deltas in
    the kernel's word layout and the rows' factor 2^r (times a channel scale the group scales do not carry); the
    fp32 group scales stay for the kernels that promote them. ValueError where the data does not fold."""
    empty = empty_groups(qw.codes.to(device), qw.scheme.weight, qw.scheme.group_size)
    folded = fold_exponents(qw.scales.to(device), ExponentFold(weight=qw.scheme.weight).window, empty)
    if folded is None:
        raise ValueError("fold_scales=True: the group scales do not fold (a row's exponents span more than the "
                         "window, or a scale is not a power of two; humming_gen.layer.weights.scales_fold decides)")
    b_exponent = pack_exponents(folded.deltas, qw.scheme.group_size, lay.n_pad, lay.k_pad)
    row = torch.ldexp(torch.ones(qw.n, device=device, dtype=torch.float64), folded.row_exponent.double()).float()
    if extra is not None:
        row = row * extra
    return b_exponent, pad_to(row, {0: lay.n_pad}).contiguous()


def _prepare_weight_nibbles(lay, qw: QuantizedWeight, codes: torch.Tensor,
                            device: torch.device | str) -> PreparedWeight:
    """Codes of at most 4 bits as nibbles in BLayoutNibble8. Order "int8": signed codes sign-extended to 4 bits
    (the register holds 16 x the code: scales times 1/16); order "e4m3": the codes as they are (a table gives their
    e4m3 value). Scales as for 8-bit codes."""
    bits = qw.scheme.weight.bits
    code_scale = 1.0
    if lay.b_layout.order == "int8":
        sign = (codes >> (bits - 1)) & 1
        codes = codes | (sign * (0xF ^ ((1 << bits) - 1))).to(torch.uint8)
        code_scale = 1.0 / 16
    return _prepare_weight8(lay, qw, codes, device, code_scale)

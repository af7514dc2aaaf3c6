"""Reference round-to-nearest quantizers for weights and activations.

Every quantizer here is plain float64 torch math, written for clarity rather than speed: it is the producer of
test weights and the activation half of the float64 GEMM oracle. Weights and activations share one core that
works on rectangular scale blocks (channel = (1, K), group = (1, g), block = (bn, bk), tensor = (N, K)).

Scale rules (docs/FORMATS.md section numbers in brackets):
- symmetric: `scale = amax / qmax` with `qmax` the largest finite element magnitude (int4: amax / 7, codes
  clamped to [-8, 7]; float4e2m1: amax / 6; float8e4m3: amax / 448). The top code -2^(b-1) of a signed int is
  only reached by clamping, so the format's range is used symmetrically (vLLM/Humming style, not GPTQ's amax/7.5).
- zero point (uintB): the range is widened to contain 0 (GPTQ style) so that 0 is exact and the zero point
  needs no clamping: `s = (max - min) / (2^b - 1)`; "int": `z = round(-min / s)`; "float": `z = -min / s`.
  An unsigned format without a zero point holds only non-negative values: `scale = amax / max`, negatives -> 0.
- e8m0 scales [2.1]: the MX shared exponent from the block amax by `scheme.scale_rule` ("rceil", "floor",
  "even"); exponents are clamped to e8m0's range [-127, 127] instead of producing a NaN scale.
- global scale [2.2, ModelOpt]: `s2 = amax_tensor / (qmax * scale_max)` in float32 (scale_max = 448 for e4m3),
  block scales `s_b = round(amax_block / (qmax * s2))`; elements saturate.
- Scales are rounded (to nearest) to the scale dtype BEFORE the codes are computed, so `dequantize()` is exactly
  what the codes mean. A block whose amax is 0 gets scale 1; a scale that rounds to 0 becomes the scale
  format's smallest positive value; codes are then computed with the stored scale (and stored zero point).
- Activations [4]: float elements get vLLM's floor `scale >= 1 / (qmax * 512)` (fp8: 1/(448*512)); int8 uses
  `amax / 127` with RNE and clamp to [-128, 127].
"""

from __future__ import annotations

import math
from typing import NamedTuple

import attrs
import torch

from humming_gen.formats import DType, FloatType, IntType
from humming_gen.schemes.scheme import ActivationScheme, QuantizedWeight, QuantScheme, first_nonfinite

__all__ = ["QuantizedActivation", "element_qmax", "mx_exponent", "quantize_activation", "quantize_weight",
           "round_to_dtype"]

_E8M0 = "float8e8m0"


# --- small numeric helpers --------------------------------------------------------------------------------
def element_qmax(elem: DType) -> float:
    """Largest element magnitude a symmetric scale maps amax onto (int4: 7, float4e2m1: 6, int1: 1)."""
    if isinstance(elem, IntType):
        return float(elem.max_value) if elem.max_value > 0 else 1.0  # int1 = {-1, 0}: map amax onto -1
    return elem.max_finite


def round_to_dtype(x: torch.Tensor, d: DType) -> torch.Tensor:
    """Values of `x` rounded to nearest (ties to even, saturating) in format `d`, as float64."""
    return d.decode(d.encode(x)).to(torch.float64)


def _exact_log2_parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(floor(log2 x), x / 2^floor) for x > 0, exactly (frexp, not log2, which rounds near powers of two)."""
    mant, exp = torch.frexp(x)
    return (exp - 1).to(torch.int64), mant * 2.0


def mx_exponent(amax: torch.Tensor, elem: DType, rule: str) -> torch.Tensor:
    """MX shared exponent e (scale 2^e) of blocks with maximum magnitude `amax` (docs/FORMATS.md 2.1).

    rceil: ceil(log2(amax / max_finite)), never clips (Humming, cuBLAS). floor: floor(log2 amax) - emax (OCP;
    elements above max_finite are clipped). even: amax rounded to the element's precision at its top binade
    (FP4: significand >= 1.75 rounds up), then floor - emax (compressed-tensors). amax == 0 gives e = 0;
    results are clamped to e8m0's [-127, 127].
    """
    amax = amax.to(torch.float64)
    positive = amax > 0
    safe = torch.where(positive, amax, torch.ones_like(amax))
    qmax = element_qmax(elem)
    emax = int(math.floor(math.log2(qmax)))
    if rule == "rceil":
        fl, sig = _exact_log2_parts(safe / qmax)
        e = fl + (sig > 1.0).to(torch.int64)
    elif rule == "floor":
        fl, _ = _exact_log2_parts(safe)
        e = fl - emax
    elif rule == "even":
        # Precision of the top binade: float mantissa bits, or for ints/e0 formats the integer steps in it.
        m = elem.mantissa_bits if isinstance(elem, FloatType) and elem.exponent_bits > 0 else emax
        fl, sig = _exact_log2_parts(safe)
        e = fl + (sig >= 2.0 - 2.0 ** -(m + 1)).to(torch.int64) - emax
    else:
        raise ValueError(f"scale_rule must be 'rceil', 'floor' or 'even', got {rule!r}")
    e = torch.where(positive, e, torch.zeros_like(e))
    return e.clamp(-127, 127)


def _round_scale(raw: torch.Tensor, d: DType) -> torch.Tensor:
    """Round raw positive scales to format `d`; zero-amax blocks get 1, underflow gets d's smallest positive."""
    s = round_to_dtype(raw, d)
    s = torch.where(s == 0, torch.full_like(s, d.min_subnormal), s)
    return torch.where(raw == 0, torch.ones_like(s), s)


# --- block views --------------------------------------------------------------------------------------------
def _blocks(x: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """(..., N, K) -> (..., ceil(N/bn), ceil(K/bk), bn*bk). Partial edge blocks are padded by repeating the
    last row/column, which belongs to the same block, so min, max and amax see only real elements."""
    n, k = x.shape[-2:]
    nb, kb = -(-n // bn), -(-k // bk)
    rows = torch.arange(nb * bn, device=x.device).clamp(max=n - 1)
    cols = torch.arange(kb * bk, device=x.device).clamp(max=k - 1)
    xp = x.index_select(-2, rows).index_select(-1, cols)
    xp = xp.reshape(*x.shape[:-2], nb, bn, kb, bk).transpose(-3, -2)
    return xp.reshape(*x.shape[:-2], nb, kb, bn * bk)


def _expand(t: torch.Tensor, bn: int, bk: int, n: int, k: int) -> torch.Tensor:
    """Per-block values (..., nb, kb) -> one per element (..., n, k)."""
    return t.repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)[..., :k]


def _block_dims(granularity: str, n: int, k: int, group_size: int | None,
                block_size: tuple[int, int] | None) -> tuple[int, int]:
    if granularity in ("channel", "token"):
        return 1, k
    if granularity == "group":
        return 1, int(group_size)
    if granularity == "block":
        return int(block_size[0]), int(block_size[1])
    return n, k  # tensor


# --- the shared core ------------------------------------------------------------------------------------------
class _Result(NamedTuple):
    codes: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor | None
    global_scale: torch.Tensor | None


def _quantize_blocks(x: torch.Tensor, bn: int, bk: int, elem: DType, scale_dtype: DType, rule: str,
                     zero_point: str | None = None, zero_point_dtype: DType | None = None,
                     global_scale: bool = False, min_scale: float | None = None,
                     static_global: torch.Tensor | None = None, static_scale: torch.Tensor | None = None) -> _Result:
    """Quantize x (..., N, K) with one scale per (bn, bk) block; leading dims (experts) are independent."""
    x64 = x.to(torch.float64)
    n, k = x64.shape[-2:]
    # A block longer than the tensor holds the same elements as one of the tensor's length; clamping keeps
    # `_blocks` from padding a (N, K) weight to (N, group_size) (group_size = 2^25 on a small weight: gigabytes).
    bn, bk = max(1, min(bn, n)), max(1, min(bk, k))
    blocks = _blocks(x64, bn, bk)
    g = None
    if zero_point is not None:
        lo = blocks.amin(-1).clamp(max=0.0)
        hi = blocks.amax(-1).clamp(min=0.0)
        qrange = float((1 << elem.bits) - 1)
        scale = _round_scale((hi - lo) / qrange, scale_dtype)
        z = -lo / scale
        z = torch.round(z).clamp(0.0, qrange) if zero_point == "int" else z.to(torch.float32).to(torch.float64)
        if zero_point_dtype is not None:
            z = round_to_dtype(z, zero_point_dtype)
        q = x64 / _expand(scale, bn, bk, n, k) + _expand(z, bn, bk, n, k)
        return _Result(elem.encode(q).to(torch.uint8), scale.to(torch.float32), z.to(torch.float32), None)

    qmax = element_qmax(elem)
    amax = blocks.abs().amax(-1)
    if global_scale:
        if static_global is not None:
            g = static_global.to(torch.float64).reshape(*x64.shape[:-2], 1, 1).expand(*x64.shape[:-2], 1, 1)
        else:
            # 8-bit scale formats (e4m3) get their whole range; wide formats keep block scales <= 1.
            top = scale_dtype.max_finite if scale_dtype.bits <= 8 and scale_dtype.name != _E8M0 else 1.0
            amax_t = x64.abs().amax(dim=(-2, -1), keepdim=True)
            g = (amax_t / (qmax * top)).to(torch.float32).to(torch.float64)
            g = torch.where(g == 0, torch.ones_like(g), g)
        amax = amax / g
    if static_scale is not None:
        scale = static_scale.to(torch.float64).reshape(*x64.shape[:-2], 1, 1).expand_as(amax)
    elif scale_dtype.name == _E8M0:
        scale = torch.exp2(mx_exponent(amax, elem, rule).to(torch.float64))
    else:
        raw = amax / qmax
        if min_scale is not None:
            raw = raw.clamp(min=min_scale)
        scale = _round_scale(raw, scale_dtype)
    full = _expand(scale, bn, bk, n, k)
    if g is not None:
        full = full * g
    codes = elem.encode(x64 / full).to(torch.uint8)
    gs = None if g is None else g.reshape(x64.shape[:-2]).to(torch.float32)
    return _Result(codes, scale.to(torch.float32), None, gs)


# --- weights --------------------------------------------------------------------------------------------------
def quantize_weight(scheme: QuantScheme, w: torch.Tensor) -> QuantizedWeight:
    """Quantize a float (N, K) or (E, N, K) weight with `scheme` (round to nearest, ties to even).

    Returns the standard `QuantizedWeight` (uint8 codes, float32 scales / zero points / global scale). Experts
    are quantized independently (per-tensor and global scales become (E,) or (E, 1, 1) tensors).
    Raises ValueError for other shapes, non-floating inputs and NaN / inf elements (naming the first one).
    """
    if not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point or w.dim() not in (2, 3):
        raise ValueError(f"quantize_weight expects a floating (N, K) or (E, N, K) tensor, got "
                         f"{getattr(w, 'dtype', type(w).__name__)} {tuple(getattr(w, 'shape', ()))}")
    found = first_nonfinite(w)
    if found is not None:
        index, value = found
        where = "weight[" + ", ".join(str(i) for i in index) + "]"
        count = int((~torch.isfinite(w)).sum())
        raise ValueError(f"quantize_weight: {where} is {value} ({count} non-finite element(s) in all); every "
                         f"weight must be finite: a NaN or inf has no quantized value and would poison its "
                         f"group's scale")
    if scheme.zero_point is not None and scheme.global_scale:
        raise ValueError("quantize_weight: a global scale together with a zero point has no reference rule")
    n, k = w.shape[-2:]
    bn, bk = _block_dims(scheme.granularity, n, k, scheme.group_size, scheme.block_size)
    r = _quantize_blocks(w, bn, bk, scheme.weight, scheme.scale_dtype, scheme.scale_rule,
                         zero_point=scheme.zero_point, zero_point_dtype=scheme.zero_point_dtype,
                         global_scale=scheme.global_scale)
    return QuantizedWeight(scheme, r.codes, r.scales, r.zero_points, r.global_scale)


# --- activations ----------------------------------------------------------------------------------------------
PANEL_K = 128  # columns per panel of QuantizedActivation's "panels" layout (a 128-byte swizzle row of codes)
MAX_PANEL_ROWS = (2 ** 31 - 1) // PANEL_K  # the GEMMs take the panel stride (rows * 128 bytes) as a 32-bit int


@attrs.define(eq=False)
class QuantizedActivation:
    """Quantized activations (..., K), in one of three layouts.

    layout "reference" (`ActivationScheme.quantize`): codes uint8, one raw element code per byte, shape of the
    input; scales float32 decoded values, (..., 1) per token, (..., ceil(K / group_size)) per group, (1, ..., 1)
    per tensor; global_scale float32 scalar or None.
    layout "kernel" (`humming_gen.quantize_activation`, the layout GEMM kernels read; docs/FORMATS.md 4.1): codes
    uint8 (..., K) for 8-bit formats or (..., K / 2) for 4-bit ones (element 2j in the low nibble of byte j), rows
    16-byte aligned (stride(-2) = K bytes rounded up to 16; the bytes past the row's end are unspecified); scales
    of the same shapes as the reference's, row-major, as raw bits of the scheme's scale dtype (float32 / bfloat16 /
    float16 tensors, uint8 codes for the 8-bit formats e4m3, e5m2, e8m0); global_scale as the reference's.
    layout "panels" (`humming_gen.quantize_activation(x, s, layout="panels")`, what the warp-specialized 8-bit GEMMs
    copy a stage of in one bulk copy): 8-bit codes of (M, K) activations, K a multiple of 128, as (K / 128, M, 128)
    uint8: panel p holds columns 128p .. 128p + 127, row r's 16-byte chunk c at bytes 16 (c ^ (r % 8)) of its row
    (wgmma's 128-byte swizzle); scales as in layout "kernel".
    `to_reference()` turns a kernel- or panels-layout result into the reference layout.
    """

    scheme: ActivationScheme
    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor | None = None
    layout: str = "reference"

    def to_reference(self) -> "QuantizedActivation":
        """The reference layout of the same codes and scales (unpacked codes, float32 decoded scales)."""
        if self.layout == "reference":
            return self
        codes = self.codes
        if self.layout == "panels":
            panels, m, _ = codes.shape
            rows = torch.arange(m, device=codes.device)
            chunk = torch.arange(8, device=codes.device)
            physical = chunk[None, :] ^ (rows[:, None] % 8)  # (m, 8): where row r keeps its chunk c
            chunks = codes.reshape(panels, m, 8, 16)
            chunks = torch.gather(chunks, 2, physical[None, :, :, None].expand(panels, m, 8, 16))
            codes = chunks.permute(1, 0, 2, 3).reshape(m, panels * 128)
        if self.scheme.dtype.bits == 4:
            low, high = codes & 0xF, codes >> 4
            codes = torch.stack([low, high], dim=-1).reshape(*codes.shape[:-1], 2 * codes.shape[-1])
        codes = codes.contiguous()
        sd = self.scheme.scale_dtype
        scales = self.scales
        if scales.dtype == torch.uint8:
            scales = sd.decode(scales.to(torch.int64))
        scales = scales.to(torch.float32)
        return QuantizedActivation(self.scheme, codes, scales, self.global_scale)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Exact value of every element: decode(code) * scale (* global scale)."""
        if self.layout != "reference":
            return self.to_reference().dequantize(dtype)
        k = self.codes.shape[-1]
        v = self.scheme.dtype.decode(self.codes).to(torch.float64)
        s = self.scales.to(torch.float64)
        if self.scheme.granularity == "group":
            s = s.repeat_interleave(self.scheme.group_size, dim=-1)[..., :k]
        v = v * s
        if self.global_scale is not None:
            v = v * self.global_scale.to(torch.float64)
        return v.to(dtype)


def quantize_activation(ascheme: ActivationScheme, x: torch.Tensor,
                        static_scale: torch.Tensor | None = None) -> QuantizedActivation:
    """Quantize activations x (..., K) with `ascheme` (docs/FORMATS.md section 4).

    static_scale: a checkpoint's per-tensor `input_scale`; it is the global scale when the scheme has one
    (NVFP4), else the per-tensor scale (granularity "tensor" only). None = dynamic, computed from x.
    """
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() < 1:
        raise ValueError(f"quantize_activation expects a floating (..., K) tensor, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    if static_scale is not None and not ascheme.global_scale and ascheme.granularity != "tensor":
        raise ValueError(f"quantize_activation: static_scale needs granularity 'tensor' or a global scale, "
                         f"got granularity {ascheme.granularity!r}")
    shape = x.shape
    k = shape[-1]
    x2 = x.reshape(1, -1, k)  # (1, M, K): the leading 1 keeps global/tensor scales per "expert" like weights
    m = x2.shape[1]
    bn, bk = _block_dims(ascheme.granularity, m, k, ascheme.group_size, None)
    elem = ascheme.dtype
    floor = None
    if elem.is_float and ascheme.scale_dtype.name != _E8M0 and not ascheme.global_scale:
        floor = 1.0 / (element_qmax(elem) * 512.0)
    static = None if static_scale is None else torch.as_tensor(static_scale, dtype=torch.float64,
                                                                device=x.device).reshape(1)
    r = _quantize_blocks(x2, max(bn, 1), bk, elem, ascheme.scale_dtype, ascheme.scale_rule,
                         global_scale=ascheme.global_scale, min_scale=floor,
                         static_global=static if ascheme.global_scale else None,
                         static_scale=static if not ascheme.global_scale else None)
    codes = r.codes.reshape(shape)
    if ascheme.granularity == "tensor":
        scales = r.scales.reshape((1,) * len(shape))
    else:
        scales = r.scales.reshape(*shape[:-1], r.scales.shape[-1])
    gs = None if r.global_scale is None else r.global_scale.reshape(())
    return QuantizedActivation(ascheme, codes, scales, gs)

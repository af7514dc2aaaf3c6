"""e8m0 group scales folded into the e4m3 weight operand (weights of at most 4 bits, e.g. MXFP4, on fp8 wgmma).

Why: multiplying wgmma partial sums by a group scale every 32 k (promotion) is FFMA-bound. Split each row's
power-of-two group scale 2^s[n, g] into a row factor 2^r[n], which joins the output scale in the epilogue, and a
small delta d = s - r carried by the operand itself: a code of value v becomes the e4m3 value v * 2^d, exact
wherever every nonzero v * 2^d is a normal e4m3 value (e2m1: d in [-5, 6]; 0.5 * 2^-5 = 2^-6 is e4m3's smallest
normal, 6 * 2^6 = 384 <= 448). Partial sums are then promoted as for channel scales (every 128 k, fp8 drift).

In registers, d is added to the exponent field of NibbleToE4m3's prmt lookup table (every entry but code 0's)
before the lookup: a table per row and k32 step costs a byte broadcast and two adds and masks, where adding d to
each widened byte would cost about seven instructions per register. Entries and increments stay below 0x80, so no
carry crosses a byte; the code's top bit is the e4m3 sign, as in NibbleToE4m3's "sign_magnitude" mode.

A layer folds when every row's exponents fit the window (fold_exponents), else its group scales stay on the
promotion path. `b_exponent` holds d per (row, k32 step) as a byte with d mod 16 in the exponent field (bits 3-6),
in int32 words [n_pad / 128][k_pad / 128][128 rows]: byte j of a word is the row's k32 step 4 * (128-k block) + j,
so a stage of a 128-row tile is one contiguous copy and a thread reads one word per row and 128 k.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, ClassVar

import attrs
import torch

from humming_gen.components.base import Component
from humming_gen.components.numeric.nibble8 import NibbleToE4m3, e4m3_table, prmt_model
from humming_gen.formats import DType, FloatType, dtype

if TYPE_CHECKING:
    from humming_gen.schemes import QuantScheme

STEP_K = 32  # k of one wgmma / mma k32 step: the granularity of the deltas
ROWS = 128  # rows of one word block of b_exponent (a layout block, the 8-bit tile's rows)
EXPONENT_SHIFT = 3  # e4m3's exponent field starts at bit 3
E4M3 = dtype("float8e4m3")


@functools.cache  # ~30 encode / decode round trips, asked per expert and per kernel: most of a QuantMoE's build
def exponent_window(weight: DType) -> tuple[int, int] | None:
    """(lo, hi): the deltas d for which every nonzero value of `weight` times 2^d is a normal e4m3 value, or None
    where there is none (an interval: the smallest magnitude bounds lo, the largest bounds hi). The folded lookup
    adds d to the exponent fields of the values' own e4m3 codes, so the window must hold d = 0: a format with
    values below e4m3's smallest normal (subnormal codes) does not fold."""
    values = weight.decode(torch.arange(1 << weight.bits)).to(torch.float64)
    values = values[values != 0]
    assert isinstance(E4M3, FloatType)
    smallest_normal = 2.0 ** (1 - E4M3.bias)
    fits = []
    for d in range(-2 * E4M3.bias, 2 * E4M3.bias + 1):
        scaled = values * 2.0 ** d
        exact = torch.equal(E4M3.decode(E4M3.encode(scaled)).to(torch.float64), scaled)
        if exact and bool((scaled.abs() >= smallest_normal).all()):
            fits.append(d)
    return (fits[0], fits[-1]) if fits and fits[0] <= 0 <= fits[-1] else None


def weight_reasons(weight: DType) -> list[str]:
    """Why codes of `weight` cannot be widened to e4m3 times 2^d by the folded lookup."""
    if weight.bits > 4:
        return [f"weight format {weight.name}: codes of at most 4 bits (nibbles looked up as e4m3) fold"]
    try:
        mode = NibbleToE4m3(weight=weight).mode
    except ValueError as e:
        return [str(e)]
    if mode != "sign_magnitude":
        return [f"weight format {weight.name}: the folded lookup holds magnitudes, the sign in a 4-bit code's top "
                f"bit (codes 8-15 are codes 0-7 negated, as in e2m1)"]
    magnitudes = weight.decode(torch.arange(1, 8)).to(torch.float64)
    if bool((magnitudes == 0).any()):
        return [f"weight format {weight.name}: a code other than 0 has the value 0 (the folded lookup leaves only "
                f"code 0's entry at zero)"]
    if exponent_window(weight) is None:
        return [f"weight format {weight.name}: its nonzero values are not all normal e4m3 values (the folded lookup "
                f"adds exponents to their e4m3 codes)"]
    return []


def fold_reasons(scheme: "QuantScheme") -> list[str]:
    """Why the scheme's weight scales cannot fold into the e4m3 weight operand, whatever the data."""
    reasons = []
    a = scheme.activation
    if a is None or not a.dtype.is_float:
        reasons.append("activations that are not fp8: the fold scales the e4m3 weight operand of fp8 kernels")
    if scheme.scale_dtype.name != "float8e8m0" or scheme.granularity != "group":
        reasons.append(f"{scheme.scale_dtype.name} {scheme.granularity} scales: e8m0 group scales (powers of two) "
                       f"fold")
    elif scheme.group_size % STEP_K:
        reasons.append(f"group_size={scheme.group_size}: a delta per k{STEP_K} step needs groups of a multiple of "
                       f"{STEP_K}")
    if scheme.global_scale:
        reasons.append("a global scale: the standard pipeline's out_scale carries it, the fold's carries 2^r")
    return reasons + weight_reasons(scheme.weight)


@attrs.frozen
class FoldedExponents:
    """A weight's group-scale exponents split into a row exponent r[n] and deltas d[n, g] within the window."""

    row_exponent: torch.Tensor  # (N,) int32: the row's factor 2^r[n] (with the output scale, epilogue)
    deltas: torch.Tensor  # (N, groups) int32: the group's 2^d[n, g] (in the operand)


def fold_exponents(scales: torch.Tensor, window: tuple[int, int],
                   empty: torch.Tensor | None = None) -> FoldedExponents | None:
    """Split power-of-two group scales (N, groups) into 2^r[n] * 2^d[n, g] with d in `window`: r[n] = the row's
    largest exponent minus window[1]. None where some row's exponents span more than the window, or a scale is
    not a finite positive power of two (the layer keeps the promotion path). `empty` (N, groups): groups whose codes
    are all zero (empty_groups), whose scale multiplies nothing: they neither bound the row nor need their own
    delta (theirs is clamped into the window; the lookup maps zero codes to zero whatever the delta)."""
    s = scales.to(torch.float64)
    used = torch.ones_like(s, dtype=torch.bool) if empty is None else ~empty.to(s.device)
    mantissa, exponent = torch.frexp(torch.where(used, s, 1.0))
    if not bool(((mantissa == 0.5) & torch.isfinite(s) | ~used).all()):
        return None
    exponent = exponent.to(torch.int32) - 1
    row = torch.where(used, exponent, torch.iinfo(torch.int32).min).amax(dim=1)
    row = torch.where(used.any(dim=1), row, window[1]) - window[1]  # a row of empty groups: r = 0
    deltas = exponent - row[:, None]
    if bool((used & (deltas < window[0])).any()):
        return None
    return FoldedExponents(row_exponent=row, deltas=deltas.clamp(window[0], window[1]))


def empty_groups(codes: torch.Tensor, weight: DType, group_size: int) -> torch.Tensor:
    """(..., N, groups) bool: the groups along K whose codes all decode to zero (+0 and -0 alike), the last group
    possibly partial. The codes are compared with the few bit patterns that decode to zero (decode masks its input
    to `bits` bits too): decoding every code of an (E, N, K) MoE weight took most of a W4A8 QuantMoE's build."""
    patterns = torch.arange(1 << weight.bits)
    c = codes if codes.dtype == torch.uint8 and weight.bits <= 8 else codes.to(torch.int32)
    c = c & ((1 << weight.bits) - 1)
    zero = torch.zeros(c.shape, dtype=torch.bool, device=c.device)
    for pattern in patterns[weight.decode(patterns) == 0].tolist():
        zero |= c == pattern
    k = codes.shape[-1]
    pad = -k % group_size
    zero = torch.nn.functional.pad(zero, (0, pad), value=True)
    return zero.view(*zero.shape[:-1], (k + pad) // group_size, group_size).all(dim=-1)


def pack_exponents(deltas: torch.Tensor, group_size: int, n_pad: int, k_pad: int) -> torch.Tensor:
    """Deltas (N, groups) -> b_exponent: int32 words [n_pad / 128][k_pad / 128][128] (module docstring). k32 steps
    past the last group take its delta, padded rows 0 (their codes are zero)."""
    n, groups = deltas.shape
    steps = torch.arange(k_pad // STEP_K, device=deltas.device)
    per_step = deltas[:, (steps * STEP_K // group_size).clamp(max=groups - 1)]
    fields = ((per_step & 0xF) << EXPONENT_SHIFT).to(torch.int64)  # d mod 16 in the exponent field
    fields = torch.nn.functional.pad(fields, (0, 0, 0, n_pad - n))
    blocks = fields.view(n_pad // ROWS, ROWS, k_pad // (4 * STEP_K), 4)  # [n block][row][128-k block][byte]
    words = (blocks << (8 * torch.arange(4, device=deltas.device))).sum(dim=-1).permute(0, 2, 1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).contiguous()


@attrs.frozen
class ExponentFold(Component):
    """Nibble codes (BLayoutNibble8, order "e4m3") -> e4m3 registers times 2^d of the row's group: NibbleToE4m3's
    sign-magnitude lookup with the delta added to the table's exponent fields (module docstring)."""

    template: ClassVar[str] = "numeric/exponent_fold.cuh.j2"
    family: ClassVar[str] = "numeric"
    ptx: ClassVar[tuple[str, ...]] = ("prmt",)
    provides: ClassVar[frozenset[str]] = frozenset({"kE4m3Low0", "kE4m3Low1", "E4m3Table", "fold_table",
                                                   "nibbles_to_a8_folded"})
    needs: ClassVar[frozenset[str]] = frozenset({"prmt"})
    weight: DType

    def __attrs_post_init__(self) -> None:
        reasons = weight_reasons(self.weight)
        if reasons:
            raise ValueError("; ".join(reasons))

    @property
    def window(self) -> tuple[int, int]:
        window = exponent_window(self.weight)
        assert window is not None  # weight_reasons
        return window

    def _low_words(self) -> tuple[int, int]:
        t = e4m3_table(self.weight)
        return sum(t[i] << 8 * i for i in range(4)), sum(t[4 + i] << 8 * i for i in range(4))

    def extra_context(self) -> dict:
        low = self._low_words()
        return {"weight_name": self.weight.name, "low": [f"0x{w:08X}u" for w in low], "lo": self.window[0],
                "hi": self.window[1]}

    def table_model(self, exponents: int, step: int) -> tuple[int, int]:
        """Python model of fold_table: the (low0, low1) table words of byte `step` of a row's exponent word."""
        low0, low1 = self._low_words()
        increment = prmt_model(exponents, 0, step * 0x1111)
        return (low0 + increment) & 0x7F7F7F00, (low1 + increment) & 0x7F7F7F7F

    def emulate(self, word: int, table_x: tuple[int, int], table_y: tuple[int, int]) -> tuple[int, int]:
        """Python model of nibbles_to_a8_folded: the X (row g) and Y (row g + 8) registers of one word."""
        index = word & 0x77777777
        x = prmt_model(*table_x, index) | (word & 0x80808080)
        y = prmt_model(*table_y, index >> 16) | ((word << 4) & 0x80808080)
        return x, y

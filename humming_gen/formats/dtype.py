"""Element formats: the `DType` description shared by reference math and code generation.

A DType is pure data (bits, exponent, mantissa, bias, special-value rules). Every property later code needs
(max finite, exact representability of one format in another, code tables) is derived from those fields,
so a custom format registered from Python works wherever a built-in one does.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Literal

import attrs
import torch

NanStyle = Literal["none", "all_ones", "ieee"]

# A format's name becomes part of generated kernel names, of the comment header of the generated source and of
# cache and lock file names, so it must be a plain identifier: no newline, no path separator, no quote.
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def check_name(name: object, what: str) -> None:
    """ValueError unless `name` is an identifier-like string of at most 64 characters."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValueError(f"{what}: got {name!r}; allowed: an identifier-like string of 1..64 characters "
                         f"(letters, digits, '_', not starting with a digit)")


@attrs.frozen
class DType:
    """Base of every element format. `name` is the public spelling (`float4e2m1`, `uint4`, ...)."""

    name: str
    bits: int

    def to_dict(self) -> dict:
        """Every field, enough to rebuild the format in another process (`humming_gen.formats.dtype_from_dict`)."""
        raise NotImplementedError

    @property
    def is_float(self) -> bool:
        return isinstance(self, FloatType)

    @property
    def is_int(self) -> bool:
        return isinstance(self, IntType)

    @property
    def signed(self) -> bool:
        raise NotImplementedError

    @property
    def num_codes(self) -> int:
        return 1 << self.bits

    # --- derived value properties -------------------------------------------------------------
    @property
    def max_finite(self) -> float:
        return float(self._finite_values().max())

    @property
    def min_finite(self) -> float:
        return float(self._finite_values().min())

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (for ints: 1)."""
        vals = self._finite_values()
        return float(vals[vals > 0].min())

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Raw bit patterns (any integer tensor) -> float32 values."""
        raise NotImplementedError

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Values -> raw codes (int64): round to nearest, ties to even, saturate to +-max finite."""
        raise NotImplementedError

    def code_values(self) -> torch.Tensor:
        """float64 value of every code 0 .. 2^bits-1 (NaN where the code is NaN). Only for bits <= 16."""
        return _code_values(self)

    def _finite_values(self) -> torch.Tensor:
        if self.bits > 16:
            return torch.tensor([-torch.finfo(torch.float32).max, torch.finfo(torch.float32).max,
                                 2.0 ** -149], dtype=torch.float64)
        vals = self.code_values()
        return vals[torch.isfinite(vals)]

    def represents(self, other: "DType") -> bool:
        """True when every finite value of `other` is exactly a value of `self`."""
        return _represents(self, other)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"dtype({self.name!r})"


def _check_bits(bits: int, lo: int, hi: int, what: str) -> None:
    if not isinstance(bits, int) or isinstance(bits, bool) or not lo <= bits <= hi:
        raise ValueError(f"{what} must be an integer in [{lo}, {hi}], got {bits!r}")


@attrs.frozen(init=False, repr=False)
class IntType(DType):
    """Two's complement (`signed=True`) or unsigned integer of 1..32 bits."""

    is_signed: bool

    def __init__(self, bits: int, signed: bool = True, name: str | None = None):
        _check_bits(bits, 1, 32, "IntType bits")
        if name is None:
            name = f"{'int' if signed else 'uint'}{bits}"
        check_name(name, "IntType name")
        self.__attrs_init__(name=name, bits=bits, is_signed=bool(signed))

    def to_dict(self) -> dict:
        return {"kind": "int", "name": self.name, "bits": self.bits, "signed": self.is_signed}

    @property
    def signed(self) -> bool:
        return self.is_signed

    @property
    def min_value(self) -> int:
        return -(1 << (self.bits - 1)) if self.is_signed else 0

    @property
    def max_value(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.is_signed else (1 << self.bits) - 1

    @property
    def max_finite(self) -> float:
        return float(self.max_value)

    @property
    def min_finite(self) -> float:
        return float(self.min_value)

    @property
    def min_subnormal(self) -> float:
        return 1.0

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        c = codes.to(torch.int64) & ((1 << self.bits) - 1)
        if self.is_signed:
            c = torch.where(c >= (1 << (self.bits - 1)), c - (1 << self.bits), c)
        return c.to(torch.float32) if self.bits <= 24 else c.to(torch.float64).to(torch.float32)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(x).to(torch.float64)
        x = torch.nan_to_num(x, nan=0.0)
        q = torch.round(x).clamp(self.min_value, self.max_value).to(torch.int64)  # torch.round is RNE
        return q & ((1 << self.bits) - 1)


@attrs.frozen(init=False, repr=False)
class FloatType(DType):
    """Floating format S.E.M. `exponent_bits=0` gives a sign-magnitude integer (`float4e0m3` = -7..7).

    nan: "none" (every code finite: OCP FP4/FP6 and generic custom formats), "all_ones" (only the code with
    all exponent and mantissa bits set is NaN: e4m3fn, e8m0), "ieee" (max exponent = inf/NaN: fp16, e5m2).
    """

    exponent_bits: int
    mantissa_bits: int
    is_signed: bool
    bias: int
    nan: str
    subnormals: bool

    def __init__(self, exponent_bits: int, mantissa_bits: int, signed: bool = True, bias: int | None = None,
                 nan: NanStyle = "none", subnormals: bool = True, name: str | None = None):
        _check_bits(exponent_bits, 0, 8, "FloatType exponent_bits")
        _check_bits(mantissa_bits, 0, 23, "FloatType mantissa_bits")
        if nan not in ("none", "all_ones", "ieee"):
            raise ValueError(f"FloatType nan must be 'none', 'all_ones' or 'ieee', got {nan!r}")
        bits = int(signed) + exponent_bits + mantissa_bits
        if bits < 1 or bits > 32:
            raise ValueError(f"FloatType has {bits} bits (1 sign + {exponent_bits} + {mantissa_bits}); allowed 1..32")
        if exponent_bits == 0:
            if not signed or mantissa_bits == 0:
                raise ValueError("an exponent-free float (e0) must be signed and have mantissa bits")
            if nan != "none":
                raise ValueError("an exponent-free float (e0) has no NaN codes; use nan='none'")
        if bias is None:
            bias = (1 << (exponent_bits - 1)) - 1 if exponent_bits > 0 else 0
        if name is None:
            # The generic name means the generic semantics; anything else gets a distinct, descriptive name.
            name = f"float{bits}e{exponent_bits}m{mantissa_bits}" + ("" if signed else "u")
            if bias != ((1 << (exponent_bits - 1)) - 1 if exponent_bits > 0 else 0):
                name += f"_bias{bias}" if bias >= 0 else f"_biasm{-bias}"  # m for minus: names are identifiers
            if nan != "none":
                name += f"_nan{nan.replace('_', '')}"
            if not subnormals:
                name += "_nosub"
        check_name(name, "FloatType name")
        self.__attrs_init__(name=name, bits=bits, exponent_bits=exponent_bits, mantissa_bits=mantissa_bits,
                            is_signed=bool(signed), bias=int(bias), nan=nan, subnormals=bool(subnormals))

    @property
    def signed(self) -> bool:
        return self.is_signed

    def to_dict(self) -> dict:
        return {"kind": "float", "name": self.name, "exponent_bits": self.exponent_bits,
                "mantissa_bits": self.mantissa_bits, "signed": self.is_signed, "bias": self.bias, "nan": self.nan,
                "subnormals": self.subnormals}

    @property
    def is_sign_magnitude_int(self) -> bool:
        """e0 formats: value = +-mantissa, no exponent."""
        return self.exponent_bits == 0

    @property
    def has_nan(self) -> bool:
        return self.nan != "none"

    @property
    def has_inf(self) -> bool:
        return self.nan == "ieee"

    @property
    def sign_bit(self) -> int:
        return self.bits - 1 if self.is_signed else -1

    @property
    def nan_code(self) -> int | None:
        if self.nan == "none":
            return None
        magnitude = (1 << (self.exponent_bits + self.mantissa_bits)) - 1
        return magnitude | ((1 << self.sign_bit) if self.is_signed else 0)

    @property
    def inf_code(self) -> int | None:
        if self.nan != "ieee":
            return None
        return ((1 << self.exponent_bits) - 1) << self.mantissa_bits

    @property
    def emax(self) -> int:
        """Exponent of the largest power of two <= max finite (the MX `emax`)."""
        return int(math.floor(math.log2(self.max_finite)))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        if self.bits in (16, 32) and self.nan == "ieee" and self.is_signed:
            torch_dtype = _TORCH_VIEW.get((self.exponent_bits, self.mantissa_bits))
            if torch_dtype is not None:
                c = codes.to(torch.int64) & ((1 << self.bits) - 1)
                c = torch.where(c >= (1 << (self.bits - 1)), c - (1 << self.bits), c)
                storage = torch.int16 if self.bits == 16 else torch.int32
                return c.to(storage).view(torch_dtype).to(torch.float32)
        return _decode_fields(self, codes.to(torch.int64)).to(torch.float32)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(x)
        if self.bits > 16:
            return _encode_by_cast(self, x)
        if self.bits == 16 and (self.exponent_bits, self.mantissa_bits) in _TORCH_VIEW:
            return _encode_16_bit(self, x)
        return _encode_by_table(self, x)


_TORCH_VIEW = {(5, 10): torch.float16, (8, 7): torch.bfloat16, (8, 23): torch.float32}


def _decode_fields(t: FloatType, c: torch.Tensor) -> torch.Tensor:
    c = c & ((1 << t.bits) - 1)
    M, E = t.mantissa_bits, t.exponent_bits
    m = (c & ((1 << M) - 1)).to(torch.float64)
    e = ((c >> M) & ((1 << E) - 1)) if E > 0 else torch.zeros_like(c)
    sign = torch.ones_like(m)
    if t.is_signed:
        sign = torch.where(((c >> t.sign_bit) & 1) == 1, -1.0, 1.0).to(torch.float64)
    if E == 0:
        return sign * m
    ef = e.to(torch.float64)
    normal = torch.exp2(ef - t.bias) * (1.0 + m / (1 << M))
    if t.subnormals:
        sub = (2.0 ** (1 - t.bias)) * (m / (1 << M))
        val = torch.where(e == 0, sub, normal)
    else:
        val = normal
    val = sign * val
    if t.nan == "ieee":
        top = e == (1 << E) - 1
        val = torch.where(top & (m == 0), sign * math.inf, val)
        val = torch.where(top & (m != 0), torch.full_like(val, math.nan), val)
    elif t.nan == "all_ones":
        mag = c & ((1 << (E + M)) - 1)
        val = torch.where(mag == (1 << (E + M)) - 1, torch.full_like(val, math.nan), val)
    return val


@functools.lru_cache(maxsize=None)
def _code_values_cached(t: DType) -> torch.Tensor:
    codes = torch.arange(1 << t.bits, dtype=torch.int64)
    if isinstance(t, FloatType):
        if t.bits in (16,) and (t.exponent_bits, t.mantissa_bits) in _TORCH_VIEW and t.nan == "ieee":
            return t.decode(codes).to(torch.float64)
        return _decode_fields(t, codes)
    return t.decode(codes).to(torch.float64)


def _code_values(t: DType) -> torch.Tensor:
    if t.bits > 16:
        raise ValueError(f"code table of {t.name} has 2^{t.bits} entries; only formats of <= 16 bits have one")
    return _code_values_cached(t).clone()


@functools.lru_cache(maxsize=None)
def _positive_table(t: FloatType) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted non-negative finite values and their codes (sign bit clear) for table rounding."""
    values = _code_values_cached(t)
    codes = torch.arange(1 << t.bits, dtype=torch.int64)
    keep = torch.isfinite(values) & (values >= 0)
    if t.is_signed:
        keep &= ((codes >> t.sign_bit) & 1) == 0
    v, order = torch.sort(values[keep], stable=True)
    return v, codes[keep][order]


def _encode_by_table(t: FloatType, x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.float64)
    values, codes = _positive_table(t)
    values, codes = values.to(x.device), codes.to(x.device)  # the cached table lives on the CPU
    mag = x.abs() if t.is_signed else x.clamp_min(0.0)
    mag_c = torch.nan_to_num(mag, nan=0.0, posinf=values[-1].item()).clamp(max=values[-1].item())
    hi = torch.searchsorted(values, mag_c).clamp(max=len(values) - 1)
    lo = (hi - 1).clamp(min=0)
    v_lo, v_hi = values[lo], values[hi]
    d_lo, d_hi = mag_c - v_lo, v_hi - mag_c
    c_lo, c_hi = codes[lo], codes[hi]
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & ((c_hi & 1) == 0) & ((c_lo & 1) == 1))
    out = torch.where(pick_hi, c_hi, c_lo)
    out = torch.where(mag_c >= v_hi, c_hi, out)
    if t.is_signed:
        out = torch.where(torch.signbit(x), out | (1 << t.sign_bit), out)
    if t.has_inf:
        out = torch.where(torch.isinf(x), torch.where(x > 0, t.inf_code, t.inf_code | (1 << t.sign_bit)), out)
    if t.has_nan:
        out = torch.where(torch.isnan(x), t.nan_code, out)
    return out.to(torch.int64)


def _encode_16_bit(t: FloatType, x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16: torch's cast where it rounds once (from float32), the code table elsewhere.

    NOTE: torch's float64 -> bf16/fp16 casts go through float32 and round twice (1 + 2^-8 + 2^-30 -> bf16 gives
    1.0 instead of 1 + 2^-7), so float64 values that float32 cannot hold exactly take the exact table path.
    """
    if x.dtype != torch.float64:
        return _encode_by_cast(t, x.to(torch.float32))
    x32 = x.to(torch.float32)
    out = _encode_by_cast(t, x32)
    inexact = (x32.to(torch.float64) != x) & ~torch.isnan(x)
    if inexact.any():
        out[inexact] = _encode_by_table(t, x[inexact])
    return out


def _encode_by_cast(t: FloatType, x: torch.Tensor) -> torch.Tensor:
    torch_dtype = _TORCH_VIEW.get((t.exponent_bits, t.mantissa_bits))
    if torch_dtype is None or t.nan != "ieee" or not t.is_signed:
        raise ValueError(f"encode for {t.name} ({t.bits} bits) is supported only for float16/bfloat16/float32")
    fmax = torch.finfo(torch_dtype).max
    xc = x.to(torch.float64 if torch_dtype == torch.float32 else torch.float32)
    finite = torch.isfinite(xc)
    xc = torch.where(finite, xc.clamp(-fmax, fmax), xc)
    storage = torch.int16 if t.bits == 16 else torch.int32
    return xc.to(torch_dtype).view(storage).to(torch.int64) & ((1 << t.bits) - 1)


@functools.lru_cache(maxsize=None)
def _represents(a: DType, b: DType) -> bool:
    if b.bits > 16:
        return a == b
    vals = b.code_values()
    vals = vals[torch.isfinite(vals)]
    if isinstance(a, IntType):
        return bool(((vals == torch.round(vals)) & (vals >= a.min_value) & (vals <= a.max_value)).all())
    if a.bits > 16:
        return bool((vals.to(torch.float32).to(torch.float64) == vals).all())
    table = a.code_values()
    table = table[torch.isfinite(table)]
    return bool(torch.isin(vals, table).all())

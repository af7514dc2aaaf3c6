"""Shared case generators and independent oracles for the CPU tests.

The float oracle here is written from the S.E.M formula in plain Python (math.ldexp), sharing no code with
humming_gen.formats, so a bug in the library's field decoding cannot hide in both.
"""

from __future__ import annotations

import math

import numpy as np
import torch

INT_FORMATS = [f"int{b}" for b in range(1, 9)] + [f"uint{b}" for b in range(1, 9)]

# name -> (exponent bits, mantissa bits, signed, special-value style) for every <= 8-bit float under test.
FLOAT_FORMATS: dict[str, tuple[int, int, bool, str]] = {
    "float4e2m1": (2, 1, True, "none"),
    "float6e2m3": (2, 3, True, "none"),
    "float6e3m2": (3, 2, True, "none"),
    "float8e4m3": (4, 3, True, "all_ones"),
    "float8e5m2": (5, 2, True, "ieee"),
    "float8e8m0": (8, 0, False, "all_ones"),
    "float8e0m7": (0, 7, True, "none"),
    "float4e0m3": (0, 3, True, "none"),
    "float8e3m4": (3, 4, True, "none"),
    "float2e0m1": (0, 1, True, "none"),
    "float3e1m1": (1, 1, True, "none"),
    "float5e2m2": (2, 2, True, "none"),
    "float5e3m1": (3, 1, True, "none"),
    "float7e3m3": (3, 3, True, "none"),
    "float7e4m2": (4, 2, True, "none"),
    "float8e2m5": (2, 5, True, "none"),
    "float8e6m1": (6, 1, True, "none"),
}
SMALL_FORMATS = INT_FORMATS + list(FLOAT_FORMATS)

# OCP / IEEE-style formats that ml_dtypes implements with the same semantics.
ML_DTYPES_NAMES = {
    "float4e2m1": "float4_e2m1fn",
    "float6e2m3": "float6_e2m3fn",
    "float6e3m2": "float6_e3m2fn",
    "float8e4m3": "float8_e4m3fn",
    "float8e5m2": "float8_e5m2",
    "float8e8m0": "float8_e8m0fnu",
}


def float_code_value(code: int, e_bits: int, m_bits: int, signed: bool, special: str) -> float:
    """Value of one code straight from the S.E.M definition (subnormals at exponent 0, bias 2^(E-1)-1;
    e8m0 has no subnormals; e0 formats are sign-magnitude integers)."""
    mag_bits = e_bits + m_bits
    sign = -1.0 if signed and (code >> mag_bits) & 1 else 1.0
    e = (code >> m_bits) & ((1 << e_bits) - 1)
    m = code & ((1 << m_bits) - 1)
    mag = code & ((1 << mag_bits) - 1)
    if special == "all_ones" and mag == (1 << mag_bits) - 1:
        return math.nan
    if special == "ieee" and e == (1 << e_bits) - 1:
        return sign * math.inf if m == 0 else math.nan
    if e_bits == 0:
        return sign * m
    bias = (1 << (e_bits - 1)) - 1
    if not signed and m_bits == 0:  # e8m0: 2^(c - 127), no zero
        return math.ldexp(1.0, e - bias)
    if e == 0:
        return sign * math.ldexp(m, 1 - bias - m_bits)
    return sign * math.ldexp((1 << m_bits) + m, e - bias - m_bits)


def int_code_value(code: int, bits: int, signed: bool) -> float:
    return float(code - (1 << bits) if signed and code >= 1 << (bits - 1) else code)


def code_table(name: str) -> np.ndarray:
    """float64 value of every code of a format under test, from the independent definitions above."""
    if name in FLOAT_FORMATS:
        e, m, signed, special = FLOAT_FORMATS[name]
        bits = int(signed) + e + m
        return np.array([float_code_value(c, e, m, signed, special) for c in range(1 << bits)])
    signed = not name.startswith("u")
    bits = int(name.lstrip("uint"))
    return np.array([int_code_value(c, bits, signed) for c in range(1 << bits)])


def sign_bit(name: str) -> int | None:
    """Bit index of the sign of a float format under test, None for unsigned and int formats."""
    if name not in FLOAT_FORMATS:
        return None
    e, m, signed, _ = FLOAT_FORMATS[name]
    return e + m if signed else None


def brute_force_encode(name: str, x: np.ndarray) -> np.ndarray:
    """Reference encoder: nearest finite value by exhaustive search over the code table, ties to the even code,
    magnitudes beyond the largest finite value saturate; sign-magnitude floats round |x| and keep x's sign."""
    table = code_table(name)
    codes = np.arange(len(table))
    sb = sign_bit(name)
    if name in FLOAT_FORMATS:
        keep = np.isfinite(table) & (table >= 0)
        if sb is not None:
            keep &= ((codes >> sb) & 1) == 0
        vals, cands = table[keep], codes[keep]
        mag = np.abs(x) if sb is not None else np.maximum(x, 0.0)
    else:
        vals, cands, mag = table, codes, x
    d = np.abs(mag[:, None] - vals[None, :])
    best = d.min(axis=1, keepdims=True)
    tie_ok = d == best
    # Among equally near candidates prefer an even code (ties-to-even); there are at most two.
    score = np.where(tie_ok, 2 - (cands[None, :] % 2 == 0), 9)
    out = cands[np.argmin(score, axis=1)]
    if sb is not None:
        out = np.where(np.signbit(x), out | (1 << sb), out)
    return out


def random_values(max_finite: float, min_pos: float, n: int, seed: int) -> np.ndarray:
    """Signed values with log-uniform magnitudes from below the smallest positive to above max (saturation)."""
    rng = np.random.default_rng(seed)
    lo, hi = math.log2(min_pos) - 2, math.log2(max_finite) + 1
    mags = np.exp2(rng.uniform(lo, hi, n))
    return np.where(rng.random(n) < 0.5, -mags, mags)


def random_weight(*shape: int, seed: int = 0, outliers: bool = True) -> torch.Tensor:
    """Gaussian float32 weight with a few large outliers (the case that stresses scale selection)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=g)
    if outliers:
        mask = torch.rand(*shape, generator=g) < 0.002
        w = torch.where(mask, w * 8, w)
    return w


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Frobenius ||a - b|| / ||b|| in float64."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    return float((a - b).norm() / b.norm())


def gated_tile_rows(rows: torch.Tensor, activation: str) -> torch.Tensor:
    """What a fused gated epilogue writes from GEMM1's (R, 2I) rows in tile order (humming_gen.layer.gate_up: in
    each 16 rows the gate rows of 8 features, then their up rows): (R, I) act(gate, up), features in order."""
    from humming_gen.reference.moe import gated_activation

    tiles = rows.view(rows.shape[0], -1, 2, 8)
    return gated_activation(torch.cat([tiles[:, :, 0].flatten(1), tiles[:, :, 1].flatten(1)], dim=1), activation)


def assert_no_spills(kernel, what: object = "") -> None:
    """A compiled kernel holds every value in registers (ptxas: no spill stores or loads), at most 255 a thread."""
    res = kernel.resources
    assert res["spill_store_bytes"] == 0 and res["spill_load_bytes"] == 0, (what, res)
    assert res["registers"] <= 255, (what, res)

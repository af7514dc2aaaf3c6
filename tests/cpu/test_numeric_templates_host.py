"""Every conversion and scale-step template, rendered as compose renders it, compiled for the host with g++ and
run over every code of every weight format, against `DType.decode` (not against the Python `emulate` models
and not against golden files, which detect change, not error).

A case is (weight format, 16-bit compute type, scale step): the code pair goes through the converter's
convert_pair (or, for the int magic number, the OR the extraction's LOP3 does with the converter's `or_bits`),
then through dequant_pair of the scale-apply component: subtract the bias / format offset, times a group scale,
with integer or float zero points for unsigned ints. The expected value is decode(code) (minus the zero point)
times the scale, rounded once to the compute type, with the sign of zero checked too.

Host stand-ins: fma2 decodes both lanes, computes a * b + c in double (exact for these operands) and rounds
to nearest even in the compute type; and_or / and_xor are their C expressions.
"""

from __future__ import annotations

import math
import shutil
import subprocess

import attrs
import pytest
import torch

from helpers import FLOAT_FORMATS, INT_FORMATS
from codegen_cases import CUSTOM_FLOAT
from humming_gen.codegen.render import environment
from humming_gen.components.numeric.convert import (FloatPlaceConvert, IntMagicConvert, kernel_codes_offset,
                                                    select_converter)
from humming_gen.components.numeric.halfbits import TORCH_DTYPE, bits16
from humming_gen.components.numeric.scale_apply import (FloatZeroPointScale, IntZeroPoint, IntZeroPointScale,
                                                         SubtractOffset, SubtractOffsetScale)
from humming_gen.formats import FloatType, dtype

CXX = shutil.which("g++") or shutil.which("c++")
DTYPES = ("bfloat16", "float16")
FORMATS = {**{n: dtype(n) for n in INT_FORMATS + list(FLOAT_FORMATS)}, "custom-e2m2": CUSTOM_FLOAT,
           "float4e3m1u": FloatType(3, 1, signed=False), "e4m3-bias9": FloatType(4, 3, nan="all_ones", bias=9)}
SCALE = 0.3141  # rounded to the compute type; not a power of two, so products round
ZERO_INT, ZERO_FLOAT = 3, 2.75

PRELUDE = r"""
#include <cmath>
#include <cstdio>
#include <cstring>
typedef unsigned int u32;
typedef unsigned short u16;
#define __device__
#define __forceinline__ inline
static inline u32 and_or(u32 a, u32 mask, u32 bits) { return (a & mask) | bits; }
static inline u32 and_xor(u32 a, u32 mask, u32 bits) { return (a & mask) ^ bits; }
static double decode16(u16 h, bool bf16) {
  if (bf16) { u32 b = u32(h) << 16; float f; std::memcpy(&f, &b, 4); return f; }
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 31 ? (m ? NAN : INFINITY) : e ? std::ldexp(1024 + m, e - 25) : std::ldexp(m, -24);
  return (h & 0x8000) ? -v : v;
}
static u16 round16(double v, bool bf16) {  // round to nearest even; overflow -> inf
  const int mant = bf16 ? 7 : 10, emin = bf16 ? -126 : -14, emax = bf16 ? 127 : 15;
  const u16 sign = std::signbit(v) ? 0x8000 : 0, inf = bf16 ? 0x7F80 : 0x7C00;
  if (v != v) return inf | 0x40;
  const double a = std::fabs(v);
  if (a == 0) return sign;
  if (std::isinf(a)) return sign | inf;
  int e;
  std::frexp(a, &e);
  e -= 1;  // a = 1.f * 2^e
  if (e < emin) e = emin;
  double q = std::nearbyint(std::ldexp(a, mant - e));
  if (q >= std::ldexp(1.0, mant + 1)) { q /= 2; e += 1; }
  if (e > emax) return sign | inf;
  const u32 iq = u32(q);
  if (iq < (1u << mant)) return sign | u16(iq);  // subnormal
  return sign | u16((u32(e - emin + 1) << mant) | (iq - (1u << mant)));
}
static u32 fma2_typed(u32 a, u32 b, u32 c, bool bf16) {
  u32 out = 0;
  for (int lane = 0; lane < 2; ++lane) {
    const int s = 16 * lane;
    const double r = decode16(u16(a >> s), bf16) * decode16(u16(b >> s), bf16) + decode16(u16(c >> s), bf16);
    out |= u32(round16(r, bf16)) << s;
  }
  return out;
}
"""


def _round(v: float, dt: str) -> float:
    return torch.tensor([v], dtype=torch.float64).to(TORCH_DTYPE[dt]).item()


def _pair(v: float, dt: str) -> int:
    b = bits16(v, dt)
    return (b << 16) | b


def _cases():
    """(id, fmt name, dt, step, scale-apply component, {param: pair value}, expected(code) -> float)."""
    out = []
    for name, fmt in FORMATS.items():
        for dt in DTYPES:
            try:
                conv = select_converter(fmt, dt)
            except ValueError:
                continue
            off = kernel_codes_offset(fmt)
            s = _round(SCALE, dt)
            steps = [("sub", SubtractOffset(dtype=dt, offset=conv.bias + off), {}, lambda v: v),
                     ("scale", SubtractOffsetScale(dtype=dt, offset=conv.bias + off), {"scale": _pair(s, dt)},
                      lambda v, s=s, dt=dt: _round(v * s, dt))]
            if fmt.is_int and not fmt.signed:
                z = min(ZERO_INT, (1 << fmt.bits) - 1)
                zf = _round(-ZERO_FLOAT * s, dt)
                steps += [
                    ("zp-int", IntZeroPoint(dtype=dt), {"zero": _pair(-(conv.bias + z), dt)}, lambda v, z=z: v - z),
                    ("zp-int-scale", IntZeroPointScale(dtype=dt), {"scale": _pair(s, dt),
                                                                   "zero": _pair(-(conv.bias + z), dt)},
                     lambda v, z=z, s=s, dt=dt: _round((v - z) * s, dt)),
                    ("zp-float", FloatZeroPointScale(dtype=dt, offset=conv.bias), {"scale": _pair(s, dt),
                                                                                   "zero": _pair(zf, dt)},
                     lambda v, s=s, zf=zf, dt=dt: _round(v * s + zf, dt))]
            for step, apply, params, expected in steps:
                out.append((f"{name}-{dt}-{step}", name, dt, conv, apply, params, expected))
            if isinstance(conv, FloatPlaceConvert) and conv.exponent_shift:
                # the group scale carries the converter's 2^exponent_shift (pipelines.common.scale_exponent): the
                # converter renders no multiply and the scale step's one rounding makes the product whole
                carried = attrs.evolve(conv, scale_carries_exponent=True)
                out.append((f"{name}-{dt}-scale-carried", name, dt, carried,
                            SubtractOffsetScale(dtype=dt, offset=carried.bias + off),
                            {"scale": _pair(math.ldexp(s, conv.exponent_shift), dt)},
                            lambda v, s=s, dt=dt: _round(v * s, dt)))
    return out


CASES = _cases()


def _source(i: int, fmt, dt: str, conv, apply, params: dict) -> str:
    env = environment()
    conv_src = "" if isinstance(conv, IntMagicConvert) else env.get_template(conv.template).render(**conv.context())
    apply_src = env.get_template(apply.template).render(**apply.context())
    if isinstance(conv, IntMagicConvert):  # the OR rides in the extraction's LOP3 (compose: or_bits)
        x = f"(codes | {conv.or_bits}u)"
    else:
        x = "convert_pair(codes)"
    args = "".join(f", {params[p]}u" for p in apply.params)
    n = 1 << fmt.bits
    off = kernel_codes_offset(fmt)
    bf16 = "true" if dt == "bfloat16" else "false"
    return (f"namespace case{i} {{\nstatic inline u32 fma2(u32 a, u32 b, u32 c) {{ return fma2_typed(a, b, c, {bf16}); }}\n"
            f"{conv_src}\n{apply_src}\nstatic void run() {{\n"
            f"  for (u32 c = 0; c < {n}u; ++c) {{\n"
            f"    const u32 hi = (c * 7u + 3u) % {n}u;\n"
            f"    const u32 codes = (c ^ {off}u) | ((hi ^ {off}u) << 16);\n"
            f"    std::printf(\"%u\\n\", dequant_pair({x}{args}));\n  }}\n}}\n}}\n")


@pytest.fixture(scope="module")
def host_results(tmp_path_factory):
    if CXX is None:
        pytest.skip("no host C++ compiler (g++) to run the rendered templates")
    parts, calls = [PRELUDE], []
    for i, (_, name, dt, conv, apply, params, _) in enumerate(CASES):
        parts.append(_source(i, FORMATS[name], dt, conv, apply, params))
        calls.append(f"  case{i}::run();")
    parts.append("int main() {\n" + "\n".join(calls) + "\n  return 0;\n}\n")
    d = tmp_path_factory.mktemp("host_numeric")
    src, exe = d / "numeric.cpp", d / "numeric"
    src.write_text("".join(parts))
    subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    values = [int(v) for v in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    results, at = {}, 0
    for cid, name, *_ in CASES:
        n = 1 << FORMATS[name].bits
        results[cid] = values[at:at + n]
        at += n
    assert at == len(values)
    return results


def _lane(bits: int, dt: str) -> float:
    signed = bits - 0x10000 if bits & 0x8000 else bits
    return torch.tensor([signed], dtype=torch.int16).view(TORCH_DTYPE[dt]).item()


def _same(a: float, b: float) -> bool:
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rendered_dequantization_matches_decode(case, host_results) -> None:
    cid, name, dt, conv, apply, params, expected = case
    fmt = FORMATS[name]
    n = 1 << fmt.bits
    decoded = fmt.decode(torch.arange(n)).tolist()
    wrong = []
    for c, got in enumerate(host_results[cid]):
        for code, lane in ((c, got & 0xFFFF), ((c * 7 + 3) % n, got >> 16)):
            if not math.isfinite(decoded[code]):
                continue  # e4m3 NaN, e5m2 inf / NaN: quantizers never emit them as weights
            want = expected(decoded[code])
            value = _lane(lane, dt)
            if not _same(value, want):
                wrong.append((code, value, want))
    assert not wrong, f"{type(conv).__name__} + {type(apply).__name__}: (code, got, want) {wrong[:6]}"


def test_every_converter_and_scale_step_is_covered() -> None:
    convs = {type(c[3]).__name__ for c in CASES}
    applies = {type(c[4]).__name__ for c in CASES}
    assert convs == {"IntMagicConvert", "IntTopBitConvert", "FloatPlaceConvert", "SignMagnitudeConvert"}
    assert applies == {"SubtractOffset", "SubtractOffsetScale", "IntZeroPoint", "IntZeroPointScale",
                       "FloatZeroPointScale"}
    # signed formats of each float converter, so a dropped sign shows
    assert any(c[1] == "float4e0m3" for c in CASES) and any(c[1] == "float4e2m1" for c in CASES)

"""The rendered dequantization templates themselves, compiled for the host with g++ and run over random packed
words, against the Python `emulate` models the other CPU tests trust. This catches a template that drifts from
its model (as the 3-bit plane order once did: the model was right, the template was not).

The ptx wrappers get host stand-ins: and_or / and_xor are their C expressions, fma2 decodes both 16-bit lanes,
computes a * b + c in double and requires the result to be exact (every use in these components is exact)."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from humming_gen.codegen.render import environment
from humming_gen.components.numeric.convert import IntMagicConvert, IntTopBitConvert
from humming_gen.components.numeric.halfbits import lane_value
from humming_gen.components.numeric.extract import PlaneExtract, ThreeBitSharedShiftExtract
from humming_gen.schemes.packing import bit_planes

CXX = shutil.which("g++") or shutil.which("c++")

PRELUDE = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
typedef unsigned int u32;
typedef unsigned short u16;
#define __device__
#define __forceinline__ inline
static inline u32 and_or(u32 a, u32 mask, u32 bits) { return (a & mask) | bits; }
static inline u32 and_xor(u32 a, u32 mask, u32 bits) { return (a & mask) ^ bits; }
static double decode(u16 h, bool bf16) {
  if (bf16) { u32 b = u32(h) << 16; float f; std::memcpy(&f, &b, 4); return f; }
  int e = (h >> 10) & 31, m = h & 1023; double v = e ? std::ldexp(1024 + m, e - 25) : std::ldexp(m, -24);
  return (h & 0x8000) ? -v : v;
}
static u16 encode(double v, bool bf16) {
  for (u32 h = 0; h < 65536; ++h) if (decode(u16(h), bf16) == v && !(v == 0 && (h & 0x8000))) return u16(h);
  std::printf("inexact %g\n", v); std::exit(3);
}
static u32 fma2_typed(u32 a, u32 b, u32 c, bool bf16) {
  u32 out = 0;
  for (int lane = 0; lane < 2; ++lane) {
    const int s = 16 * lane;
    const double r = decode(u16(a >> s), bf16) * decode(u16(b >> s), bf16) + decode(u16(c >> s), bf16);
    out |= u32(encode(r, bf16)) << s;
  }
  return out;
}
"""


def _case_source(index: int, component, dtype: str, with_convert=None) -> str:
    env = environment()
    body = env.get_template(component.template).render(**component.context())
    conv = env.get_template(with_convert.template).render(**with_convert.context()) if with_convert else ""
    bf16 = "true" if dtype == "bfloat16" else "false"
    call = "convert_pair(extract_code_pair(w, reg))" if with_convert else "extract_code_pair(w, reg)"
    return (f"namespace case{index} {{\nstatic inline u32 fma2(u32 a, u32 b, u32 c) {{ return fma2_typed(a, b, c, "
            f"{bf16}); }}\n{body}\n{conv}\nstatic void run(const u32* all) {{\n  u32 w[kChunkWords];\n"
            f"  for (int i = 0; i < kChunkWords; ++i) w[i] = all[i];\n"
            f"  for (int reg = 0; reg < 64; ++reg) std::printf(\"%u\\n\", {call});\n}}\n}}\n")


CASES = ([("plain", bits, "bfloat16") for bits in range(1, 9)]
         + [("magic", bits, dtype) for bits in range(1, 8) for dtype in ("bfloat16", "float16")]
         + [("shared3", 3, "bfloat16"), ("shared3", 3, "float16"), ("top8", 8, "bfloat16")])


def _component(kind: str, bits: int, dtype: str):
    if kind == "plain":
        return PlaneExtract(bits=bits), None
    if kind == "magic":
        return PlaneExtract(bits=bits, or_bits=IntMagicConvert(bits=bits, dtype=dtype).or_bits), None
    if kind == "shared3":
        return ThreeBitSharedShiftExtract(or_bits=IntMagicConvert(bits=3, dtype=dtype).or_bits, dtype=dtype), None
    return PlaneExtract(bits=8, mask_codes=False), IntTopBitConvert(dtype=dtype)


@pytest.fixture(scope="module")
def host_results(tmp_path_factory):
    if CXX is None:
        pytest.skip("no host C++ compiler (g++) to run the rendered templates")
    rng = random.Random(11)
    words = [rng.getrandbits(32) for _ in range(32)]
    sources, parts = [PRELUDE], []
    for i, (kind, bits, dtype) in enumerate(CASES):
        comp, conv = _component(kind, bits, dtype)
        sources.append(_case_source(i, comp, dtype, conv))
        parts.append(f"  case{i}::run(words);")
    init = ", ".join(f"{w}u" for w in words)
    sources.append("int main() {\n  static const u32 words[32] = {" + init + "};\n" + "\n".join(parts)
                   + "\n  return 0;\n}\n")
    d = tmp_path_factory.mktemp("host")
    src, exe = d / "extract.cpp", d / "extract"
    src.write_text("".join(sources))
    subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    values = [int(v) for v in out]
    assert len(values) == 64 * len(CASES)
    return words, {CASES[i]: values[64 * i: 64 * (i + 1)] for i in range(len(CASES))}


@pytest.mark.parametrize("case", CASES, ids=[f"{k}-{b}bit-{d}" for k, b, d in CASES])
def test_rendered_template_matches_its_model(case, host_results) -> None:
    words, results = host_results
    kind, bits, dtype = case
    comp, conv = _component(kind, bits, dtype)
    chunk = words[: 4 * bits]
    for reg, got in enumerate(results[case]):
        lanes = (got & 0xFFFF, got >> 16)
        if kind == "plain":
            assert lanes == PlaneExtract.emulate(chunk, reg, bits), reg
        elif kind == "magic":
            magic = int(comp.or_bits, 16) & 0xFFFF
            assert lanes == tuple(c | magic for c in PlaneExtract.emulate(chunk, reg, bits)), reg
        elif kind == "shared3":
            magic = lane_value(int(comp.or_bits, 16) & 0xFFFF, dtype)
            assert tuple(int(lane_value(v, dtype) - magic) for v in lanes) == comp.emulate(chunk, reg), reg
        else:
            codes = PlaneExtract.emulate(chunk, reg, bits)
            assert tuple(lane_value(v, dtype) for v in lanes) == tuple(conv.emulate(c) for c in codes), reg


def test_cases_cover_every_plane_split() -> None:
    """Every width 1..8 runs plain, and every multi-plane width with the magic number merged."""
    assert {b for k, b, _ in CASES if k == "plain"} == set(range(1, 9))
    assert {b for k, b, _ in CASES if k == "magic"} >= {b for b in range(1, 8) if len(bit_planes(b)) > 1}

"""The activation-quantization rounding, rendered as the kernels render it (software conversion: what every target
without a cvt instruction runs), compiled for the host with g++ and run block by block against
`ActivationScheme.quantize` on the same fp32 input: codes and scales bit for bit, with exact ties, fp32 quotients
that round onto a tie (the double-rounding trap), saturation, zeros, subnormals, NaN and inf rows.

Host stand-ins for the ptx wrappers: bit casts by memcpy, the C++ IEEE operators for div.rn / fma.rn / cvt.rni.
"""

from __future__ import annotations

import math
import shutil
import subprocess

import numpy as np
import pytest
import torch

from humming_gen.activation.components import BlockScaleRule, ElementCode, Rounding
from humming_gen.activation import kernel as activation_kernel
from humming_gen.activation.kernel import QuantizeConfig, components
from humming_gen.formats import FloatType
from humming_gen.codegen.render import environment
from humming_gen.schemes.scheme import ActivationScheme as A
from humming_gen.targets import get_target

CXX = shutil.which("g++") or shutil.which("c++")

PRELUDE = r"""
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>
typedef unsigned int u32;
typedef unsigned short u16;
#define __device__
#define __forceinline__ inline
#define __noinline__
static inline u32 f32_bits(float x) { u32 b; std::memcpy(&b, &x, 4); return b; }
static inline float bits_f32(u32 b) { float x; std::memcpy(&x, &b, 4); return x; }
static inline float div_rn(float a, float b) { return a / b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline bool normal_reciprocal(float s) {  // quantize_vector's check of its reciprocal
  const u32 e = f32_bits(1.0f / s) & 0x7F800000u;
  return e != 0u && e != 0x7F800000u;
}
static inline float fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline int rint_s32(float x) {
  if (x != x) return 0;
  const double r = std::nearbyint(double(x));
  return r >= 2147483647.0 ? 2147483647 : r <= -2147483648.0 ? (-2147483647 - 1) : int(r);
}
static inline unsigned long long f64_bits(double x) { unsigned long long b; std::memcpy(&b, &x, 8); return b; }
static inline u32 f64_high_bits(double x) { return u32(f64_bits(x) >> 32); }
static inline u32 f64_low_bits(double x) { return u32(f64_bits(x)); }
static inline double bits_f64(u32 hi, u32 lo) {
  unsigned long long b = (static_cast<unsigned long long>(hi) << 32) | lo; double x; std::memcpy(&x, &b, 8); return x;
}
"""

# stdin: n_blocks, then per block: length, [global scale], length floats (as u32 bits).
# stdout per block: scale code, then the codes.
MAIN = r"""
int main() {
  int blocks;
  if (std::scanf("%d", &blocks) != 1) return 1;
  for (int b = 0; b < blocks; ++b) {
    int n;
    std::scanf("%d", &n);
    GLOBAL_READ
    std::vector<float> x(n);
    u32 amax = 0;
    for (int i = 0; i < n; ++i) {
      u32 bits;
      std::scanf("%u", &bits);
      x[i] = bits_f32(bits);
      const u32 a = bits & 0x7FFFFFFFu;
      amax = a > amax ? a : amax;
    }
    const BlockScale s = block_scale(bits_f32(amax) GLOBAL_ARG);
    std::printf("%u", s.code);
    for (int i = 0; i < n; ++i) std::printf(" %u", encode_pair(quotient(x[i], s.value), 0.0f) & MASK);
    std::printf("\n");
  }
  return 0;
}
"""

SCHEMES = {
    "fp8e4m3-token": A("float8e4m3"),
    "fp8e5m2-token": A("float8e5m2"),
    "fp8e5m2-g128": A("float8e5m2", granularity="group", group_size=128),
    "int8-token": A("int8"),
    "int4-token": A("int4"),
    "fp8e4m3-g32-bf16scale": A("float8e4m3", granularity="group", group_size=32, scale_dtype="bfloat16"),
    "fp8e4m3-g32-fp16scale": A("float8e4m3", granularity="group", group_size=32, scale_dtype="float16"),
    "fp8e4m3-g16-e4m3scale": A("float8e4m3", granularity="group", group_size=16, scale_dtype="float8e4m3"),
    "mxfp8-rceil": A("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0"),
    "mxfp8-floor": A("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0", scale_rule="floor"),
    "mxfp8-even": A("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0", scale_rule="even"),
    # e5m2 has an inf code: a finite element over an inf amax (small floor-rule scale) must saturate, not become inf
    "mxfp8-e5m2-floor": A("float8e5m2", granularity="group", group_size=32, scale_dtype="float8e8m0",
                          scale_rule="floor"),
    "mxfp4-even": A("float4e2m1", granularity="group", group_size=32, scale_dtype="float8e8m0", scale_rule="even"),
    "nvfp4": A("float4e2m1", granularity="group", group_size=16, scale_dtype="float8e4m3", global_scale=True),
    "int4-g32-bf16scale": A("int4", granularity="group", group_size=32, scale_dtype="bfloat16"),
    # a custom float whose largest value is under 4: the big rows' scales pass 2^126, the reciprocal is subnormal
    "e1m2-token": A(FloatType(1, 2)),
    # no mantissa bits: a tie's even code is set by the exponent field's last bit
    "e3m0-token": A(FloatType(3, 0)),
}


def _build(scheme: A, tmp_path, near: bool = True):
    """`near`: the elements divided as quantize_vector divides them where ElementCode.near (x times the scale's
    reciprocal where it rounds as the quotient, rounds_as_quotient); False: every element by the exact quotient.
    e8m0 scales: x times the exact reciprocal (ElementCode.exact_product: power_of_two_quotient) with `near`, the
    fp32 scales' path (activation.kernel.EXACT_E8M0_PRODUCT = False) without."""
    cfg = QuantizeConfig(scheme, "float32", get_target("sm_80"))  # sm_80: no cvt, the software path
    env = environment()
    parts = [PRELUDE]
    near_used = exact_product = False
    saved = activation_kernel.EXACT_E8M0_PRODUCT
    activation_kernel.EXACT_E8M0_PRODUCT = near
    try:
        built = components(cfg)
    finally:
        activation_kernel.EXACT_E8M0_PRODUCT = saved
    for c in built:
        if isinstance(c, (Rounding, BlockScaleRule, ElementCode)):
            near_used = near_used or (isinstance(c, ElementCode) and c.near and near)
            exact_product = exact_product or (isinstance(c, ElementCode) and c.exact_product)
            parts.append(env.get_template(c.template).render(**c.context()))
    main = MAIN.replace("MASK", str((1 << scheme.dtype.bits) - 1))
    # (quantize_vector takes a vector's products where every one rounds as its quotient; element by element here)
    near_code = ("normal_reciprocal(s.value) && rounds_as_quotient(__fmul_rn(x[i], __frcp_rn(s.value))) ? "
                 "encode_pair_finite(__fmul_rn(x[i], __frcp_rn(s.value)), 0.0f) : encode_pair(quotient(x[i], s.value), 0.0f)")
    if near_used:
        main = main.replace("encode_pair(quotient(x[i], s.value), 0.0f)", f"({near_code})")
    if exact_product:  # e8m0 scales: quantize_vector takes x times the exact reciprocal (no quotient() rendered)
        main = main.replace("quotient(x[i], s.value)", "power_of_two_quotient(x[i], __frcp_rn(s.value))")
    if scheme.global_scale:
        main = main.replace("GLOBAL_READ", "u32 g_bits; std::scanf(\"%u\", &g_bits); const float g = bits_f32(g_bits);")
        main = main.replace("GLOBAL_ARG", ", g")
    else:
        main = main.replace("GLOBAL_READ", "").replace("GLOBAL_ARG", "")
    return compile_host("\n".join(parts) + main, tmp_path, "round")


def compile_host(source: str, tmp_path, name: str):
    """The host executable of a C++ source (rendered templates behind PRELUDE), IEEE fp32 without contraction."""
    src = tmp_path / f"{name}.cpp"
    src.write_text(source)
    exe = tmp_path / name
    subprocess.run([CXX, "-O1", "-std=c++17", "-ffp-contract=off", str(src), "-o", str(exe)], check=True,
                   capture_output=True, text=True)
    return exe


def _bits(x: torch.Tensor) -> list[int]:
    return x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64).bitwise_and(0xFFFFFFFF).tolist()


def _blocks(scheme: A, seed: int) -> list[torch.Tensor]:
    """Rows of one block each (length = group size, 64 per token): random with outliers, exact ties, fp32 quotients
    next to ties, zeros, subnormals, saturation, and one NaN and one inf row."""
    from humming_gen.schemes.quantize import element_qmax

    g = torch.Generator().manual_seed(seed)
    n = scheme.group_size if scheme.granularity == "group" else 64
    fmt = scheme.dtype
    qmax = element_qmax(fmt)
    values = fmt.code_values()
    grid = sorted({abs(float(v)) for v in values if math.isfinite(float(v))})
    ties = [(a + b) / 2 for a, b in zip(grid, grid[1:])]
    rows = []
    for i in range(24):
        x = torch.randn(n, generator=g) * 10.0 ** float(torch.randint(-6, 6, (1,), generator=g))
        x[torch.randint(0, n, (2,), generator=g)] *= 40.0  # outliers
        rows.append(x)
    for i in range(24):  # amax fixes the scale; the other elements are ties and fp32 values next to them
        amax = float(torch.rand(1, generator=g)) * 10.0 ** float(torch.randint(-3, 3, (1,), generator=g)) + 0.5
        if i % 3 == 0:
            amax = qmax * 2.0 ** int(torch.randint(-4, 4, (1,), generator=g))  # power-of-two scales: exact ties
        scale = amax / qmax
        t = torch.tensor([ties[int(j)] for j in torch.randint(0, len(ties), (n - 1,), generator=g)], dtype=torch.float64)
        sign = torch.where(torch.rand(n - 1, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
        x = (t * sign * scale).to(torch.float32)
        nudge = torch.randint(-1, 2, (n - 1,), generator=g)
        x = torch.nextafter(x, x + nudge.to(torch.float32) * torch.inf) if i % 2 else x
        rows.append(torch.cat([torch.tensor([amax], dtype=torch.float32), x]))
    for i in range(12):  # fp32 quotients up to 7 ulps from the ties: both sides of rounds_as_quotient's margin
        amax = float(torch.rand(1, generator=g)) * 10.0 ** float(torch.randint(-3, 3, (1,), generator=g)) + 0.5
        scale = amax / qmax
        t = torch.tensor([ties[int(j)] for j in torch.randint(0, len(ties), (n - 1,), generator=g)], dtype=torch.float64)
        x = (t * scale).to(torch.float32).view(torch.int32) + torch.randint(-7, 8, (n - 1,), generator=g,
                                                                            dtype=torch.int32)
        x = x.view(torch.float32).clamp(max=amax) * torch.where(torch.rand(n - 1, generator=g) < 0.5, -1.0, 1.0)
        rows.append(torch.cat([torch.tensor([amax], dtype=torch.float32), x]))
    rows.append(torch.zeros(n))
    sub = torch.tensor([1e-45, -3e-44, 1.2e-38, -5e-39] * n)[:n]
    rows.append(sub)
    big = torch.full((n,), 3.0e38)
    big[1::2] = -1.0
    rows.append(big)
    nan = torch.randn(n, generator=g)
    nan[3] = math.nan
    rows.append(nan)
    inf = torch.randn(n, generator=g)
    inf[5] = -math.inf
    rows.append(inf)
    huge = torch.randn(n, generator=g)  # inf beside huge finite values: with e8m0 rules whose scale of an inf amax is
    huge[:4] = torch.tensor([math.inf, 1e38, -1e37, 3e35])  # small, their quotients exceed fp32 and saturate
    rows.append(huge)
    return rows


@pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("near", [True, False], ids=["near", "exact"])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_software_rounding_matches_reference(name, near, tmp_path):
    scheme = SCHEMES[name]
    exe = _build(scheme, tmp_path, near)
    rows = _blocks(scheme, seed=len(name))
    lines = [str(len(rows))]
    refs = []
    for x in rows:
        x2 = x.reshape(1, -1)
        ref = scheme.quantize(x2)
        refs.append(ref)
        head = [str(x.numel())]
        if scheme.global_scale:
            head.append(str(_bits(ref.global_scale.reshape(1))[0]))
        lines.append(" ".join(head + [str(b) for b in _bits(x)]))
    out = subprocess.run([str(exe)], input="\n".join(lines), capture_output=True, text=True, check=True).stdout
    sd = scheme.scale_dtype
    for r, (x, ref, line) in enumerate(zip(rows, refs, out.strip().splitlines())):
        got = [int(v) for v in line.split()]
        scale_code, codes = got[0], got[1:]
        want_codes = ref.codes.reshape(-1).tolist()
        bad = [i for i, (a, b) in enumerate(zip(codes, want_codes)) if a != b]
        assert not bad, (f"{name} row {r}: codes differ at {bad[:8]}: x={[float(x[i]) for i in bad[:4]]} got "
                         f"{[codes[i] for i in bad[:4]]} want {[want_codes[i] for i in bad[:4]]}")
        if sd.name == "float32":
            got_scale = np.array([scale_code], dtype=np.uint32).view(np.float32)[0]
        else:
            got_scale = float(sd.decode(torch.tensor([scale_code]))[0])
        want = float(ref.scales.reshape(-1)[0])
        assert (got_scale == want) or (math.isnan(got_scale) and math.isnan(want)), \
            f"{name} row {r}: scale {got_scale!r} (code {scale_code:#x}), reference {want!r}"


def test_near_path_only_for_formats_inside_fp32s_range() -> None:
    """rounds_as_quotient's range test works on fp32 bit patterns: a format whose normal range leaves fp32's (fp32
    infinities would pass it; a review's case: bias -100, codes 124 / 255 where the reference has 0 / 128) divides
    every element."""
    from humming_gen.activation.components import near_quotient

    for fmt in ("float8e4m3", "float8e5m2", "float4e2m1"):
        assert near_quotient(A(fmt).dtype, "float") and not near_quotient(A(fmt).dtype, "double")
    assert not near_quotient(FloatType(5, 2, bias=-100, nan="ieee"), "float")  # largest finite past 2^128
    assert not near_quotient(FloatType(8, 3, bias=140), "float")  # smallest normal below 2^-126
    assert not near_quotient(A("int8").dtype, "float")

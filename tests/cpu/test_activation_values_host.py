"""fake_quantize_activation's element values (QuantizeConfig.dequantize), rendered as the kernels render them
(software decode: targets without the fp8 -> f16x2 cvt), compiled for the host with g++ and run on every code of
each element format times fp32 scales, e8m0 powers of two, and scales that put the fp32 product exactly on a 16-bit
rounding midpoint while the exact product is not: the kernel's value (the fp32 product, then cvt.rn into bf16 /
fp16) must be QuantizedActivation.dequantize(dtype)'s, torch's conversion of the exact float64 product, which goes
through fp32 too (so those midpoint cases round as the kernel does, not as the exact product would). The host's
float32 -> 16-bit rounding (torch, RN) stands in for the kernel's cvt.rn."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch

from humming_gen.activation.components import ElementValue, Rounding
from humming_gen.codegen.render import environment
from humming_gen.formats import FloatType, dtype as get_dtype

from test_activation_quantize_host import CXX, PRELUDE, compile_host

MAIN = r"""
int main() {
  int n;
  if (std::scanf("%d", &n) != 1) return 1;
  for (int i = 0; i < n; ++i) {
    u32 code, s_bits;
    std::scanf("%u %u", &code, &s_bits);
    std::printf("%u\n", f32_bits(__fmul_rn(element_value(code), bits_f32(s_bits))));
  }
  return 0;
}
"""


def _build(element, out_dtype: str, tmp_path):
    env = environment()
    parts = [PRELUDE]
    for c in (Rounding(encoders=(), decoders=(), sign_of_difference=False),
              ElementValue(element=element, convert=None, out_dtype=out_dtype, pair_cvt=True)):
        parts.append(env.get_template(c.template).render(**c.context()))
    return compile_host("\n".join(parts) + MAIN, tmp_path, "values")


def _midpoint_scales(values: np.ndarray, out: torch.dtype, count: int, rng: np.random.Generator) -> list[float]:
    """fp32 scales s for which fp32(v * s) lies exactly on a rounding midpoint of `out` while v * s does not: there
    the reference's conversion through fp32 and a single rounding of the exact product can differ."""
    found: list[float] = []
    nonzero = values[np.isfinite(values) & (values != 0)]
    low_bits = 16 if out == torch.bfloat16 else 13  # fp32 mantissa bits below the 16-bit type's last one
    for _ in range(400):
        s = rng.uniform(1.0, 2.0, 200_000).astype(np.float32) * np.float32(2.0 ** rng.integers(-20, 10))
        v = np.float32(rng.choice(nonzero))
        p32 = (np.float64(v) * s.astype(np.float64)).astype(np.float32)
        exact = np.float64(v) * s.astype(np.float64)
        mid = (p32.view(np.uint32) & ((1 << low_bits) - 1)) == (1 << (low_bits - 1))
        found += [float(x) for x in s[mid & (p32.astype(np.float64) != exact)]]
        if len(found) >= count:
            break
    return found[:count]


CASES = [("float8e4m3", False, "bfloat16"), ("float8e4m3", True, "bfloat16"), ("float8e4m3", False, "float16"),
         ("float8e5m2", False, "bfloat16"), ("int8", False, "bfloat16"), ("int8", False, "float16"),
         ("float4e2m1", True, "bfloat16"), ("int4", False, "float16")]


@pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("element, power_of_two, out_dtype", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_values_round_once(element, power_of_two, out_dtype, tmp_path):
    fmt = get_dtype(element)
    out = getattr(torch, out_dtype)
    exe = _build(fmt, out_dtype, tmp_path)
    codes = np.arange(1 << fmt.bits, dtype=np.int64)
    values = fmt.decode(torch.from_numpy(codes)).to(torch.float64).numpy()
    rng = np.random.default_rng(len(element) + 7 * power_of_two)
    if power_of_two:
        scales = [2.0 ** e for e in range(-127, 128, 3)] + [2.0 ** -127, 2.0 ** 127]
    else:
        scales = list(rng.uniform(1.0, 2.0, 60).astype(np.float32) * 2.0 ** rng.integers(-30, 20, 60))
        scales += [1.0, 2.0 ** -20, 1.0 / 448.0, 1.0 / 127.0]
    pairs = [(c, s) for c in codes.tolist() for s in scales]
    if not power_of_two:
        traps = _midpoint_scales(values, out, 64, rng)
        assert len(traps) >= 16, "no midpoint scales found"
        pairs += [(int(c), s) for s in traps for c in codes.tolist()]
    s32 = np.array([s for _, s in pairs], dtype=np.float32)
    lines = [str(len(pairs))] + [f"{c} {b}" for (c, _), b in zip(pairs, s32.view(np.uint32).tolist())]
    got = subprocess.run([str(exe)], input="\n".join(lines), capture_output=True, text=True, check=True).stdout.split()
    got32 = torch.from_numpy(np.array([int(b) for b in got], dtype=np.uint32).view(np.float32).copy())
    code_t = torch.tensor([c for c, _ in pairs])
    want = (fmt.decode(code_t).to(torch.float64) * torch.from_numpy(s32).to(torch.float64)).to(out)
    have = got32.to(out)
    same = (have.view(torch.int16) == want.view(torch.int16)) | (want.isnan() & have.isnan())
    bad = (~same).nonzero().flatten()[:5].tolist()
    assert not bad, [(pairs[i][0], float(s32[i]), float(have[i]), float(want[i])) for i in bad]

"""The e8m0 activation-scale decode the generated kernels use, compiled for the host and run over all 256 codes:
byte e is 2^(e - 127), code 0 the subnormal 2^-127, code 255 (the format's NaN) infinity as before. The kernels
decode by a shift and a max against 2^-127 (one FMNMX; a compare and a select cost MXFP8 some 40 % on the H200,
docs/DEVELOPING.md; the one macro of templates/numeric/e8m0.cuh.j2), so this checks the rendered text of every kernel
that reads e8m0 bytes: the warp-specialized swap-AB kernels (staged bytes and global reads), tokens on wgmma's M,
indexed and grouped MoE (staged, and read through the routing or the window's rows), and the standard pipeline."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import attrs
import pytest

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build
from humming_gen.pipelines.warp_specialized.heuristics import shared_weight_tunings
from humming_gen.targets import get_target
from moe_host import ws_moe_plans

CXX = shutil.which("g++") or shutil.which("c++")
DECODE = re.compile(r"fmaxf\(__uint_as_float\((\w+) << 23\), __uint_as_float\(0x00400000u\)\)")
MXFP8 = hg.ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0")


def _sources() -> dict[str, str]:
    sm90, sm89 = get_target("sm_90a"), get_target("sm_89")
    out = {}
    dense = LayerConfig(n=4096, k=4096, scheme="w8a8-mxfp8")
    for m in (1, 1024):  # staged e8m0 bytes, split-K and whole tiles
        plan = compose(dense, ComputeConfig(), choose_tunings(dense, sm90, stored=False).for_m(m), sm90)
        out[f"ws-m{m}"] = build(plan, compile=False).source
    odd = LayerConfig(n=1024, k=4096 + 64, scheme="w8a8-mxfp8")  # K not whole stages: read from global memory
    out["ws-global"] = build(compose(odd, ComputeConfig(), choose_tunings(odd, sm90, stored=False).for_m(1024), sm90),
                             compile=False).source
    std = LayerConfig(n=1024, k=2048, scheme="w8a8-mxfp8")
    out["standard-sm89"] = build(compose(std, ComputeConfig(), choose_tunings(std, sm89, stored=False).for_m(1), sm89),
                                 compile=False).source
    tokens_m = LayerConfig(n=4096, k=4096, scheme=attrs.evolve(hg.scheme("w8a8-fp8-block128"), activation=MXFP8))
    out["ws-tokens-m"] = build(compose(tokens_m, ComputeConfig(), shared_weight_tunings(tokens_m, sm90, tokens_m_from=1)
                                       .for_m(1024), sm90), compile=False).source
    scheme = hg.QuantScheme("float8e4m3", group_size=32, scale_dtype="float8e8m0", activation=MXFP8)
    for k in (2048, 2048 + 64):  # staged bytes; K not whole stages: read through the routing / the window's rows
        moe = LayerConfig(n=1024, k=k, scheme=scheme, num_experts=8)
        for gemm in ("indexed", "grouped_contiguous"):
            out[f"moe-{gemm}-k{k}"] = build(ws_moe_plans(moe, ComputeConfig(gemm=gemm), (64,))[0],
                                            compile=False).source
    return out


SOURCES = _sources()


def test_every_e8m0_decode_is_the_shift_and_max() -> None:
    assert "sc[h] = fmaxf" in SOURCES["ws-tokens-m"] and "min(m, p.m - 1)" in SOURCES["moe-grouped_contiguous-k2112"]
    assert "row >= 0 ? fmaxf" in SOURCES["moe-indexed-k2112"]  # (each source has the decode it is here for)
    for name, src in SOURCES.items():
        assert DECODE.search(src), f"{name}: no e8m0 decode found"
        assert "0x00400000u)" not in DECODE.sub("", src), f"{name}: an e8m0 decode of another form"


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++) to run the decode")
def test_the_decode_gives_every_code_its_power_of_two(tmp_path: Path) -> None:
    expressions = sorted({m.group(0).replace(m.group(1), "e") for src in SOURCES.values()
                          for m in DECODE.finditer(src)})
    program = ["#include <cmath>", "#include <cstdio>", "#include <cstring>", "typedef unsigned int u32;",
               "static float __uint_as_float(u32 b) { float f; std::memcpy(&f, &b, 4); return f; }",
               "static float host_fmaxf(float a, float b) { return std::fmax(a, b); }", "int main() {",
               "  for (u32 e = 0; e < 256; ++e) {"]
    program += [f'    std::printf("%a\\n", (double){expr.replace("fmaxf(", "host_fmaxf(")});' for expr in expressions]
    program += ["  }", "  return 0;", "}"]
    src, exe = tmp_path / "e8m0.cpp", tmp_path / "e8m0"
    src.write_text("\n".join(program) + "\n")
    built = subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(exe), str(src)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    values = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert len(values) == 256 * len(expressions)
    for e in range(256):
        want = math.inf if e == 255 else math.ldexp(1.0, e - 127)
        for j in range(len(expressions)):
            assert float.fromhex(values[e * len(expressions) + j]) == want, (e, expressions[j])

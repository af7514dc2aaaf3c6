"""The standard pipeline's dense store (templates/epilogue/store_output.cuh.j2) run on the host, with and without
StoreOutput.preload_factors (the split-K kernels' column scales and biases loaded before the reductions into a
ColumnFactors, instead of one (n tile, half) at a time inside the store): the generated epilogue section of real
plans compiled with g++, the 32 lanes of a warp run one after another (the store has no warp-collective step) on
random accumulators, column scales and biases, p.m ending inside the tile, columns past N, odd ldc. Every cell of c
in range must hold the reference value bit for bit (from_float records the float it converts) and no other cell may
change."""

from __future__ import annotations

import shutil
import subprocess

import attrs
import pytest

from host_sections import cfg_namespace, epilogue_section, params_fields, params_struct
import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import generate
from humming_gen.pipelines.standard import compose as standard_compose
from humming_gen.targets import get_target

CXX = shutil.which("g++")

HOST = r'''
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#define __device__
#define __forceinline__ inline
typedef unsigned int u32;
typedef unsigned short u16;
struct Dim { unsigned x; };
Dim threadIdx;
std::vector<float> table;       // from_float: value index
std::vector<float> bias_table;  // to_float
namespace hg {
inline u16 from_float(float x) { table.push_back(x); return (u16)(table.size() - 1); }
inline float to_float(u16 x) { return bias_table[x]; }
inline float gated_activation(float, float) { return 0.f; }
'''

MAIN = r'''
int main(int argc, char** argv) {
  std::mt19937 rng(atoi(argv[1]));
  const int NT = cfg::kWarpNTiles, MT = cfg::kWarpMTiles;
  int errors = 0; long checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int n_tiles_total = (cfg::kN + 15) / 16 + 2;
    int n_base = 16 * NT * (rng() % ((n_tiles_total + NT - 1) / NT));
    if (rng() % 3 == 0) n_base = ((cfg::kN - 1) / (16 * NT)) * 16 * NT;  // the last warp slice, past N
    const int m_base = rng() % 40, pm = m_base + (int)(rng() % (MT * 8 + 6)) - 3;
    const int rows_c = std::max(pm, m_base + MT * 8) + 2;
    int ldc = cfg::kN + (int)(rng() % 3) * 8; if (rng() % 4 == 0) ldc += 1;
    std::vector<OUT_T> c((size_t)rows_c * ldc, SENTINEL);
    std::uniform_real_distribution<float> U(-2.f, 2.f);
    std::vector<float> out_scale(cfg::kN + 256);
    for (auto& x : out_scale) x = U(rng);
    bias_table.assign(cfg::kN + 256, 0.f); std::vector<u16> bias(cfg::kN + 256);
    for (size_t i = 0; i < bias.size(); ++i) { bias_table[i] = U(rng); bias[i] = (u16)i; }
    std::vector<float> A((size_t)16 * NT * MT * 8);  // A[n - n_base][m - m_base]
    for (auto& x : A) x = U(rng);
    Params p{};
    SETP
    table.clear();
    const int warp = rng() % 4;
    for (int lane = 0; lane < 32; ++lane) {
      threadIdx.x = warp * 32 + lane;
      float acc[cfg::kWarpNTiles][cfg::kWarpMTiles][4];
      const int g = lane / 4, t = lane % 4;
      for (int nt = 0; nt < NT; ++nt) for (int mt = 0; mt < MT; ++mt) for (int r = 0; r < 4; ++r)
        acc[nt][mt][r] = A[(size_t)(nt * 16 + g + 8 * (r / 2)) * MT * 8 + mt * 8 + 2 * t + r % 2];
      CALL
    }
    for (int ml = 0; ml < MT * 8; ++ml)
      for (int k = 0; k < 16 * NT; ++k) {
        const int m = m_base + ml, n = n_base + k;
        const bool in = m < pm && n < cfg::kN;
        if (m >= rows_c || n >= ldc) continue;
        const OUT_T got = c[(size_t)m * ldc + n];
        if (!in) {
          if (got != SENTINEL && errors++ < 10) printf("stray write m %d n %d\n", m, n);
          continue;
        }
        float v = A[(size_t)k * MT * 8 + ml];
        if (OUT_SCALE) v = v * out_scale[n];
        if (BIAS) v = v + bias_table[n];
        const float have = GOT;
        if (memcmp(&have, &v, 4) != 0 && errors++ < 10)
          printf("mismatch trial %d m %d n %d got %g want %g\n", trial, m, n, have, v);
        ++checked;
      }
  }
  printf("checked %ld errors %d\n", checked, errors);
  return errors != 0 || checked == 0;
}
}
int main(int argc, char** argv) { return hg::main(argc, argv); }
'''


def _driver(plan) -> str:
    src = generate(plan, "nvrtc")
    cfg, params = cfg_namespace(src), params_struct(src)
    epilogue = epilogue_section(src, "StoreOutput")
    store = next(c for c in plan.components if type(c).__name__ == "StoreOutput")
    fields = params_fields(params)
    setp = "p.c = c.data(); p.ldc = ldc; p.m = pm;"
    for field, expr in (("out_scale", "out_scale.data()"), ("bias", "bias.data()")):
        if field in fields:
            setp += f" p.{field} = {expr};"
    if store.preload_factors:
        call = ("const ColumnFactors f = column_factors(p, n_base); "
                "if (rng() % 2) store_output(acc, p, n_base, m_base, f); else { ColumnFactors g2 = f; "
                "store_output(acc, p, n_base, m_base, g2); }")
    else:
        call = "store_output(acc, p, n_base, m_base);"
    f32 = plan.layer.out_dtype == "float32"
    main = (MAIN.replace("OUT_T", "float" if f32 else "u16").replace("SENTINEL", "-12345.f" if f32 else "(u16)0xFFFF")
            .replace("GOT", "got" if f32 else "(got < table.size() ? table[got] : -1e30f)")
            .replace("OUT_SCALE", "true" if store.out_scale else "false")
            .replace("BIAS", "true" if store.bias else "false").replace("SETP", setp).replace("CALL", call))
    return HOST + "}\n" + cfg + "\nnamespace hg {\n" + params + "\n" + epilogue + main


SM90 = get_target("sm_90a")
CASES = {  # (scheme, n, dtype, bias, out_dtype, m bucket): split-K buckets of the heuristics
    "mxfp4-carried-exponent-m1": ("w4a16-mxfp4", 4096, "bfloat16", False, "bfloat16", 1),
    "mxfp4-bias-n1000-m8": ("w4a16-mxfp4", 1000, "bfloat16", True, "bfloat16", 8),
    "nvfp4-fp16-out-f32-m1": ("w4a16-nvfp4", 1000, "float16", False, "float32", 1),
    "int4-g128-bias-only-m1": ("w4a16-int4-g128", 1000, "bfloat16", True, "bfloat16", 1),
    "int8-channel-bias-m8": ("w8a16-int8-channel", 4160, "bfloat16", True, "bfloat16", 8),
}


@pytest.mark.skipif(CXX is None, reason="needs g++")
@pytest.mark.parametrize("preload", [True, False], ids=["preloaded", "in-store"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_dense_split_k_store_with_preloaded_factors(case: str, preload: bool, tmp_path, monkeypatch) -> None:
    scheme, n, dtype, bias, out_dtype, m = CASES[case]
    monkeypatch.setattr(standard_compose, "PRELOAD_SPLIT_K_FACTORS", preload)
    layer = LayerConfig(n=n, k=4096, scheme=hg.scheme(scheme), dtype=dtype, has_bias=bias, out_dtype=out_dtype)
    tuning = choose_tunings(layer, SM90).for_m(m)
    assert tuning.pipeline == "standard" and tuning.split_k > 1, "not a standard split-K bucket: pick another M"
    plan = compose(layer, ComputeConfig(), tuning, SM90)
    store = next(c for c in plan.components if type(c).__name__ == "StoreOutput")
    assert store.preload_factors == preload
    src = generate(plan)
    tail = src[src.index("cp_async_wait<0>();", src.index("extern \"C\" __global__")):]  # the epilogue
    if preload:  # the factors are loaded before the reductions, the store reads registers only
        body = src[src.index("extern \"C\" __global__"):]
        assert body.index("column_factors(p,") < body.index("split_k_reduce(acc,")
        assert "p.out_scale" not in src.split("int n_base, int m_base, const ColumnFactors& f) {")[1].split("\n}\n")[0]
    else:
        assert "column_factors" not in tail
    cpp = tmp_path / "store.cpp"
    cpp.write_text(_driver(plan))
    exe = tmp_path / "store"
    subprocess.run([CXX, "-std=c++20", "-O1", "-ffp-contract=off", "-o", str(exe), str(cpp)], check=True,
                   capture_output=True, text=True)
    for seed in (1, 2):
        r = subprocess.run([str(exe), str(seed)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr

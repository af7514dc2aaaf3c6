"""The warp-specialized staged store (templates/epilogue/store_output_staged.cuh.j2) run on the host: the generated
store_output of real plans, compiled with g++, one warp as 32 threads in step (std::barrier) with stmatrix.trans,
ld.shared and __syncwarp emulated; random accumulators, column scales, biases, token / tensor scales, router weights,
sorted ids with padding, p.m ending inside the tile, unaligned c and odd ldc. Every cell of c in range must hold the
reference value bit for bit (from_float records the float it converts, so no rounding is compared), and no other
cell may change: a wrong stmatrix address, swizzle, piece index or bound shows as mismatches or stray writes.

from_float returns an index into a table of converted values; to_float reads biases from a table.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import attrs
import pytest

from host_sections import cfg_namespace, epilogue_section, params_fields, params_struct
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.kernel import generate
from humming_gen.pipelines.warp_specialized import compose as ws_compose
from humming_gen.pipelines.warp_specialized.heuristics import moe_tuning_for, tuning_for, tuning_for_a8
from humming_gen.targets import get_target

CXX = shutil.which("g++")
SM90 = get_target("sm_90a")
TRIALS = 40

PRELUDE = r'''
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <barrier>
#include <vector>
#include <mutex>
#include <random>
#define __device__
#define __forceinline__ inline
typedef unsigned int u32;
typedef unsigned short u16;
struct uint4 { u32 x, y, z, w; };
struct Dim { unsigned x; };
thread_local Dim threadIdx;
std::barrier<>* bar;
int errors = 0;
std::mutex mu;
std::vector<float> table;      // from_float: value index
std::vector<float> bias_table; // to_float
unsigned char smem[1 << 16];
u32 stage_lo, stage_hi;
u32 st_addr[32], st_r[32][2];
'''
PRE2 = r'''
namespace hg {
inline void __syncwarp() { bar->arrive_and_wait(); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline u16 from_float(float x) {
  std::lock_guard<std::mutex> l(mu);
  table.push_back(x);
  return (u16)(table.size() - 1);
}
inline float to_float(u16 x) { return bias_table[x]; }
inline void check_addr(u32 a, const char* what) {
  if (a % 16 || a < stage_lo || a + 16 > stage_hi) {
    std::lock_guard<std::mutex> l(mu);
    if (errors++ < 5) printf("bad %s addr %u [%u,%u)\n", what, a, stage_lo, stage_hi);
  }
}
inline void do_st(int nm) {
  for (int i = 0; i < nm; ++i)
    for (int r = 0; r < 8; ++r) {
      u32 a = st_addr[8 * i + r]; check_addr(a, "stmatrix");
      if (a % 16 || a < stage_lo || a + 16 > stage_hi) continue;
      for (int row = 0; row < 8; ++row) {
        int lane = 4 * row + r / 2; u16 v = (u16)(st_r[lane][i] >> (16 * (r % 2)));
        memcpy(smem + a + 2 * row, &v, 2);
      }
    }
}
inline void stmatrix_x1_trans(u32 addr, u32 r0) {
  int lane = threadIdx.x % 32; st_addr[lane] = addr; st_r[lane][0] = r0;
  bar->arrive_and_wait(); if (lane == 0) do_st(1); bar->arrive_and_wait();
}
inline void stmatrix_x2_trans(u32 addr, u32 r0, u32 r1) {
  int lane = threadIdx.x % 32; st_addr[lane] = addr; st_r[lane][0] = r0; st_r[lane][1] = r1;
  bar->arrive_and_wait(); if (lane == 0) do_st(2); bar->arrive_and_wait();
}
inline void ld_shared_v4(uint4& v, u32 a) { check_addr(a, "ld"); if (a + 16 <= sizeof(smem)) memcpy(&v, smem + a, 16); }
'''

MAIN = r'''
// driver: random warps' accumulators through store_output, every cell of c checked against the reference
int main(int argc, char** argv) {
  std::mt19937 rng(atoi(argv[1]));
  const int NT = cfg::kWarpNTiles, MT = cfg::kWarpMTiles;
  const bool gated = GATED, row_map = ROW_MAP, topk = TOPK; const int tok_kind = TOK;  // 0 none 1 token 2 tensor
  const int kCols = gated ? cfg::kN / 2 : cfg::kN;
  long checked = 0;
  for (int trial = 0; trial < TRIALS; ++trial) {
    // the warp's columns
    int n_tiles_total = (cfg::kN + 15) / 16 + 2;
    int n_base = 16 * NT * (rng() % ((n_tiles_total + NT - 1) / NT));
    if (rng() % 3 == 0) n_base = ((cfg::kN - 1) / (16 * NT)) * 16 * NT;  // the last
    int m_base = row_map ? 8 * (rng() % 8) : rng() % 40;
    int pm = row_map ? 0 : m_base + (int)(rng() % (MT * 8 + 10)) - 3;
    int top_k = 1 + rng() % 5;
    int ids_n = m_base + MT * 8 + 8;
    std::vector<int> sorted_ids(ids_n);
    int assignments = 0;
    if (row_map) {
      pm = ids_n + (int)(rng() % 20);
      std::vector<int> perm(pm); for (int i = 0; i < pm; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int i = 0; i < ids_n; ++i) sorted_ids[i] = rng() % 4 == 0 ? pm + (int)(rng() % 3) : perm[i];
      assignments = pm;
    }
    int rows_c = (row_map ? pm : std::max(pm, m_base + MT * 8)) + 2;
    int ldc = kCols + (int)(rng() % 3) * 8; if (rng() % 4 == 0) ldc += 1;
    int off = rng() % 4 == 0 ? 1 : 0;  // misaligned c
    std::vector<u16> cbuf((size_t)rows_c * ldc + 16, 0xFFFF);
    u16* c = cbuf.data() + off;
    std::vector<float> out_scale(cfg::kN + 64), topk_w(std::max(pm, 1)), a_scale(std::max(pm, rows_c) + 64);
    std::uniform_real_distribution<float> U(-2.f, 2.f);
    for (auto& x : out_scale) x = U(rng);
    for (auto& x : topk_w) x = U(rng);
    for (auto& x : a_scale) x = U(rng);
    bias_table.assign(cfg::kN + 64, 0.f); std::vector<u16> bias(cfg::kN + 64);
    for (size_t i = 0; i < bias.size(); ++i) { bias_table[i] = U(rng); bias[i] = (u16)i; }
    // accumulators: A[n - n_base][m_local]
    std::vector<float> A((size_t)16 * NT * MT * 8);
    for (auto& x : A) x = U(rng);
    Params p{};
    SETP
    table.clear();
    memset(smem, 0xAB, sizeof smem);
    const int warp = rng() % 8;
    const u32 base = 1024 + warp * 2048; stage_lo = base; stage_hi = base + 2048;
    std::barrier<> b(32); bar = &b;
    std::vector<std::thread> th;
    for (int lane = 0; lane < 32; ++lane)
      th.emplace_back([&, lane] {
        threadIdx.x = 128 + warp * 32 + lane;
        float acc[cfg::kWarpNTiles][cfg::kWarpMTiles][4];
        int g = lane / 4, t = lane % 4;
        for (int nt = 0; nt < NT; ++nt) for (int mt = 0; mt < MT; ++mt) for (int r = 0; r < 4; ++r)
          acc[nt][mt][r] = A[(size_t)(nt * 16 + g + 8 * (r / 2)) * MT * 8 + mt * 8 + 2 * t + r % 2];
        store_output(acc, p, n_base, m_base, base);
      });
    for (auto& x : th) x.join();
    // reference
    std::vector<char> expect((size_t)rows_c * ldc, 0);
    for (int ml = 0; ml < MT * 8; ++ml) {
      int row = row_map ? sorted_ids[m_base + ml] : m_base + ml;
      if (row >= pm) continue;
      float tok = tok_kind == 1 ? (row_map ? a_scale[row / top_k] : a_scale[m_base + ml])
                  : tok_kind == 2 ? a_scale[0] : 1.f;
      for (int k = 0; k < (gated ? 8 * NT : 16 * NT); ++k) {
        int col = (gated ? n_base / 2 : n_base) + k;
        if (col >= kCols) continue;
        float v;
        if (gated) {
          int nt = k / 8, gg = k % 8, ng = n_base + nt * 16 + gg, nu = ng + 8;
          float ag = A[(size_t)(nt * 16 + gg) * MT * 8 + ml], au = A[(size_t)(nt * 16 + 8 + gg) * MT * 8 + ml];
          float gte = ag, up = au;
          if (OUT_SCALE) { gte = gte * out_scale[ng]; up = up * out_scale[nu]; }
          if (tok_kind) { gte = gte * tok; up = up * tok; }
          if (BIAS) { gte = gte + bias_table[ng]; up = up + bias_table[nu]; }
          v = gated_activation(gte, up);
          if (topk) v = v * topk_w[row];
        } else {
          int n = n_base + k;
          v = A[(size_t)k * MT * 8 + ml];
          if (OUT_SCALE) v = v * out_scale[n];
          if (tok_kind) v = v * tok;
          if (BIAS) v = v + bias_table[n];
          if (topk) v = v * topk_w[row];
        }
        float bf = [&]{ volatile float q = v; return (float)q; }();
        size_t idx = (size_t)row * ldc + col;
        expect[idx] = 1;
        u16 got = c[idx];
        if (got == 0xFFFF || got >= table.size() || memcmp(&table[got], &bf, 4) != 0) {
          if (errors++ < 10)
            printf("mismatch trial %d row %d col %d got %d (%g) want %g n_base %d m_base %d ldc %d off %d\n", trial,
                   row, col, got, got < table.size() ? table[got] : -1.f, v, n_base, m_base, ldc, off);
        }
        ++checked;
      }
    }
    for (size_t i = 0; i < expect.size(); ++i)
      if (!expect[i] && c[i] != 0xFFFF && errors++ < 10)
        printf("stray write at row %zu col %zu (trial %d, n_base %d ldc %d)\n", i / ldc, i % ldc, trial, n_base, ldc);
  }
  printf("checked %ld errors %d\n", checked, errors);
  return errors != 0;
}
}
int main(int argc, char** argv) { return hg::main(argc, argv); }
'''



def _driver(plan) -> str:
    """The host translation unit of `plan`'s store_output (its cfg constants, Params and epilogue section)."""
    src = generate(plan, "nvrtc")
    cfg, params = cfg_namespace(src), params_struct(src)
    epilogue = epilogue_section(src, "StoreOutputStaged")
    host = re.sub(r'asm volatile\("ld\.shared\.v4\.b32.*?: "r"\((.*?)\)\);', r"ld_shared_v4(v, \1);", epilogue,
                  flags=re.S)  # the read-back at the address the template computes
    assert host != epilogue, "the staged read-back is no longer the ld.shared.v4 this test replaces"
    fields = params_fields(params)
    store = next(c for c in plan.components if type(c).__name__ == "StoreOutputStaged")
    setp = "p.c = c; p.ldc = ldc; p.m = pm;"
    for field, expr in (("sorted_ids", "sorted_ids.data()"), ("top_k", "top_k"), ("topk_weights", "topk_w.data()"),
                        ("a_scale", "a_scale.data()"), ("out_scale", "out_scale.data()"), ("bias", "bias.data()")):
        if field in fields:
            setp += f" p.{field} = {expr};"
    main = (MAIN.replace("GATED", "true" if store.gated else "false")
            .replace("ROW_MAP", "true" if store.row_map else "false")
            .replace("TOPK", "true" if store.topk_weight else "false")
            .replace("TOK;", {"": "0;", "token": "1;", "tensor": "2;"}[store.token_scale])
            .replace("OUT_SCALE", "true" if store.out_scale else "false")
            .replace("BIAS", "true" if store.bias else "false").replace("SETP", setp).replace("TRIALS", str(TRIALS)))
    stub = "" if store.gated else "inline float gated_activation(float, float) { return 0.f; }\n"
    return PRELUDE + cfg + "\n" + params + "\n" + PRE2 + host + stub + main


def _dense(scheme: str, n: int, block_m: int, warpgroups: int):
    layer = LayerConfig(n=n, k=2048, scheme=scheme, has_bias=True)
    return compose(layer, ComputeConfig(), attrs.evolve(tuning_for(layer, SM90, None), block_m=block_m,
                                                        warps_n=4 * warpgroups, stages=2), SM90)


def _dense_a8(scheme: str, n: int, block_m: int):
    layer = LayerConfig(n=n, k=2048, scheme=scheme, has_bias=True)
    return compose(layer, ComputeConfig(), attrs.evolve(tuning_for_a8(layer, SM90, None), block_m=block_m, stages=2),
                   SM90)


def _moe(scheme: str, compute: ComputeConfig, block_m: int):
    layer = LayerConfig(n=1024, k=2048, scheme=scheme, num_experts=8, has_bias=True, top_k=3)
    grouped = compute.gemm != "indexed"
    return compose(layer, compute, moe_tuning_for(layer, SM90, block_m, 4 * 9 if grouped else 0), SM90)


ROUTED = ComputeConfig(gemm="indexed", topk_weight=True)
CASES = {  # 16-byte pieces per staged row (kPieces) 1 to 8, chunks of 1 to 8 m tiles, each row kind
    "dense-16bit-n1000-4tiles-per-warp": lambda: _dense("w8a16-fp8-channel", 1000, 24, 1),
    "dense-16bit-n1000-128tok": lambda: _dense("w4a16-int4-g128", 1000, 128, 2),
    "dense-8bit-192tok": lambda: _dense_a8("w8a8-fp8-channel", 1024, 192),
    "routed-16bit-64tok": lambda: _moe("w4a16-int4-g128", ROUTED, 64),
    "grouped-16bit-128tok": lambda: _moe("w4a16-int4-g128", ComputeConfig(gemm="grouped_contiguous"), 128),
    "routed-8bit-token-scale-128tok": lambda: _moe("w8a8-fp8-channel", ROUTED, 128),
    "routed-8bit-tensor-scale-8tok": lambda: _moe("w8a8-fp8-tensor", ROUTED, 8),
    "routed-8bit-gated-192tok": lambda: _moe("w4a8-mxfp4-fp8", attrs.evolve(ROUTED, epilogue_activation="swiglu_oai"),
                                             192),
    # prefetch_rows (compose.PREFETCH_CHUNK_ROWS): a last chunk past the tile's m tiles (6 = 4 + 2), and routed rows
    # without router weights (GEMM1 of 8-bit activations: token scales alone, a tensor scale, the gated epilogue)
    "routed-16bit-48tok-partial-chunk": lambda: _moe("w4a16-int4-g128", ROUTED, 48),
    "routed-8bit-token-scale-96tok-unweighted": lambda: _moe("w8a8-fp8-channel", ComputeConfig(gemm="indexed"), 96),
    "routed-8bit-tensor-scale-128tok-unweighted": lambda: _moe("w8a8-fp8-tensor", ComputeConfig(gemm="indexed"), 128),
    "routed-8bit-gated-128tok-unweighted": lambda: _moe("w8a8-fp8-channel",
                                                        ComputeConfig(gemm="indexed", epilogue_activation="silu_mul"),
                                                        128),
}


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("case,prefetch", [(c, False) for c in CASES]
                         + [(c, True) for c in CASES if c.startswith("routed")],
                         ids=list(CASES) + [f"{c}-prefetch-rows" for c in CASES if c.startswith("routed")])
def test_staged_store_writes_every_cell_once(case: str, prefetch: bool, tmp_path, monkeypatch) -> None:
    """prefetch: routed stores read each chunk's rows and factors one chunk ahead (compose.PREFETCH_CHUNK_ROWS)."""
    monkeypatch.setattr(ws_compose, "PREFETCH_CHUNK_ROWS", prefetch)
    plan = CASES[case]()
    store = next((c for c in plan.components if type(c).__name__ == "StoreOutputStaged"), None)
    assert store is not None, "not the staged store"
    assert store.prefetch_rows == prefetch
    source = tmp_path / "staged.cpp"
    source.write_text(_driver(plan))
    exe = tmp_path / "staged"
    flags = [CXX, "-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "-include", "algorithm", "-o", str(exe),
             str(source)]
    # AddressSanitizer (where the compiler has it): a lookup past sorted_ids or the router weights (exactly p.m) fails
    built = subprocess.run(flags + ["-fsanitize=address"], capture_output=True, text=True)
    if built.returncode and "barrier" not in built.stderr:
        built = subprocess.run(flags, capture_output=True, text=True)
    if built.returncode and "barrier" in built.stderr:
        pytest.skip("the host C++ compiler lacks C++20 <barrier>")
    assert built.returncode == 0, built.stderr[-3000:]
    ran = subprocess.run([str(exe), "1"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and "errors 0" in ran.stdout, (ran.stdout[-2000:], ran.stderr[-2000:])

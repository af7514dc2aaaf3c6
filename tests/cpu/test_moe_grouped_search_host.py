"""The standard grouped_contiguous schedule's expert search (templates/schedule/moe_grouped.cuh.j2: each warp counts
the experts' m blocks lane by lane, scans with shuffles and takes the expert from the lane holding blockIdx.y) run on
the host: the generated tile_coord compiled with g++, 32 threads in step (std::barrier) standing in for the shuffles
and the ballot, against an expert-by-expert walk with the same clamping to [0, m], for sorted layouts, layouts with
empty experts and values past m, and unsorted / negative ones (which a caller should not pass; the two must still
agree). From a review helper's harness.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import attrs
import pytest

from host_sections import cfg_namespace
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import generate
from humming_gen.targets import get_target

CXX = shutil.which("g++")
SM90 = get_target("sm_90a")

PRE = r'''
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <thread>
#include <barrier>
#include <vector>
#include <random>
using std::min; using std::max;
#define __device__
#define __forceinline__ inline
struct Dim { unsigned x, y; };
thread_local Dim threadIdx; Dim blockIdx;
std::barrier<>* bar; int xch[32];
int __shfl_up_sync(unsigned, int v, int d) {
  int l = threadIdx.x % 32;
  xch[l] = v;
  bar->arrive_and_wait();
  int r = l >= d ? xch[l - d] : v;
  bar->arrive_and_wait();
  return r;
}
int __shfl_sync(unsigned, int v, int s) {
  int l = threadIdx.x % 32;
  xch[l] = v;
  bar->arrive_and_wait();
  int r = xch[s];
  bar->arrive_and_wait();
  return r;
}
unsigned __ballot_sync(unsigned, int p) {
  int l = threadIdx.x % 32;
  xch[l] = p != 0;
  bar->arrive_and_wait();
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= (unsigned)xch[i] << i;
  bar->arrive_and_wait();
  return r;
}
int __ffs(unsigned x) { return __builtin_ffs(x); }
struct Params { const void* expert_layout; int m; };
'''
MAIN = r'''
int main() {
  std::mt19937 rng(7); const int E = cfg::kNumExperts, BM = cfg::kBlockM; long n = 0; int bad = 0;
  for (int trial = 0; trial < TRIALS; ++trial) {
    int m = rng() % 3000; std::vector<int> L(E + 1); int kind = trial % 4;
    if (kind == 0) {  // sorted, from 0 to m
      for (int e = 0; e <= E; ++e) L[e] = rng() % (m + 1);
      std::sort(L.begin(), L.end());
      L[0] = 0;
      L[E] = m;
    }
    else if (kind == 1) {  // sorted, a third past m
      for (int e = 0; e <= E; ++e) L[e] = rng() % 3 == 0 ? m + 7 : (int)(rng() % (m + 1));
      std::sort(L.begin(), L.end());
    }
    else {  // unsorted, some negative, some past m
      for (int e = 0; e <= E; ++e) L[e] = (int)(rng() % (m + 600)) - 300;
    }
    Params p{L.data(), m};
    int grid = m / BM + E;
    for (int block = 0; block < grid + 2; ++block) {
      // the expert-by-expert walk (the same clamping)
      int first = 0, we = -1, wm0 = 0, wend = 0;
      for (int e = 0; e < E; ++e) {
        int b = min(max(L[e], 0), m), en = min(max(L[e + 1], b), m), nb = (en - b + BM - 1) / BM;
        if (block < first + nb) {
          we = e;
          wm0 = b + (block - first) * BM;
          wend = en;
          break;
        }
        first += nb;
      }
      blockIdx.y = block; std::barrier<> br(32); bar = &br; TileCoord out[32];
      std::vector<std::thread> th;
      for (int l = 0; l < 32; ++l) th.emplace_back([&, l] { threadIdx.x = 64 + l; out[l] = tile_coord(p); });
      for (auto& t : th) t.join();
      for (int l = 0; l < 32; ++l) {
        bool ok = out[l].expert == we && (we < 0 || (out[l].m0 == wm0 && out[l].row_end == wend));
        if (!ok && bad++ < 5)
          printf("E %d block %d lane %d got (%d,%d,%d) want (%d,%d,%d)\n", E, block, l, out[l].expert, out[l].m0,
                 out[l].row_end, we, wm0, wend);
      }
      ++n;
    }
  }
  printf("E=%d BM=%d blocks %ld bad %d\n", E, BM, n, bad); return bad != 0;
}
'''


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("experts", [5, 33, 257])
def test_grouped_search_matches_the_expert_walk(experts: int, tmp_path) -> None:
    layer = LayerConfig(n=1024, k=1024, scheme="w4a16-int4-g128", num_experts=experts)
    tuning = attrs.evolve(choose_tunings(layer, SM90, pipeline="standard").for_m(16), split_k=1)
    plan = compose(layer, ComputeConfig(gemm="grouped_contiguous"), tuning, SM90)
    src = generate(plan, "nvrtc")
    cfg = cfg_namespace(src)
    schedule = re.search(r"struct TileCoord \{.*?\n\}\n", src[src.index("// schedule: MoE, grouped_contiguous"):],
                         re.S).group(0)
    source = tmp_path / "search.cpp"
    source.write_text(PRE + cfg + "\nnamespace hg {\n" + schedule + MAIN.replace("TRIALS", "12")
                      + "}\nint main() { return hg::main(); }\n")
    exe = tmp_path / "search"
    built = subprocess.run([CXX, "-std=c++20", "-O1", "-pthread", "-o", str(exe), str(source)], capture_output=True,
                           text=True)
    if built.returncode and "barrier" in built.stderr:
        pytest.skip("the host C++ compiler lacks C++20 <barrier>")
    assert built.returncode == 0, built.stderr[-3000:]
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and " bad 0" in ran.stdout, ran.stdout[-2000:]

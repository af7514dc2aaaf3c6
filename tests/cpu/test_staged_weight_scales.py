"""Weight group scales of the standard pipeline's 8-bit-activation kernels staged through shared memory
(pipelines.standard.compose_a8.STAGE_WEIGHT_SCALES, on by default: WeightScalesCpAsync copies a stage's kWScaleRows
fp32 rows beside its weight tile, each promotion reads its warp slice's scales from there instead of from global
memory).

- Which layers stage (group k sides that divide block_k or are multiples of it; not int4 x int4), the shared memory
  the heuristics and compose count, the kernel name (`_wss`), and that the switch off renders no staging.
- NVRTC compilation without spills (dense buckets and MoE small tiles, sm_80 / sm_89 / sm_90a / sm_120a).
- The generated loader and reader compiled for the host with g++: every k tile's stage copied by all threads, then
  every warp's promotion groups read back, against the global reader's element (GroupScalesGlobal's indexing).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import attrs
import pytest

from host_sections import cfg_namespace
from symbols import declaration_mismatches
import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build_many, generate
from humming_gen.pipelines.standard import compose_a8
from humming_gen.pipelines.standard.compose import shared_memory
from humming_gen.pipelines.standard.heuristics import moe_small_tile
from humming_gen.targets import get_target

CXX = shutil.which("g++")
SCHEMES = ("w4a8-mxfp4-fp8", "w8a8-fp8-block128", "w4a8-int4-g128-int8")


@pytest.fixture
def staged(monkeypatch):
    monkeypatch.setattr(compose_a8, "STAGE_WEIGHT_SCALES", True)


def _dense(scheme: str, target: str = "sm_90a", n: int = 1536, k: int = 2048):
    layer = LayerConfig(n=n, k=k, scheme=scheme)
    return layer, choose_tunings(layer, get_target(target), pipeline="standard")


def test_default_stages_and_the_switch_off_reads_group_scales_from_global_memory(monkeypatch) -> None:
    layer, plan = _dense("w4a8-mxfp4-fp8")
    assert compose(layer, ComputeConfig(), plan.for_m(8), get_target("sm_90a")).kernel_name.endswith("_wss")
    monkeypatch.setattr(compose_a8, "STAGE_WEIGHT_SCALES", False)
    layer, plan = _dense("w4a8-mxfp4-fp8")
    kernel = compose(layer, ComputeConfig(), plan.for_m(8), get_target("sm_90a"))
    assert compose_a8.weight_scale_rows(layer, 128) is None and not kernel.kernel_name.endswith("_wss")
    assert "load_weight_group_scales(w_scale, p," in generate(kernel)


def test_which_layers_stage_and_what_a_stage_holds(staged) -> None:
    assert compose_a8.weight_scale_rows(LayerConfig(n=256, k=1024, scheme="w4a8-mxfp4-fp8"), 128) == 4
    assert compose_a8.weight_scale_rows(LayerConfig(n=256, k=1024, scheme="w8a8-fp8-block128"), 256) == 2
    assert compose_a8.weight_scale_rows(LayerConfig(n=256, k=1024, scheme="w4a8-int4-g128-int8"), 64) == 1
    assert compose_a8.weight_scale_rows(LayerConfig(n=256, k=1024, scheme="w8a8-fp8-channel"), 128) is None
    g96 = attrs.evolve(hg.scheme("w4a8-int4-g128-int8"), group_size=96)  # 96 neither divides 128 nor is a multiple
    assert compose_a8.weight_scale_rows(LayerConfig(n=256, k=1024, scheme=g96), 128) is None
    layer, plan = _dense("w4a8-mxfp4-fp8")
    t = plan.for_m(8)
    smem = shared_memory(layer, t)
    assert smem.group == t.block_k // 32 * t.block_n * 4 and smem.tensors == 1
    kernel = compose(layer, ComputeConfig(), t, get_target("sm_90a"))
    src = generate(kernel)
    assert kernel.kernel_name.endswith("_wss") and "load_weight_group_scales(w_scale, p," not in src
    assert "load_staged_weight_group_scales(w_scale, w_scale_stage(s)" in src
    # the calls whose arguments the host test below takes as given (its stage loop is the skeleton's)
    body = " ".join(src.split())
    assert ("load_weight_scale_stage(w_scale_stage(s), static_cast<const float*>(p.b_scale), tc.n0, "
            "weight_scale_stage_row0(kt));") in body
    assert ("load_staged_weight_group_scales(w_scale, w_scale_stage(s), wn * cfg::kWarpN, "
            "staged_weight_scale_row(slice_k + pg * cfg::kPromoteK, kt));") in body
    assert "const int slice_k = kt * cfg::kBlockK + wk * cfg::kWarpK;" in body
    assert "load_weight_stage(s, tc.kt_begin + s);" in body
    assert "compute_stage(it % cfg::kStages, tc.kt_begin + it);" in body
    assert declaration_mismatches(kernel) == {}
    moe = LayerConfig(n=1536, k=2048, scheme="w8a8-fp8-block128", num_experts=8)
    for compute in (ComputeConfig(gemm="indexed", topk_weight=True), ComputeConfig(gemm="grouped_contiguous")):
        t = choose_tunings(moe, get_target("sm_90a"), pipeline="standard").for_m(16)
        assert declaration_mismatches(compose(moe, compute, attrs.evolve(t, split_k=1), get_target("sm_90a"))) == {}
    offset = int(re.search(r"kWScaleOffset = (\d+);", src).group(1))
    assert offset == smem.stage - smem.group and offset >= smem.a + t.block_n * t.block_k // 2


@pytest.mark.parametrize("target", ["sm_80", "sm_89", "sm_90a", "sm_120a"])
def test_staged_kernels_compile_without_spills(staged, target: str) -> None:
    tg = get_target(target)
    plans = []
    for scheme in SCHEMES:
        if "fp8" in scheme and not tg.has("mma_fp8"):
            continue
        layer, plan = _dense(scheme, target)
        plans += [compose(layer, ComputeConfig(), t, tg) for _, t in plan.buckets]
        moe = LayerConfig(n=1536, k=2048, scheme=scheme, num_experts=128)
        for _, t in choose_tunings(moe, tg, pipeline="standard").buckets[:2]:
            t = moe_small_tile(moe, tg, attrs.evolve(t, split_k=1))
            plans.append(compose(moe, ComputeConfig(gemm="indexed", topk_weight=True), t, tg))
    assert plans and all(p.kernel_name.endswith("_wss") for p in plans)
    for kernel in build_many(plans):
        r = kernel.resources
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)


HOST = r'''
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#define __device__
#define __forceinline__ inline
typedef unsigned int u32;
struct Dim { unsigned x; };
Dim threadIdx;
static unsigned char smem_base[1 << 20];
inline u32 smem_address(const void* p) { return (u32)((const unsigned char*)p - smem_base); }
inline void cp_async_16(u32 dst, const void* src, int bytes) {
  memset(smem_base + dst, 0, 16);
  memcpy(smem_base + dst, src, bytes);
}
'''

MAIN = r'''
namespace hg {
int run(int seed) {
  std::mt19937 rng(seed);
  const int G = cfg::kWeightGroupK, groups = (cfg::kKTiles * cfg::kBlockK + G - 1) / G;
  std::vector<float> gmem((size_t)groups * cfg::kNPad);
  std::uniform_real_distribution<float> U(-4.f, 4.f);
  for (auto& x : gmem) x = U(rng);
  float* stage = reinterpret_cast<float*>(smem_base + 4096);
  long checked = 0;
  int errors = 0;
  for (int n0 = 0; n0 < cfg::kNPad; n0 += cfg::kBlockN)
    for (int kt = 0; kt < cfg::kKTiles; ++kt) {
      memset(smem_base, 0xFF, sizeof(smem_base));
      for (unsigned t = 0; t < cfg::kThreads; ++t) {
        threadIdx.x = t;
        load_weight_scale_stage(stage, gmem.data(), n0, weight_scale_stage_row0(kt));
      }
      for (unsigned t = 0; t < cfg::kThreads; ++t) {
        threadIdx.x = t;
        const int warp = t / 32, wk = warp / cfg::kWarpsMN, wn = warp % cfg::kWarpsMN % cfg::kWarpsN;
        const int slice_k = kt * cfg::kBlockK + wk * cfg::kWarpK, g = t % 32 / 4;
        for (int pg = 0; pg < cfg::kWarpK / cfg::kPromoteK; ++pg) {
          const int group = (slice_k + pg * cfg::kPromoteK) / G;
          float w[cfg::kWarpNTiles][2];
          load_staged_weight_group_scales(w, stage, wn * cfg::kWarpN,
                                          staged_weight_scale_row(slice_k + pg * cfg::kPromoteK, kt));
          for (int nt = 0; nt < cfg::kWarpNTiles; ++nt)
            for (int h = 0; h < 2; ++h) {
              const float want = gmem[(size_t)group * cfg::kNPad + n0 + wn * cfg::kWarpN + g + nt * 16 + 8 * h];
              if (memcmp(&w[nt][h], &want, 4) != 0 && errors++ < 10)
                printf("n0 %d kt %d thread %u pg %d nt %d h %d: got %g want %g\n", n0, kt, t, pg, nt, h,
                       w[nt][h], want);
              ++checked;
            }
        }
      }
    }
  printf("checked %ld errors %d\n", checked, errors);
  return errors != 0 || checked == 0;
}
}
int main(int argc, char** argv) { return hg::run(argc > 1 ? atoi(argv[1]) : 1); }
'''


def _section(src: str) -> str:
    start = src.index("// ---- memory.WeightScalesCpAsync()")
    return src[start:src.index("// ====", start)]


HOST_CASES = {  # (scheme, TuningConfig fields over the dense M <= 8 bucket)
    "mxfp4-g32-block_k128": ("w4a8-mxfp4-fp8", dict(block_k=128, warps_k=2, stages=4)),
    "mxfp4-g32-block_k256": ("w4a8-mxfp4-fp8", {}),
    "block128-block_k256": ("w8a8-fp8-block128", {}),
    "int4-g128-block_k64": ("w4a8-int4-g128-int8", dict(block_k=64, warps_k=1, stages=4)),
}


@pytest.mark.skipif(CXX is None, reason="needs g++")
@pytest.mark.parametrize("case", sorted(HOST_CASES))
def test_staged_scales_read_what_the_global_reader_reads(staged, case: str, tmp_path) -> None:
    scheme, fields = HOST_CASES[case]
    layer, plan = _dense(scheme, n=1000, k=1536)
    t = attrs.evolve(plan.for_m(8), split_k=1, **fields)
    src = generate(compose(layer, ComputeConfig(), t, get_target("sm_90a")))
    cpp = tmp_path / "scales.cpp"
    cpp.write_text(HOST + cfg_namespace(src) + "\nnamespace hg {\n" + _section(src) + "}\n" + MAIN)
    exe = tmp_path / "scales"
    subprocess.run([CXX, "-std=c++20", "-O1", "-o", str(exe), str(cpp)], check=True, capture_output=True, text=True)
    r = subprocess.run([str(exe), "3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert " errors 0" in r.stdout

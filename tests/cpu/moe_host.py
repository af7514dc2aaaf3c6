"""The warp-specialized MoE producer's schedule and row gather run on the host: the templates rendered for a real
plan (MoeIndexedPersistentSchedule, ATileSw128CpAsync), compiled with the host C++ compiler and checked against
moe_align's routing. Shared by the 16-bit (test_moe_gemm_ws.py) and 8-bit (test_moe_gemm_a8_ws.py) activation
tests, with the plans they check (ws_moe_plans)."""

from __future__ import annotations

import shutil
import subprocess

import attrs
import torch

from humming_gen.codegen import compose
from humming_gen.codegen.render import environment
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.pipelines.warp_specialized.heuristics import choose_moe_tunings, moe_tuning_for
from humming_gen.targets import get_target
from humming_gen.reference.moe import moe_align_reference

CXX = shutil.which("g++") or shutil.which("c++")
SM90 = get_target("sm_90a")


def expert_constant(name: str) -> str:
    """The kernel constant holding the bytes of one expert's slice of stacked tensor `name` (b_scale ->
    kExpertBScaleBytes), which for_expert adds per expert."""
    return "kExpert" + "".join(p.title() for p in name.split("_")) + "Bytes"


def expert_stride_mismatches(plan, stacked, names=("b", "b_scale", "out_scale")) -> dict[str, tuple]:
    """Stacked weight tensors whose bytes per expert differ from the plan's kExpert*Bytes constant, or which have a
    constant but no tensor (or the reverse): name -> (constant value, bytes per expert)."""
    consts = {name: value for name, value, _ in plan.constants}
    wrong = {}
    for name in names:
        t = getattr(stacked, name)
        per_expert = None if t is None else t[0].numel() * t.element_size()
        if consts.get(expert_constant(name)) != per_expert:
            wrong[name] = (consts.get(expert_constant(name)), per_expert)
    return wrong


def ws_moe_plans(layer: LayerConfig, compute: ComputeConfig, block_ms: tuple[int, ...] | None = None,
                 tma: bool | None = None) -> list:
    """The warp-specialized MoE kernel plans of every heuristic bucket, or of the given token tiles (any tile the
    pipeline serves, whether or not a bucket takes it); grouped GEMMs of 16-bit activations read their windows by
    TMA as grouped_moe_tuning chooses (tma=None), or as `tma` says."""
    grouped = compute.gemm in ("grouped_contiguous", "grouped_masked")
    bms = [t.block_m for _, t in choose_moe_tunings(layer, SM90).buckets] if block_ms is None else list(block_ms)
    tunings = [moe_tuning_for(layer, SM90, bm, grouped=grouped) for bm in bms]
    if tma is not None and layer.scheme.activation is None:
        tunings = [attrs.evolve(t, a_load="tma" if tma else "cp_async") for t in tunings]
    return [compose(layer, compute, t, SM90) for t in tunings]

HOST_PRELUDE = """#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>
using std::max;
using std::min;
#define __device__
#define __forceinline__ inline
typedef unsigned int u32;
typedef unsigned short u16;
struct Dim { unsigned x; } threadIdx;
struct Params { const void* sorted_ids; const void* expert_ids; const void* num_tokens_post_pad; int m; int top_k; };
// the producer's 128 threads run one after another: a shuffle reads the register of the lane it names from each
// thread's gather_rows results (src is the array load_a_stage shuffles)
std::vector<std::vector<int>> lane_src;
#define __shfl_sync(mask, value, lane) lane_src[threadIdx.x / 32 * 32 + (lane)][&(value) - &src[0]]
// cp.async: smem offset, source byte (from a base of 0), bytes
void cp_async_16(u32 dst, const void* src, int bytes) {
  printf("copy %u %ld %d\\n", dst, (long)((const char*)src - (const char*)0), bytes);
}
"""

MAIN = """
int main(int argc, char** argv) {
  const int m = atoi(argv[1]), top_k = atoi(argv[2]), blocks = atoi(argv[3]), k0 = atoi(argv[4]),
            lda = atoi(argv[5]);
  std::vector<int> sorted_ids(blocks * cfg::kBlockM), expert_ids(blocks);
  int routed;
  for (int& v : sorted_ids) scanf("%d", &v);
  for (int& v : expert_ids) scanf("%d", &v);
  scanf("%d", &routed);
  Params p{sorted_ids.data(), expert_ids.data(), &routed, m, top_k};
  const int units = unit_count(p);
  printf("units %d\\n", units);
  for (int u = 0; u < units; ++u) {
    const TileCoord tc = unit_coord(p, u);
    printf("unit %d %d %d %d %d\\n", tc.n0, tc.m0, tc.kt_begin, tc.kt_end, tc.expert);
    if (tc.n0 != 0) continue;  // the gather of each m block, once
    lane_src.assign(cfg::kProducerThreads, std::vector<int>(kAGatherRegs));
    for (threadIdx.x = 0; threadIdx.x < cfg::kProducerThreads; ++threadIdx.x) {
      int regs[kAGatherRegs];
      gather_rows(regs, p, tc.m0);
      for (int j = 0; j < kAGatherRegs; ++j) lane_src[threadIdx.x][j] = regs[j];
    }
    for (threadIdx.x = 0; threadIdx.x < cfg::kProducerThreads; ++threadIdx.x) {
      int src[kAGatherRegs];
      for (int j = 0; j < kAGatherRegs; ++j) src[j] = lane_src[threadIdx.x][j];
      load_a_stage(0, (const A_TYPE*)0, lda, src, k0);
    }
  }
  return 0;
}
"""


def check_schedule_and_gather(plan, tmp_path, seed: int) -> None:
    """The units cover every (routed m block, n tile) once with its expert, and every 16-byte chunk of the
    activation tile is copied once, from row sorted_ids[m0 + r] / top_k of a (zero-filled for padding rows and
    past K), for a routing of 37 tokens x top-3 over 8 experts with skipped slots, in the first two k tiles."""
    c = {name: value for name, value, _ in plan.constants}
    parts = [next(x for x in plan.components if type(x).__name__ == name)
             for name in ("MoeIndexedPersistentSchedule", "ATileSw128CpAsync")]
    element = parts[1].bytes  # 2 (16-bit activations) or 1 (8-bit codes)
    body = "".join(environment().get_template(x.template).render(**x.context()) for x in parts)
    cfg = "".join(f"constexpr int {name} = {value};\n" for name, value, _ in plan.constants)
    main = MAIN.replace("A_TYPE", "u16" if element == 2 else "unsigned char")
    source = tmp_path / "gather.cpp"
    source.write_text(HOST_PRELUDE + "namespace cfg {\n" + cfg + "}\n" + body + main)
    exe = tmp_path / "gather"
    subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(exe), str(source)], check=True, capture_output=True)
    block_m, block_k, chunk_k = plan.tuning.block_m, plan.tuning.block_k, 16 // element
    torch.manual_seed(seed)
    m_tokens, top_k, experts, lda = 37, 3, 8, 1000
    ids = torch.randint(0, experts, (m_tokens, top_k), dtype=torch.int32)
    ids[0, 0] = ids[5, 2] = -1  # skipped assignments
    r = moe_align_reference(ids, experts, block_m)
    routed = int(r.num_tokens_post_pad)
    chunks = block_m * block_k // chunk_k  # 16-byte chunks of a tile
    for k0 in (0, block_k):  # K < 2 block_k: the tiles reach past K, whose columns are zero-filled
        blocks = r.expert_ids.numel()
        stdin = " ".join(map(str, r.sorted_ids.tolist() + r.expert_ids.tolist() + [routed]))
        out = subprocess.run([str(exe), str(m_tokens * top_k), str(top_k), str(blocks), str(k0), str(lda)],
                             input=stdin, check=True, capture_output=True, text=True).stdout.splitlines()
        units = [tuple(map(int, line.split()[1:])) for line in out if line.startswith("unit ")]
        assert int(out[0].split()[1]) == len(units) == c["kNTiles"] * routed // block_m
        assert sorted((n0, m0) for n0, m0, *_ in units) == sorted(
            (n * c["kBlockN"], b * block_m) for b in range(routed // block_m) for n in range(c["kNTiles"]))
        assert all(e == int(r.expert_ids[m0 // block_m]) >= 0 and (kb, ke) == (0, c["kKTiles"])
                   for _, m0, kb, ke, e in units)
        copies = [tuple(map(int, line.split()[1:])) for line in out if line.startswith("copy ")]
        assert len(copies) == routed // block_m * chunks
        for unit, start in enumerate(range(0, len(copies), chunks)):
            m0, seen = unit * block_m, set()
            for dst, src, nbytes in copies[start:start + chunks]:
                assert dst not in seen
                seen.add(dst)
                panel, rest = divmod(dst, c["kBlockM"] * 128)
                row, byte = divmod(rest, 128)
                chunk = panel * 8 + ((byte // 16) ^ (row % 8))
                assignment = int(r.sorted_ids[m0 + row])
                gk = k0 + chunk * chunk_k
                # 16-bit rows are padded to 8 elements (kKA); code rows end at K, a last chunk copied in part
                valid = (min(16, (c["kK"] - gk) * element) if element == 1 else 16 * (gk < c["kKA"]))
                if assignment >= m_tokens * top_k or valid <= 0:
                    assert nbytes == 0, (m0, row, chunk)
                else:
                    assert nbytes == valid and src == (assignment // top_k * lda + gk) * element, (m0, row, chunk)
            assert len(seen) == chunks

"""The group-parameter loader and reader of group sizes that are not multiples of 16
(templates/pipelines/standard/group_params_cp_async.cuh.j2: load_group_stage; templates/memory/
group_params_shared.cuh.j2: first_group_row, load_group_pair_at), rendered for real plans
and compiled for the host with g++, with the plan's cfg:: constants.

For every k tile of one n block, every thread runs the stage load (cp.async as a host copy into a shared-memory
arena filled with a NaN sentinel outside and inside the stage), then every lane of every k warp reads the
(row g, row g + 8) scale pairs of each register's (k, k + 1) elements, as the pipeline calls it. Each value must
be the scheme's own scale of that output row and k (QuantizedWeight.scales[n, k // group_size], in the compute
type): a stage that starts at the wrong group row reads the sentinel or a neighbouring group's scale.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from numerics_check import compose, prepare_weight
from humming_gen.codegen.render import environment
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.schemes import QuantScheme
from humming_gen.targets import get_target

CXX = shutil.which("g++") or shutil.which("c++")
SENTINEL = 0x7FBF  # a NaN bit pattern no scale has
T_ODD_M = TuningConfig(block_m=24, block_n=128, block_k=128, warps_m=1, warps_n=2, warps_k=2, stages=3)
T_SPLITK = TuningConfig(block_m=16, block_n=128, block_k=128, warps_m=1, warps_n=2, warps_k=2, stages=4, split_k=3)

PRELUDE = r"""
#include <cstdio>
#include <cstring>
#include <algorithm>
using std::min;
typedef unsigned int u32;
typedef unsigned short u16;
#define __device__
#define __forceinline__ inline
struct Dim { int x; };
static Dim threadIdx;
static u16 arena[1 << 16];
static inline u32 smem_address(const void* p) { return u32((const unsigned char*)p - (const unsigned char*)arena); }
static inline void cp_async_16(u32 dst, const void* src, int bytes) {
  unsigned char* d = (unsigned char*)arena + dst;
  std::memset(d, 0, 16);
  std::memcpy(d, src, bytes);
}
static inline u32 prmt(u32 a, u32 b, u32 sel) {
  const unsigned long long both = (unsigned long long)b << 32 | a;
  u32 out = 0;
  for (int i = 0; i < 4; ++i) out |= u32((both >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return out;
}
"""

# (id, scheme, dtype, tuning or heuristic M)
CASES = [
    ("int4-g7-m1", QuantScheme("int4", group_size=7), "bfloat16", 1),
    ("int4-g7-splitk", QuantScheme("int4", group_size=7), "float16", T_SPLITK),
    ("int4-g24-m4096", QuantScheme("int4", group_size=24), "bfloat16", 4096),
    ("int4-g24-bm24", QuantScheme("int4", group_size=24), "bfloat16", T_ODD_M),
    ("uint4-g100-zp-m16", QuantScheme("uint4", group_size=100, zero_point="int"), "bfloat16", 16),
    ("int4-g40-m1", QuantScheme("int4", group_size=40), "float16", 1),
    ("int4-g8-m64", QuantScheme("int4", group_size=8), "bfloat16", 64),
    ("fp8-block128x24-m1", QuantScheme("float8e4m3", block_size=(128, 24), scale_dtype="float32"), "bfloat16", 1),
]


def _plan(scheme, dtype, tuning, n, k):
    target = get_target("sm_90a")
    layer = LayerConfig(n, k, scheme, dtype=dtype)
    if isinstance(tuning, int):
        tuning = choose_tunings(layer, target).for_m(tuning)
    return compose(layer, ComputeConfig(), tuning, target)


def _program(plan, gmem_bits: list[int]) -> str:
    loader = next(c for c in plan.components if type(c).__name__ == "GroupParamsCpAsync")
    reader = next(c for c in plan.components if type(c).__name__ == "GroupParamsShared")
    assert loader.arbitrary_groups and reader.arbitrary_groups
    body = "".join(environment().get_template(c.template).render(**c.context()) for c in (loader, reader))
    t = plan.tuning
    cfg = "".join(f"constexpr int {name} = {value};\n" for name, value, _ in plan.constants)
    guard = 2 * plan.layout.n_pad
    stage_off = 2 * plan.group.rows_per_stage * t.block_n + 256
    init = ",".join(str(v) for v in gmem_bits)
    return (PRELUDE + f"namespace cfg {{\n{cfg}}}\n{body}\n"
            f"static const u16 gmem_data[] = {{{init}}};\n"
            "int main() {\n"
            f"  static u16 gmem_buf[{guard} + sizeof(gmem_data) / 2 + {guard}];\n"
            f"  for (auto& v : gmem_buf) v = {SENTINEL};\n"
            f"  std::memcpy(gmem_buf + {guard}, gmem_data, sizeof(gmem_data));\n"
            f"  const u16* gmem = gmem_buf + {guard};\n"
            "  for (int kt = 0; kt < cfg::kKPad / cfg::kBlockK; ++kt) {\n"
            f"    for (auto& v : arena) v = {SENTINEL};\n"
            f"    u16* stage = arena + {stage_off};\n"
            "    const int row0 = first_group_row(kt);\n"
            "    for (int t = 0; t < cfg::kThreads; ++t) { threadIdx.x = t; load_group_stage(stage, gmem, 0, row0); }\n"
            "    for (int wk = 0; wk < cfg::kWarpsK; ++wk)\n"
            "      for (int lane = 0; lane < 32; ++lane) {\n"
            "        threadIdx.x = lane;\n"
            "        const int pair_k = kt * cfg::kBlockK + wk * cfg::kWarpK + 2 * (lane % 4);\n"
            "        for (int ks = 0; ks < cfg::kWarpK / 16; ++ks)\n"
            "          for (int h = 0; h < 2; ++h)\n"
            "            for (int n16 = 0; n16 < cfg::kBlockN / 16; ++n16) {\n"
            "              u32 lo, hi;\n"
            "              const int k = pair_k + ks * 16 + 8 * h;\n"
            "              load_group_pair_at(lo, hi, stage, row0, k, n16);\n"
            "              std::printf(\"%d %d %u %u\\n\", k, n16 * 16 + lane / 4, lo, hi);\n"
            "            }\n"
            "      }\n"
            "  }\n  return 0;\n}\n")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_arbitrary_group_rows_read_the_scheme_scale(case, tmp_path) -> None:
    if CXX is None:
        pytest.skip("no host C++ compiler (g++) to run the rendered templates")
    _, scheme, dtype, tuning = case
    n, k = 256, 1000  # K padded to 1024: a partial last group and rows past K
    torch.manual_seed(5)
    qw = scheme.quantize(torch.randn(n, k) * 0.05)
    plan = _plan(scheme, dtype, tuning, n, k)
    g = plan.group
    assert g.arbitrary
    pw = prepare_weight(plan, qw, "cpu")
    gmem = (pw.b_scale.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF).reshape(-1).tolist()
    src, exe = tmp_path / "rows.cpp", tmp_path / "rows"
    src.write_text(_program(plan, gmem))
    subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    rec = torch.tensor([int(v) for v in out], dtype=torch.int64).reshape(-1, 4)
    ks, rows, lo, hi = rec.unbind(1)
    assert int(ks.max()) + 2 == plan.layout.k_pad and int(rows.max()) == plan.tuning.block_n - 9  # every k, every row
    got = torch.stack([lo & 0xFFFF, lo >> 16, hi & 0xFFFF, hi >> 16], 1)  # (g, k) (g, k+1) (g+8, k) (g+8, k+1)
    assert not (got == SENTINEL).any(), "a register read shared memory the stage load did not write"
    # the scheme's scale of (n, k) in the compute type, as 16-bit patterns
    dt = torch.bfloat16 if dtype == "bfloat16" else torch.float16
    if scheme.granularity == "block":
        per_nk = scheme.expand_scales(qw.scales.double(), n, k)
    else:
        per_nk = qw.scales.double().repeat_interleave(scheme.group_size, dim=1)[:, :k]
    if plan.layout.scale_exponent:  # stored scales carry the converter's 2^e, less the row factor in out_scale
        per_nk = per_nk * 2.0 ** plan.layout.scale_exponent / pw.out_scale.double()[:n, None]
    want_bits = per_nk.to(dt).view(torch.int16).to(torch.int64) & 0xFFFF
    ks4 = torch.stack([ks, ks + 1, ks, ks + 1], 1)
    rows4 = torch.stack([rows, rows, rows + 8, rows + 8], 1)
    inside = ks4 < k
    want = want_bits[rows4[inside], ks4[inside]]
    bad = (got[inside] != want).sum().item()
    assert bad == 0, f"{bad} of {inside.sum().item()} register scale reads hold another group's scale"

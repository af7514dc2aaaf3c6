"""Grouped MoE GEMMs (grouped_contiguous, grouped_masked) of the warp-specialized pipeline (sm_90a) on the CPU: NVRTC
compilation without spills for 16-bit and 8-bit schemes, the generated source (the experts' m blocks counted on
the device after the wait for the previous kernel, dense row windows, per-expert rebasing), refusals, the
pipeline grouped_moe_gemm takes, and the schedule compiled for the host (its warp scan run by 32 threads) against
a Python enumeration of the units for ragged layouts."""

from __future__ import annotations

import subprocess

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import ComposeError, compose
from humming_gen.codegen.render import environment
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings, grouped_moe_tuning
from humming_gen.kernel import build_many
from humming_gen.layer.moe import QuantMoE
from humming_gen.pipelines.base import m_blocks
from humming_gen.pipelines.common import missing_symbols
from humming_gen.pipelines.warp_specialized.heuristics import choose_moe_tunings
from humming_gen.targets import get_target
from moe_host import CXX, ws_moe_plans
from symbols import declaration_mismatches

SM90 = get_target("sm_90a")
GROUPED = ("grouped_contiguous", "grouped_masked")
SCHEMES = ("w4a16-int4-g128", "w4a16-mxfp4", "w8a8-fp8-channel", "w8a8-fp8-block128")


def _layer(scheme: str, experts: int = 257, n: int = 1024, k: int = 2048, bias: bool = True) -> LayerConfig:
    return LayerConfig(n=n, k=k, scheme=scheme, num_experts=experts, has_bias=bias)


def _plans(layer: LayerConfig, gemm: str, block_ms=(32, 128), tma: bool | None = None):
    return ws_moe_plans(layer, ComputeConfig(gemm=gemm), block_ms, tma)


@pytest.mark.parametrize("tma", [True, False], ids=["tma", "cp_async"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_grouped_ws_kernels_compile_without_spills(scheme: str, tma: bool) -> None:
    plans = [p for gemm in GROUPED for p in _plans(_layer(scheme), gemm, tma=tma)]
    for kernel in build_many(plans):
        r = kernel.compiled.resources
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)
        assert kernel.plan.pipeline == "warp_specialized"
        assert kernel.name.endswith(("_moe_contiguous", "_moe_masked"))


@pytest.mark.parametrize("gemm", GROUPED)
def test_grouped_ws_source_counts_blocks_on_the_device_and_reads_row_windows(monkeypatch, gemm: str) -> None:
    plan = _plans(_layer("w4a16-int4-g128"), gemm, (128,), tma=False)[0]
    src = hg.kernel.generate(plan, "nvrtc")
    body = src[src.index("__launch_bounds__(cfg::kThreads, 1)"):]
    # the layout comes from the previous kernel: every CTA counts the experts' blocks after waiting for it, and reads
    # the count only after the __syncthreads
    assert (body.index("wait_for_previous_grid();") < body.index("count_expert_blocks(p);")
            < body.index("__syncthreads();") < body.index("const int units = unit_count();"))
    assert "__shared__ int expert_block_start[cfg::kNumExperts + 1];" in src
    assert "sorted_ids" not in src and "gather_rows" not in src and "if (tc.expert < 0) continue;" not in src
    # dense rows of the expert's window, zero-filled past its end; the weights rebased to the expert
    assert "load_a_stage(ring.stage(stage), static_cast<const u16*>(p.a), p.lda, tc.row_end, tc.m0," in src
    assert "const Params weights = for_expert(p, tc.expert, tc.row_end);" in src and "p.m = row_end;" in src
    assert "store_output(acc, for_expert(p, tc.expert, tc.row_end), tc.n0 + w * 64 + kTile0 * 16, tc.m0, " in src
    # rows past the window are not written
    assert "out_rows[i] = staged && m < p.m ? m : p.m;" in src
    consts = {name: value for name, value, _ in plan.constants}
    assert consts["kNumExperts"] == 257
    # the persistent grid covers the bound on the m blocks, at most one CTA per SM
    assert plan.launch.units(1000) == consts["kNTiles"] * m_blocks(1000, 128, 257, gemm)
    assert plan.grid(10**6)[0] == SM90.sm_count
    a8 = hg.kernel.generate(_plans(_layer("w8a8-fp8-block128"), gemm, (128,))[0], "nvrtc")
    # the window's rows' activation group scales and the expert's weight scales are staged with each stage
    assert "activation_scale_rows(a_scale_rows, tc.row_end, tc.m0);" in a8
    assert "load_weight_stage(ring.stage(stage), weights, tc.n0, kt, full);" in a8
    mx = hg.kernel.generate(_plans(_layer("w8a8-mxfp8"), gemm, (32,))[0], "nvrtc")  # e8m0: staged (4-byte cp.async)
    assert "static_cast<const unsigned char*>(p.a_scale), a_scale_rows, kt);" in mx and "a_scales[" not in mx
    from humming_gen.pipelines.warp_specialized import compose_a8

    monkeypatch.setattr(compose_a8, "STAGE_E8M0_SCALES", False)  # read at promotion (as where K is no whole stages)
    mx = hg.kernel.generate(_plans(_layer("w8a8-mxfp8"), gemm, (32,))[0], "nvrtc")
    assert "a_scales[static_cast<long long>(min(m, p.m - 1)) * cfg::kActivationGroups + a_group]" in mx


@pytest.mark.parametrize("gemm", GROUPED)
def test_grouped_ws_reads_its_windows_by_tma(gemm: str) -> None:
    """The default grouped kernels of 16-bit activations (grouped_moe_tuning): the producer's first thread copies each
    stage's window rows through the activation's tensor map (rows past the window read, their token columns not
    stored); the full barrier expects its one arrival."""
    layer = _layer("w4a16-int4-g128")
    compute = ComputeConfig(gemm=gemm)
    tuning = grouped_moe_tuning(choose_tunings(layer, SM90, pipeline="standard"), layer, compute, SM90, 300)
    assert tuning.a_load == "tma" and tuning.pipeline == "warp_specialized"
    plan = compose(layer, compute, tuning, SM90)
    assert plan.args[0].name == "a_map" and plan.args[0].ctype == "TensorMap"
    src = hg.kernel.generate(plan, "nvrtc")
    assert "if (threadIdx.x == 0) load_a_stage(ring.stage(stage), p.a_map, tc.m0, kt, full);" in src
    assert "mbarrier_init(ring.full_bars + 8 * s, 1);" in src and "cp_async_16(" not in src
    assert "const __grid_constant__ Params p" in src
    assert "store_output(acc, for_expert(p, tc.expert, tc.row_end), tc.n0 + w * 64 + kTile0 * 16, tc.m0, " in src


def test_grouped_ws_symbol_declarations_match_the_source() -> None:
    plans = (_plans(_layer("w4a16-int4-g128"), "grouped_masked", (32,))
             + _plans(_layer("w8a8-fp8-block128"), "grouped_contiguous", (128,)))
    for plan in plans:
        assert missing_symbols(plan.components) == []
        assert declaration_mismatches(plan) == {}


def test_grouped_ws_compose_refuses_what_grouped_kernels_do_not_do() -> None:
    layer = _layer("w4a16-int4-g128", experts=8)
    tuning = choose_moe_tunings(layer, SM90).for_m(1000)
    with pytest.raises(ComposeError, match="router weights are applied by the caller's combine step"):
        compose(layer, ComputeConfig(gemm="grouped_contiguous", topk_weight=True), tuning, SM90)
    with pytest.raises(ComposeError, match="epilogue_activation='silu_mul' needs gemm='indexed'"):
        compose(layer, ComputeConfig(gemm="grouped_masked", epilogue_activation="silu_mul"), tuning, SM90)
    with pytest.raises(ComposeError, match="MoE kernels take split_k=1"):
        compose(layer, ComputeConfig(gemm="grouped_masked"), attrs.evolve(tuning, split_k=2), SM90)
    with pytest.raises(ComposeError, match="lacks 'wgmma'"):
        compose(layer, ComputeConfig(gemm="grouped_masked"), tuning, get_target("sm_89"))
    a8 = _layer("w8a8-fp8-block128", experts=8)
    a8_tuning = choose_moe_tunings(a8, SM90).for_m(1000)
    with pytest.raises(ComposeError, match="MoE units walk each m block's n tiles"):
        compose(a8, ComputeConfig(gemm="grouped_contiguous"), attrs.evolve(a8_tuning, raster="m_band"), SM90)
    # the expert prefix counts against shared memory: this ring (and the epilogue's staging) leaves no room for 2048
    # experts' beside it
    wide = _layer("w4a16-int4-g128", experts=2048)
    full = attrs.evolve(tuning, stages=5, block_m=96)
    assert compose(wide, ComputeConfig(gemm="indexed"), full, SM90)
    with pytest.raises(ComposeError, match=r"\+ 8324 B static exceeds"):
        compose(wide, ComputeConfig(gemm="grouped_contiguous"), full, SM90)
    standard = hg.heuristics.choose_tunings(wide, SM90, pipeline="standard")
    for rows in (17, 4096):  # the heuristics' rings leave it room
        compute = ComputeConfig(gemm="grouped_contiguous")
        assert compose(wide, compute, grouped_moe_tuning(standard, wide, compute, SM90, rows), SM90)


def test_grouped_gemms_take_the_warp_specialized_pipeline_from_17_rows_per_expert() -> None:
    torch.manual_seed(3)
    w13, w2 = torch.randn(8, 2 * 128, 256) * 0.05, torch.randn(8, 256, 128) * 0.05
    moe = QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_90a", device="cpu", fused_activation=False)
    for gemm in GROUPED:
        tiles = [(moe.grouped_launcher("w2", gemm, rows).kernel.plan.pipeline,
                  moe.grouped_launcher("w2", gemm, rows).kernel.plan.tuning.block_m) for rows in (8, 16, 17, 64, 4096)]
        assert tiles == [("standard", 8), ("standard", 16), ("warp_specialized", 64), ("warp_specialized", 64),
                         ("warp_specialized", 128)]
        assert moe.grouped_launcher("w13", gemm, 4096, "standard").kernel.plan.pipeline == "standard"
        assert moe.grouped_launcher("w13", gemm, 4, "warp_specialized").kernel.plan.pipeline == "warp_specialized"
    standard = QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_90a", device="cpu", pipeline="standard")
    assert standard.grouped_launcher("w2", "grouped_masked", 4096).kernel.plan.pipeline == "standard"
    old = QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_89", device="cpu")
    assert old.grouped_launcher("w2", "grouped_contiguous", 4096).kernel.plan.pipeline == "standard"
    with pytest.raises(ValueError, match="cannot serve this grouped_masked GEMM"):
        old.grouped_launcher("w2", "grouped_masked", 4096, "warp_specialized")


# --- the schedule on the host ------------------------------------------------------------------------------------
HOST_PRELUDE = """#include <algorithm>
#include <barrier>
#include <cstdio>
#include <thread>
#include <vector>
using std::max;
using std::min;
#define __device__
#define __forceinline__ inline
#define __shared__
struct Dim { unsigned x; };
thread_local Dim threadIdx;
struct Params { const void* expert_layout; int m; };
// warp 0 runs as 32 threads: a shuffle publishes every lane's value, then reads its source lane's
std::barrier<> warp(32);
int lanes[32];
int __shfl_up_sync(unsigned, int v, int d) {
  const int lane = threadIdx.x % 32;
  lanes[lane] = v;
  warp.arrive_and_wait();
  const int r = lanes[lane >= d ? lane - d : lane];
  warp.arrive_and_wait();
  return r;
}
"""

MAIN = """
int main(int argc, char** argv) {
  const int m = atoi(argv[1]), entries = atoi(argv[2]);
  std::vector<int> layout(entries);
  for (int& v : layout) scanf("%d", &v);
  const Params p{layout.data(), m};
  std::vector<std::thread> threads;
  for (unsigned lane = 0; lane < 32; ++lane)
    threads.emplace_back([&p, lane] { threadIdx.x = lane; count_expert_blocks(p); });
  for (auto& t : threads) t.join();
  printf("%d\\n", unit_count());
  for (int u = 0; u < unit_count(); ++u) {
    const TileCoord tc = unit_coord(p, u);
    printf("%d %d %d %d %d %d\\n", tc.n0, tc.m0, tc.kt_begin, tc.kt_end, tc.expert, tc.row_end);
  }
  return 0;
}
"""


def _reference_units(gemm: str, layout: list[int], m: int, c: dict) -> list[tuple[int, ...]]:
    """Units in order: experts in order, each window's m blocks, each block's n tiles; windows clamped to a."""
    units, experts = [], c["kNumExperts"]
    for e in range(experts):
        if gemm == "grouped_masked":
            max_m = m // experts
            begin = e * max_m
            end = begin + min(max(layout[e], 0), max_m)
        else:
            begin = min(max(layout[e], 0), m)
            end = min(max(layout[e + 1], begin), m)
        for m0 in range(begin, end, c["kBlockM"]):
            units += [(n * c["kBlockN"], m0, 0, c["kKTiles"], e, end) for n in range(c["kNTiles"])]
    return units


def _layouts(gemm: str, experts: int, seed: int):
    """(m, layout): ragged windows with empty experts; masked counts above max_m and negative ones."""
    g = torch.Generator().manual_seed(seed)
    for per_expert in (1, 9, 100, 300):
        counts = torch.randint(0, 2 * per_expert + 1, (experts,), generator=g)
        counts[torch.randperm(experts, generator=g)[: experts // 3]] = 0  # a third of the experts get no row
        counts[0] = 0
        if gemm == "grouped_masked":
            max_m = per_expert
            counts[experts // 2] = max_m + 5  # past max_m: clamped
            if experts > 2:
                counts[-1] = -3  # negative: no rows
            yield experts * max_m, counts.tolist()
        else:
            offsets = [0] + torch.cumsum(counts, 0).tolist()
            yield offsets[-1], offsets


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("experts", [1, 8, 257])
@pytest.mark.parametrize("gemm", GROUPED)
def test_grouped_schedule_on_the_host_matches_the_units(gemm: str, experts: int, tmp_path) -> None:
    """The schedule rendered for real plans (16 and 128 tokens per tile) and compiled for the host: the counts of
    count_expert_blocks and unit_coord's binary search give every (m block of an expert's window, n tile) once, in
    order, with the expert and the window's end; the units never exceed the grid's bound."""
    for block_m in (16, 128):
        plan = _plans(_layer("w4a16-int4-g128", experts=experts, n=640, k=200), gemm, (block_m,))[0]
        schedule = next(x for x in plan.components if x.family == "schedule")
        body = environment().get_template(schedule.template).render(**schedule.context())
        cfg = "".join(f"constexpr int {name} = {value};\n" for name, value, _ in plan.constants)
        source = tmp_path / f"schedule{block_m}.cpp"
        source.write_text(HOST_PRELUDE + "namespace cfg {\n" + cfg + "}\n" + body + MAIN)
        exe = tmp_path / f"schedule{block_m}"
        subprocess.run([CXX, "-std=c++20", "-O1", "-pthread", "-o", str(exe), str(source)], check=True,
                       capture_output=True)
        c = {name: value for name, value, _ in plan.constants}
        for m, layout in _layouts(gemm, experts, seed=experts + block_m):
            out = subprocess.run([str(exe), str(m), str(len(layout))], input=" ".join(map(str, layout)), check=True,
                                 capture_output=True, text=True).stdout.splitlines()
            units = [tuple(map(int, line.split())) for line in out[1:]]
            expected = _reference_units(gemm, layout, m, c)
            assert int(out[0]) == len(units) and units == expected, (m, layout)
            assert len(units) <= plan.launch.units(max(m, 1))


def test_a_repeated_grouped_call_skips_the_heuristics(monkeypatch) -> None:
    """grouped_launcher remembers its launcher per (weight, gemm, rows per expert, pipeline): a repeated call (every
    grouped_moe_gemm call asks) does not run the tuning heuristics again."""
    import humming_gen.heuristics as heuristics

    torch.manual_seed(0)
    moe = QuantMoE.from_float(torch.randn(8, 256, 256) * 0.05, torch.randn(8, 256, 128) * 0.05, "w4a16-int4-g128",
                              target="sm_90a", device="cpu")
    first = moe.grouped_launcher("w2", "grouped_contiguous", 100)
    small = moe.grouped_launcher("w2", "grouped_contiguous", 4)
    assert first.kernel.plan.pipeline == "warp_specialized" and small.kernel.plan.pipeline == "standard"

    def no_heuristics(*args, **kwargs):
        raise AssertionError("the heuristics ran again for a remembered call")

    monkeypatch.setattr(heuristics, "grouped_moe_tuning", no_heuristics)
    assert moe.grouped_launcher("w2", "grouped_contiguous", 100) is first
    assert moe.grouped_launcher("w2", "grouped_contiguous", 4) is small
    with pytest.raises(AssertionError, match="ran again"):  # a new row count does run them
        moe.grouped_launcher("w2", "grouped_contiguous", 50)


def test_expected_m_picks_the_grouped_tile_and_the_grid_still_covers_max_m(monkeypatch) -> None:
    """grouped_moe_gemm tiles a DeepEP buffer of max_m = 512 rows per expert by max_m (the counts stay on the GPU),
    or by expected_m when given: 4 rows per expert take the standard pipeline's 8-row tile, whose grid still walks
    every m block up to max_m. A bad expected_m is refused before any launch."""
    from humming_gen.kernel import Launcher

    torch.manual_seed(0)
    e, max_m = 8, 512
    moe = QuantMoE.from_float(torch.randn(e, 2 * 128, 256) * 0.05, torch.randn(e, 256, 128) * 0.05,
                              "w4a16-int4-g128", target="sm_90a", device="cpu")
    launched = []  # the launchers grouped_moe_gemm launched: no GPU here
    monkeypatch.setattr(Launcher, "grouped", lambda self, a, out, layout, a_scale=None: launched.append(self))
    a, counts = torch.zeros(e, max_m, 128, dtype=torch.bfloat16), torch.zeros(e, dtype=torch.int32)
    hg.grouped_moe_gemm(a, moe, "w2", counts, layout="grouped_masked")
    hg.grouped_moe_gemm(a, moe, "w2", counts, layout="grouped_masked", expected_m=4)
    tunings = [launcher.kernel.plan.tuning for launcher in launched]
    assert [(t.pipeline, t.block_m) for t in tunings] == [("warp_specialized", 128), ("standard", 8)]
    assert launched[1].kernel.plan.launch.grid(e * max_m)[1] == e * max_m // 8  # every 8-row block of every expert
    hg.grouped_moe_gemm(a[:, :64].reshape(-1, 128).contiguous(), moe, "w2", torch.zeros(e + 1, dtype=torch.int32),
                        layout="grouped_contiguous", expected_m=100)
    assert launched[2].kernel.plan.tuning.block_m == 128  # R / E would be 64
    for bad in (0, -3, 2.5, True, "4"):
        with pytest.raises(ValueError, match=rf"expected_m={bad!r}; allowed: None or an int >= 1"):
            hg.grouped_moe_gemm(a, moe, "w2", counts, layout="grouped_masked", expected_m=bad)
    assert len(launched) == 3

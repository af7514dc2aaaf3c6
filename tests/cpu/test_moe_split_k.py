"""Split-K for the standard pipeline's indexed MoE GEMMs (issue 11) on the CPU: the kernels compile for sm_80, sm_89
and sm_90a without spills (16-bit and 8-bit activations, GEMM1 with the fused gated activation and GEMM2 with the
router weight, the atomic top-k store); the schedule, rendered for real plans and compiled for the host, gives every
(routed m block, n tile) its k slices exactly once, partitioning the k tiles, and a tile index inside the scratch
the launch sizes; the Launcher keeps that scratch big enough for every routing it launches; the heuristic's split
bucket; refusals with their reasons."""

from __future__ import annotations

import shutil
import subprocess
from fractions import Fraction

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import ComposeError, compose
from humming_gen.codegen.render import environment
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings, moe_tunings
from humming_gen.kernel import Kernel, Launcher, build_many
from humming_gen.pipelines.base import m_blocks
from humming_gen.pipelines.standard.heuristics import MOE_SPLIT_BUSY, moe_split_bucket
from humming_gen.reference.moe import moe_align_reference
from humming_gen.targets import get_target

CXX = shutil.which("g++") or shutil.which("c++")
GATED = ComputeConfig(gemm="indexed", epilogue_activation="silu_mul")
WEIGHTED = ComputeConfig(gemm="indexed", topk_weight=True)
ATOMIC = ComputeConfig(gemm="indexed", topk_weight=True, topk_reduce="atomic")
# DeepSeek-V3 per rank (TP8) shapes, fewer experts (E does not change the kernel beyond a constant)
GATE_UP = dict(n=512, k=7168)
DOWN = dict(n=7168, k=256)


def _plan(scheme: str, target: str, compute: ComputeConfig, split_k: int, experts: int = 16, **shape):
    layer = LayerConfig(scheme=scheme, num_experts=experts, **(shape or GATE_UP))
    tgt = get_target(target)
    tuning = choose_tunings(layer, tgt, pipeline="standard").buckets[0][1]
    return compose(layer, compute, attrs.evolve(tuning, split_k=split_k), tgt)


def _a8(target: str) -> str:
    return "w8a8-int8-channel" if target == "sm_80" else "w8a8-fp8-channel"


@pytest.mark.parametrize("target", ["sm_80", "sm_89", "sm_90a"])
def test_split_k_moe_kernels_compile_without_spills(target: str) -> None:
    plans = [_plan("w4a16-int4-g128", target, GATED, 4), _plan("w4a16-int4-g128", target, WEIGHTED, 3),
             _plan("w4a16-mxfp4", target, ATOMIC, 5, **GATE_UP),
             _plan("w4a16-int4-g128-zp", target, WEIGHTED, 2, n=1024, k=2048),
             _plan(_a8(target), target, GATED, 4), _plan(_a8(target), target, WEIGHTED, 2)]
    assert all(p.tuning.split_k > 1 and p.grid(8)[2] == p.tuning.split_k for p in plans)
    for kernel in build_many(plans):  # ptxas warnings fail the compile (runtime.compile.fatal_warnings)
        r = kernel.compiled.resources
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, (kernel.name, r)


@pytest.mark.parametrize("scheme", ["w4a16-int4-g128", "w8a8-fp8-channel"])
def test_split_k_slices_are_summed_before_the_fused_epilogue(scheme: str) -> None:
    """The last slice to arrive sums every slice's fp32 partials (in slice order), then runs the unsplit kernel's
    store: the gated activation of GEMM1 and the router weight of GEMM2 apply to the whole K sum."""
    for compute, what in ((GATED, "gated_activation(gate, up)"), (WEIGHTED, "weights[mt][j]")):
        plan = _plan(scheme, "sm_90a", compute, 4)
        src = hg.kernel.generate(plan, "nvrtc")
        assert "schedule.MoeIndexedSchedule(split_k=4)" in src and "epilogue.SplitKReduce(split_k=4" in src
        body = src[src.index("(const Params routed)"):]
        # an m block without an expert returns before its slices count an arrival
        assert body.index("if (tc.expert < 0) return;") < body.index("split_k_reduce(acc")
        assert body.index("split_k_reduce(acc") < body.index("store_output(acc")
        assert src.index("__device__ __forceinline__ bool split_k_reduce") < src.index(what)
        assert "cfg::kKTiles * split / cfg::kSplitK" in src and "const int split = blockIdx.z;" in src
        assert [a.name for a in plan.args if a.kind == "scratch"] == ["workspace", "counters"]
    unsplit = hg.kernel.generate(_plan(scheme, "sm_90a", GATED, 1), "nvrtc")
    assert "split_k_reduce" not in unsplit and "blockIdx.z" not in unsplit and "MoeIndexedSchedule()" in unsplit


HARNESS = """#include <cstdio>
#include <cstdlib>
#include <vector>
#define __device__
#define __forceinline__ inline
struct Dim { unsigned x, y, z; } blockIdx, gridDim;
struct Params { const void* expert_ids; const void* num_tokens_post_pad; };
namespace cfg {
%(cfg)s}
%(schedule)s
int main(int argc, char** argv) {
  gridDim = Dim{(unsigned)atoi(argv[1]), (unsigned)atoi(argv[2]), (unsigned)atoi(argv[3])};
  std::vector<int> expert_ids(gridDim.y);
  int routed;
  for (int& v : expert_ids) scanf("%%d", &v);
  scanf("%%d", &routed);
  const Params p{expert_ids.data(), &routed};
  for (unsigned z = 0; z < gridDim.z; ++z)
    for (unsigned y = 0; y < gridDim.y; ++y)
      for (unsigned x = 0; x < gridDim.x; ++x) {
        blockIdx = Dim{x, y, z};
        const TileCoord t = tile_coord(p);
        printf("%%d %%d %%d %%d %%d %%d %%d\\n", t.n0, t.m0, t.kt_begin, t.kt_end, t.expert, t.split, t.tile);
      }
  return 0;
}
"""


def _host_schedule(plan, tmp_path):
    schedule = next(c for c in plan.components if c.family == "schedule")
    body = environment().get_template(schedule.template).render(**schedule.context())
    cfg = "".join(f"constexpr int {name} = {value};\n" for name, value, _ in plan.constants)
    src = tmp_path / "moe_split_schedule.cpp"
    src.write_text(HARNESS % {"cfg": cfg, "schedule": body})
    exe = tmp_path / "moe_split_schedule"
    subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    return exe


def _schedule_plans():
    return [_plan("w4a16-int4-g128", "sm_90a", GATED, 4, experts=16),
            _plan("w4a16-int4-g128", "sm_80", WEIGHTED, 3, experts=5, n=1000, k=7168),  # 28 k tiles in 3 slices
            _plan("w8a8-fp8-channel", "sm_90a", WEIGHTED, 7, experts=3, n=384, k=4096)]


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("plan", _schedule_plans(), ids=lambda p: f"{p.kernel_name}_k{p.tuning.split_k}")
def test_split_k_units_cover_every_routed_block_tile_and_slice_once(plan, tmp_path) -> None:
    exe = _host_schedule(plan, tmp_path)
    c = {name: value for name, value, _ in plan.constants}
    split, bm, experts = plan.tuning.split_k, plan.tuning.block_m, plan.layer.num_experts
    for tokens, top_k, skew in ((1, 1, False), (1, 2, False), (3, 2, False), (5, 3, True), (40, 2, False),
                                (40, 3, True)):
        g = torch.Generator().manual_seed(tokens * 10 + top_k)
        ids = (torch.zeros if skew else torch.randint)(*(() if skew else (0, experts)), (tokens, top_k),
                                                      dtype=torch.int32, **({} if skew else {"generator": g}))
        r = moe_align_reference(ids, experts, bm)
        m = tokens * top_k  # assignments: the launch's m
        grid = plan.grid(m)
        assert grid == (plan.launch.n_tiles, m_blocks(m, bm, experts, "indexed"), split)
        assert r.expert_ids.numel() >= grid[1]  # moe_align's worst-case blocks cover the grid
        routed = int(r.num_tokens_post_pad)
        stdin = " ".join(map(str, r.expert_ids[:grid[1]].tolist() + [routed]))
        out = subprocess.run([str(exe), *map(str, grid)], input=stdin, check=True, capture_output=True,
                             text=True).stdout.split("\n")
        units = [tuple(int(v) for v in line.split()) for line in out if line]
        assert len(units) == grid[0] * grid[1] * grid[2]
        scratch = plan.scratch(m)
        tile_floats = split * bm * plan.tuning.block_n  # SplitKReduce: every slice's partial tile, per tile
        slices, tiles = {}, {}
        for n0, m0, kb, ke, expert, s, tile in units:
            block = m0 // bm
            if m0 >= routed:  # past the routed rows: no expert, every slice returns before the hand-off
                assert expert == -1
                continue
            assert expert == int(r.expert_ids[block]) >= 0
            slices.setdefault((block, n0), []).append((kb, ke, s))
            tiles.setdefault((block, n0), set()).add(tile)
            assert 0 <= tile < scratch["counters"].numel
            assert (tile + 1) * tile_floats <= scratch["workspace"].numel
        # every routed (m block, n tile) once, with its kSplitK slices partitioning [0, kKTiles)
        assert sorted(slices) == sorted((b, n * c["kBlockN"]) for b in range(routed // bm) for n in range(grid[0]))
        for ranges in slices.values():
            ranges.sort()
            assert [s for _, _, s in sorted(ranges, key=lambda x: x[2])] == list(range(split))
            assert ranges[0][0] == 0 and ranges[-1][1] == c["kKTiles"] and all(kb < ke for kb, ke, _ in ranges)
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        # the slices of one output tile share a tile index (their arrival counter), no two tiles do
        assert all(len(t) == 1 for t in tiles.values())
        assert len({next(iter(t)) for t in tiles.values()}) == len(tiles)


def test_moe_split_k_scratch_covers_the_worst_case_routing() -> None:
    """An indexed grid has an m block per assignment below a row per expert (each its own expert in the worst
    case), not ceil(m / block_m): the workspace and counters are sized for those blocks."""
    plan = _plan("w4a16-int4-g128", "sm_90a", GATED, 4, experts=256)
    launch, bm, bn = plan.launch, plan.tuning.block_m, plan.tuning.block_n
    for m in (1, 8, 13, 16, 255, 256, 2048):
        blocks = plan.grid(m)[1]
        assert blocks == m_blocks(m, bm, 256, "indexed") and (blocks == m if m <= 256 else True)
        s = plan.scratch(m)
        assert s["counters"].numel == launch.n_tiles * blocks and s["counters"].zeroed
        assert s["workspace"].numel == launch.n_tiles * blocks * 4 * bm * bn
    dense = attrs.evolve(launch, experts=1, moe_gemm="")
    assert dense.scratch(13)["counters"].numel == launch.n_tiles * 2  # dense: ceil(13 / 8) m tiles


def test_launcher_scratch_serves_every_routing_it_launches(monkeypatch) -> None:
    """Bound for a bucket's most assignments, the scratch serves every smaller routing; a bigger one (moe_gemm on
    a caller's routing) grows it before the launch. An MoE grid's blocks grow with every assignment, so the rows
    the buffers serve are exactly m (a dense grid's whole last m tile would overstate them)."""
    plan = _plan("w4a16-int4-g128", "sm_90a", WEIGHTED, 4, experts=256)
    launched = []
    monkeypatch.setattr(Launcher, "_launch", lambda self, a, out, m: launched.append(m))
    monkeypatch.setattr(Launcher, "_bound_value", lambda self, a: 0)  # no prepared weight: the kernel never runs
    launcher = Kernel(plan, "", None).bind(None, None, torch.device("cpu"), 13)

    def covered(m: int) -> bool:
        return all(launcher._scratch[name].numel() >= spec.numel for name, spec in plan.scratch(m).items())

    assert launcher._scratch_rows == 13 and covered(13)
    assert all(covered(m) for m in range(1, launcher._scratch_rows + 1))
    routing = moe_align_reference(torch.zeros(8, 2, dtype=torch.int32), 256, plan.tuning.block_m)
    out = torch.empty(16, plan.layer.n)
    launcher.moe(torch.empty(8, plan.layer.k), out, routing, 2, torch.ones(16))
    assert launched == [16] and launcher._scratch_rows == 16 and covered(16)


def _deepseek(target: str, fmt: str = "w4a16-int4-g128", experts: int = 256):
    layers = [LayerConfig(n=512, k=7168, scheme=fmt, num_experts=experts),
              LayerConfig(n=7168, k=256, scheme=fmt, num_experts=experts)]
    computes = [GATED, WEIGHTED]
    return layers, computes, [choose_tunings(layer, target, pipeline="standard") for layer in layers]


def test_heuristic_splits_the_buckets_that_leave_most_sms_idle() -> None:
    tgt = get_target("sm_90a")
    layers, computes, standard = _deepseek("sm_90a")
    plans = moe_tunings(standard, layers, computes, tgt)
    (bound, gate_up), (_, down) = plans[0].buckets[0], plans[1].buckets[0]
    # gate-up: 4 n tiles, so 16 assignments (M = 2 at top-8) keep half the 132 SMs busy unsplit
    assert bound == Fraction(int(MOE_SPLIT_BUSY * tgt.sm_count) // 4, 256) == Fraction(16, 256)
    assert gate_up.split_k == 4 and gate_up.pipeline == "standard" and down.split_k == 1  # down: one k tile
    assert gate_up.block_m == down.block_m == plans[0].buckets[1][1].block_m  # one routing tile for all buckets
    # M = 1: 8 blocks x 4 n tiles x 4 slices = 128 CTAs; the other buckets never split
    assert 8 * 4 * gate_up.split_k <= tgt.sm_count * gate_up.ctas_per_sm
    assert all(t.split_k == 1 for plan in plans for _, t in plan.buckets[1:])
    # no bucket where one assignment of every GEMM keeps most SMs busy (over 66 n tiles), or where no GEMM has
    # two k tiles per slice
    for shapes in (((10240, 2880), (9216, 5120)), ((512, 256), (256, 256))):
        pair = [LayerConfig(n=n, k=k, scheme="w4a16-int4-g128", num_experts=128) for n, k in shapes]
        tunings = [choose_tunings(lay, tgt, pipeline="standard").buckets[0][1] for lay in pair]
        assert moe_split_bucket(pair, tunings, tgt) is None
    # split_k=1: none; forced: every standard bucket, at most the k tiles; the warp-specialized ones never
    assert [m for m, _ in moe_tunings(standard, layers, computes, tgt, split_k=1)[0].buckets][0] == 8
    forced = moe_tunings(standard, layers, computes, tgt, split_k=3)
    assert [t.split_k for _, t in forced[0].buckets if t.pipeline == "standard"] == [3, 3]
    assert [t.split_k for _, t in forced[1].buckets if t.pipeline == "standard"] == [1, 1]  # K = 256: one k tile
    assert all(t.split_k == 1 for plan in forced for _, t in plan.buckets if t.pipeline != "standard")
    with pytest.raises(ValueError, match=r"split_k=0; allowed: None \(the heuristic's split-K bucket\), 1"):
        moe_tunings(standard, layers, computes, tgt, split_k=0)


@pytest.mark.parametrize("scheme", ["w8a8-fp8-block128", "w8a8-fp8-channel", "w4a8-mxfp4-fp8", "w4a16-int4-g128"])
def test_split_bucket_runs_two_ctas_and_no_ring_deeper_than_its_k_tiles(scheme: str) -> None:
    """The split bucket's GEMMs run two CTAs of 3 stages per SM (8-bit codes' dense single CTA included: DeepSeek
    fp8 block128 gate-up at M = 1 measured 22.0 us with it, 17.2 with two), split for 2 x 132 slots; no standard
    bucket's ring is deeper than one more than the k tiles a CTA walks (the down GEMM's one k tile: 2 stages, 14.0
    -> 10.4 us). pipeline="standard": W8A8 layers take the warp-specialized pipeline in every bucket by default."""
    tgt = get_target("sm_90a")
    layers = [LayerConfig(scheme=scheme, num_experts=256, **shape) for shape in (GATE_UP, DOWN)]
    computes = [GATED, WEIGHTED]
    standard = [choose_tunings(layer, tgt, pipeline="standard") for layer in layers]
    plans = moe_tunings(standard, layers, computes, tgt, pipeline="standard")

    def k_tiles(layer: LayerConfig, t) -> int:  # of one k slice
        return -(-(-(-layer.k // t.block_k)) // t.split_k)

    gate_up, down = plans[0].buckets[0][1], plans[1].buckets[0][1]
    assert (gate_up.split_k, gate_up.ctas_per_sm, gate_up.stages) == (4, 2, 3), gate_up
    assert (down.split_k, down.ctas_per_sm, down.stages) == (1, 2, 2), down
    for plan, layer in zip(plans, layers):
        for _, t in plan.buckets:
            if t.pipeline == "standard":
                assert t.stages <= k_tiles(layer, t) + 1, t
    for plan, layer in zip(standard, layers):  # the dense plans too
        assert all(t.stages <= k_tiles(layer, attrs.evolve(t, split_k=1)) + 1 for _, t in plan.buckets), plan


def test_compose_refuses_split_k_where_moe_kernels_cannot_split() -> None:
    tgt = get_target("sm_90a")
    layer = LayerConfig(n=1024, k=2048, scheme="w4a16-int4-g128", num_experts=8)
    tuning = attrs.evolve(choose_tunings(layer, tgt, pipeline="standard").buckets[0][1], split_k=2)
    for gemm in ("grouped_masked", "grouped_contiguous"):
        with pytest.raises(ComposeError, match=f"tuning.split_k=2: {gemm} MoE kernels take split_k=1 \\(split-K "
                                               f"MoE GEMMs are gemm='indexed'\\)"):
            compose(layer, ComputeConfig(gemm=gemm), tuning, tgt)
    ws = attrs.evolve(moe_tunings([choose_tunings(layer, tgt, pipeline="standard")], [layer], [WEIGHTED], tgt,
                                  pipeline="warp_specialized")[0].buckets[0][1], split_k=2)
    with pytest.raises(ComposeError, match="the warp_specialized pipeline's MoE kernels take split_k=1"):
        compose(layer, WEIGHTED, ws, tgt)
    with pytest.raises(ComposeError, match="tuning.split_k=9 exceeds the 8 k tiles"):
        compose(layer, WEIGHTED, attrs.evolve(tuning, split_k=9), tgt)


def test_quant_moe_takes_the_split_bucket_below_its_bound() -> None:
    torch.manual_seed(0)
    e, h, i = 16, 4096, 128  # gate-up: 2 n tiles, 16 k tiles: a split bucket of 16 assignments (E = 16: R <= 1)
    w13, w2 = torch.randn(e, 2 * i, h) * 0.05, torch.randn(e, h, i) * 0.05
    moe = hg.QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_90a", device="cpu")
    assert moe.buckets[0] == Fraction(16, 16) and moe.split_ks[0][0] > 1 and moe.split_ks[0][1] == 1
    assert [moe.bucket_for(m, 8) for m in (1, 2, 3)] == [0, 0, 1]  # 8, 16 assignments in it; 24 past it
    assert moe.block_m(1, 8) == moe.block_m(3, 8)  # the split bucket keeps the next bucket's token tile
    gemm1 = moe._launchers[0][0]
    assert gemm1._scratch_rows == 16  # bound for the bucket's most assignments: CUDA graphs never see it move
    assert all(gemm1._scratch[n].numel() >= s.numel for n, s in gemm1.kernel.plan.scratch(16).items())
    assert not moe._launchers[1][0]._scratch  # unsplit buckets: no scratch
    assert "split_k=" in repr(moe)
    never = hg.QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_90a", device="cpu", split_k=1)
    assert never.buckets[0] == 8 and all(k == (1, 1) for k in never.split_ks)
    with pytest.raises(ValueError, match="split_k=True; allowed"):
        hg.QuantMoE.from_float(w13, w2, "w4a16-int4-g128", target="sm_90a", device="cpu", split_k=True)


def test_launcher_for_a_callers_tile_keeps_the_split_bucket_to_its_rows(monkeypatch) -> None:
    """moe_gemm on a caller's routing padded to a tile its rows' bucket does not take falls back to a bucket of
    that tile: the unsplit one (as before the split-K bucket existed), not the split-K bucket bound for at most
    A_s assignments, whose scratch (n tiles x m blocks x slices x tile, m blocks growing with the rows) would grow
    past its bound at that call (under a CUDA graph capture too) and whose slices would run for a batch it was not
    chosen for."""
    import humming_gen.kernel as kernel_mod
    from humming_gen.layer.moe import QuantMoE

    monkeypatch.setattr(kernel_mod, "build_many", lambda plans, compiler=None: [
        kernel_mod.build(p, compile=False) for p in plans])
    torch.manual_seed(0)
    e, h, i = 4, 1024, 128
    moe = QuantMoE.from_float(torch.randn(e, 2 * i, h) * 0.05, torch.randn(e, h, i) * 0.05, "w4a16-int4-g128",
                              target="sm_90a", device="cpu", fused_activation=False)
    tiles = moe.block_ms
    assert moe.split_ks[0][0] > 1 and tiles[0] == tiles[1], (moe.buckets, moe.split_ks)  # split bucket, then unsplit
    most = moe._most_assignments[0]
    for rows in (most, most + 1, 8 * e, 64 * e, 4096 * e):
        launcher = moe.launcher_for("w13", rows, tiles[0])
        want = 0 if rows <= most else 1
        assert launcher is moe._launchers[want][0], (rows, moe.buckets, moe.split_ks)


def test_split_k_with_the_warp_specialized_pipeline_is_refused() -> None:
    """The warp-specialized MoE kernels never split K: a forced split there is an error, not silently dropped."""
    from humming_gen.heuristics.choose import moe_tunings

    with pytest.raises(ValueError, match="split_k=3 with pipeline='warp_specialized'"):
        moe_tunings([], [], [], "sm_90a", pipeline="warp_specialized", split_k=3)

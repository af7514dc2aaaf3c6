"""The warp-specialized pipeline's persistent schedule (templates/schedule/persistent.cuh.j2), rendered for real
plans and compiled for the host: for every M, the units cover each (output tile, k slice) exactly once, the k
slices of a tile partition its k tiles, and tiles go n-fastest; the launch's grid never exceeds the units."""

from __future__ import annotations

import shutil
import subprocess

import attrs
import pytest

from humming_gen.codegen.compose import compose
from humming_gen.codegen.render import environment
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings as heuristics_tunings
from humming_gen.pipelines.warp_specialized.heuristics import activation_multicast, weight_multicast
from humming_gen.targets import get_target

CXX = shutil.which("g++") or shutil.which("c++")
SM90 = get_target("sm_90a")
PRELUDE = "#include <cstdio>\n#define __device__\n#define __forceinline__ inline\n"


def choose_tunings(layer, target, **kw):
    """The heuristics' plan with register weights: this module covers the BLayout8 kernels (the shared-weight ones,
    which the heuristics pick for most dense 8-bit weights on sm_90a, are test_shared_weights.py's)."""
    return heuristics_tunings(layer, target, register_weights=True, **kw)


def _schedule_units(plan, tmp_path, fields: str, call: str = "unit_coord(i)"):
    """The plan's schedule template compiled for the host with its constants: a function of m giving unit_count(m)
    and each unit's `fields` (C expressions of `u`, a TileCoord from `call`)."""
    schedule = next(c for c in plan.components if c.family == "schedule")
    body = environment().get_template(schedule.template).render(**schedule.context())
    cfg = "".join(f"constexpr int {name} = {value};\n" for name, value, _ in plan.constants)
    printf = "printf(\"" + " ".join(["%d"] * len(fields.split(","))) + "\\n\", " + fields + ");"
    main = ("int main(int argc, char** argv) {\n  const int m = atoi(argv[1]);\n"
            "  printf(\"%d\\n\", unit_count(m));\n"
            f"  for (int i = 0; i < unit_count(m); ++i) {{\n    const TileCoord u = {call};\n    {printf}\n  }}\n"
            "  return 0;\n}\n")
    src = tmp_path / "schedule.cpp"
    src.write_text(PRELUDE + "#include <cstdlib>\n#include <algorithm>\nusing std::min;\nnamespace cfg {\n" + cfg
                   + "}\n" + body + main)
    exe = tmp_path / "schedule"
    subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)

    def units(m: int) -> tuple[int, list[tuple[int, ...]]]:
        lines = subprocess.run([str(exe), str(m)], check=True, capture_output=True, text=True).stdout.split("\n")
        count = int(lines[0])
        return count, [tuple(int(v) for v in line.split()) for line in lines[1:count + 1]]

    return units


def _plans():
    plans = []
    for n, k in ((8192, 8192), (576, 7168), (1001, 1000)):
        layer = LayerConfig(n=n, k=k, scheme="w4a16-int4-g128")
        plans += [compose(layer, ComputeConfig(), t, SM90) for t in choose_tunings(layer, SM90).tunings()
                  if t.pipeline == "warp_specialized"]
        # tokens on wgmma's M: 256-row tiles over weights padded to 128 rows (kNTiles rounds up)
        layer = LayerConfig(n=n, k=-(-k // 128) * 128, scheme="w8a8-fp8-block128")  # (whole 1 x 128 groups)
        plans += [compose(layer, ComputeConfig(), attrs.evolve(t, raster="n_major"), SM90)
                  for t in heuristics_tunings(layer, SM90, stored=False).tunings() if t.tokens_on == "m"]
    return plans


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("plan", _plans(), ids=lambda p: p.kernel_name)
def test_units_cover_every_tile_and_k_slice_once(plan, tmp_path) -> None:
    split = plan.tuning.split_k
    fields = "u.n0, u.m0, u.kt_begin, u.kt_end" + (", u.split, u.tile" if split > 1 else ", 0, 0")
    units_of = _schedule_units(plan, tmp_path, fields)
    c = {name: value for name, value, _ in plan.constants}
    block_m, block_n, k_tiles = c["kBlockM"], c["kBlockN"], c["kKTiles"]
    for m in (1, 63, 64, 65, 700, 4096):
        count, units = units_of(m)
        m_tiles = -(-m // block_m)
        assert count == c["kNTiles"] * m_tiles * split == plan.launch.units(m)
        assert plan.grid(m)[0] <= count
        covered = {}
        for n0, m0, kb, ke, s, tile in units:
            assert n0 % block_n == 0 and n0 < c["kNPad"] and m0 % block_m == 0 and m0 < m and kb < ke
            covered.setdefault((n0, m0), []).append((kb, ke))
            if split > 1:
                assert tile == (m0 // block_m) * c["kNTiles"] + n0 // block_n  # the split-K workspace's tile index
        assert len(covered) == c["kNTiles"] * m_tiles
        for ranges in covered.values():  # the slices of a tile partition [0, kKTiles)
            ranges.sort()
            assert ranges[0][0] == 0 and ranges[-1][1] == k_tiles and len(ranges) == split
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        first = units[: min(count, c["kNTiles"] * split)]  # n-fastest: the first units walk along N
        assert len({u[1] for u in first}) == 1


def _multicast_plans(multicast, shapes, variants: list[dict]):
    """Plans of the 4096 bucket's tuning of each (n, k, scheme), changed by each variant, 5 stages, then clustered."""
    plans = []
    for n, k, scheme in shapes:
        layer = LayerConfig(n=n, k=k, scheme=scheme)
        base = choose_tunings(layer, SM90, stored=False).for_m(4096)
        for changes in variants:
            t = multicast(attrs.evolve(base, stages=5, **changes))
            plans.append(compose(layer, ComputeConfig(), t, SM90))
    return plans


def _cluster_plans():
    return _multicast_plans(weight_multicast, ((8192, 8192, "w8a8-fp8-channel"), (576, 7168, "w8a8-int8-channel"),
                                               (4000, 3072, "w8a8-fp8-block128")),
                            [dict(block_m=128), dict(block_m=192)])


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("plan", _cluster_plans(), ids=lambda p: p.kernel_name)
def test_cluster_pairs_share_an_n_tile_and_cover_every_tile_once(plan, tmp_path) -> None:
    """Two-CTA clusters (cluster_m=2): units 2u and 2u + 1 are m tiles 2i and 2i + 1 of one n tile, which the two
    CTAs of a cluster (an even grid: CTA b walks b, b + grid, ...) take at the same step; every tile below m is
    covered once, and only the last pair's second tile may lie past m."""
    schedule = next(c for c in plan.components if c.family == "schedule")
    assert schedule.cluster_m == 2 and plan.launch.cluster == (2, 1, 1)
    units_of = _schedule_units(plan, tmp_path, "u.n0, u.m0, u.kt_begin, u.kt_end")
    c = {name: value for name, value, _ in plan.constants}
    block_m, block_n = c["kBlockM"], c["kBlockN"]
    for m in (1, 127, 128, 129, 300, 700, 4096):
        count, units = units_of(m)
        m_tiles = -(-m // block_m)
        assert count == c["kNTiles"] * 2 * -(-m_tiles // 2) == plan.launch.units(m)
        grid = plan.grid(m)[0]
        assert grid % 2 == 0 and grid <= count
        for u in range(0, count, 2):  # a pair: one n tile, m tiles 2i and 2i + 1
            (n0, m0, kb, ke), (n1, m1, _, _) = units[u], units[u + 1]
            assert n0 == n1 and m0 % (2 * block_m) == 0 and m1 == m0 + block_m and (kb, ke) == (0, c["kKTiles"])
            assert m0 < m  # only the second tile of a pair may lie past m
        inside = [(n0, m0) for n0, m0, _, _ in units if m0 < m]
        assert len(inside) == len(set(inside)) == c["kNTiles"] * m_tiles
        assert all(n0 % block_n == 0 and n0 < c["kNPad"] for n0, _ in inside)
        for b in range(0, grid, 2):  # the two CTAs of a cluster walk as many units, pair by pair
            assert [units[u][0] for u in range(b, count, grid)] == [units[u][0] for u in range(b + 1, count, grid)]


def _activation_cluster_plans():
    return _multicast_plans(activation_multicast, ((8192, 8192, "w8a8-fp8-channel"),
                                                   (4096, 3072, "w8a8-fp8-block128"), (768, 7168, "w8a8-int8-channel")),
                            [dict(block_m=128, raster="m_band"), dict(block_m=192, raster="m_band"),
                             dict(block_m=128, raster="n_major")])


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("plan", _activation_cluster_plans(), ids=lambda p: p.kernel_name + "_" + p.tuning.raster)
def test_activation_cluster_pairs_share_an_m_tile_and_cover_every_tile_once(plan, tmp_path) -> None:
    """Two-CTA clusters along N (cluster_n=2): units 2u and 2u + 1 are n tiles 2j and 2j + 1 of one m tile, taken by
    the two CTAs of a cluster at the same step (an even grid); every tile is covered once, none past m or N; the
    banded walk goes m-fastest within a band of pairs, the plain one n-fastest."""
    schedule = next(c for c in plan.components if c.family == "schedule")
    assert schedule.cluster_n == 2 and plan.launch.cluster == (2, 1, 1)
    banded = plan.tuning.raster == "m_band"
    units_of = _schedule_units(plan, tmp_path, "u.n0, u.m0, u.kt_begin, u.kt_end",
                               "unit_coord(i, m)" if banded else "unit_coord(i)")
    c = {name: value for name, value, _ in plan.constants}
    block_m, block_n = c["kBlockM"], c["kBlockN"]
    assert c["kNTiles"] % 2 == 0
    for m in (1, 127, 128, 129, 300, 700, 1100, 4096):
        count, units = units_of(m)
        m_tiles = -(-m // block_m)
        assert count == c["kNTiles"] * m_tiles == plan.launch.units(m)
        grid = plan.grid(m)[0]
        assert grid % 2 == 0 and grid <= count
        for u in range(0, count, 2):  # a pair: one m tile, n tiles 2j and 2j + 1
            (n0, m0, kb, ke), (n1, m1, _, _) = units[u], units[u + 1]
            assert m0 == m1 and n0 % (2 * block_n) == 0 and n1 == n0 + block_n and (kb, ke) == (0, c["kKTiles"])
        tiles = [(n0, m0) for n0, m0, _, _ in units]
        assert len(tiles) == len(set(tiles)) == c["kNTiles"] * m_tiles
        assert all(n0 % block_n == 0 and n0 < c["kNPad"] and m0 % block_m == 0 and m0 < m for n0, m0 in tiles)
        first_pairs = units[: min(count, 2 * min(8, m_tiles))]
        if banded:  # m-fastest within a band: the first pairs share their n tiles, m walks
            assert len({u[0] for u in first_pairs[::2]}) == 1
        else:  # n-fastest
            assert len({u[1] for u in units[: min(count, c["kNTiles"])]}) == 1

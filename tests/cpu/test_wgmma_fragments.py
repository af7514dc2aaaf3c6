"""A wgmma with a register A operand (the 8-bit kernels' weight fragments) reads those registers until the
wgmma.wait_group that retires it, so no instruction may write them before that wait. ptxas does not always keep them:
a trial loop (2026-12-04, not kept) that widened the next stage's fragments while a stage's wgmmas ran swapped two
fragment sets by copies, NVVM coalesced them into one, and ptxas wrote the next stage's codes into the registers of
the wgmmas in flight (wrong results and unrepeatable outputs on the H200; where it saw the writes in straight-line
code it serialized the wgmmas instead, warning C7513, which the compile treats as an error). Checked here in the
SASS of the register-weight kernels: the single-set loop, the overlapped halves with fragments double-buffered by
group parity, folded and unfolded MXFP4, MXFP8, int8, dense and MoE."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.runtime.cache import _cuda_tool
from humming_gen.targets import get_target
from moe_host import ws_moe_plans
from test_stage_release import PREDICATE, _instructions as _listing, _sass

SM90 = get_target("sm_90a")
GMMA = re.compile(r"^[QHI]GMMA\.")
DEPBAR = re.compile(r"^WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)")
WIDTH = {"64": 2, "128": 4}  # registers written by .64 / .128 forms (LDS.64, IMAD.WIDE is 2 too)
NO_REGISTER_DESTINATION = ("ST", "SYNCS", "BRA", "BAR", "WARPGROUP", "RED", "ATOM", "BSSY", "BSYNC", "EXIT", "RET")


def _instructions(sass: str) -> list[str]:
    """The listing's instructions without their predicates (test_stage_release's reader)."""
    return [re.sub("^" + PREDICATE, "", ins) for ins in _listing(sass)]


def writes_to_inflight_fragments(sass: str) -> list[str]:
    """Instructions, in listing order, that write a register an issued register-A wgmma (QGMMA / IGMMA / HGMMA) reads
    before a WARPGROUP.DEPBAR retires it: a group closes at its gsb0 wgmma, and DEPBAR.LE gsb0, n leaves the n newest
    groups in flight. (Straight-line over the listing: a wgmma's group in flight across a back edge is not followed.)"""
    groups: list[set[int]] = []  # closed groups in flight, oldest first
    current: set[int] = set()
    found = []
    for ins in _instructions(sass):
        op, _, rest = ins.partition(" ")
        if GMMA.match(op):
            a = re.match(r"R(\d+)$", rest.split(",")[1].strip())
            if a:
                current |= set(range(int(a.group(1)), int(a.group(1)) + 4))
            if "gsb0" in rest:
                groups.append(current)
                current = set()
            continue
        wait = DEPBAR.match(ins)
        if wait:
            keep = int(wait.group(1), 16)
            groups = groups[len(groups) - keep:] if keep else []
            continue
        inflight = set().union(current, *groups)
        destination = re.match(r"R(\d+)\b", rest.split(",")[0].strip())
        if not inflight or not destination or op.startswith(NO_REGISTER_DESTINATION):
            continue
        wide = re.search(r"\.(64|128)\b", op)
        width = WIDTH[wide.group(1)] if wide else 2 if ".WIDE" in op else 1
        first = int(destination.group(1))
        if set(range(first, first + width)) & inflight:
            found.append(ins)
    return found


# the trial loop, cut from its SASS (sm_90a, W4A8 MXFP4 folded, 64 tokens): the next stage's codes land in
# R56, an A register of the first wgmma, while the four are in flight
BROKEN = """
        /*0f60*/                   QGMMA.64x64x32.F32.E4M3.E4M3 R24, R56, gdesc[UR12], RZ, !UPT ;
        /*1020*/                   QGMMA.64x64x32.F32.E4M3.E4M3 R24, R64, gdesc[UR12], R24 ;
        /*10b0*/                   QGMMA.64x64x32.F32.E4M3.E4M3 R24, R60, gdesc[UR12], R24 ;
        /*1100*/                   QGMMA.64x64x32.F32.E4M3.E4M3 R24, R68, gdesc[UR12], R24, gsb0 ;
        /*1150*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R16+URZ+0x22000], R17 ;
        /*11d0*/                   LDS R56, [R60+0x4000] ;
        /*1210*/                   LDS.64 R20, [R61] ;
        /*1870*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*1880*/                   LDS.64 R62, [R61] ;
"""


def test_the_check_sees_a_write_to_an_inflight_fragment() -> None:
    assert writes_to_inflight_fragments(BROKEN) == ["LDS R56, [R60+0x4000]"]
    # a wide write into the last registers of a fragment, and a write while one older group is still in flight
    assert writes_to_inflight_fragments(BROKEN.replace("LDS R56,", "LDS.64 R70,")) == ["LDS.64 R70, [R60+0x4000]"]
    two_groups = BROKEN.replace("DEPBAR.LE gsb0, 0x0", "DEPBAR.LE gsb0, 0x1").replace(
        "LDS R56,", "MOV R2,").replace("QGMMA.64x64x32.F32.E4M3.E4M3 R24, R68, gdesc[UR12], R24, gsb0",
                                       "QGMMA.64x64x32.F32.E4M3.E4M3 R24, R68, gdesc[UR12], R24, gsb0 ;\n"
                                       "        /*1101*/ QGMMA.64x64x32.F32.E4M3.E4M3 R24, R80, gdesc[UR12], R24, gsb0")
    assert writes_to_inflight_fragments(two_groups) == []  # LDS.64 R62 after DEPBAR 1: the R56 group has retired
    assert writes_to_inflight_fragments(two_groups.replace("LDS.64 R62,", "LDS.64 R82,")) == ["LDS.64 R82, [R61]"]


def _dense(scheme: str, m: int, fold: bool = False):
    layer = LayerConfig(n=4096, k=4096, scheme=scheme, fold_scales=fold)
    return compose(layer, ComputeConfig(), choose_tunings(layer, SM90, stored=False).for_m(m), SM90)


def _moe(scheme: str, gemm: str, fold: bool = False):
    layer = LayerConfig(n=1024, k=2048, scheme=scheme, num_experts=8, fold_scales=fold)
    return ws_moe_plans(layer, ComputeConfig(gemm=gemm), (64,))[0]


# (id, plan maker): register-weight kernels of each loop and weight kind
PLANS = [(f"w4a8-fold-m{m}", lambda m=m: _dense("w4a8-mxfp4-fp8", m, fold=True)) for m in (1, 64, 1024, 4096)]
PLANS += [("w4a8-mxfp4-m64", lambda: _dense("w4a8-mxfp4-fp8", 64)),
          ("w4a8-mxfp4-m4096", lambda: _dense("w4a8-mxfp4-fp8", 4096)),  # overlapped halves, fragments by parity
          ("w8a8-mxfp8-m64", lambda: _dense("w8a8-mxfp8", 64)),
          ("w4a8-int4-channel-int8-m64", lambda: _dense("w4a8-int4-channel-int8", 64)),
          ("w4a8-fold-moe-indexed", lambda: _moe("w4a8-mxfp4-fp8", "indexed", fold=True)),
          ("w4a8-fold-moe-grouped", lambda: _moe("w4a8-mxfp4-fp8", "grouped_contiguous", fold=True)),
          ("int8-channel-moe-indexed", lambda: _moe("w8a8-int8-channel", "indexed")),
          # the 16-bit skeleton: dequantized k16 fragments double-buffered by step, one wgmma group left in flight
          ("w4a16-int4-g128-m1024", lambda: _dense("w4a16-int4-g128", 1024))]


@pytest.mark.skipif(_cuda_tool("cuobjdump") is None, reason="needs cuobjdump (PyPI wheel nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("make", [f for _, f in PLANS], ids=[i for i, _ in PLANS])
def test_no_write_to_the_fragments_of_a_wgmma_in_flight(make, tmp_path: Path) -> None:
    plan = make()
    sass = _sass(plan, tmp_path)
    register_a = [i for i in _instructions(sass) if GMMA.match(i) and re.match(r"R\d+$", i.split(",")[1].strip())]
    assert register_a, f"{plan.kernel_name}: no wgmma with register A operands"
    assert writes_to_inflight_fragments(sass) == [], plan.kernel_name

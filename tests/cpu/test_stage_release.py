"""A consumer of the 8-bit warp-specialized kernels releases a ring stage only once its shared loads of that stage
are performed (ptx/loads_fence). Without the fence ptxas issued the empty-barrier arrival right after the loads of a
promotion's staged scales, before their values came back, and the producer's cp.async refill (an L1 hit) could land
first: tokens-on-M fp8 block128 at 4000 x 3072, M = 4096, had 40-70 of its 1024 tiles wrong, differently in every run
(H200, 2026-12-04). Checked in the source (kernels that read staged scales release through the fence, the others
need none) and in the SASS: every shared load between a stage's wait (or the previous arrival) and an arrival has its
value read, or a MEMBAR, before the arrival."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build
from humming_gen.pipelines.warp_specialized.heuristics import (activation_multicast, tokens_m_tuning,
                                                               weight_multicast, widened_weight_tunings)
from humming_gen.runtime.cache import _cuda_tool, _sass as disassemble
from humming_gen.targets import get_target
from moe_host import ws_moe_plans

SM90 = get_target("sm_90a")


def _default(scheme: str, m: int, n: int = 4096, k: int = 4096):
    layer = LayerConfig(n=n, k=k, scheme=scheme)
    return compose(layer, ComputeConfig(), choose_tunings(layer, SM90, stored=False).for_m(m), SM90)


def _fenced():
    """(id, plan): kernels whose consumers read staged scales with shared loads."""
    block = LayerConfig(n=4000, k=3072, scheme="w8a8-fp8-block128")
    for block_n in (128, 256):  # tokens on M, one set of partial sums (the tiles that raced)
        t = tokens_m_tuning(block, SM90, choose_tunings(block, SM90, stored=False).for_m(4096), 4096, block_n)
        yield f"block128-tokens-m-n{block_n}", compose(block, ComputeConfig(), t, SM90)
    for scheme in ("w8a8-fp8-block128", "w8a8-mxfp8", "w4a8-mxfp4-fp8"):
        for m in (1, 16, 1024):  # split-K tiles of 8 / 16 tokens, and 128-token tiles
            yield f"{scheme}-m{m}", _default(scheme, m)
    yield "w4a8-mxfp4-fp8-m4096", _default("w4a8-mxfp4-fp8", 4096)  # 192 register-weight tokens: not deferred
    w4a8 = LayerConfig(n=4096, k=4096, scheme="w4a8-mxfp4-fp8")  # nibbles widened by the producer warpgroup
    yield "w4a8-mxfp4-fp8-widened", compose(w4a8, ComputeConfig(), widened_weight_tunings(w4a8, SM90).for_m(1024),
                                            SM90)
    for scheme in ("w8a8-mxfp8", "w4a8-mxfp4-fp8"):  # two-CTA clusters: one lane of a warp arrives on both CTAs
        layer = LayerConfig(n=4096, k=4096, scheme=scheme)
        t = choose_tunings(layer, SM90, stored=False).for_m(1024)
        for name, cluster in (("c2", weight_multicast(t)), ("cn2", activation_multicast(t))):
            yield f"{scheme}-{name}", compose(layer, ComputeConfig(), cluster, SM90)
    for gemm in ("indexed", "grouped_contiguous"):  # MoE: gathered rows, and the experts' row windows
        moe = LayerConfig(n=1024, k=2048, scheme="w8a8-fp8-block128", num_experts=8)
        yield f"block128-moe-{gemm}", ws_moe_plans(moe, ComputeConfig(gemm=gemm), (128,))[0]


FENCED = list(_fenced())
# no fence: 8-bit kernels with channel or tensor scales (their loads of a stage, fragments and codes, feed the
# wgmmas, which retire before the release). (The 16-bit skeleton is not checked here: it releases the previous stage
# once the next step's wgmmas are issued, so loads of the current stage sit between the wait and that arrival; its
# loads of the previous stage fed the previous step's dequantization and wgmmas, issued before the arrival.)
UNFENCED = [(f"{s}-m{m}", _default(s, m)) for s in ("w8a8-fp8-channel", "w8a8-int8-channel") for m in (1, 16, 4096)]
# ... and folded MXFP4 weights (their staged exponent deltas feed the fragments, which feed the wgmmas), dense and MoE
_FOLD = LayerConfig(n=4096, k=4096, scheme="w4a8-mxfp4-fp8", fold_scales=True)
UNFENCED += [(f"w4a8-fold-m{m}", compose(_FOLD, ComputeConfig(), choose_tunings(_FOLD, SM90, stored=False).for_m(m),
                                          SM90)) for m in (1, 16, 1024, 4096)]
UNFENCED += [("w4a8-fold-moe-indexed", ws_moe_plans(LayerConfig(n=1024, k=2048, scheme="w4a8-mxfp4-fp8", num_experts=8,
                                                                 fold_scales=True), ComputeConfig(gemm="indexed"), (128,))[0])]
SASS_PLANS = FENCED + UNFENCED


HELD = "release_stage(ring, stage == 0 ? cfg::kStages - 1 : stage - 1);"  # the stage before the current one
LOOP = "for (int kt = tc.kt_begin; kt < tc.kt_end; ++kt) {"


def check_deferred_releases(src: str) -> int:
    """Every consumer k loop of a deferred-release kernel (components.DEFERRED_RELEASE) releases the previous stage
    once, after its stage wait and first wgmma commit and only past the unit's first k tile, and the unit's last
    stage after the loop, before the epilogue: a release of the current stage races, a missing one hangs. Returns
    the loops checked."""
    consumers = src[src.index("void consume("):]
    assert "release_stage(ring, stage)" not in consumers, "a deferred kernel releases its current stage"
    loops = 0
    start = consumers.find(LOOP)
    while start >= 0:
        end = consumers.index("if (++stage == cfg::kStages)", start)
        body = consumers[start:end]
        assert body.count(HELD) == 1, body
        line = body[body.rindex("\n", 0, body.index(HELD)):body.index(HELD)]
        assert "if (" in line and "kt > tc.kt_begin" in line, line
        assert body.index("wait_stage(stage, phase);") < body.index("wgmma_commit();") < body.index(HELD)
        epilogue = min(i for i in (consumers.find("store_output(", end), consumers.find("split_k_publish(", end))
                       if i >= 0)
        assert f"if (tc.kt_end > tc.kt_begin) {HELD}" in consumers[end:epilogue], "no release after the k loop"
        loops += 1
        start = consumers.find(LOOP, end)
    return loops


@pytest.mark.parametrize("plan", [p for _, p in FENCED], ids=[i for i, _ in FENCED])
def test_consumers_release_through_the_fence(plan) -> None:
    src = build(plan, compile=False).source
    body = re.search(r"void release_stage\(const Ring& ring, int s\) \{\n(.*?)\n\}", src, re.S)
    assert body is not None, plan.kernel_name
    assert body.group(1).lstrip().startswith("fence_loads();"), body.group(1)
    outside = src.replace(body.group(0), "")
    assert "mbarrier_arrive(ring.empty_bars" not in outside, "a consumer arrives on an empty barrier unfenced"
    # held until the next stage's first wgmmas are issued (components.DEFERRED_RELEASE), but in register-weight
    # tiles of more than 128 tokens, which release a stage right after its last promotion
    if plan.tuning.block_m > 128 and plan.tuning.b_operand != "shared":
        assert HELD not in outside and outside.count("release_stage(ring, stage)") >= 1
    else:
        assert check_deferred_releases(src) >= 1


def test_the_deferred_release_check_sees_a_wrong_or_missing_release() -> None:
    src = build(FENCED[0][1], compile=False).source
    assert check_deferred_releases(src) >= 1
    for broken in (src.replace(HELD, "release_stage(ring, stage);", 1),  # the current stage: a race
                   src.replace(f"if (tc.kt_end > tc.kt_begin) {HELD}", ""),  # the unit's last: a hang
                   src.replace(f"kt > tc.kt_begin) {HELD}", f"true) {HELD}", 1)):  # one before the first stage
        with pytest.raises(AssertionError):
            check_deferred_releases(broken)


def test_kernels_without_staged_scales_have_no_fence() -> None:
    for name, plan in UNFENCED:
        assert "fence_loads" not in build(plan, compile=False).source, name


def _instructions(sass: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", sass)]


PREDICATE = r"(?:@!?U?P\w+\s+)?"
ARRIVAL = re.compile(PREDICATE + r"SYNCS\.ARRIVE\.TRANS64\.(?:RED\.)?A1T0")  # a consumer's, local or remote


def _opcode(ins: str) -> str:
    return re.sub("^" + PREDICATE, "", ins).split()[0]


def _loaded(ins: str) -> list[int]:
    """Registers a shared load writes (LDS.64: two, LDS.128: four; ldmatrix LDSM .x2 / .x4: two / four)."""
    m = re.match(PREDICATE + r"(LDSM|LDS)((?:\.\w+)*)\s+R(\d+),", ins)
    if m is None:
        return []
    suffixes = m.group(2).split(".")
    if m.group(1) == "LDSM":
        count = 4 if "4" in suffixes else 2 if "2" in suffixes else 1
    else:
        count = 4 if "128" in suffixes else 2 if "64" in suffixes else 1
    return [int(m.group(3)) + i for i in range(count)]


def _reads(ins: str, reg: int) -> bool:
    op = _opcode(ins)
    operands = re.sub("^" + PREDICATE, "", ins).split(None, 1)[1] if " " in ins else ""
    parts = [o.strip() for o in operands.split(",")]
    if op.split(".")[0].endswith("GMMA"):  # register A operand: four registers from the second operand's
        a = re.fullmatch(r"R(\d+)", parts[1]) if len(parts) > 1 else None
        if a is not None and int(a.group(1)) <= reg < int(a.group(1)) + 4:
            return True
    sources = ",".join(parts[1:])  # the first operand is written
    if op.startswith(("SYNCS", "STS", "STG", "ST", "RED", "ATOM")):
        sources = operands  # stores and arrivals read every operand
    return re.search(rf"\bR{reg}\b", sources) is not None


def unused_loads_before_release(sass: str) -> tuple[int, list[str]]:
    """(arrivals checked, loads between a stage's wait or the previous arrival and an arrival whose value no
    instruction reads, and no MEMBAR orders, before it)."""
    ins = _instructions(sass)
    arrivals = [i for i, s in enumerate(ins) if ARRIVAL.match(s)]
    found = []
    for i in arrivals:
        start = max((j for j in range(i) if ARRIVAL.match(ins[j]) or "TRYWAIT" in ins[j]), default=max(0, i - 400))
        for j in range(start, i):
            for reg in _loaded(ins[j]):
                if not any(_reads(ins[x], reg) or _opcode(ins[x]).startswith("MEMBAR") for x in range(j + 1, i)):
                    found.append(f"{ins[j]} (R{reg}) ... {ins[i]}")
    return len(arrivals), found


def arrivals_without_membar(sass: str) -> list[str]:
    """Arrivals with a shared load before them and no MEMBAR since: a fenced consumer's release orders every load
    before it, those of a stage held past the next stage's wait (components.DEFERRED_RELEASE) included, which the
    window of unused_loads_before_release does not reach."""
    found, pending = [], False
    for s in _instructions(sass):
        if ARRIVAL.match(s) and pending:
            found.append(s)
        elif _opcode(s).startswith("MEMBAR"):
            pending = False
        elif _loaded(s):
            pending = True
    return found


def _sass(plan, tmp_path: Path) -> str:
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(build(plan).compiled.cubin)
    sass = disassemble(cubin)
    assert sass is not None, "cuobjdump could not disassemble the cubin"
    return sass


@pytest.mark.skipif(_cuda_tool("cuobjdump") is None or _cuda_tool("nvdisasm") is None,
                    reason="cuobjdump and nvdisasm not installed (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("plan", [p for _, p in SASS_PLANS], ids=[i for i, _ in SASS_PLANS])
def test_sass_arrives_after_the_loaded_values_are_used(plan, tmp_path: Path) -> None:
    sass = _sass(plan, tmp_path)
    checked, unused = unused_loads_before_release(sass)
    assert checked >= 2 and unused == [], (checked, unused)
    if any(plan is p for _, p in FENCED):
        assert arrivals_without_membar(sass) == []


def test_the_check_sees_an_arrival_that_overtakes_a_load() -> None:
    """The SASS of the race (before the fence): scales loaded, the arrival, then their use; a predicated arrival and
    a load above the wgmma wait count too, a MEMBAR between load and arrival orders them."""
    def sass(lines):
        return "\n".join(f"        /*{16 * i:04x}*/  {s} ;" for i, s in enumerate(lines))

    race = ["SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R144+URZ+0x31800], R3", "LDS R3, [R3+0x8000]",
            "WARPGROUP.DEPBAR.LE gsb0, 0x0", "LDS.64 R16, [R5+0x8110]", "FMUL R2, R16, R3",
            "@!P1 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R144+URZ+0x31830], RZ", "FMUL R4, R17, R3"]
    checked, unused = unused_loads_before_release(sass(race))
    assert checked == 1 and [u.split(" ... ")[0] for u in unused] == ["LDS.64 R16, [R5+0x8110] (R17)"]
    assert unused_loads_before_release(sass(race[:5] + ["MEMBAR.ALL.CTA"] + race[5:]))[1] == []
    assert len(arrivals_without_membar(sass(race))) == 1
    assert arrivals_without_membar(sass(race[:5] + ["MEMBAR.ALL.CTA"] + race[5:])) == []
    two = race[:5] + ["MEMBAR.ALL.CTA"] + race[5:6] + race[5:6]  # one fence, the local and the remote arrival
    assert arrivals_without_membar(sass(two)) == []
    assert len(arrivals_without_membar(sass(two + race[1:2] + race[5:6]))) == 1  # a load after it, then an arrival
    hoisted = race[:1] + ["LDS R18, [R51+0x2e00]", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                          "SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [UR4], RZ", "FMUL R4, R18, R3"]
    assert len(unused_loads_before_release(sass(hoisted))[1]) == 1
    fragment = race[:1] + ["LDS.128 R88, [R106+0x5000]", "QGMMA.64x64x32.F32.E4M3.E4M3 R56, R88, gdesc[UR8], RZ",
                           "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R1], RZ"]
    assert unused_loads_before_release(sass(fragment))[1] == []  # the wgmma reads all four
    assert _loaded("LDSM.16.M88.4 R8, [R2]") == [8, 9, 10, 11] and _loaded("LDS.U8 R3, [R1]") == [3]
    assert _loaded("@!PT LDS RZ, [RZ]") == [] and _loaded("@P0 LDS.128 R4, [R1]") == [4, 5, 6, 7]

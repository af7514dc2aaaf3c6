"""A consumer of the 8-bit warp-specialized kernels releases a ring stage only once its shared loads of that stage
are performed (ptx/loads_fence). Without the fence ptxas issued the empty-barrier arrival right after the loads of a
promotion's staged scales, before their values came back, and the producer's cp.async refill (an L1 hit) could land
first: tokens-on-M fp8 block128 at 4000 x 3072, M = 4096, had 40-70 of its 1024 tiles wrong, differently in every run
(H200, 2026-12-04). Checked in the source and in the SASS: every load between a promotion's wgmma wait and the
arrival has its value used before the arrival."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build
from humming_gen.pipelines.warp_specialized.heuristics import tokens_m_tuning, widened_weight_tunings
from humming_gen.runtime.cache import _cuda_tool
from humming_gen.targets import get_target
from moe_host import ws_moe_plans

SM90 = get_target("sm_90a")


def _plans():
    """(id, plan): kernels whose consumers read staged scales or weight fragments with shared loads."""
    block = LayerConfig(n=4000, k=3072, scheme="w8a8-fp8-block128")
    for block_n in (128, 256):  # tokens on M, one set of partial sums (the tiles that raced)
        t = tokens_m_tuning(block, SM90, choose_tunings(block, SM90, stored=False).for_m(4096), 4096, block_n)
        yield f"block128-tokens-m-n{block_n}", compose(block, ComputeConfig(), t, SM90)
    for scheme, m in (("w8a8-fp8-block128", 64), ("w8a8-mxfp8", 4096), ("w4a8-mxfp4-fp8", 1024)):
        layer = LayerConfig(n=4096, k=4096, scheme=scheme)
        yield f"{scheme}-m{m}", compose(layer, ComputeConfig(), choose_tunings(layer, SM90, stored=False).for_m(m),
                                        SM90)
    w4a8 = LayerConfig(n=4096, k=4096, scheme="w4a8-mxfp4-fp8")  # nibbles widened by the producer warpgroup
    yield "w4a8-mxfp4-fp8-widened", compose(w4a8, ComputeConfig(), widened_weight_tunings(w4a8, SM90).for_m(1024),
                                            SM90)
    for gemm in ("indexed", "grouped_contiguous"):  # MoE: gathered rows, and the experts' row windows
        moe = LayerConfig(n=1024, k=2048, scheme="w8a8-fp8-block128", num_experts=8)
        yield f"block128-moe-{gemm}", ws_moe_plans(moe, ComputeConfig(gemm=gemm), (128,))[0]


PLANS = list(_plans())
# the 16-bit skeleton releases without the fence: its consumers' loads (weight words, group parameters) feed the
# wgmmas or the dequantization before the release, which the SASS check holds it to
W16 = LayerConfig(n=8192, k=8192, scheme="w4a16-int4-g128")
W16_MOE = LayerConfig(n=1024, k=2048, scheme="w4a16-int4-g128", num_experts=8)
SASS_PLANS = PLANS + [
    ("w4a16-int4-g128-m1024", compose(W16, ComputeConfig(), choose_tunings(W16, SM90, stored=False).for_m(1024), SM90)),
    ("w4a16-int4-g128-widened", compose(W16, ComputeConfig(), widened_weight_tunings(W16, SM90).for_m(1024), SM90)),
    ("w4a16-moe-indexed", ws_moe_plans(W16_MOE, ComputeConfig(gemm="indexed"), (128,))[0]),
    ("w4a16-moe-grouped_contiguous", ws_moe_plans(W16_MOE, ComputeConfig(gemm="grouped_contiguous"), (128,))[0])]


@pytest.mark.parametrize("plan", [p for _, p in PLANS], ids=[i for i, _ in PLANS])
def test_consumers_release_through_the_fence(plan) -> None:
    src = build(plan, compile=False).source
    body = re.search(r"void release_stage\(const Ring& ring, int s\) \{\n(.*?)\n\}", src, re.S)
    assert body is not None, plan.kernel_name
    assert body.group(1).lstrip().startswith("fence_loads();"), body.group(1)
    outside = src.replace(body.group(0), "")
    assert "mbarrier_arrive(ring.empty_bars" not in outside, "a consumer arrives on an empty barrier unfenced"
    assert outside.count("release_stage(ring, stage)") >= 1


def _instructions(sass: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", sass)]


def _loaded(ins: str) -> list[int]:
    """Registers a shared load writes (LDS.64: two, LDS.128: four; ldmatrix LDSM .x2 / .x4: two / four)."""
    m = re.match(r"(?:@!?U?P\w+\s+)?(LDSM|LDS)((?:\.\w+)*)\s+R(\d+),", ins)
    if m is None:
        return []
    suffixes = m.group(2).split(".")
    if m.group(1) == "LDSM":
        count = 4 if "4" in suffixes else 2 if "2" in suffixes else 1
    else:
        count = 4 if "128" in suffixes else 2 if "64" in suffixes else 1
    return [int(m.group(3)) + i for i in range(count)]


def _reads(ins: str, reg: int) -> bool:
    operands = ins.split(None, 1)[1] if " " in ins else ""
    sources = operands.split(",", 1)[1] if "," in operands else ""  # the first operand is written
    if ins.split()[0].startswith(("SYNCS", "STS", "STG", "ST.")):
        sources = operands  # stores and arrivals read every operand
    return re.search(rf"\bR{reg}\b", sources) is not None


def unused_loads_before_release(sass: str) -> list[str]:
    """Loads between a wgmma wait and the next consumer arrival whose value no instruction reads before it."""
    ins = _instructions(sass)
    found = []
    for i, arrive in enumerate(ins):
        if not arrive.startswith("SYNCS.ARRIVE.TRANS64.A1T0"):
            continue
        start = max((j for j in range(i) if ins[j].startswith("WARPGROUP.DEPBAR")), default=max(0, i - 300))
        for j in range(start, i):
            for reg in _loaded(ins[j]):
                if not any(_reads(ins[x], reg) for x in range(j + 1, i)):
                    found.append(f"{ins[j]} (R{reg}) ... {arrive}")
    return found


@pytest.mark.skipif(_cuda_tool("cuobjdump") is None or _cuda_tool("nvdisasm") is None,
                    reason="cuobjdump and nvdisasm not installed (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("plan", [p for _, p in SASS_PLANS], ids=[i for i, _ in SASS_PLANS])
def test_sass_arrives_after_the_loaded_values_are_used(plan, tmp_path: Path) -> None:
    kernel = build(plan)
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(kernel.compiled.cubin)
    sass = subprocess.run([_cuda_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    assert "SYNCS.ARRIVE.TRANS64.A1T0" in sass and "WARPGROUP.DEPBAR" in sass
    assert unused_loads_before_release(sass) == []


def test_the_check_sees_an_arrival_that_overtakes_a_load() -> None:
    """The SASS of the race (before the fence): scales loaded, the arrival, then their use."""
    sass = "\n".join(f"        /*{16 * i:04x}*/  {s} ;" for i, s in enumerate([
        "WARPGROUP.DEPBAR.LE gsb0, 0x0", "LDS R3, [R3+0x8000]", "LDS.64 R16, [R5+0x8110]", "FMUL R2, R16, R3",
        "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R144+URZ+0x31830], RZ", "FMUL R4, R17, R3"]))
    assert unused_loads_before_release(sass) == ["LDS.64 R16, [R5+0x8110] (R17) ... "
                                                 "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R144+URZ+0x31830], RZ"]
    assert _loaded("LDSM.16.M88.4 R8, [R2]") == [8, 9, 10, 11] and _loaded("LDS.U8 R3, [R1]") == [3]
    assert _loaded("@!PT LDS RZ, [RZ]") == [] and _loaded("@P0 LDS.128 R4, [R1]") == [4, 5, 6, 7]

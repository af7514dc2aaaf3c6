"""The overlapped promotion loop of the 8-bit warp-specialized kernels reads what a promotion multiplies by before
the wgmma wait that precedes it: a token half's activation scale pairs (fp32, or staged e8m0 bytes decoded) and the
group's weight scales. Read after the wait (before 702693c), every FFMA of the promotion waited on its shared load
(ncu, fp8 group-32 x MXFP4 at 3072 x 4096, M = 4096: short-scoreboard stalls on the FFMAs, 24 % of warp samples;
the fp32 preload measured 333.1 -> 311.9 us there on the H200). Checked in the SASS: between a WARPGROUP.DEPBAR and
the next, no FFMA of the k loop reads a register that a shared load wrote after the DEPBAR."""

from __future__ import annotations

from pathlib import Path

import pytest

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import generate
from humming_gen.runtime.cache import _cuda_tool
from humming_gen.targets import get_target
from test_stage_release import _instructions, _loaded, _opcode, _reads, _sass

SM90 = get_target("sm_90a")
FP8_G32 = hg.ActivationScheme("float8e4m3", granularity="group", group_size=32)
MXFP8 = hg.ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0")


def _plans():
    for fold in (True, False):  # folded e8m0 weight scales (the default), or staged weight group scales
        layer = LayerConfig(n=3072, k=4096, fold_scales=fold, scheme=hg.QuantScheme(
            "float4e2m1", group_size=32, scale_dtype="float8e8m0", activation=FP8_G32))
        for m in (200, 4096):
            yield f"mxfp4-fp8g32-fold{int(fold)}-m{m}", compose(
                layer, ComputeConfig(), choose_tunings(layer, SM90, stored=False).for_m(m), SM90)
    # staged e8m0 bytes, decoded before the wait: MXFP8 weights and activations, and MXFP4 x MXFP8 folded
    for name, layer in (("mxfp8", LayerConfig(n=3072, k=4096, scheme="w8a8-mxfp8")),
                        ("mxfp4-mxfp8", LayerConfig(n=3072, k=4096, fold_scales=True, scheme=hg.QuantScheme(
                            "float4e2m1", group_size=32, scale_dtype="float8e8m0", activation=MXFP8)))):
        for m in (200, 4096):
            yield f"{name}-m{m}", compose(layer, ComputeConfig(), choose_tunings(layer, SM90, stored=False).for_m(m),
                                          SM90)


PLANS = list(_plans())


def scale_loads_after_wait(sass: str) -> tuple[int, list[str]]:
    """(FFMAs checked, FFMAs of the k loop reading a register that a shared load wrote since the last
    WARPGROUP.DEPBAR): the k loop is the span from the first to the last wgmma."""
    ins = _instructions(sass)
    gmma = [i for i, s in enumerate(ins) if _opcode(s).split(".")[0].endswith("GMMA")]
    checked, found, recent = 0, [], {}
    for i in range(gmma[0], gmma[-1] + 1):
        s = ins[i]
        if _opcode(s).startswith("WARPGROUP.DEPBAR"):
            recent = {}
        elif _loaded(s):
            recent.update({reg: s for reg in _loaded(s)})
        elif _opcode(s) == "FFMA":
            checked += 1
            found += [f"{recent[reg]} ... {s}" for reg in recent if _reads(s, reg)]
    return checked, found


@pytest.mark.parametrize("plan", [p for _, p in PLANS], ids=[i for i, _ in PLANS])
def test_the_source_reads_a_halfs_scales_before_its_wait(plan) -> None:
    src = generate(plan)
    for h in (0, 1):
        assert src.index(f"pairs{h}[jj] = ") < src.index(f"const float2 pair = pairs{h}[jj];")
    assert src.index("pairs0[jj] = ") < src.index("wgmma_wait<1>();  // half 0 of group pg has retired")


@pytest.mark.skipif(_cuda_tool("cuobjdump") is None or _cuda_tool("nvdisasm") is None,
                    reason="cuobjdump and nvdisasm not installed (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("plan", [p for _, p in PLANS], ids=[i for i, _ in PLANS])
def test_promotion_ffmas_do_not_wait_on_scale_loads(plan, tmp_path: Path) -> None:
    checked, found = scale_loads_after_wait(_sass(plan, tmp_path))
    assert checked >= 64 and found == [], (checked, found[:4])


def test_the_check_sees_scales_loaded_after_the_wait() -> None:
    """The SASS before 702693c: the wait, the scale pair's load, the FFMAs that use it; and the preloaded form."""
    def sass(lines):
        return "\n".join(f"        /*{16 * i:04x}*/  {s} ;" for i, s in enumerate(lines))

    head = ["QGMMA.64x64x32.F32.E4M3.E4M3 R56, R100, gdesc[UR16], RZ, !UPT, gsb0"]
    tail = ["QGMMA.64x64x32.F32.E4M3.E4M3 R24, R104, gdesc[UR16], RZ, !UPT, gsb0"]
    after = ["WARPGROUP.DEPBAR.LE gsb0, 0x1", "LDS.64 R140, [R137+0x6200]", "FFMA R142, R57, R141, R142",
             "FFMA R143, R56, R140, R143"]
    before = ["LDS.64 R140, [R137+0x6200]", "WARPGROUP.DEPBAR.LE gsb0, 0x1", "FFMA R142, R57, R141, R142",
              "FFMA R143, R56, R140, R143"]
    assert len(scale_loads_after_wait(sass(head + after + tail))[1]) == 2
    assert scale_loads_after_wait(sass(head + before + tail)) == (2, [])

"""Weights of at most 4 bits widened into shared memory (TuningConfig.b_operand='widened'): the producer
warpgroup's warps 1-3 widen each stage's nibbles (the register kernels' BLayoutNibble8) into a BLayoutSw128 panel
of the stage, which the consumers' wgmmas read through descriptors as with 8-bit shared weights.

- NVRTC compilation for sm_90a without spills (swapped tiles of 8 to 192 tokens, tokens on M), the widening
  warps' code inside their setmaxnreg budget (no spills means ptxas fitted it), no wgmma serialization warning
  (fatal_warnings).
- The rendered widen_unit compiled for the host with g++ and run over every 16-row tile and lane of every stage of
  a packed weight: the panels must be the BLayoutSw128 packing (the layout the shared-weight kernels read, GPU-tested)
  of the 8-bit codes the scheme's values widen to (e4m3 of the value, times 2^d with folded scales; 16 x code for
  int8), computed here from the formats' tables.
- What the plans and sources promise: the packed weight is the register kernels' (one copy serves both), barrier
  counts, shared memory, refusals naming the reason.
"""

from __future__ import annotations

import re
import subprocess

import attrs
import numpy as np
import pytest
import torch

import humming_gen as hg
from host_sections import cfg_namespace
from symbols import declaration_mismatches
from test_w4a8 import CXX, PRELUDE
from helpers import assert_no_spills
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.formats import dtype
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build, generate
from humming_gen.layer.weights import scales_fold
from humming_gen.pipelines.base import ComposeError
from humming_gen.pipelines.warp_specialized import compose as ws_compose
from humming_gen.pipelines.warp_specialized import compose_a8
from humming_gen.pipelines.warp_specialized.heuristics import widened_weight_tunings
from humming_gen.pipelines.weights import prepare_weight
from humming_gen.schemes.packing import BLayoutSw128, pack_codes_sw128
from humming_gen.targets import get_target

TARGET = get_target("sm_90a")


def _widened(scheme: str, m: int, n: int = 8192, k: int = 8192, fold: bool = False, tokens_m_from=None):
    layer = LayerConfig(n=n, k=k, scheme=scheme, fold_scales=fold)
    tuning = widened_weight_tunings(layer, TARGET, tokens_m_from=tokens_m_from).for_m(m)
    return layer, compose(layer, ComputeConfig(), tuning, TARGET)


@pytest.mark.parametrize("scheme,fold,m,tokens_m_from", [
    ("w4a8-mxfp4-fp8", True, 1, None), ("w4a8-mxfp4-fp8", True, 64, None), ("w4a8-mxfp4-fp8", True, 1024, None),
    ("w4a8-mxfp4-fp8", True, 4096, None), ("w4a8-mxfp4-fp8", True, 1024, 256), ("w4a8-mxfp4-fp8", False, 1024, None),
    ("w4a8-int4-channel-int8", False, 4096, None), ("w4a8-int4-channel-int8", False, 1024, 256),
    ("w4a8-int4-g128-fp8", False, 4096, None)])
def test_widened_kernels_compile_without_spills(scheme: str, fold: bool, m: int, tokens_m_from) -> None:
    layer, plan = _widened(scheme, m, fold=fold, tokens_m_from=tokens_m_from)
    t = plan.tuning
    assert t.b_operand == "widened" and plan.kernel_name.endswith("_wd_tm" if tokens_m_from else "_wd")
    assert (t.tokens_on == "m") == (tokens_m_from is not None)
    kernel = build(plan)
    assert_no_spills(kernel, plan.kernel_name)
    src = kernel.source
    assert "widen_unit(ring.stage_ptr(stage), panel, u, lane)" in src and "load_fragment(" not in src
    assert "nibbles_to_a8_folded(v.x" in src if fold else "nibbles_to_a8(v.x" in src
    assert "wgmma_m64n" in src and "f32.e4m3.e4m3" in src if scheme.endswith("fp8") else ".s32.s8.s8" in src


@pytest.mark.parametrize("tokens_m_from", [None, 1])
def test_folded_stores_multiply_by_the_rows_factor(tokens_m_from) -> None:
    """Folded group scales leave each weight row's 2^r in out_scale: both stores (weights on wgmma's M, and the token
    rows' store of tokens_on='m') must multiply by it. (The token rows' store once dropped it: errors of 100x on the
    GPU, which no host run of the widening sees.)"""
    for m in (1, 1024):
        _, plan = _widened("w4a8-mxfp4-fp8", m, fold=True, tokens_m_from=tokens_m_from)
        assert (plan.tuning.tokens_on == "m") == (tokens_m_from is not None)
        assert "static_cast<const float*>(p.out_scale)[n]" in generate(plan), plan.kernel_name


@pytest.mark.parametrize("scheme,m,fold", [("w4a8-mxfp4-fp8", 1024, True), ("w4a16-int4-g128", 1024, False),
                                           ("w4a16-int4-g128-zp", 4096, False)])
def test_widening_warps_barriers_and_registers(scheme: str, m: int, fold: bool) -> None:
    """Three warps widen, each arriving on the stage's widened barrier, initialised to their 96 threads; the
    consumers wait for it after the full barrier. The setmaxnreg budgets share the registers the CTA holds at launch
    (kThreads x the count ptxas gives the kernel, 168 at 384 threads), not the register file: a consumer's
    setmaxnreg.inc past them would wait forever. A stage's barriers take 32 bytes, so the epilogue staging after
    them stays 16-byte aligned for every stage count."""
    layer = LayerConfig(n=8192, k=8192, scheme=scheme, fold_scales=fold)
    plan = compose(layer, ComputeConfig(), widened_weight_tunings(layer, TARGET).for_m(m), TARGET)
    src = generate(plan)
    consts = {c[0]: c[1] for c in plan.constants}
    assert consts["kWidenThreads"] == 96 == plan.threads // 3 - 32
    assert "mbarrier_init(ring.widened_bars + 8 * s, cfg::kWidenThreads)" in src
    assert "if (threadIdx.x < 32)\n      produce(p, ring, units);" in src and "widen(p, ring, units);" in src
    assert src.count("mbarrier_arrive(ring.widened_bars + 8 * stage)") == 1  # every widening thread, once a stage
    assert src.count("mbarrier_wait(ring.widened_bars + 8 * s, ph)") == 1  # the consumers' wait_stage
    held = build(plan).resources["registers"]
    assert held == ws_compose.launch_registers(plan.threads) == 168
    assert 128 * (consts["kProducerRegisters"] + 2 * consts["kConsumerRegisters"]) <= plan.threads * held
    smem = (compose_a8 if layer.scheme.activation is not None else ws_compose).shared_memory(layer, plan.tuning)
    assert smem.panel_offset % 1024 == 0 and consts["kBPanelOffset"] == smem.panel_offset and smem.barriers == 32
    assert "cfg::kStages * (cfg::kStageBytes + 32)" in src and "kStageBytes + 16" not in src
    for stages in range(2, 9):  # the staging offset: stage bytes are whole 1024s, so the barriers decide
        assert stages * (smem.stage + smem.barriers) % 16 == 0
    assert plan.shared_bytes == smem.total <= TARGET.smem_per_block_optin


ROLE_HOST = r"""
#include <cstdio>
#include <vector>
typedef unsigned int u32;
#define __device__
#define __forceinline__ inline
struct { unsigned x; } threadIdx, blockIdx, gridDim;
namespace cfg { constexpr int kStages = 3, kStageBytes = 64, kBPanelOffset = 0, kWidenThreads = 96; }
constexpr int kWidenUnits = UNITS;
struct Params { int m; };
struct TileCoord { int kt_begin, kt_end; };
struct Ring { u32 full_bars, widened_bars; unsigned char* smem_ptr; const unsigned char* stage_ptr(int) const { return smem_ptr; } };
static TileCoord unit_coord(int unit, int = 0) { return TileCoord{0, 2 + unit % 3}; }  // a few k tiles per unit
static TileCoord unit_coord(const Params&, int unit) { return unit_coord(unit); }
static int k_tile = -1, waits = 0;  // the current (unit, k tile): widen() waits on its full barrier once per k tile
static std::vector<int> arrivals, widened;
static void mbarrier_wait(u32, int) { k_tile = waits++; }
static void fence_async_shared() {}
static void mbarrier_arrive(u32) { arrivals[k_tile]++; }
static void widen_unit(const unsigned char*, unsigned char*, int unit, int lane) { widened[(k_tile * kWidenUnits + unit) * 32 + lane]++; }
"""


@pytest.mark.parametrize("units", [8, 16])  # the 8-bit kernels' 16-row tiles, the 16-bit ones' (half slice, chunk)
def test_widening_role_covers_every_unit_and_lane_and_arrives_once(units: int, tmp_path) -> None:
    """The rendered widen() run on the host for threads 32-127 of one CTA (stubs for the barriers and the schedule):
    every unit of every stage widened by exactly one lane of the right index, and exactly kWidenThreads arrivals on
    each stage's widened barrier (the count it is initialised to)."""
    if CXX is None:
        pytest.skip("no host C++ compiler (g++) to run the rendered template")
    from humming_gen.codegen.render import environment

    role = environment().get_template("pipelines/warp_specialized/widen_role.cuh.j2").render(grouped=False, banded=True)
    units_total = 5  # units of the persistent grid: one CTA (gridDim 1) takes them all
    main = r"""
int main() {
  const int units = 5;
  int tiles = 0;
  for (int u = 0; u < units; ++u) tiles += 2 + u % 3;
  arrivals.assign(tiles, 0);
  widened.assign(tiles * kWidenUnits * 32, 0);
  Ring ring{0, 0, nullptr};
  Params p{1};
  blockIdx.x = 0;
  gridDim.x = 1;
  for (unsigned t = 32; t < 128; ++t) {  // each widening thread runs its whole loop (the stubs never block)
    threadIdx.x = t;
    waits = 0;
    widen(p, ring, units);
  }
  for (int a : arrivals) std::printf("%d ", a);
  std::printf("\n");
  for (int w : widened) std::printf("%d", w);
  std::printf("\n");
  return 0;
}
"""
    assert role.count("mbarrier_wait(") == 1, "the stubs count k tiles by the role's one wait per k tile"
    cpp = ROLE_HOST.replace("UNITS", str(units)) + role + main
    (tmp_path / "role.cpp").write_text(cpp)
    exe = tmp_path / "role"
    log = subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(exe), str(tmp_path / "role.cpp")], capture_output=True,
                         text=True)
    assert log.returncode == 0, log.stderr[-3000:]
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    arrivals = [int(a) for a in lines[0].split()]
    assert len(arrivals) == sum(2 + u % 3 for u in range(units_total)) and set(arrivals) == {96}, arrivals
    assert set(lines[1]) == {"1"}, "a (k tile, unit, lane) widened not exactly once"


def test_widened_plans_read_the_register_layout() -> None:
    """A widened bucket reads the register kernels' packed nibbles: one weight copy serves the register buckets
    below widened_from and the widened ones (and the standard pipeline's, which read the same layout)."""
    layer = LayerConfig(n=4096, k=4096, scheme="w4a8-mxfp4-fp8", fold_scales=True)
    plan = widened_weight_tunings(layer, TARGET, widened_from=256)
    assert plan.for_m(64).b_operand == "registers" and plan.for_m(256).b_operand == "widened"
    layouts = {compose(layer, ComputeConfig(), t, TARGET).layout for t in plan.tunings()}
    registers = {compose(layer, ComputeConfig(), t, TARGET).layout for t in choose_tunings(layer, TARGET).tunings()}
    assert len(layouts) == 1 and layouts == registers


def test_declarations_match_the_rendered_source() -> None:
    for scheme, fold, tm in (("w4a8-mxfp4-fp8", True, None), ("w4a8-int4-channel-int8", False, 256),
                             ("w4a8-int4-g128-fp8", False, None)):
        for m in (16, 1024):
            _, plan = _widened(scheme, m, fold=fold, tokens_m_from=tm)
            assert not declaration_mismatches(plan), declaration_mismatches(plan)


@pytest.mark.parametrize("scheme,change,needle", [
    ("w8a8-fp8-channel", {}, "nibbles (weights of at most 4 bits) are widened"),
    ("w4a8-mxfp4-fp8", dict(a_load="cp_async"), "activation codes come by one bulk copy a stage (a_load='tma')"),
    ("w4a8-mxfp4-fp8", dict(block_n=256, tokens_on="m", block_m=128, split_k=1), "one 128-row layout block a tile"),
])
def test_widened_refusals_name_the_reason(scheme: str, change: dict, needle: str) -> None:
    layer = LayerConfig(n=4096, k=4096, scheme=scheme)
    base = attrs.evolve(choose_tunings(LayerConfig(n=4096, k=4096, scheme="w4a8-mxfp4-fp8"), TARGET,
                                       register_weights=True).for_m(1024), b_operand="widened")
    with pytest.raises(ComposeError, match=re.escape(needle)):
        compose(layer, ComputeConfig(), attrs.evolve(base, **change), TARGET)


def test_widened_needs_wgmma_and_whole_panels() -> None:
    with pytest.raises(ValueError, match="b_operand='widened'.*needs mma='wgmma'"):
        TuningConfig(b_operand="widened")
    TuningConfig(pipeline="warp_specialized", mma="wgmma", b_operand="widened", tokens_on="m")  # allowed
    with pytest.raises(ValueError, match="a_load='tma'"):  # K = 3000: no panels layout, so no bulk-copied codes
        widened_weight_tunings(LayerConfig(n=4096, k=3000, scheme="w4a8-int4-channel-int8"), TARGET)
    with pytest.raises(ValueError, match="tokens_on='m' with weight scales per group of 128 k"):  # before any build
        widened_weight_tunings(LayerConfig(n=4096, k=4096, scheme="w4a8-int4-g128-fp8"), TARGET, tokens_m_from=256)


# --- the rendered widening, on the host ---------------------------------------------------------------------------
HOST_MAIN = r"""
static int run_widen(int argc, char** argv) {
  const int n_blocks = std::atoi(argv[1]), k_tiles = std::atoi(argv[2]);
  std::vector<unsigned char> b(static_cast<size_t>(n_blocks) * cfg::kSlicesPerN * cfg::kBSliceBytes);
  std::fread(b.data(), 1, b.size(), stdin);
  std::vector<unsigned char> e(static_cast<size_t>(n_blocks) * EXPONENT_BLOCK_BYTES);
  std::fread(e.data(), 1, e.size(), stdin);
  std::vector<unsigned char> stage(cfg::kStageBytes);
  for (int nb = 0; nb < n_blocks; ++nb)
    for (int kt = 0; kt < k_tiles; ++kt) {
      std::memset(stage.data(), 0xA5, stage.size());  // poison: every panel byte must be written
      // load_weight_stage's copies: the block's kSlicesPerStage slices, and its exponent words of the stage
      std::memcpy(stage.data() + cfg::kAStageBytes,
                  b.data() + (static_cast<size_t>(nb) * cfg::kSlicesPerN + kt * cfg::kSlicesPerStage) * cfg::kBSliceBytes,
                  cfg::kSlicesPerStage * cfg::kBSliceBytes);
      COPY_EXPONENTS
      for (int unit = 0; unit < kWidenUnits; ++unit)
        for (int lane = 0; lane < 32; ++lane) widen_unit(stage.data(), stage.data() + cfg::kBPanelOffset, unit, lane);
      std::fwrite(stage.data() + cfg::kBPanelOffset, 1, cfg::kBlockN * cfg::kBlockK, stdout);
    }
  return 0;
}
"""
COPY_EXPONENTS = ("std::memcpy(stage.data() + cfg::kExponentOffset, e.data() + static_cast<size_t>(nb) * "
                  "cfg::kExponentBlockBytes + static_cast<size_t>(kt) * cfg::kExponentStageBytes, "
                  "cfg::kExponentStageBytes);")


def _run_host(tmp_path, name: str, prelude: str, src: str, sections: str, main: str, argv: list, stdin: bytes) -> bytes:
    """Compile the harness (prelude, the kernel's cfg constants, `sections` and `main` in namespace hg) with g++ and
    run it on `stdin`; its stdout."""
    cpp = (prelude + cfg_namespace(src) + "\nnamespace hg {\n" + sections + main
           + "}  // namespace hg\nint main(int argc, char** argv) { return hg::run_widen(argc, argv); }\n")
    (tmp_path / f"{name}.cpp").write_text(cpp)
    exe = tmp_path / name
    log = subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(exe), str(tmp_path / f"{name}.cpp")],
                         capture_output=True, text=True)
    assert log.returncode == 0, log.stderr[-3000:]
    return subprocess.run([str(exe)] + [str(a) for a in argv], input=stdin, capture_output=True, check=True).stdout


def _section(src: str, header: str) -> str:
    start = src.index(f"// ---- {header}")
    return src[start:src.index("// ---- ", start + 8)]


def _sections(src: str, header: str) -> str:
    """Every section whose header starts with `header`, in order."""
    return "".join(_section(src[m.start():], header) for m in re.finditer(re.escape(f"// ---- {header}"), src))


def _expected_codes(qw, layer: LayerConfig, b_exponent: torch.Tensor | None, n_pad: int, k_pad: int) -> torch.Tensor:
    """The 8-bit code each weight code widens to, (n_pad, k_pad) uint8: int8 activations 16 x the signed code; fp8
    the e4m3 code of the value, times 2^d of the row's k32 step where the group scales fold (d read back from
    b_exponent's exponent fields); zero codes past N and K."""
    w = layer.scheme.weight
    codes = qw.codes.view(torch.uint8).to(torch.int64) & ((1 << w.bits) - 1)
    if layer.scheme.activation.dtype.name == "int8":
        signed = torch.where(codes >= 1 << (w.bits - 1), codes - (1 << w.bits), codes)
        out = (signed * 16) & 0xFF
    else:
        values = w.decode(codes).to(torch.float64)
        if b_exponent is not None:
            fields = b_exponent.view(torch.uint8).view(n_pad // 128, k_pad // 128, 128, 4).to(torch.int64)
            d = (fields >> 3) & 0xF
            d = torch.where(d >= 8, d - 16, d)  # [n block][128-k block][row][step]
            d = d.permute(0, 2, 1, 3).reshape(n_pad, k_pad // 32)[: qw.n, : -(-qw.k // 32)]
            values = values * 2.0 ** d.repeat_interleave(32, dim=1)[:, : qw.k].double()
        out = dtype("float8e4m3").encode(values.float()).to(torch.int64)
        back = dtype("float8e4m3").decode(out).to(torch.float64)
        assert torch.equal(back, values), "a widened value is not an e4m3 value"
    full = torch.zeros(n_pad, k_pad, dtype=torch.uint8)
    full[: qw.n, : qw.k] = out.to(torch.uint8)
    return full


@pytest.mark.parametrize("scheme,fold", [("w4a8-mxfp4-fp8", True), ("w4a8-mxfp4-fp8", False),
                                         ("w4a8-int4-channel-int8", False), ("w4a8-int4-g128-fp8", False)])
def test_rendered_widening_writes_the_sw128_panels(scheme: str, fold: bool, tmp_path) -> None:
    if CXX is None:
        pytest.skip("no host C++ compiler (g++) to run the rendered template")
    n, k = 250, 640  # two layout blocks (the second part padding), five stages
    g = torch.Generator().manual_seed(7)
    w = torch.randn(n, k, generator=g) * 0.05
    if fold:  # group scales that differ by row and group: a delta read for the wrong row or step shows
        w *= 2.0 ** torch.randint(-4, 5, (n, k // 32), generator=g).repeat_interleave(32, dim=1)
    qw = hg.scheme(scheme).quantize(w)
    assert scales_fold(qw) or not fold  # (an unfolded MXFP4 layer widens to the plain values' codes)
    layer, plan = _widened(scheme, 1024, n=n, k=k, fold=fold)
    prepared = prepare_weight(plan, qw, "cpu")
    lay = plan.layout
    n_blocks, k_tiles = lay.n_pad // 128, lay.k_pad // 128
    src = generate(plan)
    stdin = prepared.b.contiguous().view(torch.uint8).numpy().tobytes()
    if fold:
        stdin += prepared.b_exponent.contiguous().view(torch.uint8).numpy().tobytes()
    out = _run_host(tmp_path, "widen", PRELUDE + "#include <cstdlib>\n#include <cstring>\n#include <vector>\n"
                    "struct uint2 { u32 x, y; };\n", src, _section(src, "numeric.") + _section(src, "memory.WeightWiden"),
                    HOST_MAIN.replace("EXPONENT_BLOCK_BYTES", "cfg::kExponentBlockBytes" if fold else "0")
                    .replace("COPY_EXPONENTS", COPY_EXPONENTS if fold else ""), [n_blocks, k_tiles], stdin)
    panels = torch.from_numpy(np.frombuffer(out, dtype=np.uint8).copy()).view(n_blocks, k_tiles, 128 * 128)
    expected = pack_codes_sw128(_expected_codes(qw, layer, prepared.b_exponent if fold else None, lay.n_pad,
                                                lay.k_pad), BLayoutSw128(block_n=128))
    wrong = (panels != expected).nonzero()
    assert wrong.numel() == 0, f"{len(wrong)} bytes differ, first (n block, k tile, byte) {wrong[:4].tolist()}"


# --- 16-bit activations: weights dequantized into 16-bit panels -----------------------------------------------------
def _widened16(scheme: str, m: int, n: int = 8192, k: int = 8192, **kw):
    layer = LayerConfig(n=n, k=k, scheme=scheme, **kw)
    tuning = widened_weight_tunings(layer, TARGET).for_m(m)
    return layer, compose(layer, ComputeConfig(), tuning, TARGET)


@pytest.mark.parametrize("scheme,m", [("w4a16-int4-g128", 64), ("w4a16-int4-g128", 1024),
                                      ("w4a16-int4-g128", 8192), ("w4a16-int4-g128-zp", 4096), ("w2a16-int2-g64-zp", 1024), ("w4a16-nvfp4", 1024),
                                      ("w4a16-mxfp4", 4096), ("w8a16-int8-channel", 4096)])
def test_widened_16bit_kernels_compile_without_spills(scheme: str, m: int) -> None:
    layer, plan = _widened16(scheme, m, has_bias=True)
    t = plan.tuning
    assert (t.b_operand, t.block_k, t.a_load) == ("widened", 64, "tma") and plan.kernel_name.endswith("_ws_wd")
    kernel = build(plan)
    assert_no_spills(kernel, plan.kernel_name)
    src = kernel.source
    assert "widen_unit(ring.stage_ptr(stage), panel, u, lane)" in src and "dequantize(" not in src
    assert f"wgmma.mma_async.sync.aligned.m64n{t.block_m}k16.f32.bf16.bf16" in src and ", p, 1, 1, 0, 0;" in src
    assert not declaration_mismatches(plan), declaration_mismatches(plan)


def test_widened_16bit_plan_keeps_small_buckets_and_one_layout() -> None:
    """Buckets on the standard pipeline (small M) keep their kernels; every kernel reads one packed weight."""
    layer = LayerConfig(n=4096, k=4096, scheme="w4a16-int4-g128")
    plan = widened_weight_tunings(layer, TARGET)
    assert plan.for_m(1).pipeline == "standard" and plan.for_m(4096).b_operand == "widened"
    layouts = {compose(layer, ComputeConfig(), t, TARGET).layout for t in plan.tunings()}
    assert len(layouts) == 1
    smem = ws_compose.shared_memory(layer, plan.for_m(4096))
    assert smem.panel_offset % 1024 == 0 and smem.barriers == 32 and smem.widened == 256 * 64 * 2


def test_widened_16bit_refuses_gathered_rows_other_stages_and_tokens_on_m() -> None:
    layer = LayerConfig(n=4096, k=4096, scheme="w4a16-int4-g128")
    base = widened_weight_tunings(layer, TARGET).for_m(4096)
    tuning = attrs.evolve(base, a_load="cp_async")
    with pytest.raises(ComposeError, match=re.escape("the activations come by TMA (a_load='tma'")):
        compose(layer, ComputeConfig(), tuning, TARGET)
    with pytest.raises(ComposeError, match=re.escape("64-k stages")):
        compose(layer, ComputeConfig(), attrs.evolve(base, block_k=128, stages=2), TARGET)
    with pytest.raises(ComposeError, match=re.escape("the tokens are wgmma's N")):
        compose(layer, ComputeConfig(), attrs.evolve(base, tokens_on="m"), TARGET)
    wide = LayerConfig(n=4096, k=4096, scheme="w8a16-int8-channel")  # a 96-register widening: 200 for the consumers
    tuning = attrs.evolve(widened_weight_tunings(wide, TARGET).for_m(8192), block_m=176)
    with pytest.raises(ComposeError, match=re.escape("at most 160 tokens, whose accumulators fit the consumers' 200")):
        compose(wide, ComputeConfig(), tuning, TARGET)
    with pytest.raises(ComposeError, match=re.escape("'shared' serves 8-bit weights x 8-bit activations")):
        compose(layer, ComputeConfig(), attrs.evolve(tuning, b_operand="shared", a_load="tma"), TARGET)


HOST16 = r"""
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>
struct { unsigned x; } threadIdx;
"""
HOST16_MAIN = r"""
static int run_widen(int argc, char** argv) {
  const int n_blocks = std::atoi(argv[1]), k_tiles = std::atoi(argv[2]), group_rows = std::atoi(argv[3]);
  std::vector<unsigned char> b(static_cast<size_t>(n_blocks) * cfg::kSlicesPerN * cfg::kBSliceBytes);
  std::fread(b.data(), 1, b.size(), stdin);
  std::vector<u16> scale(static_cast<size_t>(group_rows) * cfg::kNPad);
  std::fread(scale.data(), 2, scale.size(), stdin);
  std::vector<unsigned char> stage(cfg::kStageBytes);
  for (int nt = 0; nt < n_blocks / 2; ++nt)  // 256-row tiles: two layout blocks
    for (int kt = 0; kt < k_tiles; ++kt) {
      std::memset(stage.data(), 0xA5, stage.size());  // poison: every panel byte must be written
      for (int i = 0; i < 2; ++i)  // load_weight_stage: each block's kSlicesPerStage slices, then the group rows
        std::memcpy(stage.data() + cfg::kAStageBytes + i * cfg::kSlicesPerStage * cfg::kBSliceBytes,
                    b.data() + (static_cast<size_t>(2 * nt + i) * cfg::kSlicesPerN + kt * cfg::kSlicesPerStage) *
                                   cfg::kBSliceBytes, cfg::kSlicesPerStage * cfg::kBSliceBytes);
#if GROUP_ROWS
      for (int r = 0; r < cfg::kGroupRows; ++r)
        std::memcpy(stage.data() + cfg::kBScaleOffset + r * cfg::kBlockN * 2,
                    scale.data() + static_cast<size_t>(kt * cfg::kGroupRowsPerKTile / cfg::kKTilesPerGroup + r) *
                                       cfg::kNPad + nt * 256, cfg::kBlockN * 2);
#endif
      for (int unit = 0; unit < kWidenUnits; ++unit)
        for (int lane = 0; lane < 32; ++lane) {
          threadIdx.x = lane;
          widen_unit(stage.data(), stage.data() + cfg::kBPanelOffset, unit, lane);
        }
      std::fwrite(stage.data() + cfg::kBPanelOffset, 1, cfg::kBlockN * cfg::kBlockK * 2, stdout);
    }
  return 0;
}
"""


G32 = hg.QuantScheme("int4", group_size=32, scale_dtype="bfloat16")  # two groups a k16 pair of steps: not hoisted


@pytest.mark.parametrize("scheme", ["w4a16-int4-g128", "w3a16-int3-g128", "w4a16-int4-channel", "w8a16-int8-channel",
                                    G32], ids=["int4-g128", "int3-g128", "int4-channel", "int8-channel", "int4-g32"])
def test_rendered_dequantization_writes_the_panels(scheme, tmp_path) -> None:
    """Every panel byte of every stage against the weight dequantized in float64 and rounded once to bf16, at
    panel row 64 t + 16 w + r of weight row 64 w + 16 t + r (t: 16-row n tile of 64-row warp slice w), swizzled."""
    if CXX is None:
        pytest.skip("no host C++ compiler (g++) to run the rendered template")
    from test_numeric_templates_host import PRELUDE as NUMERIC_PRELUDE

    n, k = 500, 384  # two 256-row tiles (the second part padding), six 64-k stages
    g = torch.Generator().manual_seed(11)
    qw = (hg.scheme(scheme) if isinstance(scheme, str) else scheme).quantize(torch.randn(n, k, generator=g) * 0.05)
    layer, plan = _widened16(scheme, 4096, n=n, k=k)
    assert plan.pipeline == "warp_specialized" and plan.tuning.b_operand == "widened"
    prepared = prepare_weight(plan, qw, "cpu")
    lay = plan.layout
    src = generate(plan)
    groups = plan.group is not None
    assert not groups or plan.group.tensors == ("b_scale",)  # (the harness copies the one scale tensor's rows)
    sections = "".join(_sections(src, h) for h in ("numeric.", "memory.BChunkShared", "memory.GroupParamsShared",
                                                   "memory.WeightWidenDequant"))
    n_blocks, k_tiles = lay.n_pad // 128, lay.k_pad // 64
    stdin = prepared.b.contiguous().view(torch.uint8).numpy().tobytes()
    group_rows = 0
    if groups:
        stdin += prepared.b_scale.contiguous().view(torch.int16).numpy().tobytes()
        group_rows = prepared.b_scale.shape[0]
    prelude = (PRELUDE + NUMERIC_PRELUDE.replace("#include <cstdio>", "") + HOST16
               + "static inline u32 fma2(u32 a, u32 b, u32 c) { return fma2_typed(a, b, c, true); }\n")
    out = _run_host(tmp_path, "widen16", prelude, src, sections,
                    HOST16_MAIN.replace("GROUP_ROWS", "1" if groups else "0"), [n_blocks, k_tiles, group_rows], stdin)
    got = torch.from_numpy(np.frombuffer(out, dtype=np.int16).copy()).view(n_blocks // 2, k_tiles, 256, 64)
    # expected: row-permuted, swizzled panels of the bf16 weight (channel scales multiply the output instead: the
    # panels hold the codes' values); rows past N and k past K are not compared (zero activations meet them)
    w = torch.zeros(lay.n_pad, lay.k_pad, dtype=torch.float64)
    values = qw.dequantize(torch.float64)
    if qw.scheme.granularity == "channel":
        values = values / qw.scales.to(torch.float64).view(n, 1)
    w[:n, :k] = values
    valid = torch.zeros(lay.n_pad, lay.k_pad, dtype=torch.bool)
    valid[:n, :k] = True
    wb = w.to(torch.bfloat16).view(torch.int16).view(n_blocks // 2, 4, 4, 16, k_tiles, 64)  # [tile][w][t][r][kt][k]
    rows = wb.permute(0, 4, 2, 1, 3, 5).reshape(n_blocks // 2, k_tiles, 256, 64)  # panel row 64 t + 16 w + r
    p_row = torch.arange(256).view(256, 1)
    chunk = torch.arange(64).view(1, 64) // 8
    swizzled = (chunk ^ (p_row % 8)) * 8 + torch.arange(64).view(1, 64) % 8  # element position in the panel row
    expected = torch.empty_like(rows)
    expected[..., p_row.expand(256, 64), swizzled] = rows
    checked = torch.empty_like(rows, dtype=torch.bool)
    checked[..., p_row.expand(256, 64), swizzled] = (valid.view(n_blocks // 2, 4, 4, 16, k_tiles, 64)
                                                     .permute(0, 4, 2, 1, 3, 5).reshape(rows.shape))
    wrong = ((got != expected) & checked).nonzero()
    assert wrong.numel() == 0, f"{len(wrong)} values differ, first (tile, k tile, panel row, element) {wrong[:4].tolist()}"


CONSUMER_HOST = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <deque>
typedef unsigned int u32; typedef unsigned short u16;
#define __device__
#define __forceinline__ inline
struct D3 { unsigned x; } threadIdx, blockIdx, gridDim;
CFG
namespace hg {
struct Params { int m; };
struct TileCoord { int n0, m0, kt_begin, kt_end, split, tile; };
static TileCoord unit_coord(int unit) { return TileCoord{0, 0, 0, 3 + unit % 4, 0, unit}; }
static TileCoord unit_coord(const Params&, int unit) { return unit_coord(unit); }
RING_DESC
static u32 SMEM = 0x400;  // ring base (1024-aligned)
static int fails = 0;
#define FAIL(...) do { std::printf("FAIL: " __VA_ARGS__); std::printf("\n"); if (++fails > 20) std::exit(1); } while (0)
static int stage_of(u32 addr) { return (addr - SMEM) / cfg::kStageBytes; }
static bool full_ok[16], widened_ok[16];
struct Op { int stage; };
static std::vector<Op> open_group; static std::deque<std::vector<Op>> pending;
static int cur_kwg, expected_step[16], k16 = 0;
static void mbarrier_wait(u32 bar, int) {
  u32 full0 = SMEM + cfg::kStages * cfg::kStageBytes;
  int idx = (bar - full0) / 8;
  if (idx < cfg::kStages) full_ok[idx] = true;
  else if (idx >= 2 * cfg::kStages) { if (!full_ok[idx - 2 * cfg::kStages]) FAIL("widened waited before full"); widened_ok[idx - 2 * cfg::kStages] = true; }
  else FAIL("consumer waits on an empty barrier");
}
static void mbarrier_arrive(u32 bar) {
  u32 empty0 = SMEM + cfg::kStages * cfg::kStageBytes + cfg::kStages * 8;
  int s = (bar - empty0) / 8;
  if (s < 0 || s >= cfg::kStages) { FAIL("arrive on a non-empty barrier"); return; }
  for (auto& g : pending) for (auto& o : g) if (o.stage == s) FAIL("stage %d released while a wgmma reading it is pending", s);
  for (auto& o : open_group) if (o.stage == s) FAIL("stage %d released with an uncommitted wgmma reading it", s);
  if (!full_ok[s] || !widened_ok[s]) FAIL("stage %d released without being acquired", s);
  full_ok[s] = widened_ok[s] = false;
}
static void fence_async_shared() {}
static void wgmma_fence() {}
static void wgmma_commit() { pending.push_back(open_group); open_group.clear(); }
template <int N> static void wgmma_wait() { while ((int)pending.size() > N) pending.pop_front(); }
static void fence_accumulators(float (&)[cfg::kWarpMTiles][4]) {}
static long long ops = 0;
// decode and check: A = panel rows 64 (kTile0 + i) of the stage's panel step / 4, k 16 step; B = activation step
static void wgmma_m64nNNNk16(float (&d)[cfg::kWarpMTiles][4], unsigned long long a, unsigned long long b, int accumulate) {
  static int seq = 0;
  auto addr = [](unsigned long long x) { return (u32)((x & 0x3FFF) << 4); };
  auto check_bits = [](unsigned long long x, const char* w) {
    if (((x >> 16) & 0x3FFF) != 1 || ((x >> 32) & 0x3FFF) != 64 || ((x >> 49) & 7) != 0 || (x >> 62) != 1) FAIL("%s descriptor bits %llx", w, x);
  };
  check_bits(a, "A"); check_bits(b, "B");
  u32 aa = addr(a), ba = addr(b);
  int s = stage_of(ba);
  if (stage_of(aa) != s) FAIL("A and B from different stages");
  if (!full_ok[s] || !widened_ok[s]) FAIL("wgmma on stage %d before its full and widened waits", s);
  u32 aoff = aa - (SMEM + s * cfg::kStageBytes) - cfg::kBPanelOffset, boff = ba - (SMEM + s * cfg::kStageBytes);
  int panel = aoff / cfg::kBPanelBytes, rest = aoff % cfg::kBPanelBytes, row = rest / 128, kbyte = rest % 128;
  int bpanel = boff / kAPanelBytes, bkbyte = boff % kAPanelBytes;
  int step = panel * 4 + kbyte / 32;
  if (row % 64 || kbyte % 32) FAIL("A at row %d byte %d", row, kbyte);
  if (bpanel * 4 + bkbyte / 32 != step || bkbyte % 32) FAIL("A step %d, B at panel %d byte %d", step, bpanel, bkbyte);
  int i = (seq++) % cfg::kWarpNTiles;
  if (row / 64 != cur_kwg * cfg::kWarpNTiles + i) FAIL("instruction %d of warpgroup %d reads n tile %d", i, cur_kwg, row / 64);
  if (step != expected_step[0]) FAIL("step %d, expected %d", step, expected_step[0]);
  if (i == cfg::kWarpNTiles - 1) expected_step[0] = (expected_step[0] + 1) % cfg::kStepsPerStage;
  if ((accumulate != 0) != (k16 > 0)) FAIL("accumulate=%d at k16 step %d of the unit", accumulate, k16);
  if (i == cfg::kWarpNTiles - 1) ++k16;
  open_group.push_back(Op{s}); ++ops;
}
static int stored = 0;
template <class P> static void store_output(float (&)[cfg::kWarpNTiles][cfg::kWarpMTiles][4], const P&, int, int, u32 = 0) {
  if (!pending.empty() || !open_group.empty()) FAIL("epilogue with wgmmas pending");
  ++stored; k16 = 0;
}
template <class P> static void store_output(float (&a)[cfg::kWarpNTiles][cfg::kWarpMTiles][4], const P& p, int n0, int m0, int, int) {}
"""
CONSUMER_MAIN = r"""
}  // namespace hg
int main() {
  using namespace hg;
  Ring ring{}; ring.smem = hg::SMEM; ring.full_bars = ring.smem + cfg::kStages * cfg::kStageBytes;
  ring.empty_bars = ring.full_bars + cfg::kStages * 8; ring.widened_bars = ring.empty_bars + cfg::kStages * 8;
  Params p{1}; blockIdx.x = 0; gridDim.x = 1;
  // every consumer thread (one thread per warpgroup is enough: the stubs are per thread); fresh ring per warpgroup
  for (int kwg = 0; kwg < (cfg::kConsumerThreads / 128); ++kwg) {
    cur_kwg = kwg; threadIdx.x = 128 * (kwg + 1);
    for (int s = 0; s < 16; ++s) full_ok[s] = widened_ok[s] = false;
    expected_step[0] = 0;
    if (kwg == 0) consume<0>(p, ring, 6); else consume<1>(p, ring, 6);
    for (int s = 0; s < 16; ++s) if (full_ok[s] || widened_ok[s]) FAIL("stage %d never released", s);
  }
  std::printf("ops %lld stored %d fails %d\n", ops, stored, fails);
  return fails != 0;
}
"""


@pytest.mark.parametrize("scheme,m,dtype", [("w4a16-int4-g128", 4096, "bfloat16"), ("w4a16-int4-g128", 8192, "bfloat16"),
                                            ("w4a16-int4-g128-zp", 4096, "float16"), ("w8a16-int8-channel", 1024, "bfloat16")])
def test_widened_16bit_consumer_loop_on_the_host(scheme: str, m: int, dtype: str, tmp_path) -> None:
    """The rendered 16-bit widened consume() run on the host with stubs for wgmma and the barriers, six units of a
    few k tiles each: every wgmma's two descriptors decoded (swizzle, LBO / SBO bits; A = panel rows 64 (kTile0 + i)
    of the stage's panel at the step's 32-byte offset, B = the same k16 step of the activation tile, same stage),
    issued only after the stage's full and widened waits, accumulate = 0 exactly at a unit's first step, and no stage
    released while an uncommitted or pending wgmma reads it, every acquired stage released, no epilogue with
    wgmmas in flight."""
    if CXX is None:
        pytest.skip("no host C++ compiler (g++) to run the rendered template")
    layer, plan = _widened16(scheme, m, dtype=dtype)
    assert plan.tuning.split_k == 1, "the stubs model whole tiles"
    src = generate(plan)
    cfg = cfg_namespace(src)
    ring = src[src.index("struct Ring {"):]
    ring = ring[:ring.index("};") + 2]
    desc = re.search(r"__device__ __forceinline__ unsigned long long smem_descriptor.*?\n}\n", src, re.S).group(0)
    astep = (re.search(r"constexpr int kAPanelBytes.*?\n", src).group(0)
             + re.search(r"__device__ __forceinline__ unsigned long long a_step_descriptor.*?\n}\n", src, re.S).group(0))
    consume = re.search(r"template <int kWg>\n__device__ __forceinline__ void consume\(.*?\n}\n", src, re.S).group(0)
    harness = (CONSUMER_HOST.replace("NNN", str(plan.tuning.block_m)).replace("CFG", cfg)
               .replace("RING_DESC", ring + "\n" + desc + astep) + consume + CONSUMER_MAIN)
    (tmp_path / "consumer.cpp").write_text(harness)
    exe = tmp_path / "consumer"
    log = subprocess.run([CXX, "-std=c++17", "-O0", "-w", "-o", str(exe), str(tmp_path / "consumer.cpp")],
                         capture_output=True, text=True)
    assert log.returncode == 0, log.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and "fails 0" in run.stdout, run.stdout[-2000:]

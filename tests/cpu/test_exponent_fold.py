"""Folded e8m0 group scales (humming_gen.components.numeric.exponent_fold): the delta window against the format
classes, the rebased-table widening (Python model and the rendered template compiled for the host) over every code,
delta and position, the split of the scales into row exponents and deltas against a torch reference, the b_exponent
layout, the prepared weight, the layer's fold / fallback choice, and the folded kernels: source, refusals, NVRTC and
NVCC compilation for sm_90a without spills or wgmma serialization.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.codegen.render import environment
from humming_gen.components.numeric.exponent_fold import (ExponentFold, exponent_window, fold_exponents,
                                                          fold_reasons, pack_exponents, weight_reasons)
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.formats import dtype
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build_many, generate
from humming_gen.pipelines.weights import prepare_weight
from humming_gen.runtime.compile import fatal_warnings
from humming_gen.targets import get_target
from test_w4a8 import CXX, PRELUDE, _word

E2M1 = dtype("float4e2m1")
E4M3 = dtype("float8e4m3")
SM90 = get_target("sm_90a")
SCHEME = "w4a8-mxfp4-fp8"
FOLD = ExponentFold(weight=E2M1)


# --- the window: every e2m1 value times 2^d is a normal e4m3 value, and no wider window is ---------------------
def _normal_e4m3(values: torch.Tensor) -> bool:
    """Every value is an e4m3 value, and a normal one where nonzero."""
    exact = torch.equal(E4M3.decode(E4M3.encode(values)).double(), values)
    return exact and bool(((values == 0) | (values.abs() >= 2.0 ** -6)).all())


def test_window_of_e2m1_is_exact_for_every_code_and_as_wide_as_can_be() -> None:
    assert exponent_window(E2M1) == (-5, 6)
    values = E2M1.decode(torch.arange(16)).double()
    for d in range(-5, 7):
        assert _normal_e4m3(values * 2.0 ** d), d
    assert not _normal_e4m3(values * 2.0 ** -6)  # 0.5 * 2^-6 is an e4m3 subnormal
    assert not _normal_e4m3(values * 2.0 ** 7)  # 6 * 2^7 = 768 > 448


def test_formats_with_e4m3_subnormal_values_do_not_fold() -> None:
    """The lookup adds d to the exponent fields of the values' own e4m3 codes: a format with a value below e4m3's
    smallest normal (e2m1 with bias 7: 2^-7) would widen wrongly for every d, though some d make all its values
    normal; its window is None and the fold is refused."""
    from humming_gen.formats import FloatType

    low = FloatType(2, 1, bias=7)
    assert float(low.decode(torch.tensor([1])).item()) == 2.0 ** -7
    assert exponent_window(low) is None
    assert "not all normal e4m3 values" in weight_reasons(low)[0]
    assert weight_reasons(E2M1) == []


def _fp8(weight: str, **kw) -> hg.QuantScheme:
    kw = {"group_size": 32, "scale_dtype": "float8e8m0", **kw}
    return hg.QuantScheme(weight, activation=hg.ActivationScheme("float8e4m3", granularity="token"), **kw)


def test_fold_reasons_name_what_does_not_fold() -> None:
    assert fold_reasons(hg.scheme(SCHEME)) == [] and fold_reasons(_fp8("float4e2m1")) == []
    assert fold_reasons(_fp8("float4e0m3", group_size=64)) == []  # another sign-magnitude format
    assert "e8m0 group scales" in fold_reasons(_fp8("float4e2m1", group_size=16, scale_dtype="float8e4m3"))[0]
    assert "multiple of 32" in fold_reasons(_fp8("float4e2m1", group_size=48))[0]
    assert "global scale" in fold_reasons(_fp8("float4e2m1", global_scale=True))[0]
    assert "not fp8" in fold_reasons(hg.scheme("w4a16-mxfp4"))[0]
    assert "codes 8-15" in weight_reasons(dtype("int4"))[0] and "codes 8-15" in weight_reasons(dtype("uint2"))[0]
    assert "at most 4 bits" in weight_reasons(dtype("float8e4m3"))[0]


# --- the widening with rebased tables, every code in every position and every delta -----------------------------
DELTAS = list(range(-5, 7))


def _exponent_word(deltas: list[int]) -> int:
    """A row's exponent word: byte j holds delta j mod 16 in the e4m3 exponent field."""
    return sum(((d & 0xF) << 3) << 8 * j for j, d in enumerate(deltas))


def _fold_cases() -> list[tuple[int, int, int, int, list[list[int]], tuple[int, int]]]:
    """(word, exponents of row g, exponents of row g + 8, step, codes[xy][byte], (d_x, d_y)): every code in every
    one of the eight nibble positions under every delta of row g (x) and of row g + 8 (y), the other row's delta
    and the other bytes of the exponent words different, so a mixed-up row or step shows."""
    cases = []
    for i, d in enumerate(DELTAS):
        step = i % 4
        for slot in range(8):
            for code in range(16):
                cs = [[(code * 5 + 3 * s + 1) % 16 for s in range(4 * xy, 4 * xy + 4)] for xy in range(2)]
                cs[slot // 4][slot % 4] = code
                other = DELTAS[-1 - i]
                dx, dy = (d, other) if slot < 4 else (other, d)
                ex = [dx if j == step else DELTAS[(i + 3 * j + 1) % 12] for j in range(4)]
                ey = [dy if j == step else DELTAS[(i + 5 * j + 2) % 12] for j in range(4)]
                cases.append((_word("e4m3", cs), _exponent_word(ex), _exponent_word(ey), step, cs, (dx, dy)))
    return cases


CASES = _fold_cases()


def _expected(cs: list[list[int]], deltas: tuple[int, int]) -> tuple[int, int]:
    """The e4m3 bytes of code value x 2^d, from the format classes."""
    out = []
    for xy in range(2):
        values = E2M1.decode(torch.tensor(cs[xy])).double() * 2.0 ** deltas[xy]
        out.append(sum(int(b) << 8 * j for j, b in enumerate(E4M3.encode(values).tolist())))
    return out[0], out[1]


def test_fold_model_is_exact_for_every_code_position_and_delta() -> None:
    for word, ex, ey, step, cs, deltas in CASES:
        got = FOLD.emulate(word, FOLD.table_model(ex, step), FOLD.table_model(ey, step))
        assert got == _expected(cs, deltas), (hex(word), hex(ex), hex(ey), step, cs, deltas)


def test_fold_model_leaves_zeros_and_signs_alone() -> None:
    """Code 0 stays 0x00 and code 8 (-0) 0x80 under every delta; codes 9-15 keep the sign bit."""
    for d in DELTAS:
        table = FOLD.table_model(_exponent_word([d] * 4), 0)
        x, y = FOLD.emulate(_word("e4m3", [[0, 8, 9, 15], [8, 0, 1, 7]]), table, table)
        assert x & 0xFFFF == 0x8000 and x >> 16 & 0x80 and x >> 24 & 0x80
        assert y & 0xFFFF == 0x0080 and not y >> 16 & 0x80, (d, hex(x), hex(y))


@pytest.fixture(scope="module")
def host_fold() -> list[tuple[int, int]]:
    """The rendered exponent_fold template, compiled with g++ and run on CASES."""
    if CXX is None:
        pytest.skip("no host C++ compiler (g++) to run the rendered template")
    import tempfile
    from pathlib import Path

    rows = ",\n".join(f"{{0x{w:08X}u, 0x{ex:08X}u, 0x{ey:08X}u, {step}}}" for w, ex, ey, step, _, _ in CASES)
    src = (PRELUDE + environment().get_template(FOLD.template).render(**FOLD.context()) + f"""
int main() {{
  const u32 cases[][4] = {{{rows}}};
  for (const auto& c : cases) {{
    u32 x, y;
    nibbles_to_a8_folded(c[0], x, y, fold_table(c[1], c[3]), fold_table(c[2], c[3]));
    std::printf("%u %u\\n", x, y);
  }}
  return 0;
}}
""")
    with tempfile.TemporaryDirectory() as d:
        cpp, exe = Path(d) / "fold.cpp", Path(d) / "fold"
        cpp.write_text(src)
        subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(exe), str(cpp)], check=True, capture_output=True)
        values = [int(v) for v in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    return list(zip(values[::2], values[1::2]))


def test_rendered_fold_is_exact_for_every_code_position_and_delta(host_fold) -> None:
    assert len(host_fold) == len(CASES)
    wrong = [(hex(w), step, deltas, [hex(v) for v in got]) for (w, _, _, step, cs, deltas), got in zip(CASES, host_fold)
             if got != _expected(cs, deltas)]
    assert not wrong, f"(word, step, deltas, got) {wrong[:4]}"


# --- row exponents and deltas ---------------------------------------------------------------------------------
def _reference_split(scales: torch.Tensor, window: tuple[int, int]):
    """The split written plainly: exponents by log2, r = the row's largest minus window[1]."""
    e = torch.log2(scales.double()).round().long()
    r = e.max(dim=1).values - window[1]
    return r, e - r[:, None]


def test_fold_exponents_match_a_torch_reference_and_refuse_wide_rows() -> None:
    torch.manual_seed(0)
    n, groups = 300, 40
    base = torch.randint(-120, 110, (n, 1))
    spread = torch.randint(0, 12, (n, 1))  # each row's exponents span at most 11
    e = base + (torch.rand(n, groups) * (spread + 1)).floor().long()
    scales = torch.ldexp(torch.ones(n, groups, dtype=torch.float64), e).float()
    folded = fold_exponents(scales, (-5, 6))
    r, d = _reference_split(scales, (-5, 6))
    assert folded is not None
    assert torch.equal(folded.row_exponent.long(), r) and torch.equal(folded.deltas.long(), d)
    assert int(d.min()) >= -5 and int(d.max()) == 6
    assert torch.equal(torch.ldexp(torch.ones_like(scales, dtype=torch.float64), (r[:, None] + d)).float(), scales)
    e[7, 3] = e[7].max() - 12  # a span of 12: that row cannot fold, so neither can the layer
    assert fold_exponents(torch.ldexp(torch.ones(n, groups, dtype=torch.float64), e).float(), (-5, 6)) is None
    for bad in (0.75, 0.0, float("nan"), float("inf")):
        assert fold_exponents(torch.full((2, 2), bad), (-5, 6)) is None, bad


def test_empty_groups_neither_bound_their_row_nor_block_the_fold() -> None:
    """A group whose codes are all zero multiplies nothing: its scale (the quantizer gives such groups 2^0, far from
    a small row's) is left out of the row's exponent and span, its delta is clamped into the window."""
    from humming_gen.components.numeric.exponent_fold import empty_groups

    scales = torch.ldexp(torch.ones(2, 4, dtype=torch.float64), torch.tensor([[-20, -21, 0, -25], [3, 3, 3, 3]])).float()
    assert fold_exponents(scales, (-5, 6)) is None  # the 2^0 group spans 25 binades beside the others
    empty = torch.tensor([[False, False, True, False], [True, True, True, True]])
    folded = fold_exponents(scales, (-5, 6), empty)
    assert folded is not None
    assert folded.row_exponent.tolist() == [-26, 0]  # row 0: largest used exponent -20 minus 6; row 1: all empty
    assert folded.deltas[0].tolist() == [6, 5, 6, 1] and folded.deltas[1].tolist() == [0, 0, 0, 0]
    nan = scales.clone()
    nan[0, 2] = float("nan")  # an empty group's scale is never read
    assert fold_exponents(nan, (-5, 6), empty) is not None
    codes = torch.tensor([[0, 8, 1, 0, 8, 8, 0], [0, 0, 0, 0, 0, 0, 9]], dtype=torch.uint8)  # e2m1: 8 is -0
    assert empty_groups(codes, E2M1, 2).tolist() == [[True, False, True, True], [True, True, True, False]]


def test_exponent_words_follow_the_documented_layout() -> None:
    """Word [n block][128-k block][row], byte j: the row's k32 step 4 * block + j, d mod 16 in bits 3-6; steps
    of a group of 64 repeat its delta, steps past the last group take its delta, padded rows hold 0."""
    torch.manual_seed(1)
    n, groups, group_size, n_pad, k_pad = 200, 5, 64, 256, 512
    deltas = torch.randint(-5, 7, (n, groups), dtype=torch.int32)
    words = pack_exponents(deltas, group_size, n_pad, k_pad)
    assert words.shape == (n_pad // 128, k_pad // 128, 128) and words.dtype == torch.int32
    for row in (0, 77, 127, 128, 199, 200, 255):
        for step in range(k_pad // 32):
            byte = (int(words[row // 128, step // 4, row % 128]) >> 8 * (step % 4)) & 0xFF
            if row >= n:
                assert byte == 0, (row, step)
                continue
            d = int(deltas[row, min(step * 32 // group_size, groups - 1)])
            assert byte == (d & 0xF) << 3, (row, step, byte, d)


# --- prepared weight, the layer's choice ----------------------------------------------------------------------
def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(n, k) * 0.05


def test_prepared_weight_carries_both_forms_of_the_scales() -> None:
    """b_exponent and out_scale give back every group scale (2^r * 2^d); the fp32 group scales stay for the
    standard pipeline's kernels, which read the same prepared weight."""
    n, k = 300, 640
    layer = LayerConfig(n, k, SCHEME, fold_scales=True)
    # the heuristics' own plan (warp-specialized at every M on sm_90a) and the standard pipeline's (quantize_in_gemm,
    # batch invariance, other targets' kernels): one layout
    tunings = (list(choose_tunings(layer, SM90).tunings())
               + list(choose_tunings(layer, SM90, pipeline="standard", stored=False).tunings()))
    plans = [compose(layer, ComputeConfig(), t, SM90) for t in tunings]
    plans.sort(key=lambda p: p.pipeline)  # the warp-specialized (folding) plan last
    assert {p.pipeline for p in plans} == {"standard", "warp_specialized"} and len({p.layout for p in plans}) == 1
    qw = hg.scheme(SCHEME).quantize(_weight(n, k))
    pw = prepare_weight(plans[-1], qw, "cpu")
    lay = plans[-1].layout
    groups = qw.scales.shape[1]
    assert torch.equal(pw.b_scale[:groups, :n], qw.scales.t())
    steps = lay.k_pad // 32
    fields = torch.stack([(pw.b_exponent[:, s // 4, :].reshape(-1) >> 8 * (s % 4)) & 0xFF for s in range(steps)], 1)
    d = (fields >> 3).long()
    d = torch.where(d >= 8, d - 16, d)[:n]  # d mod 16 back to [-8, 7]
    rebuilt = pw.out_scale[:n, None].double() * torch.ldexp(torch.ones_like(d, dtype=torch.float64), d)
    assert torch.equal(rebuilt[:, :groups].float(), qw.scales)
    assert not pw.out_scale[n:].any() and not fields[n:].any()
    w = _weight(n, k)
    w[0, :32] *= 2.0 ** -14
    with pytest.raises(ValueError, match="do not fold"):  # a plan that folds, data that does not
        prepare_weight(plans[-1], hg.scheme(SCHEME).quantize(w), "cpu")


def test_layer_folds_random_mxfp4_and_falls_back_for_a_wide_row() -> None:
    w = _weight(256, 1024)
    folded = hg.QuantLinear.from_float(w, SCHEME, target="sm_90a", device="cpu")
    assert folded.fold_scales and folded.layer_config.fold_scales and "fold_scales=True" in repr(folded)
    for kernel in folded.kernels:
        ws = kernel.plan.pipeline == "warp_specialized"
        assert kernel.name.endswith("_fold") == ws, kernel.name
        assert ("b_exponent" in kernel.source) == ws and ("load_weight_group_scales" in kernel.source) != ws
    assert folded.weight.b_exponent is not None and folded.weight.b_scale is not None

    w[5, 64:96] *= 2.0 ** -12  # one group 12 binades below its row's largest: the row spans more than 11
    fallback = hg.QuantLinear.from_float(w, SCHEME, target="sm_90a", device="cpu")
    assert not fallback.fold_scales and fallback.weight.b_exponent is None
    assert not any(k.name.endswith("_fold") for k in fallback.kernels)
    assert all("cfg::kWeightScaleOffset" in k.source for k in fallback.kernels  # the group scales staged
               if k.plan.pipeline == "warp_specialized")
    w[5, 64:96] *= 2.0  # 11 binades: folds again
    assert hg.QuantLinear.from_float(w, SCHEME, target="sm_90a", device="cpu").fold_scales


def test_a_layer_with_an_all_zero_group_still_folds() -> None:
    """Small weights (e8m0 exponents around -16) with one group of zeros (scale 2^0): the layer folds, and its
    prepared scales give back every used group's scale."""
    n, k = 256, 1024
    w = _weight(n, k) * 0.001
    w[3, 256:288] = 0.0
    qw = hg.scheme(SCHEME).quantize(w)
    assert float(qw.scales[3, 8]) == 1.0 and float(qw.scales[3].min()) < 2.0 ** -12
    layer = hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu")
    assert layer.fold_scales
    pw, lay = layer.weight, layer.kernels[-1].plan.layout
    fields = torch.stack([(pw.b_exponent[:, s // 4, :].reshape(-1) >> 8 * (s % 4)) & 0xFF
                          for s in range(lay.k_pad // 32)], 1)
    d = (fields >> 3).long()
    d = torch.where(d >= 8, d - 16, d)[:n]
    rebuilt = (pw.out_scale[:n, None].double() * torch.ldexp(torch.ones_like(d, dtype=torch.float64), d)).float()
    used = torch.ones(n, k // 32, dtype=torch.bool)
    used[3, 8] = False
    assert torch.equal(rebuilt[used], qw.scales[used])
    assert -5 <= int(d[3, 8]) <= 6


def test_layer_folds_only_where_warp_specialized_kernels_run() -> None:
    """No warp-specialized 8-bit kernel, no fold: sm_89, weight-only (16-bit activations), batch invariance
    (standard pipeline), other weight formats."""
    w = _weight(256, 512)
    assert not hg.QuantLinear.from_float(w, SCHEME, target="sm_89", device="cpu").fold_scales
    assert not hg.QuantLinear.from_float(w, SCHEME, target="sm_90a", device="cpu", weight_only=True).fold_scales
    assert not hg.QuantLinear.from_float(w, SCHEME, target="sm_90a", device="cpu", batch_invariant=True).fold_scales
    assert not hg.QuantLinear.from_float(w, "w4a8-int4-g128-fp8", target="sm_90a", device="cpu").fold_scales


def test_tunings_of_the_unfolded_layer_leave_room_for_the_deltas() -> None:
    """The unfolded warp-specialized kernels stage their fp32 group scales with each stage (4 x 512 B at 128 k), more
    than the folded deltas (512 B): a tuning chosen for the unfolded layer, the deepest at 192 tokens (6 stages)
    included, fits folded too, so an explicit one still folds."""
    from humming_gen.pipelines.base import TuningPlan

    w = _weight(256, 1024)
    plain = choose_tunings(LayerConfig(256, 1024, SCHEME), SM90, stored=False)
    big = plain.for_m(100000)
    assert big.block_m == 192 and big.stages == 6
    layer = hg.QuantLinear.from_float(w, SCHEME, target="sm_90a", device="cpu", tunings=TuningPlan(((None, big),)))
    assert layer.fold_scales and layer.kernels[0].name.endswith("_fold")


# --- the folded kernels ---------------------------------------------------------------------------------------
def test_layer_config_refuses_fold_for_schemes_that_cannot() -> None:
    assert "fold_scales" not in LayerConfig(64, 256, SCHEME).to_dict()  # unfolded configs keep their JSON and keys
    assert LayerConfig.from_json(LayerConfig(64, 256, SCHEME, fold_scales=True).to_json()).fold_scales
    for scheme, needle in (("w4a8-int4-g128-fp8", "e8m0 group scales"), ("w4a16-mxfp4", "not fp8"),
                           ("w8a8-fp8-block128", "e8m0 group scales")):
        with pytest.raises(ValueError, match=f"fold_scales=True: .*{needle}"):
            LayerConfig(64, 256, scheme, fold_scales=True)


def test_folded_source_promotes_no_group_scales() -> None:
    folded = LayerConfig(8192, 8192, SCHEME, fold_scales=True, has_bias=True)
    plain = LayerConfig(8192, 8192, SCHEME, has_bias=True)
    t = choose_tunings(folded, SM90).for_m(2048)
    # (the band is the 128-token panels' tiles' raster whatever the scales: heuristics.tuning_for_a8)
    assert t.raster == "m_band" and t.a_load == "tma" and choose_tunings(plain, SM90).for_m(2048).raster == "m_band"
    plan = compose(folded, ComputeConfig(), t, SM90)
    src = generate(plan)
    c = dict((name, value) for name, value, _ in plan.constants)
    assert c["kPromoteK"] == 128 and c["kExponentOffset"] == c["kAStageBytes"] + 2 * c["kBSliceBytes"]
    for present in ("nibbles_to_a8_folded(v.x", "fold_table(exponents[0]", "p.b_exponent", "p.out_scale"):
        assert present in src, present
    for gone in ("nibbles_to_a8(", "load_weight_group_scales", "b_scale", "w_scale"):
        assert gone not in src, gone


def test_component_declarations_match_the_rendered_source() -> None:
    from symbols import declaration_mismatches

    layer = LayerConfig(4000, 3072, SCHEME, fold_scales=True, has_bias=True)
    wrong = {}
    for t in choose_tunings(layer, SM90).tunings():
        wrong.update(declaration_mismatches(compose(layer, ComputeConfig(), t, SM90)))
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())


@pytest.mark.parametrize("compiler", ["nvrtc", pytest.param("nvcc", marks=pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="nvcc not installed"))])
def test_folded_kernels_compile_without_spills_or_wgmma_serialization(compiler: str) -> None:
    """Every warp-specialized bucket of 8192 x 8192 and 4000 x 3072 (bias, fp32 output) with NVRTC; with NVCC the
    largest token tiles (192 and 128) and a split-K one."""
    plans = []
    for n, k, kw in ((8192, 8192, {}), (4000, 3072, dict(has_bias=True, out_dtype="float32"))):
        layer = LayerConfig(n, k, SCHEME, fold_scales=True, **kw)
        tunings = [t for t in choose_tunings(layer, SM90).tunings() if t.pipeline == "warp_specialized"]
        if compiler == "nvcc":
            tunings = [t for t in tunings if t.block_m >= 128 or t.split_k > 1][:3]
        plans += [compose(layer, ComputeConfig(), t, SM90) for t in tunings]
    for kernel in build_many(plans, compiler=compiler):
        r = kernel.resources
        assert kernel.name.endswith("_fold")
        assert r.get("spill_store_bytes", 0) == 0 and r.get("spill_load_bytes", 0) == 0, (kernel.name, r)
        assert r.get("stack_bytes", 0) == 0, (kernel.name, r)
        assert not fatal_warnings(kernel.compiled.log), kernel.name

"""Weights of at most 4 bits with 8-bit activations (standard pipeline, mma.sync m16n8k32): the BLayoutNibble8
layout, the nibble-to-int8 and nibble-to-e4m3 widening (rendered templates compiled for the host and run over every
code in every position), the chain packing -> 16-byte load -> widening -> atom fragment for every (n, k),
composition and refusals, NVRTC compilation without spills, and prepared weights.

Expected positions are computed here from the packing docstring, not from its index helpers: global order
[n block][k slice][warp n][tile pair][lane][4 words], tiles (16 n x 32 k) numbered k-step-major, tile 2p + j in
words 2j and 2j + 1; lane (g, t) holds row g (+8 for odd registers), k 4t..4t+3 (+16 for registers 2, 3); word
2j + q holds registers 2q (X) and 2q + 1 (Y); code bit positions per order as below.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.codegen.render import environment
from humming_gen.components.mma.atoms import MMA_SYNC_M16N8K32_8BIT as ATOM
from humming_gen.components.numeric.nibble8 import NibbleToE4m3, NibbleToInt8
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.formats import dtype
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build
from humming_gen.pipelines.base import ComposeError
from humming_gen.pipelines.standard import compose_a8 as standard_a8
from humming_gen.pipelines.weights import prepare_weight
from humming_gen.schemes.packing import BLayoutNibble8, pack_nibbles8, unpack_nibbles8
from humming_gen.targets import get_target
from helpers import assert_no_spills

CXX = shutil.which("g++") or shutil.which("c++")
E4M3 = dtype("float8e4m3")
ORDERS = ("int8", "e4m3")
LAYOUTS = [(128, 2, 64), (64, 1, 32), (256, 4, 128), (32, 1, 64)]  # (block_n, warps_n, warp_k)


def _bit(order: str, xy: int, byte: int, bit: int) -> int:
    """Word bit of bit `bit` of code `byte` of register X (xy = 0) / Y (xy = 1), from the docstring's table."""
    if order == "int8":  # byte b = X code << 4 | Y code
        return 8 * byte + 4 * (1 - xy) + bit
    if bit < 3:  # low bits: X nibbles 0-3, Y nibbles 4-7
        return 16 * xy + 4 * byte + bit
    return 8 * byte + (7 if xy == 0 else 3)  # top bits: X at each byte's bit 7, Y at bit 3


def _word(order: str, codes: list[list[int]]) -> int:
    """The word holding codes[xy][byte]."""
    return sum(((codes[xy][b] >> i) & 1) << _bit(order, xy, b, i) for xy in range(2) for b in range(4)
               for i in range(4))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("spec", LAYOUTS, ids=lambda s: "bn{}-wn{}-wk{}".format(*s))
def test_nibble_layout_round_trip_and_every_position(spec, order: str) -> None:
    layout = BLayoutNibble8(*spec, order=order)
    assert not layout.check()
    n, k = 2 * layout.block_n, 3 * layout.warp_k
    codes = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(2)).to(torch.uint8)
    packed = pack_nibbles8(codes, layout)
    assert packed.dtype == torch.int32 and packed.numel() * 8 == n * k
    assert torch.equal(unpack_nibbles8(packed, layout, n, k), codes)
    words = packed.to(torch.int64).reshape(n // layout.block_n, k // layout.warp_k, -1) & 0xFFFFFFFF
    n_tiles, pairs = layout.warp_n // 16, layout.tiles_per_warp // 2
    nn = torch.arange(n).view(-1, 1).expand(n, k)
    kk = torch.arange(k).view(1, -1).expand(n, k)
    nb, n_in = nn // layout.block_n, nn % layout.block_n
    wn, n_warp = n_in // layout.warp_n, n_in % layout.warp_n
    ks, k_warp = kk // layout.warp_k, kk % layout.warp_k
    tile = (k_warp // 32) * n_tiles + n_warp // 16
    row, col = n_warp % 16, k_warp % 32
    lane = 4 * (row % 8) + (col % 16) // 4
    reg = row // 8 + 2 * (col // 16)
    word = ((wn * pairs + tile // 2) * 32 + lane) * 4 + 2 * (tile % 2) + reg // 2
    w = words[nb, ks, word]
    xy, byte = reg % 2, col % 4
    got = torch.zeros_like(w)
    for i in range(4):
        pos = torch.tensor([[_bit(order, x, b, i) for b in range(4)] for x in range(2)])[xy, byte]
        got |= ((w >> pos) & 1) << i
    assert torch.equal(got.to(torch.uint8), codes)  # every (n, k), each at its own place


def test_nibble_layout_refuses_odd_tile_counts() -> None:
    assert any("two tiles" in e for e in BLayoutNibble8(16, 1, 32, "int8").check())
    assert BLayoutNibble8(32, 1, 32, "e4m3").check() == []
    with pytest.raises(ValueError, match="order"):
        pack_nibbles8(torch.zeros(64, 64, dtype=torch.uint8), BLayoutNibble8(64, 1, 64, "fp8"))


# --- the widening, bit-exact over every code in every position ----------------------------------------------
def _int8_byte(fmt, code: int) -> int:
    """16 x the code's value as an int8 byte (codes of fewer bits sign-extended)."""
    return (16 * int(fmt.decode(torch.tensor([code])).item())) & 0xFF


def _nibble(fmt, code: int, order: str) -> int:
    """The nibble prepare_weight stores: the code, sign-extended to 4 bits for the int8 order."""
    if order == "int8" and code >> (fmt.bits - 1):
        return code | (0xF ^ ((1 << fmt.bits) - 1))
    return code


def _e4m3_byte(fmt, code: int) -> int:
    return int(E4M3.encode(fmt.decode(torch.tensor([code])).float()).item())


# (id, converter, weight format, order)
CONVERTERS = [("int4-int8", NibbleToInt8(weight="int4"), "int4", "int8"),
              ("int3-int8", NibbleToInt8(weight="int3"), "int3", "int8"),
              ("int2-int8", NibbleToInt8(weight="int2"), "int2", "int8")]
CONVERTERS += [(f"{n}-e4m3", NibbleToE4m3(weight=dtype(n)), n, "e4m3")
               for n in ("int4", "uint4", "float4e2m1", "int3", "uint2", "int2")]


def _cases(fmt, order: str) -> list[tuple[int, list[list[int]]]]:
    """Words in which every code sits in every one of the eight positions, the others pseudo-random; with the
    codes of each word: (word, codes[xy][byte])."""
    n = 1 << fmt.bits
    out = []
    for slot in range(8):
        for code in range(n):
            cs = [[(code * 5 + 3 * s + 1) % n for s in range(4 * xy, 4 * xy + 4)] for xy in range(2)]
            cs[slot // 4][slot % 4] = code
            out.append((_word(order, [[_nibble(fmt, c, order) for c in r] for r in cs]), cs))
    return out


def _expected(fmt, order: str, cs: list[list[int]]) -> tuple[int, int]:
    byte = _int8_byte if order == "int8" else _e4m3_byte
    return tuple(sum(byte(fmt, cs[xy][b]) << 8 * b for b in range(4)) for xy in range(2))  # type: ignore


PRELUDE = r"""
#include <cstdio>
typedef unsigned int u32;
#define __device__
#define __forceinline__ inline
// PTX prmt.b32, default mode: byte n = byte (c[4n+2:4n]) of {b, a}, or its bit 7 replicated where c[4n+3] is set.
static inline u32 prmt(u32 a, u32 b, u32 c) {
  const unsigned long long pool = (static_cast<unsigned long long>(b) << 32) | a;
  u32 d = 0;
  for (int n = 0; n < 4; ++n) {
    const u32 sel = (c >> (4 * n)) & 0xF;
    u32 byte = static_cast<u32>(pool >> (8 * (sel & 7))) & 0xFF;
    if (sel & 8) byte = (byte & 0x80) ? 0xFF : 0;
    d |= byte << (8 * n);
  }
  return d;
}
"""


@pytest.fixture(scope="module")
def host_widening(tmp_path_factory) -> dict[str, list[tuple[int, int]]]:
    """Each converter's rendered nibbles_to_a8, compiled with g++ and run on its _cases words."""
    if CXX is None:
        pytest.skip("no host C++ compiler (g++) to run the rendered templates")
    env = environment()
    parts, calls = [PRELUDE], []
    for i, (_, conv, name, order) in enumerate(CONVERTERS):
        words = ", ".join(f"0x{w:08X}u" for w, _ in _cases(dtype(name), order))
        parts.append(f"namespace case{i} {{\n{env.get_template(conv.template).render(**conv.context())}\n"
                     f"static void run() {{\n  const u32 words[] = {{{words}}};\n"
                     f"  for (u32 w : words) {{ u32 x, y; nibbles_to_a8(w, x, y); std::printf(\"%u %u\\n\", x, y); }}\n"
                     f"}}\n}}\n")
        calls.append(f"  case{i}::run();")
    parts.append("int main() {\n" + "\n".join(calls) + "\n  return 0;\n}\n")
    d = tmp_path_factory.mktemp("host_nibbles")
    src, exe = d / "nibbles.cpp", d / "nibbles"
    src.write_text("".join(parts))
    subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    values = [int(v) for v in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    out, at = {}, 0
    for cid, _, name, order in CONVERTERS:
        n = len(_cases(dtype(name), order))
        out[cid] = list(zip(values[at:2 * n + at:2], values[at + 1:2 * n + at:2]))
        at += 2 * n
    assert at == len(values)
    return out


@pytest.mark.parametrize("case", CONVERTERS, ids=[c[0] for c in CONVERTERS])
def test_rendered_widening_is_exact_for_every_code(case, host_widening) -> None:
    cid, conv, name, order = case
    fmt = dtype(name)
    wrong = [(hex(w), hex(got[0]), hex(got[1]), [hex(v) for v in _expected(fmt, order, cs)])
             for (w, cs), got in zip(_cases(fmt, order), host_widening[cid]) if got != _expected(fmt, order, cs)]
    assert not wrong, f"{cid}: (word, x, y, expected) {wrong[:4]}"


@pytest.mark.parametrize("case", CONVERTERS, ids=[c[0] for c in CONVERTERS])
def test_widening_model_is_exact_for_every_code(case) -> None:
    """The Python emulate models (used by the fragment-chain test below) against the same expectations."""
    _, conv, name, order = case
    fmt = dtype(name)
    for w, cs in _cases(fmt, order):
        assert conv.emulate(w) == _expected(fmt, order, cs), (hex(w), cs)


def test_e4m3_modes_follow_the_format() -> None:
    assert NibbleToE4m3(weight=dtype("float4e2m1")).mode == "sign_magnitude"
    assert NibbleToE4m3(weight=dtype("int4")).mode == "two_tables"
    assert NibbleToE4m3(weight=dtype("uint4")).mode == "two_tables"
    assert NibbleToE4m3(weight=dtype("int3")).mode == "narrow"


@pytest.mark.parametrize("name,order", [("int4", "int8"), ("int3", "int8"), ("int4", "e4m3"), ("float4e2m1", "e4m3")])
def test_fragment_chain_gives_every_weight_at_its_atom_position(name: str, order: str) -> None:
    """packing -> the 16-byte load of tile pair p (lane's words [4 * lane .. 4 * lane + 3] of pair p) -> widening
    -> register r byte e of tile j is A element atom.a_element(lane, r, e) of that tile: every (n, k) of a warp
    slice, with its value (int8 / 16 or decoded e4m3) equal to the weight's."""
    fmt = dtype(name)
    layout = BLayoutNibble8(64, 1, 64, order)
    codes = torch.randint(0, 1 << fmt.bits, (64, 64), generator=torch.Generator().manual_seed(3)).to(torch.uint8)
    nibbles = codes.clone()
    if order == "int8":
        sign = (codes >> (fmt.bits - 1)) & 1
        nibbles |= (sign * (0xF ^ ((1 << fmt.bits) - 1))).to(torch.uint8)
    words = (pack_nibbles8(nibbles, layout).to(torch.int64) & 0xFFFFFFFF).reshape(-1).tolist()
    conv = NibbleToInt8(weight=name) if order == "int8" else NibbleToE4m3(weight=fmt)
    values = fmt.decode(codes.to(torch.int64)).double()
    seen = torch.zeros(64, 64, dtype=torch.int32)
    n_tiles = layout.warp_n // 16
    for pair in range(layout.tiles_per_warp // 2):
        for lane in range(32):
            v = words[(pair * 32 + lane) * 4:(pair * 32 + lane) * 4 + 4]
            frag = [[0] * 4 for _ in range(2)]  # load_b_tile_pair
            frag[0][0], frag[0][1] = conv.emulate(v[0])
            frag[0][2], frag[0][3] = conv.emulate(v[1])
            frag[1][0], frag[1][1] = conv.emulate(v[2])
            frag[1][2], frag[1][3] = conv.emulate(v[3])
            for j in range(2):
                tile = 2 * pair + j
                for r in range(4):
                    for e in range(4):
                        row, col = ATOM.a_element(lane, r, e)
                        n, k = (tile % n_tiles) * 16 + row, (tile // n_tiles) * 32 + col
                        b = (frag[j][r] >> 8 * e) & 0xFF
                        got = ((b - 256 if b & 0x80 else b) / 16 if order == "int8"
                               else E4M3.decode(torch.tensor([b])).item())
                        assert got == values[n, k].item(), (pair, lane, j, r, e, n, k)
                        seen[n, k] += 1
    assert (seen == 1).all()


# --- composition, compilation, refusals, prepared weights ----------------------------------------------------
W4A8_INT_G128 = "w4a8-int4-g128-int8"
W4A8_INT_CHANNEL = "w4a8-int4-channel-int8"
INT3_INT8 = hg.QuantScheme("int3", group_size=64, scale_dtype="float32",
                           activation=hg.ActivationScheme("int8", granularity="token"))
INT4_E5M2 = hg.QuantScheme("int4", granularity="channel", scale_dtype="float32",
                           activation=hg.ActivationScheme("float8e5m2", granularity="token"))


def _plan(scheme, target: str, m: int = 1, n: int = 4000, k: int = 3072, pipeline: str | None = None, **kw):
    layer = LayerConfig(n=n, k=k, scheme=scheme, **kw)
    tgt = get_target(target)
    return compose(layer, ComputeConfig(), choose_tunings(layer, tgt, pipeline=pipeline).for_m(m), tgt)


# (scheme, target, M buckets compiled): int8 activations from sm_80, fp8 from sm_89; every bucket on sm_90a; each preset
# on sm_89, sm_90a, sm_100a and sm_120a at least (the issue's NVRTC list)
COMPILE = [(W4A8_INT_G128, "sm_80", (1, 1000)), (W4A8_INT_G128, "sm_90a", (1, 16, 32, 64, 256, 1000)),
           (W4A8_INT_CHANNEL, "sm_80", (1, 1000)), (W4A8_INT_CHANNEL, "sm_120a", (1, 1000)),
           ("w4a8-int4-g128-fp8", "sm_89", (1, 1000)), ("w4a8-int4-g128-fp8", "sm_90a", (1, 16, 32, 64, 256, 1000)),
           ("w4a8-int4-g128-fp8", "sm_120a", (1, 1000)), ("w4a8-mxfp4-fp8", "sm_89", (1, 1000)),
           ("w4a8-mxfp4-fp8", "sm_90a", (1, 16, 32, 64, 256, 1000)), ("w4a8-mxfp4-fp8", "sm_120a", (1, 64, 1000)),
           # sm_100a (no wgmma: the standard pipeline for every M, split-K at small M)
           (W4A8_INT_G128, "sm_100a", (1, 1000)), (W4A8_INT_CHANNEL, "sm_100a", (1, 1000)),
           ("w4a8-int4-g128-fp8", "sm_100a", (1, 1000)), ("w4a8-mxfp4-fp8", "sm_100a", (1, 64, 1000)),
           (W4A8_INT_G128, "sm_89", (1, 1000)), (W4A8_INT_G128, "sm_120a", (1, 1000)),
           (W4A8_INT_CHANNEL, "sm_89", (1, 1000)), (W4A8_INT_CHANNEL, "sm_90a", (1, 16, 32, 64, 256, 1000))]


@pytest.mark.parametrize("scheme,target,ms", COMPILE, ids=lambda v: v if isinstance(v, str) else None)
def test_compiles_without_spills(scheme, target: str, ms) -> None:
    for m in ms:
        assert_no_spills(build(_plan(scheme, target, m, has_bias=True)), m)


@pytest.mark.parametrize("scheme,target", [(INT3_INT8, "sm_80"), (INT4_E5M2, "sm_89")], ids=["int3-int8-sm_80",
                                                                                              "int4-e5m2-sm_89"])
def test_narrower_ints_and_e5m2_activations_compile(scheme, target: str) -> None:
    for m in (1, 1000):
        kernel = build(_plan(scheme, target, m, out_dtype="float32"))
        assert kernel.resources["spill_store_bytes"] == 0, (m, kernel.resources)
    assert ".f32.e4m3.e5m2.f32" in kernel.source if scheme is INT4_E5M2 else ".s32.s8.s8.s32" in kernel.source


def _source(scheme, target: str = "sm_90a", m: int = 1, **kw) -> str:
    return build(_plan(scheme, target, m, **kw), compile=False).source


def test_rendered_sources_hold_their_widening_only() -> None:
    int_g = _source(W4A8_INT_G128, "sm_80")
    # (the standard pipeline's kernels; on sm_90a the heuristics take the warp-specialized ones at every M)
    int_ch = _source(W4A8_INT_CHANNEL, m=16, pipeline="standard")
    # (sm_89: the native fp8 mma.sync; sm_90a's standard kernels run it as f16 mmas, test_w8a8.py)
    fp8_int4 = _source("w4a8-int4-g128-fp8", "sm_89", pipeline="standard")
    mx = _source("w4a8-mxfp4-fp8", "sm_89", has_bias=True, pipeline="standard")
    for src in (int_g, int_ch, fp8_int4, mx):
        for gone in ("load_b_tile(", "BTileShared8", "dequant_pair", "convert_pair", "mma_m16n8k16", "b_zero"):
            assert gone not in src
        assert "load_b_tile_pair(b_frag, b_warp, tile / 2)" in src and "nibbles_to_a8(v.w" in src
    for src in (int_g, int_ch):
        assert "x = w & 0xF0F0F0F0u;" in src and "prmt" not in src and ".s32.s8.s8.s32" in src
    assert "kE4m3High0" in fp8_int4 and "prmt(w, w, 0xBA98u)" in fp8_int4
    assert "kE4m3High0" not in mx and "| (w & 0x80808080u)" in mx and ".f32.e4m3.e4m3.f32" in mx
    # promotion: every group of 32 (MXFP4), once per 64-k slice (group 128), no group scales for channel scales
    assert "kPromoteK = 32;" in mx and "kPromoteK = 64;" in fp8_int4
    assert "acc_slice[nt][mt][i] * w_scale[nt][i / 2]" in mx
    assert "load_weight_group_scales" not in int_ch and "* scale * token_scales[mt][j]" in int_ch
    assert "static_cast<float>(acc_slice[nt][mt][i]) * w_scale[nt][i / 2]" in int_g
    w8a8 = _source("w8a8-fp8-channel", pipeline="standard")
    assert "nibbles_to_a8" not in w8a8 and "load_b_tile(b_frag, b_warp" in w8a8


@pytest.mark.parametrize("scheme,needle", [
    (hg.QuantScheme("uint4", group_size=128, scale_dtype="float32", activation=hg.ActivationScheme("int8")),
     "signed ints of at most 4 bits"),
    (hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", activation=hg.ActivationScheme("int8")),
     "signed ints of at most 4 bits"),
    (hg.QuantScheme("int6", group_size=128, scale_dtype="float32", activation=hg.ActivationScheme("float8e4m3")),
     "at most 4 bits"),
    (hg.QuantScheme("uint4", group_size=128, scale_dtype="float32", zero_point="int",
                    activation=hg.ActivationScheme("float8e4m3")), "zero points"),
    (hg.QuantScheme("int4", group_size=48, scale_dtype="float32", activation=hg.ActivationScheme("float8e4m3")),
     "multiple of 32")], ids=["uint4-int8", "e2m1-int8", "int6-fp8", "zero-point", "group48"])
def test_unserved_schemes_are_refused_with_their_reason(scheme, needle: str) -> None:
    with pytest.raises(ComposeError, match=needle):
        _plan(scheme, "sm_90a", k=4608)


def test_fp8_on_sm80_names_the_feature_and_int8_runs() -> None:
    with pytest.raises(ComposeError, match="lacks 'mma_fp8'"):
        _plan("w4a8-mxfp4-fp8", "sm_80")
    _plan(W4A8_INT_G128, "sm_86")


def test_presets_command_lists_w4a8(capsys) -> None:
    from humming_gen.cli import main

    assert main(["presets"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("w")}
    for name in ("w4a8-mxfp4-fp8", "w4a8-int4-g128-fp8", W4A8_INT_G128, W4A8_INT_CHANNEL):
        assert " yes " in lines[name], lines[name]
    assert main(["presets", "--target", "sm_80"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("w")}
    assert " as bfloat16 " in lines["w4a8-mxfp4-fp8"] and " yes " in lines[W4A8_INT_G128] and "mma_fp8" in out


def test_shared_memory_holds_half_a_byte_per_weight() -> None:
    nib, full = (_plan("w4a8-int4-g128-fp8", "sm_90a", m=16, pipeline="standard"),
                 _plan("w8a8-fp8-channel", "sm_90a", m=16, pipeline="standard"))
    t = nib.tuning
    assert nib.tuning == full.tuning
    # (the group-128 weights also stage one fp32 scale row per column with each stage: compose_a8.STAGE_WEIGHT_SCALES)
    wss = standard_a8.weight_scale_stage_bytes(nib.layer, t)
    assert wss == t.block_k // 128 * t.block_n * 4  # a row of fp32 scales per group of the stage
    assert full.shared_bytes - (nib.shared_bytes - t.stages * wss) == t.stages * t.block_n * t.block_k // 2
    from humming_gen.pipelines.warp_specialized import compose_a8 as ws_a8  # a stage of the warp-specialized ring

    nib, full = _plan("w4a8-int4-g128-fp8", "sm_90a", m=1000), _plan("w8a8-fp8-channel", "sm_90a", m=1000)
    t = full.tuning
    assert ws_a8.shared_memory(full.layer, t).b - ws_a8.shared_memory(nib.layer, t).b == t.block_n * t.block_k // 2
    assert nib.tuning.stages >= t.stages


@pytest.mark.parametrize("scheme", [W4A8_INT_G128, W4A8_INT_CHANNEL, "w4a8-int4-g128-fp8", "w4a8-mxfp4-fp8"])
def test_prepared_weight(scheme: str) -> None:
    torch.manual_seed(0)
    n, k = 300, 640
    w = torch.randn(n, k) * 0.05
    plan = _plan(scheme, "sm_90a", n=n, k=k)
    qw = hg.scheme(scheme).quantize(w)
    pw = prepare_weight(plan, qw, "cpu")
    lay = plan.layout
    assert isinstance(lay.b_layout, BLayoutNibble8)
    nibbles = unpack_nibbles8(pw.b, lay.b_layout, lay.n_pad, lay.k_pad)
    fmt = qw.scheme.weight
    if lay.b_layout.order == "int8":  # sign-extended two's complement nibble = the value; registers hold 16 x it
        values = torch.where(nibbles >= 8, nibbles.to(torch.int32) - 16, nibbles.to(torch.int32)).double()
        factor = 1 / 16
    else:
        values = fmt.decode(nibbles.to(torch.int64)).double()
        factor = 1.0
    assert torch.equal(values[:n, :k], fmt.decode(qw.codes.to(torch.int64)).double())
    assert not values[n:].any() and not values[:, k:].any()
    g = qw.scheme.group_size
    if qw.scheme.granularity == "group":
        assert pw.out_scale is None and pw.b_scale.shape == (lay.k_pad // g, lay.n_pad)
        assert pw.b_scale.dtype == torch.float32
        assert torch.equal(pw.b_scale[3, 17], qw.scales[17, 3] * factor)
        assert torch.equal(pw.b_scale[:, n:], torch.zeros_like(pw.b_scale[:, n:]))
    else:
        assert pw.b_scale is None and torch.equal(pw.out_scale[:n], qw.scales.reshape(-1) * factor)


def test_component_declarations_match_the_rendered_source() -> None:
    """provides / needs of every component of the W4A8 kernels against what its rendered template defines and
    uses (the check of test_component_symbols.py, on these schemes and every int / e4m3 widening mode)."""
    from symbols import declaration_mismatches

    wrong = {}
    for scheme in (W4A8_INT_G128, W4A8_INT_CHANNEL, "w4a8-int4-g128-fp8", "w4a8-mxfp4-fp8", INT3_INT8):
        layer = LayerConfig(4096, 4096, scheme, has_bias=True)
        for t in choose_tunings(layer, get_target("sm_90a")).tunings():
            wrong.update(declaration_mismatches(compose(layer, ComputeConfig(), t, get_target("sm_90a"))))
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())

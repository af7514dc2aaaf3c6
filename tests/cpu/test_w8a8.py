"""Kernels with 8-bit activations on the standard pipeline (mma.sync m16n8k32): the BLayout8 weight layout, the
8-bit atom, composition and refusals, NVRTC compilation without spills, and what the rendered source holds.

Expected positions in BLayout8 are computed here from the packing docstring, not from its index helpers: global
order [n block][k slice][warp n][tile][lane][16 bytes], tiles (16 n x 32 k) numbered k-step-major, lane (g, t)
holding row g (+8 for odd registers), k 4t..4t+3 (+16 for registers 2, 3), lowest byte first.
"""

from __future__ import annotations

import re
import shutil

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.components.mma.atoms import MMA_SYNC_M16N8K16, MMA_SYNC_M16N8K32_8BIT
from humming_gen.components.mma.wgmma import WgmmaRS8
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings as heuristics_tunings
from humming_gen.kernel import build, build_many, generate
from humming_gen.pipelines.base import ComposeError
from humming_gen.runtime.compile import fatal_warnings
from humming_gen.pipelines.standard.compose_a8 import activation_e8m0
from humming_gen.pipelines.warp_specialized import compose_a8
from humming_gen.pipelines.warp_specialized import WARP_SPECIALIZED
from humming_gen.pipelines.warp_specialized.heuristics import restaged, weight_multicast
from humming_gen.pipelines.weights import prepare_weight
from humming_gen.schemes.packing import BLayout8, pack_codes8, unpack_codes8
from humming_gen.targets import get_target
from helpers import assert_no_spills

LAYOUTS8 = [(128, 2, 64), (64, 1, 32), (256, 4, 128)]


def choose_tunings(layer, target, **kw):
    """The heuristics' plan with register weights: this module covers the BLayout8 kernels (the shared-weight ones,
    which the heuristics pick for most dense 8-bit weights on sm_90a, are test_shared_weights.py's)."""
    return heuristics_tunings(layer, target, register_weights=True, **kw)


@pytest.mark.parametrize("spec", LAYOUTS8, ids=lambda s: "bn{}-wn{}-wk{}".format(*s))
def test_blayout8_round_trip_and_positions(spec) -> None:
    layout = BLayout8(*spec)
    n, k = 2 * layout.block_n, 4 * layout.warp_k
    codes = torch.randint(0, 256, (n, k), generator=torch.Generator().manual_seed(1), dtype=torch.int64)
    codes = codes.to(torch.uint8)
    packed = pack_codes8(codes, layout)
    assert torch.equal(unpack_codes8(packed, layout, n, k), codes)
    flat = packed.view(torch.uint8).reshape(n // layout.block_n, k // layout.warp_k, -1)
    n_tiles = layout.warp_n // 16
    nn = torch.arange(n).view(-1, 1).expand(n, k)
    kk = torch.arange(k).view(1, -1).expand(n, k)
    nb, n_in = nn // layout.block_n, nn % layout.block_n
    wn, n_warp = n_in // layout.warp_n, n_in % layout.warp_n
    ks, k_warp = kk // layout.warp_k, kk % layout.warp_k
    tile = (k_warp // 32) * n_tiles + n_warp // 16
    row, col = n_warp % 16, k_warp % 32
    lane = 4 * (row % 8) + (col % 16) // 4
    reg = row // 8 + 2 * (col // 16)
    byte = (((wn * layout.tiles_per_warp + tile) * 32 + lane) * 4 + reg) * 4 + col % 4
    assert torch.equal(flat[nb, ks, byte], codes)


def test_atom_8bit_is_the_16bit_fragment_of_byte_pairs() -> None:
    """Register r of the m16n8k32 8-bit atom holds byte pairs exactly where the m16n8k16 atom holds elements: what
    lets the 16-bit ldmatrix path load 8-bit activations (design note in the atom's comment)."""
    for lane in range(32):
        for reg in range(4):
            for byte in range(4):
                row16, k16 = MMA_SYNC_M16N8K16.a_element(lane, reg, byte // 2)
                assert MMA_SYNC_M16N8K32_8BIT.a_element(lane, reg, byte) == (row16, 2 * k16 + byte % 2)


def _plan(scheme: str, target: str, m: int = 1, n: int = 4000, k: int = 3072, pipeline: str | None = None, **kw):
    layer = LayerConfig(n=n, k=k, scheme=scheme, **kw)
    tgt = get_target(target)
    return compose(layer, ComputeConfig(), choose_tunings(layer, tgt, pipeline=pipeline).for_m(m), tgt)


# (scheme, target, M buckets compiled): int8 from sm_80, fp8 from sm_89; every bucket on sm_90a; each preset on sm_89,
# sm_90a, sm_100a and sm_120a at least (the NVRTC list)
COMPILE = [("w8a8-int8-channel", "sm_80", (1, 1000)), ("w8a8-int8-channel", "sm_90a", (1, 16, 32, 64, 256, 1000)),
           ("w8a8-int8-channel", "sm_120a", (1, 1000)), ("w8a8-fp8-channel", "sm_89", (1, 1000)),
           ("w8a8-fp8-channel", "sm_90a", (1, 16, 32, 64, 256, 1000)), ("w8a8-fp8-channel", "sm_120a", (1, 1000)),
           ("w8a8-fp8-block128", "sm_89", (1, 1000)), ("w8a8-fp8-block128", "sm_90a", (1, 16, 32, 64, 256, 1000)),
           ("w8a8-fp8-block128", "sm_120a", (1, 1000)), ("w8a8-fp8-tensor", "sm_90a", (1,)),
           # sm_100a (no wgmma: the standard pipeline for every M, split-K at small M)
           ("w8a8-int8-channel", "sm_100a", (1, 64, 1000)), ("w8a8-fp8-channel", "sm_100a", (1, 64, 1000)),
           ("w8a8-fp8-block128", "sm_100a", (1, 64, 1000)), ("w8a8-int8-channel", "sm_89", (1, 1000))]


@pytest.mark.parametrize("scheme,target,ms", COMPILE, ids=lambda v: v if isinstance(v, str) else None)
def test_compiles_without_spills(scheme: str, target: str, ms) -> None:
    for m in ms:
        assert_no_spills(build(_plan(scheme, target, m, has_bias=True)), m)


def test_fp8_on_sm80_names_the_feature() -> None:
    with pytest.raises(ComposeError, match="lacks 'mma_fp8'") as e:
        _plan("w8a8-fp8-channel", "sm_80")
    assert "sm_80" in str(e.value) and "MmaSyncM16N8K32" in str(e.value)
    with pytest.raises(ComposeError, match="lacks 'mma_fp8'"):
        _plan("w8a8-fp8-block128", "sm_86")


@pytest.mark.parametrize("scheme,needle", [
    ("w4a4-nvfp4", "8-bit activations"), (hg.QuantScheme("float8e4m3", granularity="channel", scale_dtype="float32",
                                                       activation=hg.ActivationScheme("float8e4m3", granularity="token",
                                                                                      scale_dtype="float8e8m0")),
                                        "e8m0 activation scales are read per group")])
def test_unserved_schemes_are_refused_with_their_reason(scheme: str, needle: str) -> None:
    with pytest.raises(ComposeError, match=needle):
        _plan(scheme, "sm_90a", k=4096)


def test_warp_specialized_takes_every_bucket_on_sm90a_only() -> None:
    layer = LayerConfig(n=8192, k=8192, scheme="w8a8-fp8-channel")
    assert WARP_SPECIALIZED.supports(layer, ComputeConfig(), get_target("sm_90a")) == []
    plan = choose_tunings(layer, get_target("sm_90a"), stored=False)
    assert plan.for_m(1).block_m == 8 and plan.for_m(16).block_m == 16
    for m_max, t in plan.buckets:
        assert (t.pipeline, t.mma) == ("warp_specialized", "wgmma"), m_max
        assert t.split_k == 1 or (m_max is not None and m_max <= 64), (m_max, t.split_k)
    for target in ("sm_89", "sm_120a"):
        assert any("wgmma" in r for r in WARP_SPECIALIZED.supports(layer, ComputeConfig(), get_target(target)))
        plan = choose_tunings(layer, get_target(target), stored=False)
        assert all(t.pipeline == "standard" for _, t in plan.buckets)


def test_a8_buckets_split_and_tile_as_measured() -> None:
    """8192 x 8192 (heuristics.tuning_for_a8, measured on the H200): 8-bit weights with channel scales stream them
    with one k slice up to 64 tokens (64 units: half the SMs), nibble and block-scaled weights split to a wave; the
    buckets from 4096 on take 192-token tiles unless activation groups are promoted or those tiles would need split-K
    to fill the SMs; a narrow layer still splits."""
    sm90 = get_target("sm_90a")
    for scheme, small_split in (("w8a8-fp8-channel", 1), ("w8a8-int8-channel", 1), ("w4a8-mxfp4-fp8", 2),
                                ("w8a8-fp8-block128", 2)):
        plan = choose_tunings(LayerConfig(n=8192, k=8192, scheme=scheme), sm90, stored=False)
        for m in (1, 16, 32, 64):
            assert plan.for_m(m).split_k == small_split, (scheme, m)
        large = 128 if scheme == "w8a8-fp8-block128" else 192
        assert plan.for_m(2048).block_m == 128 and plan.for_m(4096).block_m == plan.for_m(10**5).block_m == large
    narrow = choose_tunings(LayerConfig(n=1024, k=4096, scheme="w8a8-fp8-channel"), sm90, stored=False)
    assert narrow.for_m(1).split_k == 8  # 8 n tiles, 64 units
    for scheme in ("w8a8-fp8-channel", "w4a8-mxfp4-fp8"):  # 2 n tiles: 22 units of 192 tokens; 128 of 64, no split
        t = choose_tunings(LayerConfig(n=256, k=8192, scheme=scheme), sm90, stored=False).for_m(4096)
        assert (t.block_m, t.split_k) == (64, 1), (scheme, t)


def _source(scheme: str, target: str = "sm_90a", m: int = 1, **kw) -> str:
    return build(_plan(scheme, target, m, **kw), compile=False).source


def test_rendered_source_holds_only_the_8bit_path() -> None:
    # (the standard pipeline's kernels; on sm_90a the heuristics take the warp-specialized ones at every M)
    fp8 = _source("w8a8-fp8-channel", target="sm_89", m=16, pipeline="standard")  # (sm_90a: f16 mmas)
    int8 = _source("w8a8-int8-channel", target="sm_80")
    block = _source("w8a8-fp8-block128", has_bias=True, pipeline="standard")
    for src in (fp8, int8, block):
        for gone in ("dequant_pair", "extract_code_pair", "convert_pair", "mma_m16n8k16", "load_b_chunk",
                     "kChunkWords", "load_group_stage", "b_zero", "u16* a"):
            assert gone not in src
        assert "mma_m16n8k32(acc_slice" in src and "load_b_tile(" in src
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in fp8
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in int8 and "static_cast<float>(acc_slice" in int8
    assert "static_cast<float>" not in fp8.split("auto compute_stage")[1].split("};")[0]
    # per-token scales in the epilogue; block scales at promotion, not in the epilogue
    assert "* scale * token_scales[mt][j]" in fp8 and "load_weight_group_scales" not in fp8
    # every token scale loaded before the first store (a load after a store to c would wait for it)
    store = fp8.split("void store_output(")[1]
    assert store.index("token_scales[mt][j] = m < p.m ? a_scale[m] : 0.0f;") < store.index(" * p.ldc + n] = ")
    assert "a_scale[m]" not in block and "* w_scale[nt][i / 2] * a_scale[mt][i % 2]" in block
    assert "kActivationGroups = 24" in block and "p.out_scale" not in block
    assert "const float a_scale = *static_cast<const float*>(p.a_scale);" in _source("w8a8-fp8-tensor",
                                                                                        pipeline="standard")


def test_warp_specialized_8bit_source() -> None:
    """wgmma k32 on the weights' registers as loaded; fp8 partial sums promoted every stage, in two token halves of
    their own wgmmas (one promoted while the other's run), s32 ones once per tile; channel x token scales in the
    epilogue, block scales at promotion."""
    fp8 = _source("w8a8-fp8-channel", m=1000)
    int8 = _source("w8a8-int8-channel", m=1000)
    block = _source("w8a8-fp8-block128", m=1000, has_bias=True)
    mxfp4 = _source("w4a8-mxfp4-fp8", m=1000)
    for src in (fp8, int8, block, mxfp4):
        assert "consume<1>(p, ring, units)" in src and "setmaxnreg" in src
        for gone in ("dequant_pair", "extract_code_pair", "mma_m16n8k32", "mma.sync.aligned", "k16("):
            assert gone not in src, gone
    assert "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3" in fp8  # 128 tokens: two halves
    assert "m64n128k32" not in fp8 and "wgmma_wait<1>();  // half 0 of group pg has retired" in fp8
    assert "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8" in int8
    assert "kPromoteSteps = 4;" in fp8 and "acc[0][j][i] += part[1][jj][i];" in fp8
    # whole tiles leave through the warps' staging (stmatrix.trans, then 16-byte stores), channel x token scales
    assert "acc[nt][mt][0] * scales[nt][0] * token_scales[mc][0]" in fp8 and "stmatrix_x2_trans(staging + " in fp8
    assert "*reinterpret_cast<uint4*>(dst) = v;" in fp8 and "kStagingBytes = 2048;" in fp8
    assert "acc[0][j][i] = static_cast<float>(part[j][i]);" in int8 and "acc[0][j][i] +=" not in int8
    assert "acc[0][j][i] += part[0][jj][i] * a_scale[i % 2];" in block and "a_scale[m]" not in block
    assert "const float a_scale[2] = {pair.x * w_scale, pair.y * w_scale};" in block  # the tile's block scale
    assert "kPromoteSteps = 1;" in mxfp4 and "nibbles_to_a8(v.x, frag[0], frag[1])" in mxfp4


def test_16bit_kernels_keep_their_source() -> None:
    """The 8-bit options render nothing in a 16-bit kernel (tests/golden holds the full texts)."""
    src = _source("w4a16-int4-g128")
    for gone in ("a_scale", "m16n8k32", "load_b_tile", "unsigned char* a"):
        assert gone not in src


def test_prepared_weight8() -> None:
    torch.manual_seed(0)
    w = torch.randn(300, 640) * 0.05
    for scheme in ("w8a8-fp8-channel", "w8a8-fp8-block128", "w8a8-int8-channel"):
        plan = _plan(scheme, "sm_90a", n=300, k=640)
        qw = hg.scheme(scheme).quantize(w)
        pw = prepare_weight(plan, qw, "cpu")
        lay = plan.layout
        codes = unpack_codes8(pw.b, lay.b_layout, lay.n_pad, lay.k_pad)
        assert torch.equal(codes[:300, :640], qw.codes) and not codes[300:].any() and not codes[:, 640:].any()
        if scheme.endswith("block128"):
            assert pw.out_scale is None and pw.b_scale.shape == (lay.k_pad // 128, lay.n_pad)
            assert torch.equal(pw.b_scale[4, 130], qw.scales[1, 4]) and torch.equal(pw.b_scale[5, 0], qw.scales[0, 4])
        else:
            assert pw.b_scale is None and torch.equal(pw.out_scale[:300], qw.scales.reshape(-1))


def test_launcher_requires_activation_scales() -> None:
    plan = _plan("w8a8-int8-channel", "sm_90a", n=256, k=512)
    pw = prepare_weight(plan, hg.scheme("w8a8-int8-channel").quantize(torch.randn(256, 512)), "cpu")
    launcher = build(plan, compile=False).bind(pw, None, torch.device("cpu"))
    codes, out = torch.zeros(4, 512, dtype=torch.uint8), torch.empty(4, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="pass a_scale"):
        launcher(codes, out)


def test_quantlinear_refuses_unserved_schemes_clearly_with_strict() -> None:
    w = torch.randn(256, 512)
    with pytest.raises(ValueError, match="8-bit activations") as e:
        hg.QuantLinear.from_float(w, "w4a4-nvfp4", target="sm_90a", device="cpu", strict=True)
    assert "weight_only=True" in str(e.value)
    with pytest.raises(ValueError, match="mma_fp8"):
        hg.QuantLinear.from_float(w, "w8a8-fp8-channel", target="sm_80", device="cpu", strict=True)


@pytest.mark.parametrize("preset,target,compute", [
    ("w4a4-nvfp4", "sm_90a", "bfloat16"),        # no fp4 MMA; NVFP4's group-16 weight scales keep fp8 out too
    ("w8a8-fp8-channel", "sm_80", "bfloat16"),   # no fp8 mma.sync before sm_89
    ("w8a8-int8-channel", "sm_80", "int8"),
    ("w8a8-mxfp8", "sm_89", "float8e4m3"),       # e8m0 activation scales read as powers of two (on sm_90a the
    # layer runs MXFP8's values on the 16-bit kernels by default: tests/cpu/test_dequantized_activations.py)
    ("w8a8-fp8-channel", "sm_90a", "float8e4m3")])
def test_compute_dtype_falls_back_to_the_next_supported_type(preset: str, target: str, compute: str) -> None:
    layer = hg.QuantLinear.from_float(torch.randn(256, 512), preset, target=target, device="cpu")
    assert layer.compute_dtype == compute
    assert (layer.activation_scheme is None) == (compute == "bfloat16")
    assert bool(layer.fallback_reasons) == (compute != hg.scheme(preset).activation.dtype.name)


def test_fp4_activations_fall_back_to_fp8_where_the_weights_allow() -> None:
    """fp4 activations -> 8-bit ones, per token, when the weights' scales fit the 8-bit kernels (group 32 here)."""
    scheme = hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0",
                            activation=hg.ActivationScheme("float4e2m1", granularity="group", group_size=32,
                                                           scale_dtype="float8e8m0"))
    layer = hg.QuantLinear.from_float(torch.randn(256, 512), scheme, target="sm_90a", device="cpu")
    assert layer.compute_dtype == "float8e4m3" and layer.activation_scheme.granularity == "token"
    layer = hg.QuantLinear.from_float(torch.randn(256, 512), scheme, target="sm_80", device="cpu")
    assert layer.compute_dtype == "bfloat16"


def test_mxfp8_activation_scales_are_read_as_e8m0_bytes(monkeypatch) -> None:
    """Read from global memory as bytes (standard pipeline; warp-specialized with STAGE_E8M0_SCALES off, as where K
    is not whole stages)."""
    monkeypatch.setattr(compose_a8, "STAGE_E8M0_SCALES", False)
    for m in (1, 1000):
        src = _source("w8a8-mxfp8", m=m, k=4096, pipeline="standard" if m == 1 else None)
        assert ("e8m0_scale(p.a_scale" in src) if m == 1 else ("<< 23" in src and "const unsigned char* a_scales" in src)
        assert "e8m0 (byte) activation scales [m][k groups]" in src
    assert "e8m0" not in _source("w8a8-fp8-block128", m=1000)


def test_quantlinear_shares_one_weight_between_both_pipelines() -> None:
    """On sm_90a the standard pipeline's buckets (mma.sync, here those of quantize_in_gemm=True, whose loader
    quantizes) and the warp-specialized ones (wgmma) read one packed weight."""
    torch.manual_seed(0)
    layer = hg.QuantLinear.from_float(torch.randn(512, 1024), "w8a8-fp8-channel", target="sm_90a", device="cpu",
                                      quantize_in_gemm=True)
    assert {kern.plan.tuning.mma for _, kern in layer._buckets} == {"m16n8k32", "wgmma"}
    assert len({(kern.plan.layout.b_layout, kern.plan.layout.n_pad) for _, kern in layer._buckets}) == 1


INT8_GROUP = hg.QuantScheme("int8", group_size=128, scale_dtype="float32",
                            activation=hg.ActivationScheme("int8", granularity="group", group_size=128))
FP8_E5M2_ACT = hg.QuantScheme("float8e4m3", granularity="channel", scale_dtype="float32",
                              activation=hg.ActivationScheme("float8e5m2", granularity="token"))


@pytest.mark.parametrize("scheme,target", [(INT8_GROUP, "sm_80"), (INT8_GROUP, "sm_90a"), (FP8_E5M2_ACT, "sm_89"),
                                           (FP8_E5M2_ACT, "sm_120a")], ids=["int8g128-sm_80", "int8g128-sm_90a",
                                                                            "e5m2act-sm_89", "e5m2act-sm_120a"])
def test_group_int8_and_e5m2_activations_compile(scheme, target: str) -> None:
    for m in (1, 1000):
        kernel = build(_plan(scheme, target, m, out_dtype="float32"))
        assert kernel.resources["spill_store_bytes"] == 0, (m, kernel.resources)
    src = kernel.source
    if scheme is INT8_GROUP and target == "sm_90a":  # M = 1000: the warp-specialized kernel
        assert "static_cast<float>(part[1][jj][i]) * w_scale[i / 2] * a_scale[i % 2]" in src
    elif scheme is INT8_GROUP:
        assert "static_cast<float>(acc_slice[nt][mt][i]) * w_scale[nt][i / 2] * a_scale[mt][i % 2]" in src
    else:
        assert ".f32.e4m3.e5m2.f32" in src and "* scale * token_scales[mt][j]" in src


def test_uint8_operands_stay_on_the_standard_pipeline() -> None:
    """wgmma k32 takes int8 x int8 / fp8 x fp8 only: u8 weights with int8 activations run mma.sync everywhere."""
    u8 = hg.QuantScheme("uint8", granularity="channel", scale_dtype="float32",
                        activation=hg.ActivationScheme("int8", granularity="token"))
    layer = LayerConfig(1024, 2048, u8)
    assert any("int8 x int8 or fp8 x fp8" in r
               for r in WARP_SPECIALIZED.supports(layer, ComputeConfig(), get_target("sm_90a")))
    assert all(t.pipeline == "standard" for _, t in choose_tunings(layer, get_target("sm_90a"), stored=False).buckets)


def test_int8_partial_sums_are_promoted_per_stage_past_64k() -> None:
    """s32 partial sums of int8 x int8 could overflow past ~2^17 k: long K promotes them every stage."""
    short = _source("w8a8-int8-channel", m=1000, n=256, k=1 << 16)
    long = _source("w8a8-int8-channel", m=1000, n=256, k=(1 << 16) + 256)
    assert "acc[0][j][i] = static_cast<float>(part[j][i]);" in short and "long_k" not in short
    assert "acc[0][j][i] += static_cast<float>(part[1][jj][i]);" in long and "long_k=True" in long


def test_activation_groups_that_do_not_tile_k_fall_back() -> None:
    """1 x 128 activation groups need K % 128 == 0: K = 320 runs the weights with 16-bit activations (strict
    refuses naming the group size) instead of failing in LayerConfig."""
    w = torch.randn(256, 320)
    layer = hg.QuantLinear.from_float(w, "w8a8-fp8-block128", target="sm_90a", device="cpu")
    assert layer.compute_dtype == "bfloat16" and "group_size=128" in layer.fallback_reasons[0]
    with pytest.raises(ValueError, match="group_size=128"):
        hg.QuantLinear.from_float(w, "w8a8-fp8-block128", target="sm_90a", device="cpu", strict=True)


@pytest.mark.parametrize("block_k,group_k", [(128, 128), (128, 32), (256, 128), (128, 256), (128, 96), (256, 96)])
def test_stage_groups_counts_the_groups_a_stage_reaches_into(block_k: int, group_k: int) -> None:
    """The producer stages this many scale groups per stage: the most any k tile touches (brute force)."""
    touched = max(len({k // group_k for k in range(kt * block_k, (kt + 1) * block_k)}) for kt in range(64))
    assert compose_a8.stage_groups(block_k, group_k) == touched


def _constants(src: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"constexpr int (\w+) = (-?\d+);", src)}


def check_e8m0_pairs(src: str, c: dict[str, int]) -> None:
    """The consumers' two bytes of m tile j (the promotion's e0, e1, read at promotion or preloaded before the wgmma
    wait) are tokens 8j + 2t and 8j + 2t + 1 of the group slot, in the stage's [kBlockM][kStageActivationGroups]
    bytes."""
    groups = c["kStageActivationGroups"]
    base = re.findall(r"stage_group_slot<cfg::kActivationGroupK>\(kt, pg\) \+\s+(.+?) \* cfg::kStageActivationGroups;",
                      src)
    reads = re.findall(r"const u32 e([01]) = a_bytes\[(.+?)\];", src)
    assert base and reads, "the e8m0 byte reads"
    pairs = [args for args in re.findall(r"make_float2\(([^;]*)\);", src) if re.search(r"\be0\b", args)]
    assert pairs and all(re.search(r"\be0\b.*\be1\b", args, re.S) for args in pairs), pairs  # (x: token 8j + 2t)
    py = lambda e: e.replace("cfg::", "").replace("threadIdx.x % 4", "t")  # noqa: E731
    for e, index in reads:
        for j in range(c["kWarpMTiles"]):
            for t in range(4):
                for slot in range(groups):
                    env = {"t": t, "j": j, "tile": j, "kStageActivationGroups": groups}
                    byte = slot + eval(py(base[0]), env) * groups + eval(py(index), env)
                    assert divmod(byte, groups) == (8 * j + 2 * t + int(e), slot), (e, index, j, t, slot)


@pytest.mark.parametrize("scheme,m", [("w8a8-fp8-block128", 1000), ("w8a8-fp8-block128", 64), ("w8a8-mxfp8", 1000),
                                      ("w4a8-int4-g128-int8", 1000)])
def test_staged_group_scales_fit_the_stage_and_pair_each_token(scheme: str, m: int) -> None:
    """The shared-memory plan holds a stage's weight and activation group scales after its weights (the stage size,
    the offsets and the launch's bytes agree), the full barrier's transaction bytes count the weight scales, and the
    consumers' 8-byte pair reads (taken from the source) find tokens 8j + 2t and + 1 where the producer put them."""
    plan = _plan(scheme, "sm_90a", m, n=4000, k=3200)
    src = build(plan, compile=False).source
    c = _constants(src)
    smem = compose_a8.shared_memory(plan.layer, plan.tuning)
    assert c["kStageBytes"] == smem.stage and plan.shared_bytes == smem.total and smem.fits(get_target("sm_90a"))
    end = c["kAStageBytes"] + c["kSlicesPerStage"] * c["kBSliceBytes"]
    assert c["kWeightScaleOffset"] == end
    end += c["kStageWeightGroups"] * c["kWeightScaleBytes"]
    assert "cfg::kBSliceBytes + cfg::kStageWeightGroups * cfg::kWeightScaleBytes;" in src  # expect_tx
    assert "w_group = reinterpret_cast<const float*>(ring.stage_ptr(stage) + cfg::kWeightScaleOffset)" in src
    assert "__ldg" not in src and "load_weight_group_scales" not in src
    if not compose_a8.staged_scale_bytes(plan.layer, plan.tuning.block_k):  # per-token scales
        assert "kActivationScaleOffset" not in c and not activation_e8m0(plan.layer)
        return
    assert c["kActivationScaleOffset"] == end and end % 8 == 0
    if activation_e8m0(plan.layer):  # e8m0 bytes, [kBlockM][kStageActivationGroups] (the test of staged e8m0 scales)
        assert c["kActivationScaleOffset"] + c["kBlockM"] * c["kStageActivationGroups"] <= c["kStageBytes"]
        assert "const u32 e = m < p.m ? a_scales[" not in src
        check_e8m0_pairs(src, c)
        return
    end += c["kStageActivationGroups"] * c["kBlockM"] * 4
    assert end <= c["kStageBytes"] == -(-end // 1024) * 1024
    # producer: token `token` of group slot i at float i * kBlockM + token; consumer: float2 pair a_pairs[...] of slot
    written = re.search(r"cfg::kActivationScaleOffset \+ \((.+?)\) \* 4,", src).group(1)
    pair = re.search(r"stage_group_slot<cfg::kActivationGroupK>\(kt, pg\) \* (.+?);\n", src).group(1)
    # (the pair of m tile j: a_pairs[4 * j] read at promotion, or, in the overlapped halves, preloaded before the
    # wgmma wait as pairs<h>[jj] = a_pairs[4 * (first tile of half h + jj)])
    reads = re.findall(r"const float2 pair = a_pairs\[(.+?)\];", src)
    preloads = re.findall(r"pairs(\d)\[jj\] = a_pairs\[(.+?)\];", src)
    assert bool(reads) != bool(preloads), "one form of pair read"
    half = c["kWarpMTiles"] // 2
    indices = ([(range(c["kWarpMTiles"]), reads[0], 0)] if reads else
               [(range(int(h) * half, (int(h) + 1) * half), e.replace("kHalfTiles", str(half)), int(h) * half)
                for h, e in preloads])
    assert reads or sorted(int(h) for h, _ in preloads) == [0, 1]
    py = lambda e: e.replace("cfg::", "").replace("threadIdx.x % 4", "t").replace("/", "//")  # noqa: E731
    for slot in range(c["kStageActivationGroups"]):
        where = {eval(py(written), {"i": slot, "token": tok, "kBlockM": c["kBlockM"]}): tok
                 for tok in range(c["kBlockM"])}
        for tiles, index, first in indices:
            for j in tiles:
                for t in range(4):
                    f2 = eval(py(f"{slot} * {pair} + {index}"), {"t": t, "j": j, "jj": j - first,
                                                                   "kBlockM": c["kBlockM"]})
                    assert (where[2 * f2], where[2 * f2 + 1]) == (8 * j + 2 * t, 8 * j + 2 * t + 1), (slot, j, t)


@pytest.mark.parametrize("compiler", ["nvrtc", pytest.param("nvcc", marks=pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="nvcc not installed"))])
def test_staged_scale_kernels_compile_without_spills_or_wgmma_serialization(compiler: str) -> None:
    """Every warp-specialized bucket of the group-scaled 8-bit schemes (4000 x 3200, bias) with NVRTC, the m_band and
    split-K ones among them; with NVCC the largest token tile of each and a split-K one."""
    plans = []
    for scheme in ("w8a8-fp8-block128", "w8a8-mxfp8", "w4a8-int4-g128-int8", "w4a8-mxfp4-fp8"):
        layer = LayerConfig(n=4000, k=3200, scheme=scheme, has_bias=True)
        tunings = [t for t in choose_tunings(layer, get_target("sm_90a")).tunings() if t.pipeline == "warp_specialized"]
        if compiler == "nvcc":
            tunings = [max(tunings, key=lambda t: t.block_m)] + [t for t in tunings if t.split_k > 1][:1]
        plans += [compose(layer, ComputeConfig(), t, get_target("sm_90a")) for t in tunings]
    assert any(p.tuning.split_k > 1 for p in plans) and any(p.tuning.raster == "m_band" for p in plans)
    for kernel in build_many(plans, compiler=compiler):
        r = kernel.resources
        assert r.get("spill_store_bytes", 0) == 0 and r.get("stack_bytes", 0) == 0, (kernel.name, r)
        assert not fatal_warnings(kernel.compiled.log), kernel.name


def _cluster_tuning(layer: LayerConfig, block_m: int = 128, **kw):
    base = choose_tunings(layer, get_target("sm_90a"), stored=False).for_m(4096)
    return attrs.evolve(weight_multicast(attrs.evolve(base, block_m=block_m, stages=6)), **kw)


@pytest.mark.parametrize("scheme,fold", [("w8a8-fp8-channel", False), ("w8a8-int8-channel", False),
                                         ("w8a8-fp8-block128", False), ("w4a8-mxfp4-fp8", True),
                                         ("w4a8-int4-g128-int8", False)])
def test_weight_multicast_clusters_compile_without_spills(scheme: str, fold: bool) -> None:
    """cluster_m=2: two CTAs along M share each weight stage (half multicast by each, the rest of the stage by the
    first), release stages on both CTAs' empty barriers (a lane per warp) and meet at a cluster barrier at start and
    exit; 128-token tiles keep every register."""
    tgt = get_target("sm_90a")
    layer = LayerConfig(n=4000, k=3072, scheme=scheme, has_bias=True, fold_scales=fold)
    plan = compose(layer, ComputeConfig(), _cluster_tuning(layer), tgt)
    assert plan.kernel_name.endswith("_c2") and plan.launch.cluster == (2, 1, 1)
    assert plan.grid(1) == (2 * 32, 1, 1)  # 32 n tiles, each a pair of m tiles (the second idle)
    kernel = build(plan)
    assert_no_spills(kernel, plan.kernel_name)
    for symbol in ("bulk_copy_multicast", "release_stage(ring, ", "cluster_sync();", "peer_empty_bars"):
        assert symbol in kernel.source, symbol
    single = build(_plan(scheme, "sm_90a", 4096, has_bias=True, fold_scales=fold))
    assert "cluster_sync" not in single.source and "multicast(" not in single.source  # none of it without clusters


@pytest.mark.parametrize("change,needle", [
    (dict(split_k=2), "split_k=1, raster='n_major'"), (dict(raster="m_band"), "split_k=1, raster='n_major'"),
    (dict(cluster_m=2, cluster_n=2), "allowed: 1x1, 2x1"), (dict(b_load="tma"), "b_load='tma_multicast'"),
    (dict(cluster_m=1), "needs cluster_m > 1")])
def test_weight_multicast_refusals_name_the_field(change: dict, needle: str) -> None:
    layer = LayerConfig(n=4000, k=3072, scheme="w8a8-fp8-channel")
    with pytest.raises((ComposeError, ValueError), match=re.escape(needle)):  # TuningConfig checks its own fields
        compose(layer, ComputeConfig(), _cluster_tuning(layer, **change), get_target("sm_90a"))


def test_weight_multicast_is_refused_for_moe_and_16_bit_activations() -> None:
    tgt = get_target("sm_90a")
    moe = LayerConfig(n=512, k=7168, scheme="w8a8-fp8-channel", num_experts=8)
    with pytest.raises(ComposeError, match="clusters serve dense layers"):
        compose(moe, ComputeConfig(gemm="indexed"), _cluster_tuning(moe), tgt)
    w4a16 = LayerConfig(n=4000, k=3072, scheme="w4a16-int4-g128")
    t = attrs.evolve(choose_tunings(w4a16, tgt, stored=False).for_m(4096), cluster_m=2, b_load="tma_multicast")
    with pytest.raises(ComposeError, match="allowed: 1x1"):
        compose(w4a16, ComputeConfig(), t, tgt)


@pytest.mark.parametrize("scheme,fold", [("w8a8-fp8-channel", False), ("w8a8-int8-channel", False),
                                         ("w8a8-fp8-block128", False), ("w4a8-mxfp4-fp8", True)])
def test_activation_multicast_clusters_compile_without_spills(scheme: str, fold: bool) -> None:
    """cluster_n=2: two CTAs along N share each activation stage (each multicasts half the tile's rows of its
    panel into both; the full barrier still expects the whole tile), weights their own; stages released on both
    CTAs' empty barriers; no producer cp.async unless scales are staged."""
    from humming_gen.pipelines.warp_specialized.heuristics import activation_multicast

    tgt = get_target("sm_90a")
    layer = LayerConfig(n=4096, k=3072, scheme=scheme, has_bias=True, fold_scales=fold)
    base = choose_tunings(layer, tgt, stored=False).for_m(4096)
    plan = compose(layer, ComputeConfig(), activation_multicast(attrs.evolve(base, block_m=128, stages=5)), tgt)
    assert plan.kernel_name.endswith("_cn2") and plan.launch.cluster == (2, 1, 1)
    kernel = build(plan)
    assert_no_spills(kernel, plan.kernel_name)
    src = kernel.source
    for symbol in ("bulk_copy_multicast(a_smem_stage + first * 128", "release_stage(ring, ", "cluster_sync();",
                   "peer_empty_bars", "weight_stage_bytes(tc.n0) + a_stage_bytes(p.m, tc.m0)"):
        assert symbol in src, symbol
    assert "kHalfSlicesBytes" not in src  # the weights are not shared


@pytest.mark.parametrize("change,needle", [
    (dict(split_k=2), "split_k=1, a_load='tma_multicast'"), (dict(a_load="tma"), "needs cluster_n > 1"),
    (dict(block_m=8), "block_m a multiple of 16")])
def test_activation_multicast_refusals_name_the_field(change: dict, needle: str) -> None:
    from humming_gen.pipelines.warp_specialized.heuristics import activation_multicast

    layer = LayerConfig(n=4096, k=3072, scheme="w8a8-fp8-channel")
    base = choose_tunings(layer, get_target("sm_90a"), stored=False).for_m(4096)
    t = activation_multicast(attrs.evolve(base, block_m=128, stages=5))
    if change.get("a_load") == "tma":
        change = dict(a_load="tma_multicast", cluster_n=1)
    with pytest.raises((ComposeError, ValueError), match=re.escape(needle)):
        compose(layer, ComputeConfig(), attrs.evolve(t, **change), get_target("sm_90a"))
    odd = LayerConfig(n=4000 - 128, k=3072, scheme="w8a8-fp8-channel")  # 31 n tiles
    with pytest.raises(ComposeError, match="must be even"):
        compose(odd, ComputeConfig(), t, get_target("sm_90a"))
    moe = LayerConfig(n=512, k=7168, scheme="w8a8-fp8-channel", num_experts=8)
    with pytest.raises(ComposeError, match="clusters serve dense layers"):
        compose(moe, ComputeConfig(gemm="indexed"), attrs.evolve(t, raster="n_major"), get_target("sm_90a"))


def test_int8_tiles_above_192_tokens_only_without_promotion() -> None:
    """int8 x int8 with channel scales sums K in one set of s32 registers (block_m / 2 per thread), so 224- and
    256-token tiles compile without spills; every layer that promotes partial sums (fp8, group scales) is refused."""
    tgt = get_target("sm_90a")
    plans = []
    for bm in (224, 256):
        layer = LayerConfig(n=8192, k=8192, scheme="w8a8-int8-channel")
        t = restaged(layer, tgt, choose_tunings(layer, tgt, stored=False).for_m(10 ** 6), block_m=bm)
        plans.append(compose(layer, ComputeConfig(), t, tgt))
    for kernel in build_many(plans):
        assert_no_spills(kernel, kernel.name)
    for scheme in ("w8a8-fp8-channel", "w4a8-int4-g128-int8", "w8a8-fp8-block128"):
        layer = LayerConfig(n=8192, k=8192, scheme=scheme)
        t = attrs.evolve(choose_tunings(layer, tgt, stored=False).for_m(10 ** 6), block_m=256, stages=3)
        with pytest.raises(ComposeError, match="above 192 tokens only for int8"):
            compose(layer, ComputeConfig(), t, tgt)


def _mxfp4_weights(act: hg.ActivationScheme) -> hg.QuantScheme:
    return hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", activation=act)


G32 = hg.ActivationScheme("float8e4m3", granularity="group", group_size=32)
MXFP8 = hg.ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0")


@pytest.mark.parametrize("scheme,block_m,fold,expected", [
    ("w8a8-fp8-channel", 128, False, True), ("w8a8-fp8-channel", 192, False, True),
    ("w8a8-fp8-block128", 128, False, True),
    ("w4a8-mxfp4-fp8", 128, True, False),  # 4-bit weights widened, promoted once a stage: one set at 128 tokens
    ("w4a8-mxfp4-fp8", 192, True, True),
    (_mxfp4_weights(G32), 64, True, True), (_mxfp4_weights(MXFP8), 64, True, True),  # four promotions a stage
    ("w8a8-int8-channel", 128, False, False),  # s32 sums exact over K: nothing promoted in the loop
    ("w8a8-fp8-channel", 8, False, False)])  # halves of 4 tokens are off wgmma's n step
def test_overlapped_promotion_where_measured_faster(scheme, block_m: int, fold: bool, expected: bool) -> None:
    """Two token halves (each promoted while the other's wgmmas run) wherever bench/a8_sweep.py measured them
    faster (compose_a8.overlaps_promotion); the source then issues m64n{block_m / 2}k32 and waits for one half."""
    layer = LayerConfig(n=4096, k=4096, scheme=scheme, fold_scales=fold)
    tuning = attrs.evolve(dict(choose_tunings(layer, get_target("sm_90a"), stored=False).buckets)[None],
                          block_m=block_m, raster="n_major")
    assert compose_a8.overlaps_promotion(layer, tuning) is expected
    src = build(compose(layer, ComputeConfig(), tuning, get_target("sm_90a")), compile=False).source
    half = f"wgmma.mma_async.sync.aligned.m64n{block_m // 2}k32."
    assert (half in src and "wgmma_wait<1>();  // half 0 of group pg has retired" in src) is expected
    assert (f"wgmma.mma_async.sync.aligned.m64n{block_m}k32." in src) is not expected
    if expected:  # half 1 promotes token tiles kHalfTiles .. and its wgmmas read the tile's rows from kBlockM / 2 on
        assert src.count("const int j = 0 + jj;") == 1 and src.count("const int j = kHalfTiles + jj;") == 1
        assert src.count("a_step_descriptor(a_stage + kHalfBytes, step)") == 2
        assert src.count("a_step_descriptor(a_stage, step)") == 2
        assert "constexpr u32 kHalfBytes = cfg::kBlockM / 2 * 128;" in src


@pytest.mark.parametrize("block_m,overlap", [(64, True), (80, False), (96, True), (112, False), (128, True)])
def test_int8_halves_are_integer_wgmma_shapes(block_m: int, overlap: bool) -> None:
    """Integer wgmma takes N of 8 .. 32 or a multiple of 16: promoted int8 tiles whose halves are not keep one set
    of partial sums (m64n80k32 for 80 tokens, not two m64n40k32), and compile."""
    layer = LayerConfig(n=1024, k=2048, scheme=hg.QuantScheme("int8", group_size=128, scale_dtype="float32",
                                                               activation=hg.ActivationScheme("int8")))
    target = get_target("sm_90a")
    tuning = restaged(layer, target, dict(choose_tunings(layer, target, stored=False).buckets)[None],
                      block_m=block_m, raster="n_major")
    assert compose_a8.overlaps_promotion(layer, tuning) is overlap
    kernel = build(compose(layer, ComputeConfig(), tuning, target))
    n = block_m // 2 if overlap else block_m
    assert f"m64n{n}k32.s32.s8.s8" in kernel.source and kernel.resources["spill_store_bytes"] == 0
    with pytest.raises(ValueError, match="N must be 8, 16, 24, 32 or a multiple of 16"):
        WgmmaRS8(weight="int8", activation="int8", n=40)


def test_group32_activation_scales_take_128_token_tiles(monkeypatch) -> None:
    """Staged group-32 activation scales (fp32, and MXFP8's e8m0 bytes) fit 128 tokens in overlapped halves (M = 4096:
    fp8 group-32 392.4 -> 329.1 us, MXFP8 429.9 -> 355.0); e8m0 ones read from global memory at each promotion (K not
    whole stages, or STAGE_E8M0_SCALES off) stay at 64 (128 spills)."""
    target = get_target("sm_90a")
    for act, k, tile in ((G32, 4096, 128), (MXFP8, 4096, 128), (MXFP8, 4096 + 64, 64)):
        layer = LayerConfig(n=3072, k=k, scheme=_mxfp4_weights(act), fold_scales=True)
        assert dict(choose_tunings(layer, target, stored=False).buckets)[None].block_m == tile, (act, k)
    monkeypatch.setattr(compose_a8, "STAGE_E8M0_SCALES", False)
    layer = LayerConfig(n=3072, k=4096, scheme=_mxfp4_weights(MXFP8), fold_scales=True)
    assert dict(choose_tunings(layer, target, stored=False).buckets)[None].block_m == 64


@pytest.mark.parametrize("block_m", [64, 128])
@pytest.mark.parametrize("weights", ["mxfp4-fold", "mxfp4", "mxfp8"])
def test_staged_e8m0_activation_scales_compile_without_spills(monkeypatch, weights: str, block_m: int) -> None:
    """STAGE_E8M0_SCALES (the default): MXFP8 activation scales staged with the codes, [kBlockM][4] bytes a stage,
    read from shared memory at each promotion; switched off, the sources keep their global loads; not staged where
    a stage's groups are not whole 4-byte words or K is not whole stages."""
    scheme = _mxfp4_weights(MXFP8) if weights.startswith("mxfp4") else "w8a8-mxfp8"
    layer = LayerConfig(n=3072, k=4096, scheme=scheme, fold_scales=weights == "mxfp4-fold")
    target = get_target("sm_90a")
    base = dict(choose_tunings(layer, target, stored=False).buckets)[None]
    monkeypatch.setattr(compose_a8, "STAGE_E8M0_SCALES", False)
    off = build(compose(layer, ComputeConfig(), restaged(layer, target, base, block_m=block_m), target), compile=False)
    assert "a_bytes" not in off.source and off.a_scale_alignment == 1
    monkeypatch.setattr(compose_a8, "STAGE_E8M0_SCALES", True)
    tuning = restaged(layer, target, base, block_m=block_m)  # the ring holds a byte a group more
    plan = compose(layer, ComputeConfig(), tuning, target)
    kernel = build(plan)
    assert "cp_async_4(smem_stage + cfg::kActivationScaleOffset + token * cfg::kStageActivationGroups + i" in \
        kernel.source and "kStageActivationGroups = 4;" in kernel.source
    on = compose_a8.shared_memory(layer, tuning)
    assert kernel.a_scale_alignment == 4 and on.activation_scales == block_m * 4  # 4 groups of a byte per token
    assert plan.shared_bytes >= on.stages * on.stage
    r = kernel.resources
    assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, r
    # a stage's groups of 2 bytes (group 64) or K off whole stages keep the global loads
    assert not compose_a8.staged_e8m0_scales(attrs.evolve(layer, k=4096 + 64), 128)
    g64 = hg.ActivationScheme("float8e4m3", granularity="group", group_size=64, scale_dtype="float8e8m0")
    assert not compose_a8.staged_e8m0_scales(LayerConfig(n=3072, k=4096, scheme=_mxfp4_weights(g64)), 128)
    assert compose_a8.staged_e8m0_scales(layer, 128)


def _f16_mma_source() -> str:
    from humming_gen.pipelines.standard import compose_a8 as standard_a8

    old, standard_a8.FP8_ON_F16_MMA = standard_a8.FP8_ON_F16_MMA, True
    try:
        plan = _plan("w8a8-fp8-channel", "sm_90a", 1, pipeline="standard")
    finally:
        standard_a8.FP8_ON_F16_MMA = old
    src = generate(plan)
    return src[src.index("void widen_activation_fragment("):]


@pytest.mark.parametrize("low_byte_low_half", [True, False])
def test_fp8_on_f16_mmas_sum_the_k32_products(low_byte_low_half: bool) -> None:
    """compose_a8.FP8_ON_F16_MMA (opt-in, GPU-untested): the operands of the two m16n8k16 mmas, read from the
    rendered source (which k32 register and which code pair feeds each of their registers), put back together by
    the m16n8k16 fragment maps, multiply to the k32 product of the 8-bit fragments, whichever byte of a pair cvt
    puts in the low half (the same cvt serves both operands)."""
    src = _f16_mma_source()
    # variable -> (k32 register expression, pair) from the x4_to_f16(a[...], lo, hi) calls; mma j's operand list
    pairs = {}
    for reg, lo, hi in re.findall(r"x4_to_f16\(a\[(2 \* j(?: \+ 1)?)\], (\w+), (\w+)\)", src):
        pairs[lo], pairs[hi] = (reg, 0), (reg, 1)
    operands = re.search(r':\s*"r"\((\w+)\), "r"\((\w+)\), "r"\((\w+)\), "r"\((\w+)\), "r"\(b16\[(2 \* j)\]\), '
                         r'"r"\(b16\[(2 \* j \+ 1)\]\)', src)
    widened = re.search(r"x4_to_f16\(b\[j\], b16\[(2 \* j(?: \+ 1)?)\], b16\[(2 \* j(?: \+ 1)?)\]\)", src)
    assert operands and len(pairs) == 4 and widened, "the f16 mma's operand lists changed: update this test"
    b_pair = {widened.group(1): 0, widened.group(2): 1}  # b16 index expression -> code pair of b[j]
    torch.manual_seed(0)
    w = torch.randint(-8, 8, (16, 32), dtype=torch.int64)  # 16 n x 32 k, the 8-bit A operand
    x = torch.randint(-8, 8, (32, 8), dtype=torch.int64)   # 32 k x 8 m, the 8-bit B operand
    got = torch.zeros(16, 8, dtype=torch.int64)
    order = (0, 1) if low_byte_low_half else (1, 0)
    for j in range(2):
        a16 = torch.zeros(16, 16, dtype=torch.int64)
        b16 = torch.zeros(16, 8, dtype=torch.int64)
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for reg16, name in enumerate(operands.groups()[:4]):
                reg_expr, pair = pairs[name]
                reg8 = 2 * j + (1 if reg_expr.endswith("+ 1") else 0)
                for half in range(2):
                    byte = 2 * pair + order[half]
                    row8, k8 = MMA_SYNC_M16N8K32_8BIT.a_element(lane, reg8, byte)
                    row16, k16 = MMA_SYNC_M16N8K16.a_element(lane, reg16, half)
                    assert row8 == row16
                    a16[row16, k16] = w[row8, k8]
            for reg16, expr in enumerate(operands.groups()[4:]):  # the mma's B registers: pairs of b[j]
                for half in range(2):
                    k8 = 4 * t + 16 * j + 2 * b_pair[expr] + order[half]  # B register j, byte 2 * pair + half
                    k16 = 2 * t + 8 * reg16 + half
                    b16[k16, g] = x[k8, g]
        got += a16 @ b16
    assert torch.equal(got, w @ x)


@pytest.mark.parametrize("scheme", ["w8a8-fp8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8"])
def test_fp8_on_f16_mmas_compile_on_sm90a_only(scheme: str) -> None:
    """The opt-in applies where fp8 mma.sync is emulated (sm_90a): the kernels compile without spills and run no
    fp8 mma.sync; sm_89 and sm_120a keep their native m16n8k32."""
    from humming_gen.pipelines.standard import compose_a8 as standard_a8

    old, standard_a8.FP8_ON_F16_MMA = standard_a8.FP8_ON_F16_MMA, True
    try:
        plans = [_plan(scheme, "sm_90a", m, pipeline="standard", has_bias=True) for m in (1, 16, 64)]
        native = [_plan(scheme, target, 1, pipeline="standard") for target in ("sm_89", "sm_120a")]
    finally:
        standard_a8.FP8_ON_F16_MMA = old
    for plan, kernel in zip(plans, build_many(plans)):
        src = generate(plan)
        assert "m16n8k16.row.col.f32.f16.f16.f32" in src and "mma.sync.aligned.m16n8k32" not in src
        assert_no_spills(kernel, plan.tuning.block_m)
    for plan in native:
        assert "mma.sync.aligned.m16n8k32" in generate(plan) and "_f16mma" not in plan.kernel_name


def test_fp8_codes_are_exact_in_f16() -> None:
    """MmaSyncM16N8K32ViaF16 relies on cvt.rn.f16x2.{e4m3x2, e5m2x2} being exact: every finite e4m3 / e5m2 code is
    an f16 value (e4m3's subnormals down to 2^-9 are f16 normals, e5m2 shares f16's exponent range), and the
    non-finite codes (e4m3 0x7f / 0xff NaN; e5m2 inf and NaN) stay what they are, as in the native fp8 mma."""
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).double()
        widened = values.to(torch.float16).double()
        finite = torch.isfinite(values)
        assert torch.equal(widened[finite], values[finite]), dtype
        assert torch.equal(torch.isnan(widened), torch.isnan(values)) and torch.equal(widened[torch.isinf(values)],
                                                                                     values[torch.isinf(values)])


def test_fp8_on_f16_mmas_every_path_compiles(monkeypatch) -> None:
    """The opt-in through the skeleton's other paths on sm_90a (MoE indexed / grouped with activation group scales,
    the fused output quantization, a_load='quantize', split-K with one warp along k, e5m2 operands): each renders
    the f16 mmas and compiles without spills; sm_100a (no wgmma) keeps the native m16n8k32."""
    from humming_gen.pipelines.standard import compose_a8 as standard_a8

    monkeypatch.setattr(standard_a8, "FP8_ON_F16_MMA", True)
    tgt = get_target("sm_90a")
    e5m2 = hg.QuantScheme("float8e5m2", granularity="channel", scale_dtype="float32",
                          activation=hg.ActivationScheme("float8e5m2", granularity="token"))

    def moe(scheme, compute, bucket, n=1024, k=2048):
        layer = LayerConfig(n=n, k=k, scheme=scheme, num_experts=8, has_bias=True)
        t = choose_tunings(layer, tgt, pipeline="standard").buckets[bucket][1]
        return compose(layer, compute, attrs.evolve(t, split_k=1), tgt)

    def dense(scheme, m, **changes):
        layer = LayerConfig(n=4000, k=3072, scheme=scheme, has_bias=True)
        t = choose_tunings(layer, tgt, pipeline="standard", stored=False).for_m(m)
        return compose(layer, ComputeConfig(), attrs.evolve(t, **changes), tgt)

    mx = hg.scheme("w8a8-mxfp8").activation
    fused = ComputeConfig(gemm="indexed", epilogue_activation="silu_mul", epilogue_quantization=mx)
    plans = [moe("w8a8-mxfp8", ComputeConfig(gemm="indexed", topk_weight=True), 2),
             moe("w8a8-fp8-block128", ComputeConfig(gemm="grouped_masked"), -1),
             moe("w4a8-mxfp4-fp8", ComputeConfig(gemm="grouped_contiguous"), 0),
             moe("w8a8-mxfp8", fused, 0, n=512, k=256),
             dense("w8a8-fp8-channel", 16, a_load="quantize"), dense("w4a8-int4-g128-fp8", 1, a_load="quantize"),
             dense("w8a8-fp8-block128", 16, split_k=2, warps_k=1), dense(e5m2, 64)]
    for plan, kernel in zip(plans, build_many(plans)):
        src = generate(plan)
        assert "m16n8k16.row.col.f32.f16.f16.f32" in src and "mma.sync.aligned.m16n8k32" not in src, plan.kernel_name
        assert "_f16mma" in plan.kernel_name, plan.kernel_name
        assert_no_spills(kernel, plan.kernel_name)
    assert "cvt.rn.f16x2.e5m2x2" in generate(plans[-1]) and "cvt.rn.f16x2.e4m3x2" not in generate(plans[-1])
    native = _plan("w8a8-fp8-channel", "sm_100a", 1, pipeline="standard")
    assert "mma.sync.aligned.m16n8k32" in generate(native) and "_f16mma" not in native.kernel_name

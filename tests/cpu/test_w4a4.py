"""int4 weights x int4 activations on the standard pipeline (mma.sync m16n8k64 s4): the s4 atom against the PTX ISA
fragment tables, the packed-byte equivalence with the 8-bit atom, the BLayoutS4 weight layout, composition,
refusals, NVRTC compilation without spills, the rendered source, and QuantLinear's compute type and fallback.

Expected positions come from the PTX ISA's m16n8k64 .s4 fragment description (written out here, not read from the
atoms): A register r of lane (g = lane / 4, t = lane % 4) holds elements a_{8r}..a_{8r+7}, element 0 in the least
significant nibble, row g (+8 for odd r), column 8t + (i % 8) (+32 for r = 2, 3); B register j holds rows (k)
8t + (i % 8) + 32 j of column g.
"""

from __future__ import annotations


import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.components.mma.atoms import MMA_SYNC_M16N8K32_8BIT, MMA_SYNC_M16N8K64_S4
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build
from humming_gen.pipelines.base import ComposeError
from humming_gen.pipelines.standard import STANDARD
from humming_gen.pipelines.standard.compose_a8 import byte_layer
from humming_gen.pipelines.warp_specialized import WARP_SPECIALIZED
from humming_gen.pipelines.weights import prepare_weight
from humming_gen.runtime.cache import _cuda_tool, _sass as disassemble
from humming_gen.schemes.packing import (BLayoutS4, pack_codes8, pack_s4, pair_nibbles, split_nibbles, unpack_codes8,
                                         unpack_s4)
from humming_gen.targets import get_target
from helpers import assert_no_spills

G128, CHANNEL = "w4a4-int4-g128", "w4a4-int4-channel"
A = hg.ActivationScheme


def _scheme(weight_gran: str = "group", group: int = 128, act: A | None = None, **kw) -> hg.QuantScheme:
    act = act or A("int4")
    if weight_gran == "channel":
        return hg.QuantScheme("int4", granularity="channel", scale_dtype="float32", activation=act, **kw)
    return hg.QuantScheme("int4", group_size=group, scale_dtype="bfloat16", activation=act, **kw)


def _plan(scheme, target: str = "sm_90a", m: int = 1, n: int = 4000, k: int = 3072, compute=None, **kw):
    layer = LayerConfig(n=n, k=k, scheme=hg.scheme(scheme) if isinstance(scheme, str) else scheme, **kw)
    tgt = get_target(target)
    return compose(layer, compute or ComputeConfig(), choose_tunings(layer, tgt).for_m(m), tgt)


# --- fragments -----------------------------------------------------------------------------------------------------
def _ptx_s4_a(lane: int, reg: int, i: int) -> tuple[int, int]:
    g, t = lane // 4, lane % 4
    return g + 8 * (reg % 2), 8 * t + i + 32 * (reg // 2)


def _ptx_s4_b(lane: int, reg: int, i: int) -> tuple[int, int]:
    """(k, column) of nibble i of B register reg (m16n8k64 .s4)."""
    g, t = lane // 4, lane % 4
    return 8 * t + i + 32 * reg, g


def _ptx_s8_b(lane: int, reg: int, b: int) -> tuple[int, int]:
    """(k, column) of byte b of B register reg (m16n8k32 .s8), what ldmatrix gives the 8-bit kernels."""
    g, t = lane // 4, lane % 4
    return 4 * t + b + 16 * reg, g


def test_s4_atom_is_the_ptx_fragment() -> None:
    assert (MMA_SYNC_M16N8K64_S4.k, MMA_SYNC_M16N8K64_S4.a_per_register) == (64, 8)
    for lane in range(32):
        for reg in range(4):
            for i in range(8):
                assert MMA_SYNC_M16N8K64_S4.a_element(lane, reg, i) == _ptx_s4_a(lane, reg, i)


def test_packed_bytes_through_the_8bit_fragments_are_the_s4_fragments() -> None:
    """Codes packed two per byte along k (low nibble = even k): nibble e of byte b of a register of the k32 8-bit
    fragment of the packed bytes is element 2b + e of the same register of the k64 s4 fragment of the codes, for A
    (the weight layout) and B (the activation tile read by ldmatrix)."""
    for lane in range(32):
        for reg in range(4):
            for b in range(4):
                row, kb = MMA_SYNC_M16N8K32_8BIT.a_element(lane, reg, b)
                for e in range(2):
                    assert _ptx_s4_a(lane, reg, 2 * b + e) == (row, 2 * kb + e)
        for reg in range(2):
            for b in range(4):
                kb, col = _ptx_s8_b(lane, reg, b)
                for e in range(2):
                    assert _ptx_s4_b(lane, reg, 2 * b + e) == (2 * kb + e, col)


# --- weight layout -------------------------------------------------------------------------------------------------
LAYOUTS = [(128, 2, 64), (64, 1, 32), (256, 4, 128)]


@pytest.mark.parametrize("spec", LAYOUTS, ids=lambda s: "bn{}-wn{}-wkb{}".format(*s))
def test_blayout_s4_round_trip_and_fragments(spec) -> None:
    """pack_s4 round-trips, and reading the packed words as k64 s4 A fragments (tile k-step-major, one 16-byte load
    per lane and tile) gives every code at the position of the PTX table."""
    layout = BLayoutS4(*spec)
    n, k = 2 * layout.block_n, 4 * 2 * layout.warp_k
    codes = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(3), dtype=torch.int64)
    codes = codes.to(torch.uint8)
    packed = pack_s4(codes, layout)
    assert packed.dtype == torch.int32 and packed.numel() * 8 == n * k
    assert torch.equal(unpack_s4(packed, layout, n, k), codes)
    assert torch.equal(split_nibbles(pair_nibbles(codes)), codes)
    assert torch.equal(pair_nibbles(codes)[:, 0], codes[:, 0] | (codes[:, 1] << 4))
    # the kernel's view: [n block][k slice][warp n][tile][lane][register], nibble i of a register = element i
    nb, ks = n // layout.block_n, k // (2 * layout.warp_k)
    words = packed.to(torch.int64).reshape(nb, ks, layout.warps_n, layout.tiles_per_warp, 32, 4) & 0xFFFFFFFF
    n_tiles = layout.warp_n // 16
    seen = torch.full((n, k), -1, dtype=torch.int64)
    for tile in range(layout.tiles_per_warp):
        kstep, nt = tile // n_tiles, tile % n_tiles
        for lane in range(32):
            for reg in range(4):
                for i in range(8):
                    row, col = _ptx_s4_a(lane, reg, i)
                    for b_ in range(nb):
                        for w in range(layout.warps_n):
                            nn = b_ * layout.block_n + w * layout.warp_n + nt * 16 + row
                            kk = torch.arange(ks) * 2 * layout.warp_k + kstep * 64 + col
                            seen[nn, kk] = (words[b_, :, w, tile, lane, reg] >> (4 * i)) & 0xF
    assert torch.equal(seen, codes.to(torch.int64))


def test_blayout_s4_is_blayout8_of_the_packed_bytes() -> None:
    layout = BLayoutS4(128, 2, 64)
    codes = torch.randint(0, 16, (256, 512), generator=torch.Generator().manual_seed(4), dtype=torch.int64)
    codes = codes.to(torch.uint8)
    assert torch.equal(pack_s4(codes, layout), pack_codes8(pair_nibbles(codes), layout.bytes_layout))
    assert torch.equal(unpack_codes8(pack_s4(codes, layout), layout.bytes_layout, 256, 256), pair_nibbles(codes))
    assert layout.stage_bytes(2) == 128 * 64 * 2 and layout.bits == 4


@pytest.mark.parametrize("scheme", [G128, CHANNEL])
def test_prepared_weight(scheme: str) -> None:
    torch.manual_seed(0)
    n, k = 300, 640
    qw = hg.scheme(scheme).quantize(torch.randn(n, k) * 0.05)
    plan = _plan(scheme, n=n, k=k)
    lay = plan.layout
    assert isinstance(lay.b_layout, BLayoutS4) and lay.k_pad == 1024 and lay.n_pad == 384
    pw = prepare_weight(plan, qw, "cpu")
    nib = unpack_s4(pw.b, lay.b_layout, lay.n_pad, lay.k_pad).to(torch.int32)
    values = torch.where(nib >= 8, nib - 16, nib)  # two's complement nibbles: the code's value, no code scale
    assert torch.equal(values[:n, :k].double(), qw.scheme.weight.decode(qw.codes.to(torch.int64)).double())
    assert not values[n:].any() and not values[:, k:].any()
    if qw.scheme.granularity == "group":
        assert pw.out_scale is None and pw.b_scale.shape == (lay.k_pad // 128, lay.n_pad)
        assert torch.equal(pw.b_scale[3, 17], qw.scales[17, 3].float())
    else:
        assert pw.b_scale is None and torch.equal(pw.out_scale[:n], qw.scales.reshape(-1).float())


# --- composition and source ----------------------------------------------------------------------------------------
def test_byte_layer_halves_k_and_groups() -> None:
    layer = LayerConfig(n=1024, k=3072, scheme=_scheme(group=128, act=A("int4", granularity="group", group_size=64)))
    bl = byte_layer(layer)
    assert (bl.k, bl.scheme.group_size, bl.scheme.activation.group_size) == (1536, 64, 32)
    assert bl.scheme.weight.name == bl.scheme.activation.dtype.name == "int8"


def _source(scheme, target: str = "sm_90a", m: int = 1, **kw) -> str:
    return build(_plan(scheme, target, m, **kw), compile=False).source


def test_rendered_source_uses_k64_s4_and_nothing_else() -> None:
    for scheme, m in ((G128, 1), (CHANNEL, 1000), (_scheme(act=A("int4", granularity="group", group_size=64)), 16)):
        src = _source(scheme, m=m, has_bias=True)
        assert "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32" in src
        for gone in ("mma_m16n8k32", "m16n8k32.row", "mma_m16n8k16", "nibbles_to_a8", "load_b_tile_pair", "e4m3",
                     "wgmma", "b_zero", "dequant_pair", "{% "):
            assert gone not in src, (gone, scheme)
        assert "mma_m16n8k64(acc_slice" in src and "standard with int4 activations" in src
    g = _source(G128)
    assert "kK = 1536;" in g and "kWeightGroupK = 64;" in g and "kPromoteK = 64;" in g  # bytes: 2 codes each
    grp = _source(_scheme(group=128, act=A("int4", granularity="group", group_size=64)), m=16)
    assert "kActivationGroupK = 32;" in grp and "kActivationGroups = 48;" in grp and "kPromoteK = 32;" in grp


def test_component_declarations_match_the_rendered_source() -> None:
    from symbols import declaration_mismatches

    wrong = {}
    for scheme in (G128, CHANNEL, _scheme(act=A("int4", granularity="group", group_size=128))):
        layer = LayerConfig(4096, 4096, hg.scheme(scheme) if isinstance(scheme, str) else scheme, has_bias=True)
        for t in choose_tunings(layer, get_target("sm_90a")).tunings():
            wrong.update(declaration_mismatches(compose(layer, ComputeConfig(), t, get_target("sm_90a"))))
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())


def test_every_bucket_is_standard_m16n8k64() -> None:
    """wgmma has no s4: every bucket stays on the standard pipeline, also on sm_90a at large M."""
    layer = LayerConfig(n=8192, k=8192, scheme=hg.scheme(G128))
    for target in ("sm_80", "sm_90a"):
        plan = choose_tunings(layer, get_target(target))
        assert {(t.pipeline, t.mma) for t in plan.tunings()} == {("standard", "m16n8k64")}
    reasons = WARP_SPECIALIZED.supports(layer, ComputeConfig(), get_target("sm_90a"))
    assert any("int4 weights x int4 activations" in r for r in reasons)


INT4_TARGETS = [t for t in ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_103a", "sm_120a", "sm_121a")
                if get_target(t).has("mma_int4")]
COMPILE = [(G128, "sm_80", (1, 1000)), (G128, "sm_89", (1, 16, 1000)), (G128, "sm_90a", (1, 16, 32, 64, 256, 1000)),
           (CHANNEL, "sm_90a", (1, 1000)),
           (_scheme(act=A("int4", granularity="group", group_size=64)), "sm_90a", (1, 64, 1000)),
           (_scheme(weight_gran="channel", act=A("int4", granularity="tensor")), "sm_89", (1, 1000))]
COMPILE += [(G128, t, (1, 1000)) for t in INT4_TARGETS if t not in ("sm_80", "sm_89", "sm_90a")]


@pytest.mark.parametrize("scheme,target,ms", COMPILE, ids=lambda v: v if isinstance(v, str) else None)
def test_compiles_without_spills(scheme, target: str, ms) -> None:
    for m in ms:
        assert_no_spills(build(_plan(scheme, target, m, has_bias=True)), m)


@pytest.mark.skipif(_cuda_tool("cuobjdump") is None or _cuda_tool("nvdisasm") is None,
                    reason="cuobjdump and the nvdisasm it runs not found")
@pytest.mark.parametrize("target,sass", [("sm_80", "IMMA.16864.S4.S4"), ("sm_89", "IMMA.16864.S4.S4"),
                                         ("sm_90a", "IMMA.16832.S8.S8")])
def test_sass_of_the_s4_mma(target: str, sass: str, tmp_path) -> None:
    """Ampere and Ada run m16n8k64 s4 on int4 tensor cores; from Hopper on ptxas lowers it to s8 IMMA (no int4
    tensor cores): exact, but not twice the int8 rate (docs/DESIGN.md)."""
    kernel = build(_plan(CHANNEL, target, 1, n=4096, k=4096))
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(kernel.compiled.cubin)
    out = disassemble(cubin)
    assert out is not None and sass in out


# --- refusals and fallback -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme,needle", [
    (hg.QuantScheme("uint4", group_size=128, scale_dtype="float32", zero_point="int", activation=A("int4")),
     "weight format uint4 with int4 activations"),
    (hg.QuantScheme("uint4", group_size=128, scale_dtype="float32", zero_point="int", activation=A("int4")),
     "zero points"),
    (hg.QuantScheme("int8", granularity="channel", scale_dtype="float32", activation=A("int4")),
     "weight format int8 with int4 activations"),
    (hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", activation=A("int4")),
     "weight format float4e2m1 with int4 activations"),
    (_scheme(group=32), "weight scale groups of 32 along K with int4 activations"),
    (_scheme(group=96), "multiple of 64"),
    (_scheme(act=A("int4", granularity="group", group_size=32)), "activation scale groups of 32"),
], ids=["uint4", "zero-point", "int8-weights", "e2m1-weights", "wgroup32", "wgroup96", "agroup32"])
def test_unserved_schemes_are_refused_naming_the_field(scheme, needle: str) -> None:
    with pytest.raises(ComposeError, match=needle):
        _plan(scheme, k=3072, n=1024)


def test_odd_k_and_moe_are_refused() -> None:
    with pytest.raises(ComposeError, match="K = 3001 with int4 activations"):
        _plan(CHANNEL, k=3001, n=1024)
    layer = LayerConfig(n=1024, k=2048, scheme=hg.scheme(G128), num_experts=4)
    reasons = STANDARD.supports(layer, ComputeConfig(gemm="indexed", topk_weight=False), get_target("sm_90a"))
    assert any("MoE GEMMs" in r for r in reasons)


def test_target_without_int4_mma_names_the_feature_and_falls_back_to_int8() -> None:
    """A target whose table lacks mma_int4 (as zhenwu810e): compose names it; QuantLinear runs int8 per token."""
    import attrs

    no_int4 = attrs.evolve(get_target("sm_90a"), name="sm_90a_no_int4", features=get_target("sm_90a").features
                           - {"mma_int4"})
    layer = LayerConfig(n=1024, k=2048, scheme=hg.scheme(G128))
    with pytest.raises(ComposeError, match="mma_int4"):
        compose(layer, ComputeConfig(), choose_tunings(layer, no_int4).for_m(1), no_int4)
    torch.manual_seed(1)
    w = torch.randn(256, 512)
    lin = hg.QuantLinear.from_float(w, G128, target=no_int4, device="cpu")
    assert lin.compute_dtype == "int8" and lin.activation_scheme == A("int8", granularity="token")
    assert lin.fallback_reasons and "mma_int4" in " ".join(lin.fallback_reasons)
    assert {k.plan.tuning.mma for _, k in lin._buckets} <= {"m16n8k32", "wgmma"}
    with pytest.raises(ValueError, match="mma_int4"):
        hg.QuantLinear.from_float(w, G128, target=no_int4, device="cpu", strict=True)
    assert get_target("zhenwu810e").activation_compute_dtype("int4")[0] != "int4"


@pytest.mark.parametrize("target,strict", [("sm_80", False), ("sm_89", False), ("sm_90a", True)])
def test_quantlinear_runs_int4_natively(target: str, strict: bool) -> None:
    """Where the target has int4 tensor cores (sm_80 - sm_89), and with strict=True where ptxas emulates them."""
    torch.manual_seed(2)
    w, bias = torch.randn(256, 1024) * 0.05, torch.randn(256)
    lin = hg.QuantLinear.from_float(w, G128, bias=bias, target=target, device="cpu", strict=strict)
    assert lin.compute_dtype == "int4" and not lin.fallback_reasons
    assert lin.activation_scheme == hg.scheme(G128).activation
    assert {k.plan.tuning.mma for _, k in lin._buckets} == {"m16n8k64"}
    assert isinstance(lin.weight.b, torch.Tensor) and lin.weight.b.numel() * 8 == 256 * 1024
    qw = hg.scheme(CHANNEL).quantize(w)
    lin = hg.QuantLinear.from_quantized(qw, target=target, device="cpu", dtype=torch.float16, strict=strict)
    assert lin.compute_dtype == "int4"
    assert hg.QuantLinear.from_quantized(qw, target=target, device="cpu", weight_only=True).compute_dtype == "bfloat16"


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a", "sm_120a"])
def test_emulated_int4_mma_falls_back_to_int8_unless_strict(target: str, caplog) -> None:
    """From sm_90a on ptxas lowers the s4 mma to s8 IMMA (no int4 tensor cores; test_sass_of_the_s4_mma): W4A4 int4
    took 3130.7 us at M = 1024 on the H200 against 211.8 with int8 activations, so layers fall back to int8 (the
    W4A8 kernels, warp-specialized at large M on sm_90a), logged once naming the emulation; strict=True runs it."""
    import logging

    assert ("int4", "int4") in get_target(target).emulated_mma
    w = torch.randn(256, 1024) * 0.05
    with caplog.at_level(logging.WARNING, logger="humming_gen"):
        lin = hg.QuantLinear.from_float(w, G128, target=target, device="cpu")
    assert lin.compute_dtype == "int8" and lin.activation_scheme == A("int8", granularity="token")
    assert "emulates" in lin.fallback_reasons[0] and "strict=True runs the emulation" in caplog.text
    assert "m16n8k64" not in {k.plan.tuning.mma for _, k in lin._buckets}
    if target == "sm_90a":
        assert lin.kernel_for(4096).plan.pipeline == "warp_specialized"
    assert hg.QuantLinear.from_float(w, G128, target=target, device="cpu", strict=True).compute_dtype == "int4"
    for native in ("sm_80", "sm_86", "sm_89"):
        assert not get_target(native).emulated_mma


def test_unserved_int4_schemes_fall_back_to_int8_with_weights_unchanged() -> None:
    """Group sizes off 64 and non-int4 weights fall back to int8 per-token activations, which those weights run."""
    w = torch.randn(256, 512)
    lin = hg.QuantLinear.from_float(w, _scheme(group=32), target="sm_90a", device="cpu")
    assert lin.compute_dtype == "int8" and lin.scheme.group_size == 32
    with pytest.raises(ValueError, match="multiple of 64"):
        hg.QuantLinear.from_float(w, _scheme(group=32), target="sm_90a", device="cpu", strict=True)


def test_presets() -> None:
    for name, gran in ((G128, "group"), (CHANNEL, "channel")):
        s = hg.scheme(name)
        assert s.weight.name == "int4" and s.granularity == gran and s.activation == A("int4", granularity="token")


@pytest.mark.parametrize("weight,act", [("channel", "tensor"), ("g64", "g64"), ("g128", "token")])
def test_gpu_test_layers_build_on_cpu(weight: str, act: str) -> None:
    """The layers of tests/gpu/test_linear_w4a4.py, built for sm_90a on the CPU with strict=True, as that test builds
    them to run the s4 kernels on the H200 (kernels compiled, weights packed), and their float64 reference."""
    from humming_gen.reference import reference_gemm

    acts = {"token": A("int4"), "g64": A("int4", granularity="group", group_size=64),
            "tensor": A("int4", granularity="tensor")}
    scheme = (_scheme(weight_gran="channel", act=acts[act]) if weight == "channel"
              else _scheme(group=int(weight[1:]), act=acts[act]))
    torch.manual_seed(5)
    n, k = 576, 3072
    qw = scheme.quantize(torch.randn(n, k) * 0.05)
    lin = hg.QuantLinear.from_quantized(qw, bias=torch.randn(n), target="sm_90a", device="cpu", strict=True)
    assert lin.compute_dtype == "int4"
    x = torch.randn(3, k)
    ref = reference_gemm(x.double(), qw)
    qa = scheme.activation.quantize(x)
    assert qa.codes.max() <= 15 and ref.shape == (3, n) and torch.isfinite(ref).all()


def test_quantmoe_falls_back_to_int8_activations() -> None:
    """MoE GEMMs with int4 activations are not generated: QuantMoE runs int8 per token with the weights unchanged."""
    torch.manual_seed(6)
    moe = hg.QuantMoE.from_float(torch.randn(4, 256, 256) * 0.05, torch.randn(4, 256, 128) * 0.05, G128,
                                 target="sm_90a", device="cpu")
    assert moe.compute_dtypes == ("int8", "int8")

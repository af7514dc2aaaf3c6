"""Kernels that quantize their 16-bit activations in the loader (TuningConfig.a_load='quantize', standard pipeline,
8-bit activations, small M): codegen (only the chosen branch renders; other kernels keep their sources), refusals,
NVRTC compilation without spills, the element and scale code (the activation-quantization kernel's own, checked
verbatim in the source and run on the host against ActivationScheme.quantize), and QuantLinear's bucket choice.
GPU numerics: tests/gpu/test_linear_fused_quant.py."""

from __future__ import annotations

import re
import subprocess

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.layer.weights import layout_key
from humming_gen.activation.components import BlockScaleRule, ElementCode, Rounding
from humming_gen.activation.kernel import QuantizeConfig, generate as generate_quantize
from humming_gen.codegen import compose
from humming_gen.codegen.render import environment
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build
from humming_gen.pipelines.base import ComposeError
from humming_gen.pipelines.standard.compose_a8 import quantize_a_plan
from humming_gen.targets import get_target
from helpers import assert_no_spills
from test_activation_quantize_host import CXX, MAIN, PRELUDE, _bits, _blocks

FUSED_NAMES = ("quantize_token_scales", "fetch_a_stage", "store_a_stage", "TokenScalesSmem", "a_token_scale_smem",
               "ATile8Quantize", "quantize_vector")


INT8_TENSOR = hg.QuantScheme("int8", granularity="channel", scale_dtype="float32",
                             activation=hg.ActivationScheme("int8", granularity="tensor"))


def _plan(scheme: str, target: str, m: int, a_load: str = "quantize", n: int = 4096, k: int = 4096, **kw):
    layer = LayerConfig(n=n, k=k, scheme=scheme, **kw)
    # (a_load='quantize' is the standard pipeline's; on sm_90a the heuristics run the warp-specialized kernels)
    t = choose_tunings(layer, get_target(target), pipeline="standard", stored=False).for_m(m)
    return compose(layer, ComputeConfig(), attrs.evolve(t, a_load=a_load), get_target(target))


def _source(*a, **kw) -> str:
    return build(_plan(*a, **kw), compile=False).source


def _body(src: str) -> str:
    """The source below the header comment (which lists configs and components)."""
    return src[src.index("typedef unsigned int u32;"):]


@pytest.mark.parametrize("scheme", ["w8a8-fp8-channel", "w8a8-int8-channel"])
def test_the_option_renders_only_its_branch(scheme: str) -> None:
    fused = _source(scheme, "sm_90a", 1, has_bias=True)
    plain = _source(scheme, "sm_90a", 1, a_load="cp_async", has_bias=True)
    for name in FUSED_NAMES:
        assert name not in plain, name
    body = _body(fused)
    for name in FUSED_NAMES[:5]:
        assert name in body, name
    assert "p.a_scale" not in body and "a_scale;" not in body  # no activation-scale argument: Params has none
    assert "load_a_stage(" not in body and "load_activation_stage" not in body
    assert "quantize_token_scales(x, p.lda, p.m, cfg::kK, tc.m0);" in body
    assert re.search(r"extern \"C\" __global__ .* gemm_\w+_xq\(", body)
    assert "16-bit activations x (m, k) bfloat16, row stride lda elements" in body
    # the 8-bit tile's fragment reads are shared (one template), so both kernels read codes alike
    frag = body[body.index("// B-operand fragments of one k32 step"):]
    assert frag[:frag.index("\n}\n")] in _body(plain)


def test_per_tensor_scales_are_static_in_the_loader() -> None:
    """Per-tensor activation scales: the loader reads the static scale (a checkpoint's input_scale) from p.a_scale,
    the epilogue multiplies by it as for quantize_activation's codes; no amax pass, no shared token scales."""
    body = _body(_source("w8a8-fp8-tensor", "sm_90a", 1))
    assert "load_tensor_scale(static_cast<const float*>(p.a_scale));" in body
    assert "const float a_scale = *static_cast<const float*>(p.a_scale);" in body  # the epilogue's
    for name in ("quantize_token_scales", "TokenScalesSmem", "a_amax_smem", "block_scale"):
        assert name not in body, name
    assert "fp32 static activation scale [1]" in body


def test_only_fp8_renders_the_fp8_conversion() -> None:
    assert "cvt_e4m3x2" in _source("w8a8-fp8-channel", "sm_90a", 16)
    src = _source("w8a8-int8-channel", "sm_90a", 16)
    assert "cvt_e4m3x2" not in src and "float8" not in _body(src) and "encode_int8" in src


@pytest.mark.parametrize("scheme", ["w8a8-fp8-channel", "w8a8-int8-channel"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_element_and_scale_code_are_the_quantize_kernels(scheme: str, dtype: str) -> None:
    """quotient, encode_pair, block_scale, load_vector, amax_bits and quantize_vector appear in the fused GEMM
    exactly as in humming_gen.quantize_activation's kernel for the same scheme, input type and target."""
    target = get_target("sm_90a")
    gemm = _source(scheme, "sm_90a", 1, dtype=dtype, has_bias=dtype == "float16")
    quant = generate_quantize(QuantizeConfig(hg.scheme(scheme).activation, dtype, target))
    def definition(src: str, fn: str) -> str:  # definitions precede uses: the first `fn(` in the body is its own
        body = _body(src)
        start = body.rindex("__device__", 0, body.index(" " + fn + "("))
        return body[start:body.index("\n}\n", start)]

    for fn in ("quotient", "encode_pair", "block_scale", "load_vector", "amax_bits", "quantize_vector", "round_to_odd"):
        assert definition(gemm, fn) == definition(quant, fn), fn


@pytest.mark.parametrize("scheme,target,m,dtype,bias", [
    ("w8a8-int8-channel", "sm_80", 1, "bfloat16", True), ("w8a8-int8-channel", "sm_80", 16, "float16", False),
    ("w8a8-fp8-channel", "sm_89", 1, "bfloat16", True), ("w8a8-int8-channel", "sm_89", 16, "bfloat16", False),
    ("w8a8-fp8-channel", "sm_90a", 1, "bfloat16", True), ("w8a8-fp8-channel", "sm_90a", 16, "float16", False),
    ("w8a8-int8-channel", "sm_90a", 1, "float16", True), ("w8a8-int8-channel", "sm_90a", 16, "bfloat16", False),
    ("w8a8-fp8-tensor", "sm_90a", 16, "bfloat16", True), ("w8a8-fp8-tensor", "sm_89", 1, "float16", False),
    (INT8_TENSOR, "sm_80", 16, "bfloat16", True),
    # W4A8: nibble weights widened in registers; the loader is the same
    ("w4a8-mxfp4-fp8", "sm_90a", 1, "bfloat16", True), ("w4a8-int4-g128-int8", "sm_90a", 16, "float16", False),
    ("w4a8-int4-g128-fp8", "sm_89", 16, "bfloat16", True), ("w4a8-int4-channel-int8", "sm_80", 1, "bfloat16", True)],
    ids=str)
def test_compiles_without_spills(scheme, target, m, dtype, bias) -> None:
    kernel = build(_plan(scheme, target, m, dtype=dtype, has_bias=bias))
    assert_no_spills(kernel, (scheme, target, m))
    assert kernel.plan.tuning.a_load == "quantize"


@pytest.mark.parametrize("scheme,needle", [
    ("w8a8-fp8-block128", "per-token scales"), ("w8a8-mxfp8", "per-token scales"), ("w4a4-nvfp4", "quantizes to")])
def test_unserved_schemes_are_refused(scheme: str, needle: str) -> None:
    with pytest.raises(ComposeError, match=needle):
        _plan(scheme, "sm_90a", 1)


def test_refusals_name_k_block_m_and_pipeline() -> None:
    with pytest.raises(ComposeError, match="multiple of 8"):
        _plan("w8a8-fp8-channel", "sm_90a", 1, k=4100)
    layer = LayerConfig(n=4096, k=4096, scheme="w8a8-fp8-channel")
    t = choose_tunings(layer, get_target("sm_90a"), pipeline="standard", stored=False).for_m(16)
    with pytest.raises(ComposeError, match="block_m <= 16"):
        compose(layer, ComputeConfig(), attrs.evolve(t, a_load="quantize", block_m=32, warps_m=1),
                get_target("sm_90a"))
    with pytest.raises(ValueError, match="needs pipeline='standard'"):
        attrs.evolve(choose_tunings(layer, get_target("sm_90a"), stored=False).for_m(64), a_load="quantize")


@pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("scheme,target", [("w8a8-fp8-channel", "sm_90a"), ("w8a8-int8-channel", "sm_80")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_in_kernel_quantization_matches_reference_on_the_host(scheme, target, dtype, tmp_path) -> None:
    """The fused plan's own Rounding / BlockScaleRule / ElementCode (software conversion: the host has no cvt),
    run as the loader runs them (row amax as |x| bits, block_scale, quotient, encode_pair) on 16-bit rows, against
    ActivationScheme.quantize: codes and fp32 token scales bit for bit."""
    plan = _plan(scheme, target, 16)
    act = hg.scheme(scheme).activation
    parts = [PRELUDE]
    for c in plan.components:
        if isinstance(c, Rounding):
            c = attrs.evolve(c, encoders=tuple(dict.fromkeys(c.encoders + (act.dtype,))))
        elif isinstance(c, ElementCode):
            c = attrs.evolve(c, convert=None)
        elif not isinstance(c, BlockScaleRule):
            continue
        parts.append(environment().get_template(c.template).render(**c.context()))
    assert len(parts) == 4
    src = tmp_path / "fused.cpp"
    src.write_text("\n".join(parts) + MAIN.replace("MASK", "255").replace("GLOBAL_READ", "").replace("GLOBAL_ARG", ""))
    exe = tmp_path / "fused"
    subprocess.run([CXX, "-O1", "-std=c++17", "-ffp-contract=off", str(src), "-o", str(exe)], check=True,
                   capture_output=True, text=True)
    rows = [x.to(dtype).to(torch.float32) for x in _blocks(act, seed=7)]
    rows = [x for x in rows if x.abs().max() < torch.finfo(dtype).max or not torch.isfinite(x).all()]
    lines = [str(len(rows))] + [" ".join([str(x.numel())] + [str(b) for b in _bits(x)]) for x in rows]
    out = subprocess.run([str(exe)], input="\n".join(lines), capture_output=True, text=True, check=True).stdout
    for r, (x, line) in enumerate(zip(rows, out.strip().splitlines())):
        got = [int(v) for v in line.split()]
        ref = act.quantize(x.reshape(1, -1))
        codes = ref.codes.reshape(-1)
        assert got[1:] == (codes.view(torch.uint8) if codes.dtype == torch.int8 else codes).tolist(), r
        want = ref.scales.reshape(-1)[:1].to(torch.float32)
        assert got[0] == _bits(want)[0] or (torch.isnan(want).all() and got[0] & 0x7FFFFFFF > 0x7F800000), r


def test_quantlinear_picks_fused_kernels_for_small_m_only() -> None:
    torch.manual_seed(0)
    w = torch.randn(256, 512)
    layer = hg.QuantLinear.from_float(w, "w8a8-fp8-channel", target="sm_90a", device="cpu", quantize_in_gemm=True)
    for (m_max, kernel), fused in zip(layer._buckets, layer.quantizes_in_gemm):
        assert fused == (m_max is not None and m_max <= 16), (m_max, kernel.name)
        assert (kernel.plan.tuning.a_load == "quantize") == fused
        assert kernel.name.endswith("_xq") == fused
        assert any(a.name == "a_scale" for a in kernel.plan.args) != fused
    assert any(layer.quantizes_in_gemm)
    default = hg.QuantLinear.from_float(w, "w8a8-fp8-channel", target="sm_90a", device="cpu")
    assert not any(default.quantizes_in_gemm)
    # (the default layer reads its weights from shared memory: BLayoutSw128, which mma.sync does not read)
    assert all(k.plan.tuning.b_operand == "shared" for _, k in default._buckets)
    assert all(k.plan.tuning.b_operand == "registers" for _, k in layer._buckets)
    default = hg.QuantLinear.from_float(w, "w8a8-fp8-channel", target="sm_90a", device="cpu",
                                        tunings=choose_tunings(layer.layer_config, layer.target, stored=False,
                                                               register_weights=True))
    # the fused buckets are the standard pipeline's (sm_90a's own plan runs the warp-specialized kernels there),
    # the others the register-weight plan's: one packed weight (BLayout8) for both
    standard = choose_tunings(layer.layer_config, layer.target, pipeline="standard", stored=False)
    for (m_max, a), (_, b) in zip(layer._buckets, default._buckets):
        expected = standard.for_m(m_max) if m_max is not None and m_max <= 16 else b.plan.tuning
        assert attrs.evolve(a.plan.tuning, a_load="cp_async") == attrs.evolve(expected, a_load="cp_async"), m_max
        assert a.plan.tuning.a_load == ("quantize" if m_max is not None and m_max <= 16 else expected.a_load)
    assert len({layout_key(k.plan) for _, k in layer._buckets + default._buckets}) == 1


def test_quantlinear_keeps_unserved_schemes_unfused() -> None:
    layer = hg.QuantLinear.from_float(torch.randn(256, 512), "w8a8-fp8-block128", target="sm_90a", device="cpu",
                                      quantize_in_gemm=True)
    assert not any(layer.quantizes_in_gemm)
    # and its buckets keep the default plan's (warp-specialized) kernels: nothing to gain from the standard ones
    default = hg.QuantLinear.from_float(torch.randn(256, 512), "w8a8-fp8-block128", target="sm_90a", device="cpu")
    assert [k.plan.tuning for _, k in layer._buckets] == [k.plan.tuning for _, k in default._buckets]


def test_quantlinear_fuses_per_tensor_scales_only_when_static() -> None:
    """A dynamic per-tensor scale is the amax of every row (a kernel of its own); a checkpoint's static one fuses."""
    qw = hg.scheme("w8a8-fp8-tensor").quantize(torch.randn(256, 512))
    dynamic = hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu", quantize_in_gemm=True)
    assert not any(dynamic.quantizes_in_gemm)
    qw.input_scale = torch.tensor([4.0 / 448])
    static = hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu", quantize_in_gemm=True)
    assert static.quantizes_in_gemm == [m is not None and m <= 16 for m, _ in static.tunings.buckets]
    assert any(static.quantizes_in_gemm)


@pytest.mark.parametrize("bad", [0.0, -0.01, float("inf"), float("nan")])
def test_static_scales_must_be_positive_and_finite(bad) -> None:
    """The kernels divide by a checkpoint's input_scale unchecked: the layers refuse a bad one when built."""
    qw = hg.scheme("w8a8-fp8-tensor").quantize(torch.randn(256, 512))
    qw.input_scale = torch.tensor([bad])
    with pytest.raises(ValueError, match=r"QuantLinear: qweight\.input_scale: .*positive and finite"):
        hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu")
    scheme = hg.scheme("w8a8-fp8-tensor")
    q13 = scheme.quantize(torch.randn(4, 256, 128))
    q2 = scheme.quantize(torch.randn(4, 128, 128))
    q2.input_scale = torch.tensor([bad])
    with pytest.raises(ValueError, match=r"QuantMoE: q2\.input_scale: .*positive and finite"):
        hg.QuantMoE.from_quantized(q13, q2, target="sm_90a", device="cpu")


def test_quantize_a_plan_leaves_large_m_alone() -> None:
    layer = LayerConfig(n=8192, k=8192, scheme="w8a8-int8-channel")
    plan = choose_tunings(layer, get_target("sm_90a"), stored=False, register_weights=True)
    fused = quantize_a_plan(plan, layer, get_target("sm_90a"))
    standard = choose_tunings(layer, get_target("sm_90a"), pipeline="standard", stored=False)
    for (m_max, t), (_, u) in zip(plan.buckets, fused.buckets):
        small = m_max is not None and m_max <= 16
        assert (u.a_load == "quantize") == small
        assert (attrs.evolve(u, a_load="cp_async") == standard.for_m(m_max)) if small else u == t, m_max


HOST_TILE = r"""
struct ThreadIdx { unsigned x; } threadIdx;
#define __shared__
#define __align__(n) alignas(n)
static inline void __syncthreads() {}
static inline u32 smem_address(const void*) { return 0u; }
static inline void ldmatrix_x4(u32 (&)[4], u32) {}
static inline void ldmatrix_x2(u32 (&)[2], u32) {}
static inline u32 warp_max_xor(u32 v, int) { return v; }
static inline float to_float(u16 x) { return bits_f32(static_cast<u32>(x) << 16); }  // bf16
"""

HOST_TILE_MAIN = r"""
int main() {
  int m, k, k0;
  std::scanf("%d %d %d", &m, &k, &k0);
  std::vector<u16> x(static_cast<size_t>(m) * k);
  for (auto& v : x) { unsigned b; std::scanf("%u", &b); v = static_cast<u16>(b); }
  for (int r = 0; r < cfg::kBlockM; ++r) { unsigned b; std::scanf("%u", &b); a_token_scale_smem[r] = bits_f32(b); }
  std::vector<unsigned char> smem(cfg::kBlockM * cfg::kBlockK, 0xEEu);  // poisoned
  for (unsigned t = 0; t < cfg::kThreads; ++t) {  // the loader's threads, one after another (no barrier inside)
    threadIdx.x = t;
    AStageX ax;
    fetch_a_stage(ax, x.data(), k, m, k, 0, k0);
    store_a_stage(smem.data(), ax);
  }
  for (unsigned char c : smem) std::printf("%u ", c);
  std::printf("\n");
  return 0;
}
"""


@pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("scheme", ["w8a8-fp8-channel", "w8a8-int8-channel", "w8a8-fp8-tensor"])
@pytest.mark.parametrize("threads,m,k,k0", [(64, 5, 200, 128), (96, 8, 256, 0), (256, 1, 136, 128)])
def test_loader_writes_the_8bit_tile_layout_on_the_host(scheme, threads, m, k, k0, tmp_path) -> None:
    """fetch_a_stage + store_a_stage as rendered (software conversion), run thread by thread on the host on a bf16
    x: the shared tile must hold ActivationScheme.quantize's codes where ATile8CpAsync puts byte k of row r
    (a_smem_chunk(r, k / 16) * 16 + k % 16), and code 0 at rows >= m and k >= K."""
    from humming_gen.pipelines.standard.loaders import ATile8Quantize

    block_m, block_k = 8, 128
    plan = _plan(scheme, "sm_80" if "int8" in scheme else "sm_89", 1)
    act = hg.scheme(scheme).activation
    env = environment()
    parts = [PRELUDE, HOST_TILE, "namespace cfg {", f"constexpr int kBlockM = {block_m}, kBlockK = {block_k}, "
             f"kThreads = {threads}, kVector = 8, kCodeWords = 2, kWarpMTiles = 1;", "}"]
    for c in plan.components:
        if isinstance(c, Rounding):
            c = attrs.evolve(c, encoders=tuple(dict.fromkeys(c.encoders + (act.dtype,))))
        elif isinstance(c, ElementCode):
            c = attrs.evolve(c, convert=None)
        elif type(c).__name__ in ("VectorIO", "StaticScale") or isinstance(c, BlockScaleRule):
            pass
        elif isinstance(c, ATile8Quantize):
            c = attrs.evolve(c, block_k=block_k)
        else:
            continue
        parts.append(env.get_template(c.template).render(**c.context()))
    src = tmp_path / "tile.cpp"
    src.write_text("\n".join(parts) + HOST_TILE_MAIN)
    exe = tmp_path / "tile"
    subprocess.run([CXX, "-O1", "-std=c++17", "-ffp-contract=off", str(src), "-o", str(exe)], check=True,
                   capture_output=True, text=True)
    g = torch.Generator().manual_seed(m * k + threads)
    x = (torch.randn(m, k, generator=g) * torch.logspace(-2, 2, m).reshape(-1, 1)).to(torch.bfloat16)
    if act.granularity == "tensor":  # a static scale (the loader copies it beside every row)
        from humming_gen.schemes.quantize import quantize_activation

        ref = quantize_activation(act, x.float(), static_scale=torch.tensor([0.37]))
        scales = torch.full((block_m,), 0.37)
    else:
        ref = act.quantize(x.float())
        scales = torch.ones(block_m)
        scales[:m] = ref.scales.reshape(-1)
    codes = ref.codes.view(torch.uint8) if ref.codes.dtype == torch.int8 else ref.codes
    xbits = x.view(torch.int16).to(torch.int64).bitwise_and(0xFFFF).reshape(-1).tolist()
    stdin = f"{m} {k} {k0}\n" + " ".join(map(str, xbits)) + "\n" + " ".join(map(str, _bits(scales)))
    got = [int(v) for v in subprocess.run([str(exe)], input=stdin, capture_output=True, text=True,
                                          check=True).stdout.split()]
    swizzle = min(8, block_k // 16) - 1
    want = [None] * (block_m * block_k)
    for r in range(block_m):
        for kk in range(block_k):
            pos = (r * (block_k // 16) + ((kk // 16) ^ (r & swizzle))) * 16 + kk % 16
            want[pos] = int(codes[r, k0 + kk]) if r < m and k0 + kk < k else 0
    bad = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
    assert not bad, f"{len(bad)} bytes differ, first at {bad[:4]}: got {[got[i] for i in bad[:4]]} want " \
                    f"{[want[i] for i in bad[:4]]}"


@pytest.mark.parametrize("scheme", ["w8a8-fp8-channel", "w8a8-fp8-tensor"])
def test_symbol_declarations_match_the_rendered_source(scheme: str) -> None:
    """As tests/cpu/test_component_symbols.py for the fused kernels' own components (the activation-quantization
    components they reuse declare no symbols, as in the quantize kernels)."""
    from humming_gen.pipelines.common import missing_symbols
    from symbols import declaration_mismatches

    reused = ("ScalarPtx", "Rounding", "BlockScaleRule", "StaticScale", "ElementCode", "VectorIO")
    for m in (1, 16):
        plan = _plan(scheme, "sm_90a", m, has_bias=m == 1)
        wrong = {k: v for k, v in declaration_mismatches(plan).items() if not k.split("(")[0].endswith(reused)}
        assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())
        assert missing_symbols(plan.components) == []


HOST_SCALES = r"""
#include <barrier>
#include <thread>
constexpr int kHostThreads = HOST_THREADS;
thread_local struct ThreadIdx { unsigned x; } threadIdx;
#define __shared__
#define __align__(n) alignas(n)
static std::barrier<> block_barrier(kHostThreads);
static std::vector<std::barrier<>*> warp_barriers;
static u32 lane_slots[kHostThreads];
static inline void __syncthreads() { block_barrier.arrive_and_wait(); }
static inline u32 warp_max_xor(u32 v, int lane_mask) {  // shfl.sync.bfly + max, lane-synchronous
  std::barrier<>& b = *warp_barriers[threadIdx.x / 32];
  lane_slots[threadIdx.x] = v;
  b.arrive_and_wait();
  const u32 d = lane_slots[(threadIdx.x & ~31u) | ((threadIdx.x % 32) ^ lane_mask)];
  b.arrive_and_wait();
  return v > d ? v : d;
}
static inline u32 smem_address(const void*) { return 0u; }
static inline void ldmatrix_x4(u32 (&)[4], u32) {}
static inline void ldmatrix_x2(u32 (&)[2], u32) {}
static inline float to_float(u16 x) { return bits_f32(static_cast<u32>(x) << 16); }  // bf16
"""

HOST_SCALES_MAIN = r"""
int main() {
  int m, k, m0;
  std::scanf("%d %d %d", &m, &k, &m0);
  std::vector<u16> x(static_cast<size_t>(m) * k);
  for (auto& v : x) { unsigned b; std::scanf("%u", &b); v = static_cast<u16>(b); }
  for (int w = 0; w < kHostThreads / 32; ++w) warp_barriers.push_back(new std::barrier<>(32));
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kHostThreads; ++t)
    threads.emplace_back([&, t] { threadIdx.x = t; quantize_token_scales(x.data(), k, m, k, m0); });
  for (auto& th : threads) th.join();
  for (int r = 0; r < cfg::kBlockM; ++r) std::printf("%u ", f32_bits(a_token_scale_smem[r]));
  std::printf("\n");
  return 0;
}
"""


@pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("scheme", ["w8a8-fp8-channel", "w8a8-int8-channel"])
@pytest.mark.parametrize("threads,block_m,m,m0,k", [(64, 8, 5, 0, 1000), (128, 16, 21, 16, 4096),
                                                    (64, 16, 16, 0, 8)])
def test_token_scales_on_the_host(scheme, threads, block_m, m, m0, k, tmp_path) -> None:
    """quantize_token_scales as rendered, one host thread per CUDA thread (barriers and warp shuffles emulated):
    the tile's rows m0.. get ActivationScheme.quantize's fp32 token scales bit for bit, rows >= m a zero row's."""
    from humming_gen.pipelines.standard.loaders import ATile8Quantize

    plan = _plan(scheme, "sm_80" if "int8" in scheme else "sm_89", 1)
    act = hg.scheme(scheme).activation
    env = environment()
    parts = [PRELUDE.replace("#include <vector>", "#include <vector>\n#include <barrier>"),
             HOST_SCALES.replace("HOST_THREADS", str(threads)), "namespace cfg {",
             f"constexpr int kBlockM = {block_m}, kBlockK = 128, kThreads = {threads}, kVector = 8, kCodeWords = 2, "
             f"kWarpMTiles = 1;", "}"]
    for c in plan.components:
        if isinstance(c, Rounding):
            c = attrs.evolve(c, encoders=tuple(dict.fromkeys(c.encoders + (act.dtype,))))
        elif isinstance(c, ElementCode):
            c = attrs.evolve(c, convert=None)
        elif not (type(c).__name__ == "VectorIO" or isinstance(c, (BlockScaleRule, ATile8Quantize))):
            continue
        parts.append(env.get_template(c.template).render(**c.context()))
    src = tmp_path / "scales.cpp"
    src.write_text("\n".join(parts) + HOST_SCALES_MAIN)
    exe = tmp_path / "scales"
    subprocess.run([CXX, "-O1", "-std=c++20", "-pthread", "-ffp-contract=off", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    g = torch.Generator().manual_seed(m * k + threads)
    x = (torch.randn(m, k, generator=g) * torch.logspace(-3, 3, m).reshape(-1, 1)).to(torch.bfloat16)
    if m > m0 + 2:
        x[m0 + 2] = 0  # a zero row (fp8: vLLM's floor scale; int8: 1)
        x[m0, k - 1] = -1e4  # the amax in the row's last vector
    xbits = x.view(torch.int16).to(torch.int64).bitwise_and(0xFFFF).reshape(-1).tolist()
    out = subprocess.run([str(exe)], input=f"{m} {k} {m0}\n" + " ".join(map(str, xbits)), capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    ref = act.quantize(x.float()).scales.reshape(-1)
    zero = act.quantize(torch.zeros(1, k)).scales.reshape(1)  # rows >= m: amax 0 (their codes are 0 anyway)
    want = [_bits(ref[m0 + r].reshape(1))[0] if m0 + r < m else _bits(zero)[0] for r in range(block_m)]
    assert [int(v) for v in out] == want

"""QuantLinear with 8-bit activations (on sm_90a the warp-specialized pipeline, wgmma k32 with split-K at small M, for
every M; the standard pipeline, mma.sync m16n8k32, elsewhere, and here for the same weights through standard_layer)
against the float64 reference.

The reference is reference_gemm: x quantized by the scheme's ActivationScheme in float64 (bit-identical to what
humming_gen.quantize_activation writes, docs/FORMATS.md 4.1), dequantized, times the dequantized weight, plus
bias. What remains between kernel and reference is the accumulation order (int8: exact s32 partial sums per warp
k slice; fp8: the tensor core's accumulation inside a 64-k slice, then fp32), fp32 scaling and the output
rounding, so the tolerances are those of the output type: relative Frobenius error below TOLERANCE and every
element within ELEMENT_TOL of the largest reference value. Outputs are poisoned (NaN) before every launch.

Tolerances per activation format (the error budget of each; the CPU estimates are randn outputs rounded to the
output type, and a 13- / 14-bit truncating accumulator over k32 steps promoted every 128 k for fp8, K = 4096):
- int8 x int8 (W8A8 int8, W4A8 int4 as 16 x code): s32 sums are exact and the fp32 scaling adds 2^-24, so only the
  output rounding remains: relative Frobenius 1.7e-3 (bf16) / 2.1e-4 (fp16), largest element 2.9e-3 / 3.6e-4.
- fp8 e4m3 / e5m2 (W8A8 fp8, MXFP8, W4A8 widened to e4m3): products are exact; wgmma's fp8 accumulation keeps about
  14 bits between promotions (every 128 k; DeepSeek-V3 3.3.2) and adds 1.1e-4 to 2.4e-4 (element 1.3e-4 to 2.5e-4):
  1.7e-3 (bf16) / 3e-4 (fp16) in all; mma.sync on sm_90a runs fp8 as f16 HMMA with fp32 sums, below that.
The difference between the two is far below the slack of either bound, so one table per output type serves both:
4x (bf16) and 10x (fp16) the larger estimate, while one output column's scale doubled costs 1 / sqrt(N) (3e-2 at
N = 1024) and fp4 activations in place of 16-bit ones about 9e-2.
"""

from __future__ import annotations

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.pipelines.base import TuningPlan
from humming_gen.reference import reference_gemm

pytestmark = pytest.mark.gpu

M_VALUES = (1, 3, 7, 16, 33, 64, 127, 128, 1000)  # 4096: test_a8_large_m and test_a8_large_m_odd_shapes
SHAPES = ((1024, 2048), (4000, 3000), (576, 7168))  # (N, K)
SCHEMES = ("w8a8-int8-channel", "w8a8-fp8-channel", "w8a8-fp8-block128")
# every activation format (int8, fp8 e4m3 / e5m2; module docstring): output rounding 2^-9 (bf16), 2^-12 (fp16) plus
# fp8 accumulation (<= 2.4e-4), with slack
TOLERANCE = {torch.bfloat16: 8e-3, torch.float16: 3e-3}
ELEMENT_TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2}  # |y - ref| / max |ref|


def _cases():
    for scheme in SCHEMES:
        for n, k in SHAPES:
            if scheme.endswith("block128") and k % 128:
                k = k // 128 * 128 + 128  # 1 x 128 activation groups need K % 128 == 0 (LayerConfig): 3072
            for dtype in (torch.bfloat16, torch.float16):
                bias = dtype == torch.bfloat16
                dt = "bf16" if dtype == torch.bfloat16 else "fp16"
                yield pytest.param(scheme, n, k, dtype, bias, id=f"{scheme}-n{n}-k{k}-{dt}{'-bias' if bias else ''}")


def assert_pipelines(layer: hg.QuantLinear) -> None:
    """Every bucket runs wgmma where the target has it (heuristics.choose: WS_A8_FROM_M), else mma.sync m16n8k32."""
    wgmma = layer.target.has("wgmma")
    for m_max, kern in layer._buckets:
        assert kern.plan.tuning.mma == ("wgmma" if wgmma else "m16n8k32"), (m_max, kern.plan.kernel_name)


def standard_layer(layer: hg.QuantLinear, qw, bias, dtype) -> hg.QuantLinear:
    """`layer`'s weights on the standard pipeline's kernels for every bucket (mma.sync m16n8k32: what sm_80 / sm_89 /
    sm_120a run, and on sm_90a quantize_in_gemm and batch-invariant layers), so the H200 tests them too."""
    from humming_gen.heuristics import choose_tunings

    plan = choose_tunings(layer.layer_config, layer.target, pipeline="standard", stored=False)
    layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, bias=bias, dtype=dtype, tunings=plan)
    assert all(kern.plan.tuning.mma == "m16n8k32" for _, kern in layer._buckets)
    return layer


def _check(layer: hg.QuantLinear, qw, bias, dtype, m: int, what: str) -> None:
    x = torch.randn(m, qw.k, device="cuda").to(dtype)
    x[0, : min(7, qw.k)] *= 30  # an outlier row: per-token scales differ by an order of magnitude
    out = torch.full((m, qw.n), float("nan"), device="cuda", dtype=layer.out_dtype)
    layer(x, out=out)
    run = attrs.evolve(qw, scheme=layer.scheme)  # the activation the layer quantizes (the scheme's, or its fallback)
    ref = reference_gemm(x.double(), run, bias=bias)
    y = out.double()
    assert torch.isfinite(y).all(), f"{what} m={m}: non-finite outputs (rows or columns left unwritten)"
    err = ((y - ref).norm() / ref.norm()).item()
    assert err < TOLERANCE[dtype], f"{what} m={m}: relative error {err:.3g}"
    worst = ((y - ref).abs().max() / ref.abs().max()).item()
    assert worst < ELEMENT_TOL[dtype], f"{what} m={m}: largest element error {worst:.3g} of max |ref|"


@pytest.mark.parametrize("scheme,n,k,dtype,has_bias", list(_cases()))
def test_w8a8_linear(scheme: str, n: int, k: int, dtype: torch.dtype, has_bias: bool) -> None:
    torch.manual_seed(n + k)
    w = torch.randn(n, k, device="cuda") * 0.05
    bias = torch.randn(n, device="cuda").to(dtype) if has_bias else None
    qw = hg.scheme(scheme).quantize(w)
    layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, bias=bias, dtype=dtype)
    assert_pipelines(layer)
    for m in M_VALUES:
        _check(layer, qw, bias, dtype, m, scheme)
    standard = standard_layer(layer, qw, bias, dtype)
    for m in (1, 7, 16, 64):
        _check(standard, qw, bias, dtype, m, f"{scheme} standard pipeline")


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_w8a8_fp8_per_tensor_scale(static: bool) -> None:
    """Per-tensor activation scales: dynamic (tensor_amax kernel) or a checkpoint's static input_scale."""
    torch.manual_seed(5)
    n, k = 1024, 2048
    qw = hg.scheme("w8a8-fp8-tensor").quantize(torch.randn(n, k, device="cuda") * 0.05)
    if static:
        qw.input_scale = torch.tensor([4.0 / 448], device="cuda")  # |x| beyond 4 saturates, as in the reference
    layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=torch.bfloat16)
    for m in (1, 33, 1000):
        _check(layer, qw, None, torch.bfloat16, m, f"fp8 tensor {'static' if static else 'dynamic'}")


def test_w8a8_3d_and_strided_input() -> None:
    """(batch, seq, K) inputs and a row-strided view are quantized and multiplied row by row."""
    torch.manual_seed(6)
    qw = hg.scheme("w8a8-int8-channel").quantize(torch.randn(512, 1024, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=torch.bfloat16)
    buf = torch.randn(2, 5, 1100, device="cuda").bfloat16()
    x = buf[..., :1024]
    y = layer(x)
    ref = reference_gemm(x.reshape(-1, 1024).double(), qw).reshape(2, 5, 512)
    assert ((y.double() - ref).norm() / ref.norm()).item() < TOLERANCE[torch.bfloat16]


INT8_GROUP = hg.QuantScheme("int8", group_size=128, scale_dtype="float32",
                            activation=hg.ActivationScheme("int8", granularity="group", group_size=128))
E5M2_NAME = "e4m3-channel-x-e5m2-token"
FP8_E5M2_ACT = hg.QuantScheme("float8e4m3", granularity="channel", scale_dtype="float32",
                              activation=hg.ActivationScheme("float8e5m2", granularity="token"))


@pytest.mark.parametrize("scheme,out_dtype", [(INT8_GROUP, torch.bfloat16), (FP8_E5M2_ACT, torch.float32)],
                         ids=["int8-g128-x-int8-g128", "e4m3-channel-x-e5m2-token-out-fp32"])
def test_w8a8_group_int8_and_e5m2_activations(scheme, out_dtype) -> None:
    """int8 per-group weights and activations (promotion with both group scales) and e5m2 activations against
    e4m3 weights, with an fp32 output."""
    torch.manual_seed(7)
    n, k = 4000, 3072
    qw = scheme.quantize(torch.randn(n, k, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=torch.bfloat16, out_dtype=out_dtype)
    for m in (1, 33, 1000):
        x = torch.randn(m, k, device="cuda").bfloat16()
        out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
        layer(x, out=out)
        ref = reference_gemm(x.double(), qw)
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < TOLERANCE[torch.bfloat16], f"m={m}: relative error {err:.3g}"


@pytest.mark.parametrize("f16", [True, False], ids=["f16_mmas", "ptxas_fp8_mma"])
@pytest.mark.parametrize("scheme", ["w8a8-fp8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8", E5M2_NAME])
def test_fp8_on_f16_mmas(monkeypatch, scheme, f16: bool) -> None:
    """compose_a8.FP8_ON_F16_MMA (sm_90a's default): the standard pipeline's fp8 x fp8 as explicit f16 mmas
    (activation fragments widened once per k32 step); and with it off, the fp8 mma.sync that sm_89 / sm_120a kernels
    issue (on sm_90a ptxas's F2FP + HMMA): every bucket through standard_layer, with a bias."""
    from humming_gen.pipelines.standard import compose_a8 as standard_a8

    if not hg.Target.current().has("wgmma"):
        pytest.skip("the f16 form is composed on sm_90a only (elsewhere fp8 mma.sync is native)")
    monkeypatch.setattr(standard_a8, "FP8_ON_F16_MMA", f16)
    torch.manual_seed(11)
    n, k = 4000, 3072
    s = FP8_E5M2_ACT if scheme == E5M2_NAME else hg.scheme(scheme)
    qw = s.quantize(torch.randn(n, k, device="cuda") * 0.05)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    layer = standard_layer(hg.QuantLinear.from_quantized(qw, dequantize_activations=False, bias=bias), qw, bias,
                           torch.bfloat16)
    assert all(("_f16mma" in kern.plan.kernel_name) == f16 for _, kern in layer._buckets)
    for m in (1, 7, 16, 64, 300):
        _check(layer, qw, bias, torch.bfloat16, m, f"{scheme} on {'f16' if f16 else 'fp8'} mmas")


@pytest.mark.parametrize("scheme", ["w8a8-int8-channel", "w8a8-fp8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8",
                                    "w4a8-int4-g128-int8", "w4a8-int4-g128-fp8"])
def test_a8_large_m(scheme: str) -> None:
    """M = 4096 on a 4096 x 4096 layer: the warp-specialized kernels' 192-token tiles (128 with activation groups) on
    every SM, K of 32 stages (fp8 partial sums promoted 32 times); M = 200: two tiles, the second partial."""
    torch.manual_seed(11)
    n = k = 4096
    w = torch.randn(n, k, device="cuda") * 0.05
    qw = hg.scheme(scheme).quantize(w)
    layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=torch.bfloat16)
    assert_pipelines(layer)
    if layer.target.has("wgmma"):
        assert layer.kernel_for(4096).plan.tuning.block_m in (128, 192)
    for m in (4096, 200):
        _check(layer, qw, None, torch.bfloat16, m, scheme)


@pytest.mark.parametrize("n,k", [(4000, 3000), (576, 7168)])
def test_a8_large_m_odd_shapes(n: int, k: int) -> None:
    """fp8 channel at M = 4096 on the issue's odd shapes: N = 4000 leaves a partial n tile, K = 3000 a partial last
    128-k stage (fp8 partial sums promoted with it), N = 576 K = 7168 few n tiles over a long K; with a bias."""
    torch.manual_seed(n + k + 4096)
    w = torch.randn(n, k, device="cuda") * 0.05
    bias = torch.randn(n, device="cuda").bfloat16()
    qw = hg.scheme("w8a8-fp8-channel").quantize(w)
    layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, bias=bias, dtype=torch.bfloat16)
    assert_pipelines(layer)
    _check(layer, qw, bias, torch.bfloat16, 4096, f"w8a8-fp8-channel n={n} k={k}")


def _cluster_linear(scheme: str, seed: int, k: int, multicast, **changes):
    """A QuantLinear (N = 8192, bias) whose one bucket is the M = 4096 tuning with `changes`, at most 5 stages for
    192 tokens and 6 otherwise, made a two-CTA cluster by `multicast`; skips where the target launches no
    clusters."""
    from humming_gen.config import LayerConfig
    from humming_gen.heuristics import choose_tunings
    from humming_gen.layer.weights import scales_fold

    torch.manual_seed(seed)
    n = 8192
    qw = hg.scheme(scheme).quantize(torch.randn(n, k, device="cuda") * 0.05)
    bias = torch.randn(n, device="cuda").bfloat16()
    target = hg.Target.current()
    if not target.has("clusters"):
        pytest.skip(f"{target.name} launches no clusters")
    layer = LayerConfig(n=n, k=k, scheme=qw.scheme, has_bias=True, fold_scales=scales_fold(qw))
    # (clusters are generated for register weights; the heuristics read most 8-bit weights from shared memory)
    base = choose_tunings(layer, target, stored=False, register_weights=True).for_m(4096)
    stages = min(base.stages, 5 if changes["block_m"] == 192 else 6)
    tuning = multicast(attrs.evolve(base, stages=stages, **changes))
    linear = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, bias=bias, dtype=torch.bfloat16,
                                           tunings=TuningPlan(((None, tuning),)))
    return linear, qw, bias


@pytest.mark.parametrize("scheme,block_m", [("w8a8-fp8-channel", 128), ("w8a8-fp8-channel", 192),
                                             ("w8a8-int8-channel", 128), ("w8a8-fp8-block128", 128),
                                             ("w4a8-mxfp4-fp8", 128), ("w4a8-int4-g128-int8", 128)])
def test_a8_weight_multicast_clusters(scheme: str, block_m: int) -> None:
    """Two-CTA clusters sharing weight stages by multicast (cluster_m=2): pairs of m tiles, an idle second tile
    where their count is odd (M = 1, 300), more pairs than clusters (N = 8192: rings refilled across units), K not
    a multiple of the stage (3000), group scales and folded e8m0 scales multicast with the weights."""
    from humming_gen.pipelines.warp_specialized.heuristics import weight_multicast

    linear, qw, bias = _cluster_linear(scheme, 13, 3072 if scheme.endswith("block128") else 3000, weight_multicast,
                                       block_m=block_m)
    assert linear.kernel_for(1).plan.launch.cluster == (2, 1, 1)
    for m in (1, 300, 1000):
        _check(linear, qw, bias, torch.bfloat16, m, f"{scheme} cluster 2x1 block_m={block_m}")


@pytest.mark.parametrize("scheme,block_m,raster", [("w8a8-fp8-channel", 128, "m_band"), ("w8a8-fp8-channel", 192, "m_band"),
                                                   ("w8a8-int8-channel", 192, "n_major"),
                                                   ("w8a8-fp8-block128", 128, "m_band"), ("w4a8-mxfp4-fp8", 128, "m_band")])
def test_a8_activation_multicast_clusters(scheme: str, block_m: int, raster: str) -> None:
    """Two-CTA clusters along N sharing activation stages by multicast (cluster_n=2, a_load='tma_multicast'): each
    CTA copies half of the tile's rows of its panel into both; tiles cut by M (M = 1: the second half empty; 300,
    1000), pairs of n tiles, more pairs than clusters (rings refilled), banded and plain walks, staged block scales
    and folded e8m0 scales beside."""
    from humming_gen.pipelines.warp_specialized.heuristics import activation_multicast

    linear, qw, bias = _cluster_linear(scheme, 17, 3072, activation_multicast, block_m=block_m, raster=raster)
    assert linear.kernel_for(1).plan.launch.cluster == (2, 1, 1) and linear.kernel_for(1).activation_layout == "panels"
    for m in (1, 300, 1000):
        _check(linear, qw, bias, torch.bfloat16, m, f"{scheme} cluster 1x2 block_m={block_m} {raster}")


MXFP4_MXFP8 = hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0",
                             activation=hg.ActivationScheme("float8e4m3", granularity="group", group_size=32,
                                                            scale_dtype="float8e8m0"))
MXFP4_FP8_G32 = hg.QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0",
                               activation=hg.ActivationScheme("float8e4m3", granularity="group", group_size=32))


@pytest.mark.parametrize("scheme", ["w8a8-mxfp8", MXFP4_MXFP8, MXFP4_FP8_G32],
                         ids=["mxfp8", "mxfp4-x-mxfp8", "mxfp4-x-fp8-g32"])
@pytest.mark.parametrize("n,k", [(1024, 2048), (576, 7168)])
def test_group32_activation_scales(scheme, n: int, k: int) -> None:
    """Group-32 activation scales, e8m0 (MX, read as powers of two) or fp32, promoted every 32 k on both pipelines
    (M = 200 and 1000 take the warp-specialized kernels on sm_90a)."""
    torch.manual_seed(n)
    scheme = scheme if isinstance(scheme, hg.QuantScheme) else hg.scheme(scheme)
    qw = scheme.quantize(torch.randn(n, k, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=torch.bfloat16)
    assert layer.compute_dtype == "float8e4m3" and not layer.fallback_reasons
    assert_pipelines(layer)
    for m in (1, 64, 200, 1000):
        _check(layer, qw, None, torch.bfloat16, m, f"{scheme.activation}")


@pytest.mark.parametrize("scheme", ["w8a8-mxfp8", MXFP4_MXFP8], ids=["mxfp8", "mxfp4-x-mxfp8"])
@pytest.mark.parametrize("block_m", [None, 128])
def test_staged_e8m0_activation_scales(scheme, block_m) -> None:
    """compose_a8.STAGE_E8M0_SCALES (the default): MXFP8's e8m0 scales staged with the codes; the heuristics' tiles,
    or 128 tokens at every warp-specialized M; partial last tiles (M = 200, 1000), several units per CTA (N = 8192).
    (K off whole stages reads them from global memory: the mxfp8-k3008 cases.)"""
    from humming_gen.pipelines.warp_specialized.heuristics import restaged

    torch.manual_seed(7)
    scheme = scheme if isinstance(scheme, hg.QuantScheme) else hg.scheme(scheme)
    for n, k in ((1024, 2048), (8192, 1024)):
        qw = scheme.quantize(torch.randn(n, k, device="cuda") * 0.05)
        layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=torch.bfloat16)
        if block_m is not None:
            plan = layer.kernel_for(1000).plan
            layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=torch.bfloat16,
                                                  tunings=TuningPlan(
                ((None, restaged(plan.layer, plan.target, plan.tuning, block_m=block_m)),)))
        assert layer.kernel_for(1000).a_scale_alignment == 4, "the staged kernel runs"
        for m in (64, 200, 1000):
            _check(layer, qw, None, torch.bfloat16, m, f"staged e8m0 {scheme.activation} n={n}")


def test_w4a4_falls_back_to_16_bit_activations_and_runs() -> None:
    """NVFP4 (fp4 activations, no fp4 MMA on sm_90a; group-16 weight scales keep the fp8 kernels out): the layer
    runs the weights with bf16 activations and says so; the reference is the weight-only product."""
    import attrs

    torch.manual_seed(8)
    qw = hg.scheme("w4a4-nvfp4").quantize(torch.randn(1024, 2048, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=torch.bfloat16)
    assert layer.compute_dtype == "bfloat16" and layer.fallback_reasons
    weight_only = attrs.evolve(qw, scheme=attrs.evolve(qw.scheme, activation=None))
    for m in (1, 300):
        _check(layer, weight_only, None, torch.bfloat16, m, "w4a4-nvfp4 fallback")


@pytest.mark.parametrize("scheme,n,k", [("w4a8-mxfp4-fp8", 4000, 3000), ("w4a8-int4-g128-int8", 4000, 3000),
                                        ("w8a8-mxfp8", 1000, 3008), (MXFP4_FP8_G32, 576, 3008)],
                         ids=["mxfp4-fp8-k3000", "int4-g128-int8-k3000", "mxfp8-k3008", "mxfp4-fp8g32-k3008"])
def test_group_scales_with_a_partial_last_k_tile(scheme, n: int, k: int) -> None:
    """K not a multiple of the 128-k stage: the last stage's group indices (weights: padded groups; activations:
    clamped to the last group) on the warp-specialized kernels, M = 40 (split-K) and 700."""
    torch.manual_seed(k)
    scheme = scheme if isinstance(scheme, hg.QuantScheme) else hg.scheme(scheme)
    qw = scheme.quantize(torch.randn(n, k, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=torch.bfloat16)
    assert_pipelines(layer)
    for m in (40, 700):
        _check(layer, qw, None, torch.bfloat16, m, f"{scheme.weight.name} k={k}")


@pytest.mark.parametrize("scheme", ["w8a8-int8-channel", "w8a8-fp8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8",
                                    "w8a8-mxfp8", "w8a8-fp8-tensor"])
def test_a8_panels_equal_row_codes(scheme: str) -> None:
    """Activation codes in the panels layout, a stage's tile by one bulk copy (the default where K % 128 == 0,
    a_load='tma'), against the same tiles reading rows of codes by cp.async (a_load='cp_async'): the MMAs see the
    same bytes in the same order, so the outputs are bitwise equal; M values cover split-K buckets, tiles cut by M
    (rows past M are not copied) and the m_band raster."""
    from humming_gen.pipelines.base import TuningPlan

    n, k = 1024, 2048
    torch.manual_seed(3)
    qw = hg.scheme(scheme).quantize(torch.randn(n, k, device="cuda") * 0.02)
    if scheme.endswith("tensor"):  # a checkpoint's static scale (the dynamic one: test_w8a8_fp8_per_tensor_scale)
        qw.input_scale = torch.tensor([0.05], device="cuda")
    layer = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=torch.bfloat16)
    assert all(kern.activation_layout == "panels" for _, kern in layer._buckets), layer.tunings
    rows_plan = TuningPlan(tuple((m_max, attrs.evolve(t, a_load="cp_async")) for m_max, t in layer.tunings.buckets))
    rows = hg.QuantLinear.from_quantized(qw, dequantize_activations=False, dtype=torch.bfloat16, tunings=rows_plan)
    assert all(kern.activation_layout == "rows" for _, kern in rows._buckets)
    for m in (1, 5, 16, 100, 300, 1000, 4100):
        x = torch.randn(m, k, device="cuda").bfloat16()
        outs = []
        for lay in (layer, rows):
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            lay(x, out=out)
            outs.append(out)
        assert torch.isfinite(outs[0]).all(), (scheme, m)
        assert torch.equal(outs[0], outs[1]), (scheme, m)

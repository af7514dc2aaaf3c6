"""QuantMoE and its MoE GEMMs with 8-bit activations (W8A8, W4A8) on the standard pipeline (mma.sync m16n8k32: every
bucket, pipeline="standard") on the GPU against the float64 references, for the presets w8a8-fp8-channel,
w8a8-fp8-block128, w8a8-int8-channel, w4a8-mxfp4-fp8, w4a8-int4-g128-int8, w8a8-fp8-tensor (one dynamic per-tensor
activation scale per GEMM input: the amax of every row; and a checkpoint's static input_scale,
test_quant_moe_a8_static_per_tensor_scales) and w8a8-mxfp8 (e8m0 scales per 1 x 32 group). The warp-specialized
buckets (sm_90a by default: from 17 rows per expert on, W8A8 layers' all) are tests/gpu/test_quant_moe_a8_ws.py's.

The references quantize both GEMM inputs with the scheme's ActivationScheme (`quantize(.).dequantize()`, which
humming_gen.quantize_activation matches bit for bit): x, and GEMM2's input, the gated activation. Every output the
test owns is poisoned (NaN) before launch; inputs and routing are fresh random tensors per case, with -1 ids
(dropped slots) and an expert_map whose -1 entries send experts to other ranks.

Tolerances (relative Frobenius error unless stated):
- one GEMM (`moe_gemm`, `grouped_moe_gemm`): its codes are the reference's, so what remains is the accumulation
  order, the fp32 scaling and the output rounding: the dense W8A8 / W4A8 bounds (tests/gpu/test_linear_w8a8.py),
  GEMM_TOLERANCE and every element within GEMM_ELEMENT_TOL of the largest reference value.
- the whole layer: reference_fused_moe(activation_scheme=..., intermediate_dtype=the layer's dtype,
  fused_activation=...) also rounds GEMM1's output and the activation where QuantMoE stores them, so GEMM2's codes
  are those the kernels quantize, except the few whose bf16 value the kernel's fp32 GEMM1 rounds to the other side
  than float64 does and that then land one code apart: one fp8 e4m3 step is 6-12 % of the value, one int8 step
  1/127 of the row's largest value. LAYER_TOLERANCE per activation format (the CPU test of QuantMoE's host path
  with float64 stand-ins, tests/cpu/test_moe_gemm_a8.py, measures 2.5e-3 from the output roundings alone);
  without quantizing the activations the reference moves by 1.5e-2 (int8) to 4e-2 (fp8).
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import local_experts, reference_fused_moe, routed_rows_gemm
from test_quant_moe import _rel, _routing, capture_without_sync

pytestmark = pytest.mark.gpu

PRESETS = ("w8a8-fp8-channel", "w8a8-fp8-block128", "w8a8-int8-channel", "w4a8-mxfp4-fp8", "w4a8-int4-g128-int8",
           "w8a8-fp8-tensor", "w8a8-mxfp8")
M_VALUES = (1, 7, 128, 1000)
EXPERTS = (3, 19)
H, I = 512, 256  # multiples of 128: the block128 activation groups tile both GEMMs' K
LAYER_TOLERANCE = {"int8": 1e-2, "float8e4m3": 1.5e-2}
GEMM_TOLERANCE = {torch.bfloat16: 8e-3, torch.float16: 3e-3}
GEMM_ELEMENT_TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2}


def build_layer(preset: str, e: int, *, seed: int, pipeline: str | None, dtype=torch.bfloat16, biases: bool = False,
                fused: bool | None = None, activation: str = "silu_mul", layout: str = "split", h: int = H, i: int = I):
    """A QuantMoE of E random experts (w13 (E, 2i, h), w2 (E, h, i)) quantized with `preset`, with random biases
    where asked: (moe, q13, q2, b13, b2)."""
    torch.manual_seed(seed)
    s = hg.scheme(preset)
    q13 = s.quantize(torch.randn(e, 2 * i, h, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(e, h, i, device="cuda") * 0.05)
    b13 = (torch.randn(e, 2 * i, device="cuda") * 0.1).to(dtype) if biases else None
    b2 = (torch.randn(e, h, device="cuda") * 0.1).to(dtype) if biases else None
    moe = hg.QuantMoE.from_quantized(q13, q2, activation=activation, gate_up_layout=layout, bias13=b13, bias2=b2,
                                     dtype=dtype, fused_activation=fused, pipeline=pipeline)
    return moe, q13, q2, b13, b2


def _layer(preset: str, e: int, *, seed: int, dtype=torch.bfloat16, biases: bool = False, fused: bool | None = None,
           activation: str = "silu_mul", layout: str = "split"):
    moe, q13, q2, b13, b2 = build_layer(preset, e, seed=seed, pipeline="standard", dtype=dtype, biases=biases,
                                        fused=fused, activation=activation, layout=layout)
    kernels = [k.kernel for pair in moe._launchers for k in pair]
    assert {k.plan.tuning.mma for k in kernels} == {"m16n8k32"}, preset
    return moe, q13, q2, b13, b2


def _reference(moe, x, weights, ids, q13, q2, b13, b2, expert_map=None):
    return reference_fused_moe(x.double(), q13.dequantize().double(), q2.dequantize().double(), weights.double(), ids,
                               activation=moe.activation, gate_up_layout=moe.gate_up_layout, expert_map=expert_map,
                               bias13=None if b13 is None else b13.double(), bias2=None if b2 is None else b2.double(),
                               activation_scheme=moe.activation_schemes[0], intermediate_dtype=moe.dtype,
                               fused_activation=moe.fused_activation, activation_static_scales=moe._static_scales)


def _layer_cases():
    for preset in PRESETS:
        for e in EXPERTS:
            for fused in (False, True):
                if fused and preset == "w8a8-fp8-block128":
                    continue  # refused: w13's block scales cannot follow the gate/up tile order (CPU test)
                yield pytest.param(preset, e, fused, id=f"{preset}-e{e}-{'fused' if fused else 'torch'}-activation")


@pytest.mark.parametrize("preset,e,fused", list(_layer_cases()))
def test_quant_moe_a8_matches_reference(preset: str, e: int, fused: bool) -> None:
    """fused_moe into a poisoned (M, H) output for M in M_VALUES and top-k 1, 2 and E, with dropped slots."""
    activation, layout = ("swiglu_oai", "interleaved") if preset == "w4a8-mxfp4-fp8" else ("silu_mul", "split")
    moe, q13, q2, b13, b2 = _layer(preset, e, seed=e, biases=e == 3, fused=fused, activation=activation,
                                   layout=layout)
    tolerance = LAYER_TOLERANCE[moe.activation_schemes[0].dtype.name]
    errors = {}
    for m in M_VALUES:
        for top_k in (1, 2, e):
            x = torch.randn(m, H, device="cuda").to(moe.dtype)
            x[0, :5] *= 20  # an outlier token: per-token scales differ by an order of magnitude
            weights, ids = _routing(m, e, top_k, drop=0.1 if m > 1 else 0.0)
            out = torch.full((m, H), float("nan"), dtype=moe.dtype, device="cuda")
            assert hg.fused_moe(x, moe, weights, ids, output=out) is out
            assert torch.isfinite(out).all(), f"m={m} top_k={top_k}: rows left unwritten or non-finite"
            ref = _reference(moe, x, weights, ids, q13, q2, b13, b2)
            errors[(m, top_k)] = _rel(out, ref)
    bad = {k: err for k, err in errors.items() if not err < tolerance}
    assert not bad, f"{preset}: relative error above {tolerance} at (m, top_k) {bad} (all {errors})"


def check_expert_map(moe, q13, q2, b13, b2, *, poisoned: bool) -> None:
    """Expert parallelism on an fp16 layer of E experts: ids are global over 2E experts, expert_map sends the lower
    half to -1; a token whose slots are all elsewhere (or dropped) gets a zero row, the rest match the float64
    reference. poisoned: through fused_moe into a NaN-poisoned output, every row checked finite; else the layer's
    forward."""
    e = moe.num_experts
    expert_map = torch.full((2 * e,), -1, dtype=torch.int32, device="cuda")
    expert_map[e:] = torch.arange(e, dtype=torch.int32, device="cuda")
    for m in M_VALUES:
        x = torch.randn(m, H, device="cuda").half()
        weights = torch.rand(m, 4, device="cuda")
        ids = torch.randint(0, 2 * e, (m, 4), device="cuda", dtype=torch.int32)
        ids[0] = torch.tensor([0, 1, -1, 5], device="cuda")  # every slot elsewhere or dropped
        if m > 1:
            ids[1, 2] = -1
        if poisoned:
            out = torch.full((m, H), float("nan"), dtype=torch.float16, device="cuda")
            hg.fused_moe(x, moe, weights, ids, expert_map=expert_map, output=out)
        else:
            out = moe(x, weights, ids, expert_map=expert_map)
        ref = _reference(moe, x, weights, ids, q13, q2, b13, b2, expert_map=expert_map)
        assert torch.equal(out[0], torch.zeros_like(out[0])), f"m={m}: a token with no local slot"
        if m > 1:
            if poisoned:
                assert torch.isfinite(out).all(), f"m={m}: rows left unwritten or non-finite"
            err = _rel(out, ref)
            assert err < LAYER_TOLERANCE[moe.activation_schemes[0].dtype.name], f"m={m}: relative error {err:.3g}"


@pytest.mark.parametrize("preset", PRESETS)
def test_quant_moe_a8_fp16_expert_map_and_dropped_tokens(preset: str) -> None:
    """check_expert_map through the layer's forward, fp16 with biases."""
    moe, q13, q2, b13, b2 = _layer(preset, 19, seed=31, dtype=torch.float16, biases=True)
    check_expert_map(moe, q13, q2, b13, b2, poisoned=False)


def _check_rows(out, ref, dtype, what):
    y = out.double()
    assert torch.isfinite(y).all(), f"{what}: a routed row was not written"
    err = _rel(y, ref)
    assert err < GEMM_TOLERANCE[dtype], f"{what}: relative error {err:.3g}"
    worst = ((y - ref).abs().max() / ref.abs().max()).item()
    assert worst < GEMM_ELEMENT_TOL[dtype], f"{what}: largest element error {worst:.3g} of max |ref|"


def check_routed_gemms(moe, q13, q2, b13, b2, ms, routing, what: str) -> set[int]:
    """moe_gemm of both GEMMs of `moe` (biases b13 / b2; built with fused_activation=False) on moe_align's routing
    of each M in `ms` (top-2 over its experts, `routing(m, e, top_k, drop=)`) into poisoned outputs: GEMM1 row i =
    q(x)[i // top_k] @ w13_e^T + b13_e, GEMM2 row i = (q(a)[i] @ w2_e^T + b2_e) * topk_weight[i] (q: the scheme's
    activation quantization of the whole input, as the layer does); rows of dropped slots stay NaN. Returns the
    token tiles the batches took."""
    e = moe.num_experts
    act = moe.activation_schemes[0]
    w13, w2 = q13.dequantize().double(), q2.dequantize().double()
    tiles = set()
    for m in ms:
        top_k = 2
        x = torch.randn(m, H, device="cuda").bfloat16()
        weights, ids = routing(m, e, top_k, drop=0.2 if m > 1 else 0.0)
        bm = moe.block_m(m, top_k)
        tiles.add(bm)
        r = hg.moe_align(ids, e, bm)
        h = torch.full((m * top_k, 2 * I), float("nan"), dtype=torch.bfloat16, device="cuda")
        hg.moe_gemm(x, moe, "w13", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad, top_k=top_k, block_m=bm,
                    out=h)
        expert = local_experts(ids, e).reshape(-1)
        routed = expert >= 0
        rows = (torch.arange(m * top_k, device="cuda") // top_k)[routed]
        xq = act.quantize(x).dequantize(torch.float64)
        ref = routed_rows_gemm(xq[rows], w13, expert[routed], b13)
        assert torch.isnan(h[~routed]).all(), f"m={m}: a dropped assignment's row was written"
        _check_rows(h[routed], ref, torch.bfloat16, f"{what} w13 m={m} block_m={bm}")
        a = torch.randn(m * top_k, I, device="cuda").bfloat16()
        y = torch.full((m * top_k, H), float("nan"), dtype=torch.bfloat16, device="cuda")
        hg.moe_gemm(a, moe, "w2", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad, top_k=1, block_m=bm,
                    topk_weights=weights.reshape(-1), out=y)
        aq = act.quantize(a).dequantize(torch.float64)
        ref2 = routed_rows_gemm(aq[routed], w2, expert[routed], b2) * weights.reshape(-1).double()[routed, None]
        assert torch.isnan(y[~routed]).all(), f"m={m}: a dropped assignment's row was written (w2)"
        _check_rows(y[routed], ref2, torch.bfloat16, f"{what} w2 m={m} block_m={bm}")
    return tiles


@pytest.mark.parametrize("preset", PRESETS)
def test_a8_indexed_gemms_write_exactly_the_routed_rows(preset: str) -> None:
    """check_routed_gemms on every bucket of the standard pipeline (pipeline="standard")."""
    moe, q13, q2, b13, b2 = _layer(preset, 19, seed=7, biases=True, fused=False)
    check_routed_gemms(moe, q13, q2, b13, b2, M_VALUES, _routing, preset)


@pytest.mark.parametrize("layout", ["grouped_masked", "grouped_contiguous"])
@pytest.mark.parametrize("preset", PRESETS)
def test_a8_grouped_moe_gemm(preset: str, layout: str) -> None:
    """grouped_moe_gemm on rows grouped by expert (an empty expert, a full one), poisoned outputs: rows past an
    expert's count (masked) and rows past the segments (contiguous) stay NaN."""
    e = 19
    moe, q13, q2, b13, b2 = _layer(preset, e, seed=11, biases=True, fused=False)  # w13 alone
    act = moe.activation_schemes[0]
    if layout == "grouped_masked" and act.granularity == "tensor":  # its amax would read rows past the counts
        with pytest.raises(ValueError, match="dynamic per-tensor activation scale"):
            hg.grouped_moe_gemm(torch.zeros(e, 8, H, device="cuda").bfloat16(), moe, "w13",
                                torch.zeros(e, dtype=torch.int32, device="cuda"), layout=layout)
        return
    for weight, q, b, k, n in (("w13", q13, b13, H, 2 * I), ("w2", q2, b2, I, H)):
        w = q.dequantize().double()
        for rows_per_expert in (1, 7, 128, 1000):
            if layout == "grouped_masked":
                max_m = rows_per_expert
                counts = torch.randint(0, max_m + 1, (e,), device="cuda", dtype=torch.int32)
                counts[0], counts[1] = 0, max_m
                a = torch.randn(e, max_m, k, device="cuda").bfloat16()
                out = torch.full((e, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                hg.grouped_moe_gemm(a, moe, weight, counts, layout=layout, out=out)
                aq = act.quantize(a.reshape(-1, k)).dequantize(torch.float64).reshape(e, max_m, k)
                for j in range(e):
                    c = int(counts[j])
                    assert torch.isnan(out[j, c:]).all(), f"{weight} expert {j}: rows past its count were written"
                    if c:
                        _check_rows(out[j, :c], aq[j, :c] @ w[j].T + b[j].double(), torch.bfloat16,
                                    f"{preset} {weight} masked expert {j} max_m={max_m}")
            else:
                counts = torch.randint(0, 2 * rows_per_expert + 1, (e,))
                counts[3] = 0
                offsets = torch.zeros(e + 1, dtype=torch.int32)
                offsets[1:] = torch.cumsum(counts, 0)
                rows = int(offsets[-1])
                a = torch.randn(rows, k, device="cuda").bfloat16()
                out = torch.full((rows + 5, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                hg.grouped_moe_gemm(a, moe, weight, offsets.cuda(), layout=layout, out=out[:rows])
                aq = act.quantize(a).dequantize(torch.float64)
                ref = torch.cat([aq[offsets[j]:offsets[j + 1]] @ w[j].T + b[j].double() for j in range(e)])
                assert torch.isnan(out[rows:]).all(), f"{weight}: rows past the segments were written"
                _check_rows(out[:rows], ref, torch.bfloat16, f"{preset} {weight} contiguous rows={rows}")


def static_scales(preset: str, e: int, *, seed: int, shrink: float = 0.5) -> tuple[float, float]:
    """Per-tensor activation scales as a checkpoint's calibration would set them for the experts of build_layer(
    preset, e, seed=seed): amax / 448 of bf16 x ~ N(0, 1) (GEMM1's input) and of the gated activations those tokens
    give over every expert (GEMM2's input), times `shrink` (below 1: the largest values of a batch clip at 448 * s,
    so a layer that ignored the static scale for a dynamic one would fail the test)."""
    from humming_gen.reference.moe import gated_activation

    torch.manual_seed(seed)
    s = hg.scheme(preset)
    w13 = s.quantize(torch.randn(e, 2 * I, H, device="cuda") * 0.05).dequantize().double()
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    x = torch.randn(256, H, device="cuda", generator=g).bfloat16().double()
    act = gated_activation(torch.einsum("mk,enk->emn", x, w13).reshape(-1, 2 * I))
    return shrink * x.abs().max().item() / 448, shrink * act.abs().max().item() / 448


@pytest.mark.parametrize("fused", [False, True], ids=["torch-activation", "fused-activation"])
@pytest.mark.parametrize("pipeline", ["standard", None], ids=["standard", "default"])
def test_quant_moe_a8_static_per_tensor_scales(pipeline: str | None, fused: bool) -> None:
    """w8a8-fp8-tensor with a checkpoint's static input_scale on both GEMMs (QuantizedWeight.input_scale, one value
    each): no amax pass, both inputs quantized with the fixed scales, saturating. fused_moe into a poisoned output
    for M in M_VALUES and top-k 1, 2 and E, dropped slots, an outlier token, against the float64 reference with the
    same static scales; the same reference with dynamic scales is further off than the bound. pipeline: every bucket
    standard, and the default (warp-specialized from 17 rows per expert on sm_90a)."""
    preset, e = "w8a8-fp8-tensor", 19
    s1, s2 = static_scales(preset, e, seed=e)
    torch.manual_seed(e)
    s = hg.scheme(preset)
    q13 = s.quantize(torch.randn(e, 2 * I, H, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(e, H, I, device="cuda") * 0.05)
    q13.input_scale = torch.tensor([s1], device="cuda")
    q2.input_scale = torch.tensor([s2], device="cuda")
    moe = hg.QuantMoE.from_quantized(q13, q2, fused_activation=fused, pipeline=pipeline)
    assert [float(t) for t in moe._static_scales] == [torch.tensor(s1).float().item(), torch.tensor(s2).float().item()]
    tolerance = LAYER_TOLERANCE["float8e4m3"]
    errors, dynamic = {}, {}
    for m in M_VALUES:
        for top_k in (1, 2, e):
            x = torch.randn(m, H, device="cuda").bfloat16()
            x[0, :5] *= 20
            weights, ids = _routing(m, e, top_k, drop=0.1 if m > 1 else 0.0)
            out = torch.full((m, H), float("nan"), dtype=moe.dtype, device="cuda")
            assert hg.fused_moe(x, moe, weights, ids, output=out) is out
            assert torch.isfinite(out).all(), f"m={m} top_k={top_k}: rows left unwritten or non-finite"
            ref = _reference(moe, x, weights, ids, q13, q2, None, None)
            errors[(m, top_k)] = _rel(out, ref)
            unscaled = reference_fused_moe(x.double(), q13.dequantize().double(), q2.dequantize().double(),
                                           weights.double(), ids, activation_scheme=moe.activation_schemes[0],
                                           intermediate_dtype=moe.dtype, fused_activation=moe.fused_activation)
            dynamic[(m, top_k)] = _rel(unscaled, ref)
    bad = {k: err for k, err in errors.items() if not err < tolerance}
    assert not bad, f"relative error above {tolerance} at (m, top_k) {bad} (all {errors})"
    assert min(dynamic.values()) > tolerance, f"dynamic scales are as close to the reference: {dynamic}"


def test_a8_cuda_graph_replay_with_new_routing_and_no_host_sync() -> None:
    """Quantizing x and the intermediate adds no host sync, and a captured forward replays with new routing."""
    e = 19
    moe, q13, q2, b13, b2 = _layer("w8a8-fp8-block128", e, seed=19)
    m, top_k = 40, 2
    x = torch.randn(m, H, device="cuda").bfloat16()
    weights, ids = _routing(m, e, top_k)
    graph, out = capture_without_sync(moe, x, weights, ids)
    new_weights, new_ids = _routing(m, e, top_k)
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    x.copy_(torch.randn(m, H, device="cuda").bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    ref = _reference(moe, x, weights, ids, q13, q2, b13, b2)
    assert _rel(out, ref) < LAYER_TOLERANCE["float8e4m3"]


@pytest.mark.parametrize("f16", [True, False], ids=["f16_mmas", "ptxas_fp8_mma"])
@pytest.mark.parametrize("preset", ["w8a8-fp8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8", "w8a8-mxfp8"])
def test_quant_moe_a8_fp8_on_f16_mmas(monkeypatch, preset: str, f16: bool) -> None:
    """compose_a8.FP8_ON_F16_MMA (sm_90a's default): the standard buckets' fp8 x fp8 as explicit f16 mmas, and with
    it off the fp8 mma.sync of sm_89 / sm_120a kernels, against the float64 reference, torch activation, M in
    M_VALUES and top-k 2."""
    from humming_gen.pipelines.standard import compose_a8 as standard_a8

    if not hg.Target.current().has("wgmma"):
        pytest.skip("the f16 form is composed on sm_90a only (elsewhere fp8 mma.sync is native)")
    monkeypatch.setattr(standard_a8, "FP8_ON_F16_MMA", f16)
    moe, q13, q2, b13, b2 = _layer(preset, 19, seed=5, fused=False)
    assert all(("_f16mma" in kernel.plan.kernel_name) == f16 for pair in moe._kernels for kernel in pair
               if kernel.plan.tuning.pipeline == "standard")
    tolerance = LAYER_TOLERANCE[moe.activation_schemes[0].dtype.name]
    for m in M_VALUES:
        x = torch.randn(m, H, device="cuda").to(moe.dtype)
        weights, ids = _routing(m, 19, 2, drop=0.1 if m > 1 else 0.0)
        out = torch.full((m, H), float("nan"), dtype=moe.dtype, device="cuda")
        hg.fused_moe(x, moe, weights, ids, output=out)
        assert torch.isfinite(out).all(), f"m={m}: rows left unwritten or non-finite"
        err = _rel(out, _reference(moe, x, weights, ids, q13, q2, b13, b2))
        assert err < tolerance, f"{preset} m={m}: relative error {err:.3g}"

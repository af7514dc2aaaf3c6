"""QuantMoE with GEMM1's output quantized for GEMM2 in its epilogue (fused_quantization) on the GPU, for every scheme
family that fuses on the standard pipeline's 128-row gate/up tiles (64 features): MXFP8 (e8m0 scales per group of
32, any I), per-token fp8 / int8 scales where the tile covers the row (I = 64: w8a8-fp8-channel, w8a8-int8-channel,
w4a8-int4-g128-fp8) and a static per-tensor fp8 scale (w8a8-fp8-tensor with q2.input_scale, any I).

- GEMM1 alone: the fused kernel's codes and scales are bit for bit humming_gen.quantize_activation's of the bf16 rows
  the unfused layer's GEMM1 writes (same mainloop), for every routed row, M in M_VALUES; run twice into buffers
  poisoned with different bytes, so every routed byte is shown written (dropped slots' rows are not read).
- The whole layer: fused_moe into a NaN-poisoned output is bitwise the unfused layer's (fused_quantization=False)
  and within the 8-bit layer tolerance of the float64 reference (tests/gpu/test_quant_moe_a8.py's).
Both pipelines: pipeline="standard" (every bucket fused) and the default (sm_90a: warp-specialized buckets, which
keep quantize_activation, from 17 rows per expert on; for 8-bit weights every bucket, so those layers fuse nothing by
default and the GEMM1 test takes only their standard case).
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import local_experts
from moe_cases import w8a8
from test_quant_moe import _rel, _routing, capture_without_sync
from test_quant_moe_a8 import LAYER_TOLERANCE, _reference

pytestmark = pytest.mark.gpu

E, H, TOP_K = 8, 512, 2
M_VALUES = (1, 7, 128, 4096)
# scheme -> intermediate size at which it fuses
SCHEMES = {"w8a8-mxfp8": 256, "w8a8-fp8-channel": 64, "w8a8-int8-channel": 64, "w4a8-int4-g128-fp8": 64,
           "w8a8-fp8-tensor": 256}
PIPELINES = ("standard", None)


def _layers(preset: str, pipeline: str | None, seed: int = 0, biases: bool = True):
    """(fused, unfused, q13, q2, b13, b2): two QuantMoE of the same experts, fused_quantization None and False."""
    torch.manual_seed(seed)
    i = SCHEMES[preset]
    s = hg.scheme(preset)
    q13 = s.quantize(torch.randn(E, 2 * i, H, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(E, H, i, device="cuda") * 0.05)
    if s.activation.granularity == "tensor":
        q2.input_scale = torch.tensor([0.01], device="cuda")  # GEMM2's static input scale: about amax / 448
    b13 = (torch.randn(E, 2 * i, device="cuda") * 0.1).bfloat16() if biases else None
    b2 = (torch.randn(E, H, device="cuda") * 0.1).bfloat16() if biases else None
    layers = [hg.QuantMoE.from_quantized(q13, q2, bias13=b13, bias2=b2, pipeline=pipeline, fused_quantization=f)
              for f in (None, False)]
    fused, unfused = layers
    assert not any(unfused.fused_quantization)
    if pipeline == "standard":
        assert all(fused.fused_quantization), fused.fused_quantization
    else:  # the standard buckets fuse; warp-specialized ones (sm_90a) keep the separate pass
        for (g1, _), f in zip(fused._launchers, fused.fused_quantization):
            assert f == (g1.kernel.plan.tuning.pipeline == "standard")
    return fused, unfused, q13, q2, b13, b2


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def _cases(fusing: bool = False):
    """(preset, pipeline) pairs; fusing: only those whose default buckets fuse somewhere on sm_90a (8-bit weights run
    every bucket warp-specialized: heuristics.choose.ws_moe_from_rows)."""
    for preset in SCHEMES:
        for pipeline in PIPELINES:
            if fusing and pipeline is None and w8a8(preset):
                continue
            yield pytest.param(preset, pipeline, id=f"{preset}-{pipeline or 'default'}")


@pytest.mark.parametrize("preset,pipeline", list(_cases(fusing=True)))
def test_fused_gemm1_writes_quantize_activations_codes(preset: str, pipeline: str | None) -> None:
    fused, unfused, *_ = _layers(preset, pipeline)
    scheme, static = fused.activation_schemes[1], fused._static_scales[1]
    checked = 0
    for m in M_VALUES:
        x = torch.randn(m, H, device="cuda").bfloat16()
        x[0, :5] *= 20  # an outlier token
        _, ids = _routing(m, E, TOP_K, drop=0.1 if m > 1 else 0.0)
        bucket = fused.bucket_for(m, TOP_K)
        if not fused.fused_quantization[bucket]:
            continue
        g1, g1u = fused._launchers[bucket][0], unfused._launchers[bucket][0]
        routing = hg.moe_align(ids, E, g1.kernel.plan.tuning.block_m)
        a1, s1 = fused.gemm_input(x, 0)
        routed = local_experts(ids, E).reshape(-1) >= 0
        runs = []
        for poison in (0x00, 0xFF):
            codes, scales = fused._quantized_rows(m * TOP_K)
            codes.fill_(poison)
            if static is None:
                scales.view(torch.uint8).fill_(poison)
            g1.moe(a1, codes, routing, TOP_K, a_scale=s1, out_scale=scales)
            runs.append((codes.clone(), scales.clone()))
        (c0, sc0), (c1, sc1) = runs
        assert torch.equal(c0[routed], c1[routed]), f"m={m}: a routed code byte was not written"
        # the unfused layer: bf16 act(gate, up) rows, then quantize_activation
        act = torch.full((m * TOP_K, fused.intermediate), float("nan"), dtype=torch.bfloat16, device="cuda")
        g1u.moe(a1, act, routing, TOP_K, a_scale=s1)
        qa = hg.quantize_activation(act, scheme, static_scale=static)
        assert torch.equal(c0[routed], qa.codes[routed]), f"{preset} m={m}: codes differ from quantize_activation's"
        if static is None:
            assert torch.equal(_bits(sc0[routed]), _bits(sc1[routed])), f"m={m}: a routed scale was not written"
            assert torch.equal(_bits(sc0[routed]), _bits(qa.scales.reshape(sc0.shape)[routed])), (
                f"{preset} m={m}: scales differ from quantize_activation's")
        checked += 1
    assert checked, "no bucket of M_VALUES fuses"


@pytest.mark.parametrize("preset,pipeline", list(_cases()))
def test_fused_quantization_layer_is_bitwise_the_unfused_one(preset: str, pipeline: str | None) -> None:
    fused, unfused, q13, q2, b13, b2 = _layers(preset, pipeline, seed=1)
    errors = {}
    for m in M_VALUES:
        x = torch.randn(m, H, device="cuda").bfloat16()
        weights, ids = _routing(m, E, TOP_K, drop=0.1 if m > 1 else 0.0)
        outs = []
        for moe in (fused, unfused):
            out = torch.full((m, H), float("nan"), dtype=torch.bfloat16, device="cuda")
            assert hg.fused_moe(x, moe, weights, ids, output=out) is out
            assert torch.isfinite(out).all(), f"m={m}: rows left unwritten or non-finite"
            outs.append(out)
        assert torch.equal(outs[0], outs[1]), f"{preset} m={m}: fused and unfused quantization differ"
        errors[m] = _rel(outs[0], _reference(fused, x, weights, ids, q13, q2, b13, b2))
    tolerance = LAYER_TOLERANCE[fused.activation_schemes[0].dtype.name]
    bad = {m: err for m, err in errors.items() if not err < tolerance}
    assert not bad, f"{preset}: relative error above {tolerance} at M {bad} (all {errors})"


def test_fused_quantization_captures_in_a_cuda_graph() -> None:
    """No host synchronisation; the graph replays with new inputs into the same output as an eager call."""
    fused, *_ = _layers("w8a8-mxfp8", "standard", seed=2)
    m = 7
    x = torch.randn(m, H, device="cuda").bfloat16()
    weights, ids = _routing(m, E, TOP_K)
    graph, out = capture_without_sync(fused, x, weights, ids)
    x.copy_(torch.randn(m, H, device="cuda").bfloat16())
    graph.replay()
    assert torch.equal(out, fused(x, weights, ids))

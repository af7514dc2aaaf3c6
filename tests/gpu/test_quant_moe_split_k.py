"""Split-K indexed MoE GEMMs (issue 11: small batches whose routed experts leave SMs idle) on the GPU, against the
float64 references of tests/gpu/test_quant_moe.py: QuantMoE at M = 1, 2, 3 and 200 with split-K forced in every
standard bucket (split_k=3; GEMMs of fewer k tiles split fewer ways) and by the heuristic (a first bucket below
one row per expert splits GEMM1 here: 8 n tiles, 8 k tiles), 16-bit activations with the fused gated activation
and without it, 8-bit activations; each GEMM alone into NaN-poisoned rows (exactly the routed rows written, the
slices' sum before the router weight); run-to-run bitwise determinism; a CUDA graph of the split bucket replayed
with new routing (its scratch bound at construction).

    pytest tests/gpu/test_quant_moe_split_k.py -q
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import local_experts, reference_fused_moe, routed_rows_gemm
from test_quant_moe import TOLERANCE, _rel, _routing, capture_without_sync, quantized_experts
from test_quant_moe_a8 import LAYER_TOLERANCE
from test_quant_moe_a8 import _reference as a8_reference

pytestmark = pytest.mark.gpu

E, H, I, TOP_K = 32, 2048, 512, 4  # gate-up N = 1024 (8 n tiles), K = 2048 (8 k tiles); down N = 2048, K = 512
M_VALUES = (1, 2, 3, 200)
SPLITS = {"forced": 3, "heuristic": None}
# (id, scheme, dtype, activation, gate_up_layout, biases)
CASES = [
    ("int4-silu", "int4-g128", torch.bfloat16, "silu_mul", "split", False),
    ("uint4zp-gelu-upfirst-bias-fp16", "uint4-g64-zp", torch.float16, "gelu_mul", "up_first", True),
    ("mxfp4-swiglu-interleaved-bias", "mxfp4", torch.bfloat16, "swiglu_oai", "interleaved", True),
]


def _weights(case, seed: int):
    _, scheme, dtype, _, _, biases = case
    return quantized_experts(scheme, dtype, E, H, I, biases, seed)  # schemes of test_quant_moe.SCHEMES


def _layer(case, q13, q2, b13, b2, split_k, fused=None):
    _, _, dtype, activation, layout, _ = case
    return hg.QuantMoE.from_quantized(q13, q2, activation=activation, gate_up_layout=layout, bias13=b13, bias2=b2,
                                      dtype=dtype, fused_activation=fused, pipeline="standard", split_k=split_k)


def _split_of(moe, m: int) -> tuple[int, int]:
    return moe.split_ks[moe.bucket_for(m, TOP_K)]


def test_heuristic_splits_gate_up_at_m1_on_this_gpu():
    q13, q2, b13, b2 = _weights(CASES[0], seed=0)
    moe = _layer(CASES[0], q13, q2, b13, b2, split_k=None)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert _split_of(moe, 1)[0] > 1, f"no split-K gate-up at M = 1 ({sms} SMs): buckets {moe.buckets}, {moe.split_ks}"
    assert _split_of(moe, 200) == (1, 1)


@pytest.mark.parametrize("split", SPLITS, ids=list(SPLITS))
@pytest.mark.parametrize("fused", [None, False], ids=["fused-activation", "torch-activation"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_split_k_layer_matches_reference(case, fused, split):
    q13, q2, b13, b2 = _weights(case, seed=1)
    moe = _layer(case, q13, q2, b13, b2, SPLITS[split], fused=fused)
    if split == "forced":
        assert _split_of(moe, 1) == (3, 2), moe.split_ks  # down: 2 k tiles
    dtype = case[2]
    w13, w2 = q13.dequantize().double(), q2.dequantize().double()
    errors = {}
    for m in M_VALUES:
        x = torch.randn(m, H, device="cuda").to(dtype)
        weights, ids = _routing(m, E, TOP_K, drop=0.1 if m > 2 else 0.0)
        out = moe(x, weights, ids)
        again = moe(x, weights, ids)
        assert torch.equal(out, again), f"m={m}: split-K results differ from run to run"
        ref = reference_fused_moe(x.double(), w13, w2, weights.double(), ids, activation=moe.activation,
                                  gate_up_layout=moe.gate_up_layout, bias13=None if b13 is None else b13.double(),
                                  bias2=None if b2 is None else b2.double())
        assert out.shape == (m, H) and torch.isfinite(out).all(), f"m={m}: non-finite output"
        errors[m] = _rel(out, ref)
    bad = {m: err for m, err in errors.items() if not err < TOLERANCE[dtype]}
    assert not bad, f"{case[0]} {split}: relative error above {TOLERANCE[dtype]} at {bad} (all {errors}, " \
                    f"splits {[_split_of(moe, m) for m in M_VALUES]})"


@pytest.mark.parametrize("split", SPLITS, ids=list(SPLITS))
@pytest.mark.parametrize("m", M_VALUES)
def test_split_k_gemms_write_exactly_the_routed_rows(m, split):
    """GEMM1 (gate/up rows, no activation) and GEMM2 (times the router weight) alone, into NaN-poisoned outputs: every
    routed assignment row holds its product, rows of dropped assignments stay untouched."""
    case = CASES[2]  # biases: added once, by the slice that finishes the tile
    q13, q2, b13, b2 = _weights(case, seed=2)
    moe = _layer(case, q13, q2, b13, b2, SPLITS[split], fused=False)
    dtype = case[2]
    x = torch.randn(m, H, device="cuda").to(dtype)
    weights, ids = _routing(m, E, TOP_K, drop=0.2 if m > 1 else 0.0)
    gemm1, gemm2 = moe._launchers[moe.bucket_for(m, TOP_K)]
    routing = hg.moe_align(ids, E, gemm1.kernel.plan.tuning.block_m)
    expert = local_experts(ids, E).reshape(-1)
    routed = expert >= 0
    rows = torch.arange(m * TOP_K, device="cuda")
    h = torch.full((m * TOP_K, 2 * I), float("nan"), dtype=dtype, device="cuda")
    gemm1.moe(x, h, routing, TOP_K)
    ref1 = routed_rows_gemm(x[rows // TOP_K][routed], q13.dequantize(), expert[routed], b13)
    a2 = torch.randn(m * TOP_K, I, device="cuda").to(dtype)
    y = torch.full((m * TOP_K, H), float("nan"), dtype=dtype, device="cuda")
    flat = weights.reshape(-1).float().contiguous()
    gemm2.moe(a2, y, routing, 1, flat)
    ref2 = routed_rows_gemm(a2[routed], q2.dequantize(), expert[routed], b2) * flat.double()[routed, None]
    splits = (gemm1.kernel.plan.tuning.split_k, gemm2.kernel.plan.tuning.split_k)
    for name, out, ref in (("GEMM1", h, ref1), ("GEMM2", y, ref2)):
        assert torch.isfinite(out[routed]).all(), f"{name} (splits {splits}): a routed row was not written"
        assert torch.isnan(out[~routed]).all(), f"{name} (splits {splits}): a dropped assignment's row was written"
        assert _rel(out[routed], ref) < TOLERANCE[dtype], f"{name} (splits {splits})"


@pytest.mark.parametrize("preset", ["w8a8-fp8-channel", "w8a8-int8-channel", "w4a8-mxfp4-fp8"])
def test_split_k_8bit_activations_match_reference(preset):
    major, minor = torch.cuda.get_device_capability()
    if "fp8" in preset and (major, minor) < (8, 9):
        pytest.skip("fp8 activations need sm_89+")
    torch.manual_seed(4)
    s = hg.scheme(preset)
    q13 = s.quantize(torch.randn(E, 2 * I, H, device="cuda") * 0.05)
    q2 = s.quantize(torch.randn(E, H, I, device="cuda") * 0.05)
    for split_k in (3, None):
        moe = hg.QuantMoE.from_quantized(q13, q2, pipeline="standard", split_k=split_k)
        errors = {}
        for m in M_VALUES:
            x = torch.randn(m, H, device="cuda").bfloat16()
            weights, ids = _routing(m, E, TOP_K, drop=0.1 if m > 2 else 0.0)
            out = moe(x, weights, ids)
            ref = a8_reference(moe, x, weights, ids, q13, q2, None, None)
            assert torch.isfinite(out).all(), f"{preset} split_k={split_k} m={m}: non-finite output"
            errors[m] = _rel(out, ref)
        tol = LAYER_TOLERANCE[s.activation.dtype.name]
        bad = {m: err for m, err in errors.items() if not err < tol}
        assert not bad, f"{preset} split_k={split_k}: above {tol} at {bad} (all {errors}, {moe.split_ks})"


def test_split_bucket_cuda_graph_replays_new_routing():
    case = CASES[0]
    q13, q2, b13, b2 = _weights(case, seed=5)
    moe = _layer(case, q13, q2, b13, b2, split_k=None)
    m = 2
    assert _split_of(moe, m)[0] > 1, moe.split_ks
    x = torch.randn(m, H, device="cuda").bfloat16()
    weights, ids = _routing(m, E, TOP_K)
    graph, out = capture_without_sync(moe, x, weights, ids)
    for seed in range(3):
        torch.manual_seed(100 + seed)
        new_w, new_ids = _routing(m, E, TOP_K)
        x.copy_(torch.randn_like(x))
        weights.copy_(new_w)
        ids.copy_(new_ids)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, moe(x, weights, ids)), f"replay {seed}: graph and eager differ"

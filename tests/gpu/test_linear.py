"""QuantLinear on the GPU against the float64 reference (reference_gemm over the dequantized weight).

Outputs are poisoned (NaN) before every launch; inputs are fresh random values. One layer is built per
(format, granularity, dtype, shape) case and run at every M of the bucket list, so all M buckets (and with
them split-K and the in-CTA k reduction) are exercised. Tolerances are relative Frobenius errors; a kernel that
mixes up fragments or scales misses them by orders of magnitude. Every output is also held to the per-element
bound of numerics_check (|y - y_ref| against u |y_ref| + the kernel's weight rounding + 2^-6 eps |x| |W|), and each
case runs the negative control: one scale entry doubled in a copy of the prepared weight must fail that bound.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.formats import FloatType, IntType, register_dtype
from humming_gen.reference import reference_gemm
from numerics_check import check_elementwise, elementwise_bound, emulate_prepared_weight, plant_wrong_scale

pytestmark = pytest.mark.gpu

M_VALUES = (1, 3, 16, 127, 1000, 4096)
TOLERANCE = {torch.bfloat16: 1.2e-2, torch.float16: 4e-3}

register_dtype("float5e2m2", FloatType(2, 2))
register_dtype("uint5", IntType(5, signed=False))

# (id, scheme kwargs): every weight format of the foundation issue at group 128, bf16.
FORMATS = [
    ("int1-g128", dict(weight="int1", group_size=128)),
    ("int2-g128", dict(weight="int2", group_size=128)),
    ("int3-g128", dict(weight="int3", group_size=128)),
    ("int4-g128", dict(weight="int4", group_size=128)),
    ("int5-g128", dict(weight="int5", group_size=128)),
    ("int6-g128", dict(weight="int6", group_size=128)),
    ("int7-g128", dict(weight="int7", group_size=128)),
    ("int8-g128", dict(weight="int8", group_size=128)),
    ("int8-channel", dict(weight="int8")),
    ("uint4-g128-zp", dict(weight="uint4", group_size=128, zero_point="int")),
    ("uint4-g128-fzp", dict(weight="uint4", group_size=128, zero_point="float")),
    ("uint8-g64-zp", dict(weight="uint8", group_size=64, zero_point="int")),
    ("uint5-g32-zp", dict(weight="uint5", group_size=32, zero_point="int")),
    ("uint4-channel-zp", dict(weight="uint4", zero_point="int")),
    ("float4e2m1-mxfp4", dict(weight="float4e2m1", group_size=32, scale_dtype="float8e8m0")),
    ("float4e2m1-nvfp4", dict(weight="float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True)),
    ("float8e4m3-channel", dict(weight="float8e4m3", scale_dtype="float32")),
    ("float8e4m3-block128", dict(weight="float8e4m3", block_size=(128, 128), scale_dtype="float32")),
    ("float8e5m2-g128", dict(weight="float8e5m2", group_size=128)),
    ("float6e2m3-g32", dict(weight="float6e2m3", group_size=32, scale_dtype="float8e8m0")),
    ("float6e3m2-g32", dict(weight="float6e3m2", group_size=32, scale_dtype="float8e8m0")),
    ("float4e0m3-g64", dict(weight="float4e0m3", group_size=64)),
    ("float8e0m7-channel", dict(weight="float8e0m7")),
    ("float5e2m2-custom-g128", dict(weight="float5e2m2", group_size=128)),
    ("int4-tensor", dict(weight="int4", granularity="tensor", scale_dtype="float32")),
]
GROUPS = [("int4-g32", dict(weight="int4", group_size=32)), ("int4-g64", dict(weight="int4", group_size=64)),
          ("int4-g48", dict(weight="int4", group_size=48)), ("int4-g512", dict(weight="int4", group_size=512)),
          ("int4-channel", dict(weight="int4"))]
FP16 = [("fp16-int4-g128", dict(weight="int4", group_size=128)),
        ("fp16-uint4-g128-zp", dict(weight="uint4", group_size=128, zero_point="int")),
        ("fp16-int8-channel", dict(weight="int8")),
        ("fp16-float8e4m3-channel", dict(weight="float8e4m3", scale_dtype="float32")),
        ("fp16-float4e2m1-g32", dict(weight="float4e2m1", group_size=32, scale_dtype="float16")),
        ("fp16-int3-g64", dict(weight="int3", group_size=64)),
        ("fp16-uint3-g64-zp", dict(weight="uint3", group_size=64, zero_point="int"))]
SHAPES = [(4000, 3000), (640, 7168), (8192, 8192)]

CASES = ([(cid, kw, torch.bfloat16, 1024, 2048, False) for cid, kw in FORMATS]
         + [(cid, kw, torch.bfloat16, 768, 1536, True) for cid, kw in GROUPS]
         + [(cid, kw, torch.float16, 1024, 2048, False) for cid, kw in FP16]
         + [(f"int4-g128-n{n}-k{k}", dict(weight="int4", group_size=128), torch.bfloat16, n, k, True)
            for n, k in SHAPES]
         + [(f"uint4-g128-zp-n{n}-k{k}", dict(weight="uint4", group_size=128, zero_point="int"), torch.bfloat16,
             n, k, False) for n, k in SHAPES[:2]])

# Group sizes (and a block scale K side) that are not multiples of 16: each register finds its group row. Every
# one runs on an odd N with K = 1000 (a partial last group, rows past K) and on a larger square-ish shape.
ARBITRARY_M_VALUES = (1, 16, 127, 1000)
ARBITRARY_GROUPS = [
    ("int4-g8", dict(weight="int4", group_size=8), torch.bfloat16),
    ("int4-g24", dict(weight="int4", group_size=24), torch.bfloat16),
    ("int4-g40", dict(weight="int4", group_size=40), torch.bfloat16),
    ("int4-g100", dict(weight="int4", group_size=100), torch.bfloat16),
    ("int4-g7", dict(weight="int4", group_size=7), torch.bfloat16),
    ("uint4-g100-zp", dict(weight="uint4", group_size=100, zero_point="int"), torch.bfloat16),
    ("uint4-g24-fzp", dict(weight="uint4", group_size=24, zero_point="float"), torch.bfloat16),
    ("fp16-int4-g40", dict(weight="int4", group_size=40), torch.float16),
    ("float8e4m3-block128x24", dict(weight="float8e4m3", block_size=(128, 24), scale_dtype="float32"),
     torch.bfloat16),
]
ARBITRARY_SHAPES = [(1001, 1000), (2048, 4096)]
ARBITRARY_CASES = [(f"{cid}-n{n}-k{k}", kw, dtype, n, k, (n, k) == ARBITRARY_SHAPES[0])
                   for cid, kw, dtype in ARBITRARY_GROUPS for n, k in ARBITRARY_SHAPES]


def run_case(kwargs, dtype, n, k, bias_on, m_values=M_VALUES):
    torch.manual_seed(n * 7 + k)
    scheme = hg.QuantScheme(**kwargs)
    w = torch.randn(n, k, device="cuda") * 0.05
    qw = scheme.quantize(w)
    bias = (torch.randn(n, device="cuda") * 0.1).to(dtype) if bias_on else None
    layer = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype)
    errors = {}
    w_ref = qw.dequantize(torch.float64)
    w_kernel = emulate_prepared_weight(layer.kernel_for(1).plan, qw, layer.weight)
    for m in m_values:
        x = torch.randn(m, k, device="cuda").to(dtype)
        kernel = layer.kernel_for(m)
        out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")  # poison
        kernel.launch(*_launch_args(layer, x, out))
        ref = reference_gemm(x.double(), qw, bias=None if bias is None else bias.double())
        err = ((out.double() - ref).norm() / ref.norm()).item()
        errors[m] = err
        via_forward = layer(x)
        assert torch.isfinite(out).all(), f"m={m}: non-finite output (poison left or overflow)"
        assert torch.equal(via_forward, out), f"m={m}: forward() and a direct launch disagree"
        bound = elementwise_bound(x, w_ref, w_kernel, ref, dtype, dtype, bias)
        report = check_elementwise(out, ref, bound)
        assert report.ok, f"m={m}: {report} (relative Frobenius error {err:.3g})"
    # negative control at the largest m: a doubled scale entry must fail the same bound
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    a, _, _, b = _launch_args(layer, x, out)
    kernel.launch(a, plant_wrong_scale(layer.weight), out, b)
    assert not check_elementwise(out, ref, bound).ok, "negative control: a doubled scale entry passes the bound"
    return errors


def _launch_args(layer, x, out):
    a = x
    if layer.weight.k_perm is not None:
        a = a[:, layer.weight.k_perm]
    if layer.in_features % 8:
        a = torch.nn.functional.pad(a, (0, (-layer.in_features) % 8)).contiguous()
    return a, layer.weight, out, layer.bias


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_quant_linear_matches_reference(case):
    cid, kwargs, dtype, n, k, bias_on = case
    errors = run_case(kwargs, dtype, n, k, bias_on)
    bad = {m: e for m, e in errors.items() if not e < TOLERANCE[dtype]}
    assert not bad, f"{cid}: relative error above {TOLERANCE[dtype]} at {bad} (all: {errors})"


@pytest.mark.parametrize("case", ARBITRARY_CASES, ids=[c[0] for c in ARBITRARY_CASES])
def test_group_sizes_not_multiple_of_16_match_reference(case):
    cid, kwargs, dtype, n, k, bias_on = case
    errors = run_case(kwargs, dtype, n, k, bias_on, m_values=ARBITRARY_M_VALUES)
    bad = {m: e for m, e in errors.items() if not e < TOLERANCE[dtype]}
    assert not bad, f"{cid}: relative error above {TOLERANCE[dtype]} at {bad} (all: {errors})"


# split-K kernels with the store's column factors loaded before the reductions (PRELOAD_SPLIT_K_FACTORS, the
# default) and in the store: out_scale (carried exponents, channel scales, a global scale) and biases, at the split-K
# buckets M = 1, 3, 16
PRELOAD_CASES = [("mxfp4-bias", dict(weight="float4e2m1", group_size=32, scale_dtype="float8e8m0"), True),
                 ("nvfp4", dict(weight="float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True),
                  False),
                 ("int8-channel-bias", dict(weight="int8"), True),
                 ("int4-g128-bias", dict(weight="int4", group_size=128), True)]


@pytest.mark.parametrize("preload", [True, False], ids=["preloaded", "in_store"])
@pytest.mark.parametrize("case", PRELOAD_CASES, ids=[c[0] for c in PRELOAD_CASES])
def test_split_k_preloaded_column_factors_match_reference(monkeypatch, case, preload: bool):
    from humming_gen.pipelines.standard import compose as standard_compose

    monkeypatch.setattr(standard_compose, "PRELOAD_SPLIT_K_FACTORS", preload)
    cid, kwargs, bias_on = case
    errors = run_case(kwargs, torch.bfloat16, 4096, 4096, bias_on, m_values=(1, 3, 16))
    bad = {m: e for m, e in errors.items() if not e < TOLERANCE[torch.bfloat16]}
    assert not bad, f"{cid}: relative error above {TOLERANCE[torch.bfloat16]} at {bad} (all: {errors})"


def test_bad_inputs_raise_before_launch():
    scheme = hg.QuantScheme("int4", group_size=128)
    layer = hg.QuantLinear.from_float(torch.randn(256, 512, device="cuda"), scheme, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="dtype"):
        layer(torch.randn(4, 512, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match=r"\(\.\.\., 512\)"):
        layer(torch.randn(4, 500, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"out has dtype torch.float16"):
        layer(torch.randn(4, 512, device="cuda", dtype=torch.bfloat16),
              out=torch.empty(4, 256, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="cpu"):
        layer(torch.randn(4, 512, dtype=torch.bfloat16))


def test_shared_memory_matches_loaded_function():
    layer = hg.QuantLinear.from_float(torch.randn(512, 1024, device="cuda"), hg.QuantScheme("int4", group_size=128))
    layer(torch.randn(3, 1024, device="cuda", dtype=torch.bfloat16))
    kernel = layer.kernel_for(3)
    loaded = kernel._function(torch.cuda.current_device())
    assert loaded.max_dynamic_smem_bytes >= kernel.plan.shared_bytes
    assert loaded.dynamic_smem_bytes == kernel.plan.shared_bytes
    assert loaded.num_regs == kernel.resources["registers"]
    if loaded.param_size is not None:
        assert loaded.param_size == kernel._struct.size


def test_act_order_permutation_and_unaligned_k():
    """k_perm (GPTQ act-order) permutes activation columns; K % 8 != 0 pads activations on the host."""
    torch.manual_seed(1)
    n, k = 384, 1004
    qw = hg.QuantScheme("uint4", group_size=128, zero_point="int").quantize(torch.randn(n, k, device="cuda") * 0.05)
    qw.k_perm = torch.randperm(k, device="cuda")
    layer = hg.QuantLinear.from_quantized(qw)
    for m in (1, 37):
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = layer(x)
        ref = reference_gemm(x.double(), qw)
        err = ((y.double() - ref).norm() / ref.norm()).item()
        assert err < TOLERANCE[torch.bfloat16], f"m={m}: relative error {err}"


def test_weight_only_fp8_checkpoint_scheme():
    """A scheme that quantizes activations runs weight-only when asked; one whose quantized activations no kernel
    on sm_90a serves (W4A4) falls back to 16-bit activations by default and refuses clearly with strict=True (W8A8
    and W4A8 run: tests/gpu/test_linear_w8a8.py, test_linear_w4a8.py)."""
    qw = hg.scheme("w8a8-fp8-channel").quantize(torch.randn(512, 768, device="cuda") * 0.05)
    w4a4 = hg.scheme("w4a4-nvfp4").quantize(torch.randn(512, 768, device="cuda") * 0.05)
    with pytest.raises(ValueError, match="weight_only=True"):
        hg.QuantLinear.from_quantized(w4a4, strict=True)
    x = torch.randn(5, 768, device="cuda").bfloat16()
    for weights, layer in ((qw, hg.QuantLinear.from_quantized(qw, weight_only=True)),
                           (w4a4, hg.QuantLinear.from_quantized(w4a4))):
        ref = reference_gemm(x.double(), weights, quantize_input=False)
        err = ((layer(x).double() - ref).norm() / ref.norm()).item()
        assert err < TOLERANCE[torch.bfloat16], f"{weights.scheme}: relative error {err}"
    assert hg.QuantLinear.from_quantized(w4a4).compute_dtype == "bfloat16"


def test_kernel_launch_keeps_few_launchers_alive():
    """Kernel.launch binds a launcher per weight and keeps only LAUNCH_CACHE_SIZE of them (each holds its
    weight): a loop over many weights through one kernel neither leaks them nor mixes them up."""
    from humming_gen.kernel import LAUNCH_CACHE_SIZE

    torch.manual_seed(3)
    scheme = hg.QuantScheme("int4", group_size=128)
    qws = [scheme.quantize(torch.randn(256, 512, device="cuda") * 0.05) for _ in range(LAUNCH_CACHE_SIZE + 2)]
    layers = [hg.QuantLinear.from_quantized(q) for q in qws]
    kernel = layers[0].kernel_for(1)
    x = torch.randn(1, 512, device="cuda").bfloat16()
    for _ in range(2):
        for layer, q in zip(layers, qws):
            out = torch.full((1, 256), float("nan"), dtype=torch.bfloat16, device="cuda")
            kernel.launch(x, layer.weight, out)
            ref = reference_gemm(x.double(), q)
            assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2
            assert len(kernel._launchers) <= LAUNCH_CACHE_SIZE

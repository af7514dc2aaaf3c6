"""The warp-specialized pipeline on the GPU against the float64 reference, outputs poisoned before launch.

Each case builds a QuantLinear whose buckets from M = 17 on (9 for layers of at most 3072 rows) run the
warp-specialized pipeline (asserted), then runs M values across its buckets, partial token tiles and odd shapes
(N not a multiple of the tile's 256 rows, K not a multiple of 128). Tolerances are relative Frobenius errors, as in
test_linear.py.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.formats import FloatType, register_dtype
from humming_gen.reference import reference_gemm

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.bfloat16: 1.2e-2, torch.float16: 4e-3}
M_VALUES = (17, 32, 33, 64, 65, 127, 128, 255, 1000, 4096)
SKINNY_M_VALUES = (9, 16) + M_VALUES  # layers of at most 3072 rows take the pipeline from M = 9
register_dtype("float5e2m2", FloatType(2, 2))

FORMATS = [
    ("int4-g128", dict(weight="int4", group_size=128), torch.bfloat16),
    ("int3-g128", dict(weight="int3", group_size=128), torch.bfloat16),
    ("int8-channel", dict(weight="int8"), torch.bfloat16),
    ("int2-g64", dict(weight="int2", group_size=64), torch.bfloat16),
    ("uint4-g128-zp", dict(weight="uint4", group_size=128, zero_point="int"), torch.bfloat16),
    ("uint4-g128-fzp", dict(weight="uint4", group_size=128, zero_point="float"), torch.bfloat16),
    ("uint8-g64-zp", dict(weight="uint8", group_size=64, zero_point="int"), torch.bfloat16),
    ("uint4-channel-zp", dict(weight="uint4", zero_point="int"), torch.bfloat16),
    ("int4-g32", dict(weight="int4", group_size=32), torch.bfloat16),
    ("int4-g48", dict(weight="int4", group_size=48), torch.bfloat16),
    ("int4-g512", dict(weight="int4", group_size=512), torch.bfloat16),
    ("mxfp4", dict(weight="float4e2m1", group_size=32, scale_dtype="float8e8m0"), torch.bfloat16),
    ("nvfp4", dict(weight="float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True), torch.bfloat16),
    ("float8e4m3-channel", dict(weight="float8e4m3", scale_dtype="float32"), torch.bfloat16),
    ("float8e4m3-block128", dict(weight="float8e4m3", block_size=(128, 128), scale_dtype="float32"), torch.bfloat16),
    ("float6e3m2-g32", dict(weight="float6e3m2", group_size=32, scale_dtype="float8e8m0"), torch.bfloat16),
    ("float4e0m3-g64", dict(weight="float4e0m3", group_size=64), torch.bfloat16),
    ("float5e2m2-custom", dict(weight="float5e2m2", group_size=128), torch.bfloat16),
    ("int4-tensor", dict(weight="int4", granularity="tensor", scale_dtype="float32"), torch.bfloat16),
    ("fp16-int4-g128", dict(weight="int4", group_size=128), torch.float16),
    ("fp16-uint4-g128-zp", dict(weight="uint4", group_size=128, zero_point="int"), torch.float16),
    ("fp16-int8-channel", dict(weight="int8"), torch.float16),
]
SHAPES = [(4000, 3000), (576, 7168), (1001, 1000), (8192, 8192)]
CASES = ([(cid, kw, dt, 1536, 2048, False, SKINNY_M_VALUES) for cid, kw, dt in FORMATS]
         + [(f"int4-g128-n{n}-k{k}", dict(weight="int4", group_size=128), torch.bfloat16, n, k, True,
             M_VALUES + (8192,) if n == 8192 else SKINNY_M_VALUES if n <= 3072 else M_VALUES) for n, k in SHAPES]
         + [(f"fp16-int4-g128-n{n}-k{k}", dict(weight="int4", group_size=128), torch.float16, n, k, True,
             SKINNY_M_VALUES if n <= 3072 else M_VALUES) for n, k in SHAPES[:3]]
         # the open-ended bucket's 160-token tile (heuristics.LARGE_M_BLOCK_HEAVY_GROUPS)
         + [(f"{cid}-open-bucket", kw, dt, 1536, 2048, False, (4100,)) for cid, kw, dt in FORMATS
            if cid in ("uint4-g128-fzp", "float8e4m3-block128")])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_warp_specialized_matches_reference(case):
    cid, kwargs, dtype, n, k, bias_on, m_values = case
    torch.manual_seed(n * 7 + k)
    qw = hg.QuantScheme(**kwargs).quantize(torch.randn(n, k, device="cuda") * 0.05)
    bias = (torch.randn(n, device="cuda") * 0.1).to(dtype) if bias_on else None
    layer = hg.QuantLinear.from_quantized(qw, bias=bias, dtype=dtype)
    errors = {}
    for m in m_values:
        kernel = layer.kernel_for(m)
        assert kernel.plan.pipeline == "warp_specialized", f"m={m} runs {kernel.plan.pipeline}"
        assert not cid.endswith("-open-bucket") or kernel.plan.tuning.block_m == 160, kernel.name
        x = torch.randn(m, k, device="cuda").to(dtype)
        a = x if k % 8 == 0 else torch.nn.functional.pad(x, (0, (-k) % 8)).contiguous()
        out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")  # poison
        kernel.launch(a, layer.weight, out, layer.bias)
        ref = reference_gemm(x.double(), qw, bias=None if bias is None else bias.double())
        assert torch.isfinite(out).all(), f"{cid} m={m}: non-finite output (poison left or overflow)"
        errors[m] = ((out.double() - ref).norm() / ref.norm()).item()
        assert torch.equal(layer(x), out), f"m={m}: forward() and a direct launch disagree"
    bad = {m: e for m, e in errors.items() if not e < TOLERANCE[dtype]}
    assert not bad, f"{cid}: relative error above {TOLERANCE[dtype]} at {bad} (all: {errors})"


def test_float32_output_and_split_k_repeatable():
    """fp32 output through the warp-specialized epilogue; split-K sums in slice order, so two runs agree bitwise."""
    torch.manual_seed(5)
    n, k = 2048, 4096
    qw = hg.QuantScheme("int4", group_size=128).quantize(torch.randn(n, k, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw, out_dtype=torch.float32)
    x = torch.randn(64, k, device="cuda").bfloat16()
    assert layer.kernel_for(64).plan.tuning.split_k > 1
    y1, y2 = layer(x), layer(x)
    ref = reference_gemm(x.double(), qw)
    assert y1.dtype == torch.float32 and torch.equal(y1, y2)
    assert ((y1.double() - ref).norm() / ref.norm()).item() < 4e-3


def test_unsupported_target_request_is_refused():
    """A warp-specialized request for a target without wgmma names the missing feature before any launch."""
    from humming_gen.codegen import ComposeError, compose
    from humming_gen.config import ComputeConfig, LayerConfig
    from humming_gen.heuristics import choose_tunings
    from humming_gen.targets import get_target

    layer = LayerConfig(n=4096, k=4096, scheme="w4a16-int4-g128")
    tuning = choose_tunings(layer, get_target("sm_90a")).for_m(1024)
    with pytest.raises(ComposeError, match="wgmma"):
        compose(layer, ComputeConfig(), tuning, get_target("sm_89"))


def test_split_k_slices_across_waves():
    """Every split-K slice waits for its tile's others and sums a share: with more units than SMs, the slices of one
    tile run on both sides of a wave of the persistent grid. It must finish, match the reference, and leave the
    arrival counters at zero (the second and third runs agree bitwise with the first)."""
    import attrs

    from humming_gen.pipelines.base import TuningPlan

    torch.manual_seed(11)
    n, k, m = 1024, 4096, 600
    qw = hg.QuantScheme("int4", group_size=128).quantize(torch.randn(n, k, device="cuda") * 0.05)
    heuristic = hg.QuantLinear.from_quantized(qw).tunings.for_m(m)
    tuning = attrs.evolve(heuristic, split_k=8)
    layer = hg.QuantLinear.from_quantized(qw, tunings=TuningPlan(((None, tuning),)))
    plan = layer.kernel_for(m).plan
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert plan.pipeline == "warp_specialized" and plan.launch.units(m) > sms, (plan.launch.units(m), sms)
    x = torch.randn(m, k, device="cuda").bfloat16()
    outs = []
    for _ in range(3):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        layer.kernel_for(m).launch(x, layer.weight, out, None)
        outs.append(out)
    ref = reference_gemm(x.double(), qw)
    assert torch.isfinite(outs[0]).all()
    assert ((outs[0].double() - ref).norm() / ref.norm()).item() < TOLERANCE[torch.bfloat16]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])

"""The prepared (kernel-layout) weight, dequantized on the CPU with the kernel's math, against the scheme's own
dequantized weight, elementwise: every scale a kernel applies (group scales and zero points in b_scale / b_zero,
channel, tensor, global and fused-shard channel scales in the fp32 out_scale) must be there exactly once.

A scale dropped or doubled while preparing (prepare_weight) or a scale path compose does not enable (out_scale)
changes whole rows of the emulated weight, far beyond the 16-bit rounding allowed for inexact cases.
"""

from __future__ import annotations

import pytest
import torch

from numerics_check import compose, emulate_prepared_weight, prepare_weight
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.schemes import QuantScheme
from humming_gen.targets import get_target

TARGET = get_target("sm_90a")
T_WARPS_M4 = TuningConfig(block_m=128, block_n=64, block_k=64, warps_m=4, warps_n=1, warps_k=1, stages=3)
T_WIDE = TuningConfig(block_m=32, block_n=256, block_k=64, warps_m=1, warps_n=4, warps_k=1, stages=3)

# (id, scheme, dtype, exact): exact where every dequantized weight is exact in the kernel's arithmetic
CASES = [
    ("int8-channel", QuantScheme("int8"), "bfloat16", True),
    ("int4-tensor-f32", QuantScheme("int4", granularity="tensor", scale_dtype="float32"), "bfloat16", True),
    ("float6e3m2-tensor-fp16", QuantScheme("float6e3m2", granularity="tensor", scale_dtype="float32"), "float16", True),
    ("fp8-channel-f32", QuantScheme("float8e4m3", scale_dtype="float32"), "bfloat16", True),
    ("nvfp4-global", QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True),
     "bfloat16", True),
    ("nvfp4-global-fp16", QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True),
     "float16", True),
    ("mxfp4", QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0"), "bfloat16", True),
    ("int4-g128-fp16", QuantScheme("int4", group_size=128), "float16", True),
    ("int4-g128", QuantScheme("int4", group_size=128), "bfloat16", False),  # (q - 8) * s rounds in bf16
    ("uint4-channel-zp", QuantScheme("uint4", zero_point="int"), "bfloat16", False),
    ("uint4-g64-zp", QuantScheme("uint4", group_size=64, zero_point="int"), "float16", False),
    ("uint4-g128-fzp", QuantScheme("uint4", group_size=128, zero_point="float"), "bfloat16", False),
    ("fp8-block128", QuantScheme("float8e4m3", block_size=(128, 128), scale_dtype="float32"), "bfloat16", False),
    ("float4e0m3-g64", QuantScheme("float4e0m3", group_size=64), "bfloat16", False),
    ("int4-g24", QuantScheme("int4", group_size=24), "float16", True),
]
TUNINGS = [("heuristic-m1", None), ("heuristic-m4096", 4096), ("wm4", T_WARPS_M4), ("bn256", T_WIDE)]


def _check(scheme: QuantScheme, dtype: str, exact: bool, tuning, n=200, k=1000, channel_scale=False,
           k_perm=False) -> None:
    torch.manual_seed(n * 3 + k)
    qw = scheme.quantize(torch.randn(n, k) * 0.05)
    if channel_scale:  # fused shards: a second per-row fp32 scale
        qw.channel_scale = torch.rand(n) + 0.5
    if k_perm:
        qw.k_perm = torch.randperm(k)
    layer = LayerConfig(n, k, scheme, dtype=dtype)
    if tuning is None or isinstance(tuning, int):
        tuning = choose_tunings(layer, TARGET).for_m(tuning or 1)
    plan = compose(layer, ComputeConfig(), tuning, TARGET)
    got = emulate_prepared_weight(plan, qw, prepare_weight(plan, qw, "cpu"))
    want = qw.dequantize(torch.float64)
    if exact:
        assert torch.equal(got, want), f"max deviation {(got - want).abs().max().item():.3g}"
    else:  # one rounding of each weight to the 16-bit compute type (or a rounded scale / zero term)
        err = (got - want).abs()
        allowed = 2.0 ** -7 * (want.abs() + want.abs().amax(1, keepdim=True))
        assert (err <= allowed).all(), f"max deviation {err.max().item():.3g}"


@pytest.mark.parametrize("tuning", [t for _, t in TUNINGS], ids=[i for i, _ in TUNINGS])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_prepared_weight_dequantizes_like_the_scheme(case, tuning) -> None:
    _, scheme, dtype, exact = case
    _check(scheme, dtype, exact, tuning)


@pytest.mark.parametrize("scheme", [QuantScheme("float8e4m3", granularity="tensor", scale_dtype="float32"),
                                    QuantScheme("int4", group_size=128),
                                    QuantScheme("uint4", group_size=128, zero_point="int")],
                         ids=["fp8-tensor", "int4-g128", "uint4-g128-zp"])
def test_fused_shard_channel_scale_is_applied(scheme) -> None:
    _check(scheme, "bfloat16", False, None, channel_scale=True)


def test_act_order_permutation_round_trips() -> None:
    _check(QuantScheme("uint4", group_size=128, zero_point="int"), "float16", False, None, k_perm=True)

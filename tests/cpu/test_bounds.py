"""Shape bounds (humming_gen/config/limits.py): what the generated 32-bit arithmetic cannot index is refused
where it is described, and everything inside the bounds composes into constants that fit an `int`."""

from __future__ import annotations

import pytest
import torch

from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.config.limits import MAX_K, MAX_N
from humming_gen.kernel import compile as hg_compile
from humming_gen.schemes import ActivationScheme, QuantScheme
from humming_gen.targets import get_target

INT_MAX = (1 << 31) - 1
# The widest tile (block_n 512) and the shallowest k tile give the largest weight stride and the most k tiles.
WIDE = TuningConfig(block_m=16, block_n=512, block_k=32, warps_m=1, warps_n=4, warps_k=1, stages=2, split_k=512)


@pytest.mark.parametrize("scheme", [
    "w8a16-int8-channel",                                    # 8-bit codes: the largest packed-weight stride
    QuantScheme("int4", group_size=MAX_K),                   # one group as long as the longest K
    QuantScheme("int4", group_size=MAX_K - 1),               # an arbitrary (odd) group size at the bound
    QuantScheme("float8e4m3", block_size=(MAX_N, MAX_K), scale_dtype="float32"),
], ids=["int8-channel", "group-max", "group-max-odd", "block-max"])
def test_constants_fit_int_at_the_bounds(scheme):
    layer = LayerConfig(n=MAX_N, k=MAX_K, scheme=scheme)
    plan = compose(layer, ComputeConfig(), WIDE, get_target("sm_90a"))
    too_big = {name: value for name, value, _ in plan.constants if not -INT_MAX - 1 <= value <= INT_MAX}
    assert not too_big
    assert plan.layout.n_pad <= INT_MAX and plan.layout.k_pad <= INT_MAX


@pytest.mark.parametrize("field,value,fragments", [
    ("k", 1 << 30, ["LayerConfig.k", "got 1073741824", f"[1, {MAX_K}]", "2^31"]),
    ("k", MAX_K + 1, ["LayerConfig.k", f"[1, {MAX_K}]"]),
    ("n", MAX_N + 1, ["LayerConfig.n", f"[1, {MAX_N}]", "32-bit"]),
])
def test_layer_refuses_what_kernels_cannot_index(field, value, fragments):
    with pytest.raises(ValueError) as info:
        LayerConfig(**{"n": 4096, "k": 4096, "scheme": "w4a16-int4-g128", field: value})
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("make,fragments", [
    (lambda: QuantScheme("int4", group_size=10 ** 9), ["QuantScheme.group_size", "got 1000000000", str(MAX_K)]),
    (lambda: QuantScheme("int4", group_size=1 << 40), ["QuantScheme.group_size", str(MAX_K)]),
    (lambda: QuantScheme("int4", group_size=0), ["QuantScheme.group_size", "got 0"]),
    (lambda: QuantScheme("int4", group_size=True), ["QuantScheme.group_size", "got True"]),
    (lambda: QuantScheme("int8", block_size=(128, MAX_K + 1)), ["block_size[1] (bk)", str(MAX_K)]),
    (lambda: QuantScheme("int8", block_size=(MAX_N + 1, 128)), ["block_size[0] (bn)", str(MAX_N)]),
    (lambda: QuantScheme("int8", block_size=(0, 128)), ["block_size[0] (bn)", "got 0"]),
    (lambda: ActivationScheme("int8", granularity="group", group_size=10 ** 9),
     ["ActivationScheme.group_size", str(MAX_K)]),
])
def test_scheme_refuses_absurd_group_and_block_sizes(make, fragments):
    with pytest.raises(ValueError) as info:
        make()
    for fragment in fragments:
        assert fragment in str(info.value)


def test_group_longer_than_the_weight_does_not_pad_it():
    """A group of MAX_K on a 1024 x 1024 weight is one group per row: same codes and scales as channel scales,
    computed without padding the weight to 1024 x 2^25 float64 (256 GB)."""
    w = torch.randn(1024, 1024)
    long_group = QuantScheme("int4", group_size=MAX_K).quantize(w)
    channel = QuantScheme("int4", granularity="channel").quantize(w)
    assert torch.equal(long_group.codes, channel.codes)
    assert torch.equal(long_group.scales, channel.scales)
    block = QuantScheme("int8", block_size=(MAX_N, MAX_K), scale_dtype="float32").quantize(w)
    assert block.scales.shape == (1, 1)


@pytest.mark.parametrize("m,exc", [(0, ValueError), (-1, ValueError), (1 << 31, ValueError), (1.5, TypeError),
                                   (True, TypeError), ("1", TypeError)])
def test_compile_refuses_bad_m(m, exc):
    layer = LayerConfig(n=4096, k=4096, scheme="w4a16-int4-g128")
    with pytest.raises(exc) as info:
        hg_compile(layer, target="sm_90a", m=m)
    assert "compile.m" in str(info.value) and repr(m) in str(info.value)

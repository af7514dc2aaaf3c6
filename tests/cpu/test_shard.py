"""QuantizedWeight.shard: the dequantized shards are the slices of the dequantized full weight (exactly: the same
float64 products per element), row-parallel shards sum to the full product in the float64 reference, and splits
that would cut a group or block are refused naming the sizes."""

from __future__ import annotations

import pytest
import torch

from humming_gen.reference import reference_gemm
from humming_gen.schemes import QuantScheme

N, K = 512, 768

SCHEMES = {
    "int4-g128": QuantScheme("int4", group_size=128),
    "uint4-g64-zp": QuantScheme("uint4", group_size=64, zero_point="int"),
    "uint4-g32-fzp": QuantScheme("uint4", group_size=32, zero_point="float"),
    "int8-channel": QuantScheme("int8"),
    "uint4-channel-zp": QuantScheme("uint4", zero_point="int"),
    "int4-tensor": QuantScheme("int4", granularity="tensor", scale_dtype="float32"),
    "fp8-block128": QuantScheme("float8e4m3", block_size=(128, 128), scale_dtype="float32"),
    "nvfp4-global": QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True),
    "mxfp4": QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0"),
}


def quantize(name: str, seed: int = 0, channel_scale: bool = False):
    torch.manual_seed(seed)
    qw = SCHEMES[name].quantize(torch.randn(N, K) * 0.05)
    if channel_scale:
        qw.channel_scale = torch.rand(N) + 0.5
    return qw


def shard_local_act_order(k: int, world_size: int, side: int) -> torch.Tensor:
    """An act-order permutation whose stored groups each hold channels of one shard, groups in random order."""
    part = k // world_size
    groups = []
    for r in range(world_size):
        channels = r * part + torch.randperm(part)
        groups += list(channels.split(side))
    order = torch.randperm(len(groups))
    return torch.cat([groups[i] for i in order]).to(torch.int32)


@pytest.mark.parametrize("world_size", (2, 3, 4))
@pytest.mark.parametrize("name", list(SCHEMES))
def test_column_shards_concatenate_to_the_full_weight(name, world_size):
    qw = quantize(name, channel_scale=name == "int8-channel")
    if N % world_size:
        with pytest.raises(ValueError, match=r"N = 512 does not split into 3 equal shards"):
            qw.shard(0, 0, world_size)
        return
    shards = [qw.shard(0, r, world_size) for r in range(world_size)]
    assert all(s.n == N // world_size and s.k == K for s in shards)
    assert torch.equal(torch.cat([s.dequantize(torch.float64) for s in shards]), qw.dequantize(torch.float64))


@pytest.mark.parametrize("world_size", (2, 3, 4))
@pytest.mark.parametrize("name", list(SCHEMES))
def test_row_shards_sum_to_the_full_product(name, world_size):
    qw = quantize(name, channel_scale=name == "int8-channel")
    part = K // world_size
    side = {"group": SCHEMES[name].group_size, "block": 128}.get(SCHEMES[name].granularity)
    if side and part % side:
        with pytest.raises(ValueError, match=rf"K = {K} into shards of {part} would cut a group.*\({part} is not\)"):
            qw.shard(1, 0, world_size)
        return
    shards = [qw.shard(1, r, world_size) for r in range(world_size)]
    assert all(s.n == N and s.k == part for s in shards)
    full = qw.dequantize(torch.float64)
    assert torch.equal(torch.cat([s.dequantize(torch.float64) for s in shards], dim=1), full)
    x = torch.randn(5, K, dtype=torch.float64)
    total = sum(reference_gemm(x[:, r * part:(r + 1) * part], s) for r, s in enumerate(shards))
    torch.testing.assert_close(total, reference_gemm(x, qw), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dim", (0, 1))
def test_act_order_shards(dim):
    qw = quantize("uint4-g64-zp")
    qw.k_perm = shard_local_act_order(K, 3, 64)
    full = qw.dequantize(torch.float64)
    world_size = 3 if dim == 1 else 2
    shards = [qw.shard(dim, r, world_size) for r in range(world_size)]
    assert torch.equal(torch.cat([s.dequantize(torch.float64) for s in shards], dim=dim), full)
    if dim == 1:
        assert all(s.k_perm is not None and sorted(s.k_perm.tolist()) == list(range(K // 3)) for s in shards)
        x = torch.randn(3, K, dtype=torch.float64)
        total = sum(reference_gemm(x[:, r * 256:(r + 1) * 256], s) for r, s in enumerate(shards))
        torch.testing.assert_close(total, reference_gemm(x, qw), rtol=1e-12, atol=1e-12)


def test_act_order_row_split_that_cuts_a_group_is_refused():
    qw = quantize("int4-g128")
    torch.manual_seed(5)
    qw.k_perm = torch.randperm(K).to(torch.int32)
    with pytest.raises(ValueError, match=r"stored group \d+ \(stored columns \d+\.\.\d+\) of this act-order weight "
                                         r"holds input channels of shards 0 to 1"):
        qw.shard(1, 0, 2)
    with pytest.raises(ValueError, match=r"splitting N = 512 into shards of 64 would cut a group: shard boundaries "
                                         r"must be multiples of the block side 128 along N \(64 is not\)"):
        quantize("fp8-block128").shard(0, 0, 8)
    channel = quantize("int8-channel")  # no groups: any permutation splits
    channel.k_perm = qw.k_perm
    shards = [channel.shard(1, r, 2) for r in range(2)]
    assert torch.equal(torch.cat([s.dequantize(torch.float64) for s in shards], dim=1),
                       channel.dequantize(torch.float64))


def test_moe_weight_shards():
    torch.manual_seed(2)
    qw = QuantScheme("int4", group_size=128).quantize(torch.randn(3, 256, 512) * 0.05)
    for dim in (0, 1):
        shards = [qw.shard(dim, r, 2) for r in range(2)]
        assert torch.equal(torch.cat([s.dequantize(torch.float64) for s in shards], dim=dim + 1),
                           qw.dequantize(torch.float64))


def test_bad_arguments_are_refused():
    qw = quantize("int4-g128")
    with pytest.raises(ValueError, match=r"dim must be 0 \(split N, column-parallel\) or 1 .*got 2"):
        qw.shard(2, 0, 2)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 1\] for world_size 2, got 2"):
        qw.shard(0, 2, 2)
    with pytest.raises(ValueError, match=r"world_size must be >= 1, got 0"):
        qw.shard(0, 0, 0)
    with pytest.raises(TypeError, match=r"rank must be an int, got 1.0"):
        qw.shard(0, 1.0, 2)
    with pytest.raises(ValueError, match=r"splitting K = 768 into shards of 192 would cut a group: shard boundaries "
                                         r"must be multiples of the group_size 128 \(192 is not\)"):
        qw.shard(1, 0, 4)
    with pytest.raises(ValueError, match=r"splitting N = 512 into shards of 64 would cut a group: shard boundaries "
                                         r"must be multiples of the block side 128 along N \(64 is not\)"):
        quantize("fp8-block128").shard(0, 0, 8)

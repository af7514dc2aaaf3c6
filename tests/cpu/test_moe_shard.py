"""Tensor-parallel MoE shards on the CPU: the ranks' float64 MoE outputs (reference_fused_moe on each shard's
dequantized weights) sum to the unsharded layer's output, for every gate/up layout and scale granularity; splits
that cut a group or block are refused."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.layer.moe_shard import shard_moe
from humming_gen.reference.moe import reference_fused_moe

SCHEMES = {
    "int4-g64": hg.QuantScheme("int4", group_size=64),
    "uint4-g32-zp": hg.QuantScheme("uint4", group_size=32, zero_point="int"),
    "int8-channel": hg.QuantScheme("int8"),
    "fp8-block64": hg.QuantScheme("float8e4m3", block_size=(64, 64), scale_dtype="float32"),
}


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("layout, activation", [("split", "silu_mul"), ("up_first", "gelu_mul"),
                                                ("interleaved", "swiglu_oai")])
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_rank_outputs_sum_to_the_layer(scheme: str, layout: str, activation: str, world_size: int) -> None:
    torch.manual_seed(world_size)
    e, h, i, m, top_k = 4, 128, 256, 9, 2
    s = SCHEMES[scheme]
    q13, q2 = s.quantize(torch.randn(e, 2 * i, h) * 0.1), s.quantize(torch.randn(e, h, i) * 0.1)
    b13, b2 = torch.randn(e, 2 * i), torch.randn(e, h)
    x = torch.randn(m, h, dtype=torch.float64)
    weights, ids = torch.rand(m, top_k, dtype=torch.float64), torch.randint(0, e, (m, top_k))
    full = reference_fused_moe(x, q13.dequantize(), q2.dequantize(), weights, ids, activation=activation,
                               gate_up_layout=layout, bias13=b13, bias2=b2)
    total = torch.zeros_like(full)
    for rank in range(world_size):
        shard = shard_moe(q13, q2, rank, world_size, gate_up_layout=layout, bias13=b13, bias2=b2)
        assert shard.q13.n == 2 * i // world_size and shard.q2.k == i // world_size
        assert (shard.bias2 is None) == (rank > 0)
        total += reference_fused_moe(x, shard.q13.dequantize(), shard.q2.dequantize(), weights, ids,
                                     activation=activation, gate_up_layout=layout, bias13=shard.bias13,
                                     bias2=shard.bias2)
    torch.testing.assert_close(total, full, rtol=1e-10, atol=1e-10)


def test_refusals() -> None:
    s = hg.QuantScheme("int4", group_size=64)
    q13, q2 = s.quantize(torch.randn(2, 2 * 96, 64)), s.quantize(torch.randn(2, 64, 96))
    with pytest.raises(ValueError, match="group"):  # 96 / 2 = 48 input channels of w2 per rank cut a 64-group
        shard_moe(q13, q2, 0, 2)
    with pytest.raises(ValueError, match="does not split into 5"):
        shard_moe(q13, q2, 0, 5)
    with pytest.raises(ValueError, match="gate_up_layout='fused'"):
        shard_moe(q13, q2, 0, 2, gate_up_layout="fused")

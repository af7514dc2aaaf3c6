"""Tensor-parallel shards on one GPU: QuantLinear of each shard of QuantizedWeight.shard, outputs concatenated
(column-parallel) or summed (row-parallel), against the float64 reference and the unsharded layer.

Inputs are fresh random values, outputs poisoned (NaN) before each launch. Row-parallel shards write float32 and
are summed in float32 (as an all-reduce would), so only the shards' own rounding enters.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm

pytestmark = pytest.mark.gpu

N, K = 1024, 1536
TOLERANCE = 1.2e-2  # relative Frobenius error of bf16 outputs (tests/gpu/test_linear.py)
SCHEMES = {
    "int4-g128": dict(weight="int4", group_size=128),
    "uint4-g64-zp": dict(weight="uint4", group_size=64, zero_point="int"),
    "fp8-block128": dict(weight="float8e4m3", block_size=(128, 128), scale_dtype="float32"),
    "nvfp4-global": dict(weight="float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True),
    "int8-channel": dict(weight="int8"),
}
CASES = [(name, dim, ws, False) for name in SCHEMES for dim in (0, 1) for ws in (2, 4)]
CASES += [("uint4-g64-zp", dim, 2, True) for dim in (0, 1)]  # act-order, groups local to a shard


def act_order(k: int, world_size: int, side: int) -> torch.Tensor:
    part = k // world_size
    groups = [g for r in range(world_size) for g in (r * part + torch.randperm(part)).split(side)]
    return torch.cat([groups[i] for i in torch.randperm(len(groups))]).to(torch.int32)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def poisoned(m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((m, n), float("nan"), dtype=dtype, device="cuda")


@pytest.mark.parametrize("case", CASES, ids=[f"{n}-dim{d}-tp{w}{'-act-order' if a else ''}" for n, d, w, a in CASES])
def test_shards_match_unsharded_layer(case):
    name, dim, world_size, with_perm = case
    torch.manual_seed(world_size * 10 + dim)
    qw = hg.QuantScheme(**SCHEMES[name]).quantize(torch.randn(N, K, device="cuda") * 0.05)
    if with_perm:
        qw.k_perm = act_order(K, world_size, 64).cuda()
    full = hg.QuantLinear.from_quantized(qw)
    shards = [qw.shard(dim, r, world_size) for r in range(world_size)]
    out_dtype = torch.bfloat16 if dim == 0 else torch.float32
    layers = [hg.QuantLinear.from_quantized(s, out_dtype=out_dtype) for s in shards]
    for m in (1, 40, 300):
        x = torch.randn(m, K, device="cuda").bfloat16()
        ref = reference_gemm(x.double(), qw)
        y_full = full(x, out=poisoned(m, N, torch.bfloat16))
        if dim == 0:
            parts = [layer(x, out=poisoned(m, N // world_size, out_dtype)) for layer in layers]
            y = torch.cat(parts, dim=1)
        else:
            part = K // world_size
            parts = [layer(x[:, r * part:(r + 1) * part], out=poisoned(m, N, out_dtype))
                     for r, layer in enumerate(layers)]
            y = torch.stack(parts).sum(0)
        assert torch.isfinite(y).all(), f"m={m}: poison left in a shard's output"
        assert rel_err(y, ref) < TOLERANCE, f"m={m}: shards vs float64 reference {rel_err(y, ref):.3g}"
        assert rel_err(y_full, ref) < TOLERANCE
        assert rel_err(y, y_full.double()) < TOLERANCE, f"m={m}: shards vs the unsharded layer"

"""The MoE top-k reduction (humming_gen.moe.reduce): rendering (header with the full config, deterministic, only the
chosen branch), config and argument errors, NVRTC compilation for the targets, and its reference
(humming_gen.reference.moe.topk_sum_reference), which defines the kernel's bits (GPU test: tests/gpu/
test_moe_topk_reduce_gpu.py): the summation order of torch.sum's CUDA kernel over the slots, skipped slots left out
without a changed bit, their rows never read."""

from __future__ import annotations

import json

import pytest
import torch

from humming_gen.moe.reduce import (DTYPES, ReduceConfig, generate, param_fields, params_struct, topk_reduce,
                                    weighted_topk_reduce)
from humming_gen.reference.moe import moe_align_reference, topk_sum_reference, weighted_topk_sum_reference
from humming_gen.runtime.compile import compile_source
from humming_gen.targets import get_target

ARCHS = ["sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a"]


def _code(src: str) -> str:
    """The generated code without comment lines."""
    body = src.split("namespace hg {", 1)[1]
    return "\n".join(line.split("//", 1)[0] for line in body.splitlines())


def test_header_holds_the_full_config():
    cfg = ReduceConfig("bfloat16", get_target("sm_90a"))
    src = generate(cfg)
    line = next(l for l in src.splitlines() if l.startswith("//   moe_topk_reduce "))
    assert json.loads(line.split("moe_topk_reduce ", 1)[1]) == cfg.to_dict()
    assert cfg.kernel_name in src and "accumulators=4 pdl=yes" in src
    assert generate(cfg) == src  # deterministic


@pytest.mark.parametrize("dtype, arch, absent, present", [
    ("bfloat16", "sm_80", ["griddepcontrol", "cvt.rn.f16.f32", "atom", "red."],
     ["cvt.rn.bf16.f32", "add.rn.f32", "inverse[j] >= 0", "kAccumulators = 4"]),
    ("float16", "sm_90a", ["cvt.rn.bf16.f32", "atom", "red."], ["griddepcontrol.wait", "cvt.rn.f16.f32"]),
])
def test_source_has_only_its_branch(dtype, arch, absent, present):
    src = generate(ReduceConfig(dtype, get_target(arch)))
    code = _code(src)
    for word in absent:
        assert word not in code, word
    for word in present:
        assert word in src, word


@pytest.mark.parametrize("kwargs, message", [
    ({"dtype": "float32"}, "ReduceConfig.dtype: got 'float32'"),
    ({"dtype": "bfloat16", "target": get_target("sm_75")}, "mma_bf16"),
])
def test_config_errors_name_the_field(kwargs, message):
    args = {"target": get_target("sm_80")} | kwargs
    with pytest.raises(ValueError) as info:
        ReduceConfig(**args)
    assert message in str(info.value)


def test_params_struct_matches_the_field_order():
    cfg = ReduceConfig("float16", get_target("sm_90a"))
    assert [f[0] for f in param_fields(cfg)] == ["y", "inverse", "out", "ldy", "ldo", "top_k", "vectors"]
    assert params_struct(cfg).size == 5 * 8 + 2 * 4


@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_compiles_without_spills(arch):
    from helpers import assert_no_spills

    for dtype in DTYPES:
        cfg = ReduceConfig(dtype, get_target(arch))
        compiled = compile_source(generate(cfg), cfg.kernel_name, arch)
        assert compiled.cubin, cfg.kernel_name
        assert_no_spills(compiled, cfg.kernel_name)


# --- the reference: the order of the bits ------------------------------------------------------------------------
def _torch_cuda_sum(y: torch.Tensor, top_k: int) -> torch.Tensor:
    """torch.sum(y.view(M, top_k, H), dim=1, dtype=torch.float32) as its CUDA kernel orders it (Reduce.cuh,
    thread_reduce with vt0 = 4: four accumulators fed in strides of 4, then combined in order), written out
    independently of topk_sum_reference."""
    m, h = y.shape[0] // top_k, y.shape[1]
    rows = y.view(m, top_k, h).float()
    acc = torch.zeros(4, m, h)
    for start in range(0, top_k, 4):
        for i in range(min(4, top_k - start)):
            acc[i] = acc[i] + rows[:, start + i]
    return ((acc[0] + acc[1]) + acc[2]) + acc[3]


def test_order_is_torch_cuda_sums_not_plain_slot_order():
    """Values whose fp32 sum depends on the order: 2^24 + 1 + 1 ... (slot order drops every 1; torch's interleaved
    accumulators keep the ones that meet in one accumulator first)."""
    top_k = 8
    big, one = 2.0 ** 24, 1.0
    y = torch.tensor([[big], [one], [one], [one], [-big], [one], [one], [one]], dtype=torch.float32)
    y = y.expand(8, 8).contiguous().to(torch.bfloat16)  # bf16 holds 2^24 and 1 exactly
    inverse = torch.zeros(8, dtype=torch.int32)
    got = topk_sum_reference(y, inverse, top_k, torch.bfloat16)
    slot_order = torch.zeros(1, 8)
    for j in range(top_k):
        slot_order = slot_order + y[j].float()
    want = _torch_cuda_sum(y, top_k).to(torch.bfloat16)
    assert torch.equal(got, want)
    assert not torch.equal(got, slot_order.to(torch.bfloat16))  # the case tells the two orders apart
    # acc0 = 2^24 - 2^24 = 0, acc1..3 = 2 each: 6; in slot order 2^24 + 1 + 1 + 1 rounds to 2^24, then - 2^24 + 3
    assert got.float().unique().tolist() == [6.0] and slot_order.unique().tolist() == [3.0]


@pytest.mark.parametrize("top_k", [1, 2, 3, 4, 5, 8, 9, 13])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_is_the_torch_path_on_zeroed_rows(top_k, dtype):
    """Random rows spanning many binades (so the order matters), some slots skipped: the reference, which leaves
    skipped rows out unread (they hold NaN here), gives the bits of the old torch path, which summed zeros there."""
    g = torch.Generator().manual_seed(top_k)
    m, h, experts = 64, 48, 6
    ids = torch.randint(-1, experts, (m, top_k), generator=g, dtype=torch.int32)
    routing = moe_align_reference(ids, experts, 16)
    y = (torch.randn(m * top_k, h, generator=g) * torch.exp2(torch.randint(-12, 12, (m * top_k, h), generator=g))
         ).to(dtype)
    skipped = routing.inverse < 0
    assert skipped.any() and not skipped.all()
    zeroed = torch.where(skipped[:, None], torch.zeros((), dtype=dtype), y)
    garbage = torch.where(skipped[:, None], torch.full((), float("nan"), dtype=dtype), y)
    want = _torch_cuda_sum(zeroed, top_k).to(dtype)
    got = topk_sum_reference(garbage, routing.inverse, top_k, dtype)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    if top_k <= 4:  # plain slot order there
        plain = torch.zeros(m, h)
        for j in range(top_k):
            plain = plain + zeroed.view(m, top_k, h)[:, j].float()
        assert torch.equal(got.view(torch.int16), plain.to(dtype).view(torch.int16))


def test_negative_zero_and_all_skipped_tokens():
    """A sum of -0.0 rows is +0.0 (accumulators start at +0.0, torch's identity); a token whose slots are all
    skipped gives a +0.0 row."""
    y = torch.full((4, 8), -0.0, dtype=torch.bfloat16)
    inverse = torch.tensor([0, 1, -1, -1], dtype=torch.int32)
    got = topk_sum_reference(y, inverse, 2, torch.bfloat16)
    assert got.view(torch.int16).eq(0).all()


def test_topk_reduce_on_cpu_is_the_reference_and_fills_out():
    g = torch.Generator().manual_seed(1)
    y = torch.randn(12, 16, generator=g).bfloat16()
    inverse = torch.tensor([3, -1, 0, 5, 1, -1, 2, 4, -1, -1, 6, 7], dtype=torch.int32)
    want = topk_sum_reference(y, inverse, 3, torch.bfloat16)
    assert torch.equal(topk_reduce(y, inverse, 3), want)
    out = torch.full((8, 32), float("nan"), dtype=torch.bfloat16)[:4, ::2]  # strided columns too
    assert topk_reduce(y, inverse, 3, out) is out and torch.equal(out, want)


@pytest.mark.parametrize("kwargs, message", [
    ({"y": torch.zeros(12, 16)}, "bfloat16 / float16"),
    ({"top_k": 5}, "top_k = 5 must be an int >= 0 dividing y's 12 rows"),
    ({"inverse": torch.zeros(12, dtype=torch.int64)}, "inverse must be a contiguous int32 tensor of 12 entries"),
    ({"out": torch.zeros(4, 16, dtype=torch.float16)}, "out must be (4, 16) torch.bfloat16"),
])
def test_topk_reduce_errors_name_the_argument(kwargs, message):
    args = {"y": torch.zeros(12, 16, dtype=torch.bfloat16), "inverse": torch.zeros(12, dtype=torch.int32),
            "top_k": 3} | kwargs
    with pytest.raises(ValueError) as info:
        topk_reduce(**args)
    assert message in str(info.value)


# --- the weighted variant (the grouped down GEMM's rows in expert order) ------------------------------------------
def test_weighted_source_has_only_its_branch():
    plain, weighted = (_code(generate(ReduceConfig("bfloat16", get_target("sm_90a"), w))) for w in (False, True))
    assert "mul.rn.f32" in weighted and "add_weighted_vector" in weighted and "inverse" not in weighted
    assert "mul.rn.f32" not in plain and "add_weighted_vector" not in plain and "add_vector(" in plain
    assert "add_vector(" not in weighted
    cfg = ReduceConfig("float16", get_target("sm_90a"), True)
    assert [f[0] for f in param_fields(cfg)] == ["y", "rows", "weights", "out", "ldy", "ldo", "top_k", "vectors"]
    assert params_struct(cfg).size == 6 * 8 + 2 * 4
    # the unweighted kernel keeps its config (and so its cache key and name)
    assert ReduceConfig("float16", get_target("sm_90a")).to_dict() == {"dtype": "float16", "target": "sm_90a"}
    assert "weighted" in cfg.kernel_name and cfg.kernel_name != ReduceConfig("float16", get_target("sm_90a")).kernel_name


@pytest.mark.parametrize("arch", ARCHS)
def test_every_weighted_kernel_compiles_without_spills(arch):
    from helpers import assert_no_spills

    for dtype in DTYPES:
        cfg = ReduceConfig(dtype, get_target(arch), weighted=True)
        compiled = compile_source(generate(cfg), cfg.kernel_name, arch)
        assert_no_spills(compiled, cfg.kernel_name)


@pytest.mark.parametrize("top_k", [1, 3, 4, 8, 9])
def test_weighted_reference_is_the_rounded_products_in_torch_order(top_k):
    """Written out independently: each kept slot's fp32 product weight * row, rounded, then _torch_cuda_sum's order;
    skipped slots (rows -1) point at NaN rows that must not be read."""
    g = torch.Generator().manual_seed(top_k)
    m, h = 40, 24
    y = (torch.randn(m * top_k + 3, h, generator=g) * torch.exp2(torch.randint(-12, 12, (1, h), generator=g))
         ).bfloat16()
    rows = torch.randperm(m * top_k + 3, generator=g)[:m * top_k].int()
    weights = torch.rand(m * top_k, generator=g)
    skipped = torch.rand(m * top_k, generator=g) < 0.2
    y[rows[skipped].long()] = float("nan")
    rows = torch.where(skipped, torch.full_like(rows, -1), rows)
    products = torch.zeros(m * top_k, h)
    for i in range(m * top_k):
        if rows[i] >= 0:
            products[i] = weights[i] * y[rows[i]].float()
    want = _torch_cuda_sum(products, top_k).to(torch.bfloat16)
    got = weighted_topk_sum_reference(y, rows, weights, top_k, torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    # the public function's argument handling (output dtype and shape) on CPU tensors, which take the reference
    assert torch.equal(weighted_topk_reduce(y, rows, weights, top_k), got)


@pytest.mark.parametrize("kwargs, message", [
    ({"rows": torch.zeros(12, dtype=torch.int64)}, "rows must be a contiguous int32 tensor of 12 entries"),
    ({"weights": torch.zeros(12, dtype=torch.float16)}, "weights must be a contiguous float32 tensor of 12 entries"),
    ({"weights": torch.zeros(11)}, "weights must be a contiguous float32 tensor of 12 entries"),
    ({"top_k": 5}, "top_k = 5 must be an int >= 0 dividing the 12 entries of rows"),
    ({"y": torch.zeros(30, 16)}, "bfloat16 / float16"),
    ({"out": torch.zeros(4, 16)}, "out must be (4, 16) torch.bfloat16"),
])
def test_weighted_reduce_errors_name_the_argument(kwargs, message):
    args = {"y": torch.zeros(30, 16, dtype=torch.bfloat16), "rows": torch.zeros(12, dtype=torch.int32),
            "weights": torch.zeros(12), "top_k": 3} | kwargs
    with pytest.raises(ValueError) as info:
        weighted_topk_reduce(**args)
    assert message in str(info.value)

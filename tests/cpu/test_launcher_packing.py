"""What Launcher packs into a kernel's Params on each launch path (dense, indexed MoE, grouped MoE), with the
runtime's launch replaced by a recorder: every field of the argument spec holds the pointer, int or bound tensor
it names, and the grid is the plan's."""

from __future__ import annotations

import struct

import attrs
import pytest
import torch

import humming_gen as hg
import humming_gen.runtime as runtime
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build_many
from humming_gen.layer.moe import prepare_moe_weight
from humming_gen.layer.weights import prepare_weight
from humming_gen.targets import get_target

TARGET = get_target("sm_90a")


@pytest.fixture
def launches(monkeypatch):
    calls = []
    monkeypatch.setattr(runtime, "launch", lambda fn, grid, block, smem, params, **kw: calls.append((grid, params)))
    return calls


def _fields(kernel, params: bytes) -> dict[str, int]:
    fmt = "<" + "".join({"const void*": "Q", "void*": "Q", "int": "i", "TensorMap": "128s"}[a.ctype]
                        for a in kernel.plan.args)
    return dict(zip((a.name for a in kernel.plan.args), struct.unpack_from(fmt, params)))


def _launcher(layer, compute, m, moe=False, bias=None, pipeline="standard"):
    tuning = choose_tunings(layer, TARGET, pipeline=pipeline).for_m(m)
    plan = compose(layer, compute, attrs.evolve(tuning, split_k=1) if moe else tuning, TARGET)
    kernel = build_many([plan])[0]
    q = layer.scheme.quantize(torch.randn(*((layer.num_experts,) if moe else ()), layer.n, layer.k) * 0.05)
    weight = (prepare_moe_weight if moe else prepare_weight)(plan, q, "cpu")
    launcher = kernel.bind(weight, bias, torch.device("cpu"), None)
    launcher._fn = object()  # loaded: nothing to load on the CPU
    return kernel, launcher, weight


def test_dense_launch_packs_pointers_strides_and_bound_tensors(launches):
    layer = LayerConfig(n=256, k=512, scheme="w4a16-int4-g128-zp", has_bias=True)
    bias = torch.randn(256).bfloat16()
    kernel, launcher, weight = _launcher(layer, ComputeConfig(), 5, bias=bias)
    a, out = torch.randn(5, 520).bfloat16()[:, :512], torch.empty(5, 256).bfloat16()
    launcher(a, out)
    grid, params = launches[-1]
    f = _fields(kernel, params)
    assert grid == kernel.plan.grid(5)
    assert (f["a"], f["c"], f["m"], f["lda"], f["ldc"]) == (a.data_ptr(), out.data_ptr(), 5, 520, 256)
    assert (f["b"], f["b_scale"], f["b_zero"], f["bias"]) == (weight.b.data_ptr(), weight.b_scale.data_ptr(),
                                                               weight.b_zero.data_ptr(), bias.data_ptr())
    if "workspace" in f:
        assert f["workspace"] == launcher._scratch["workspace"].data_ptr() != 0


def test_moe_launches_pack_the_routing(launches):
    layer = LayerConfig(n=256, k=512, scheme="w4a16-int4-g128", num_experts=4)
    kernel, launcher, weight = _launcher(layer, ComputeConfig(gemm="indexed", topk_weight=True), 8, moe=True)
    routing = hg.moe_align(torch.randint(0, 4, (3, 2), dtype=torch.int32), 4, kernel.plan.tuning.block_m)
    x, out, tw = torch.randn(3, 512).bfloat16(), torch.empty(6, 256).bfloat16(), torch.rand(6)
    launcher.moe(x, out, routing, 2, tw)
    grid, params = launches[-1]
    f = _fields(kernel, params)
    assert grid == kernel.plan.grid(6)
    assert (f["a"], f["c"], f["m"], f["lda"], f["ldc"], f["top_k"]) == (x.data_ptr(), out.data_ptr(), 6, 512, 256, 2)
    assert (f["sorted_ids"], f["expert_ids"], f["num_tokens_post_pad"], f["topk_weights"]) == (
        routing.sorted_ids.data_ptr(), routing.expert_ids.data_ptr(), routing.num_tokens_post_pad.data_ptr(),
        tw.data_ptr())
    assert f["b"] == weight.b.data_ptr()
    with pytest.raises(ValueError, match="launch it with Launcher.moe"):
        launcher(x, out)

    kernel, launcher, _ = _launcher(layer, ComputeConfig(gemm="grouped_masked"), 8, moe=True)
    a, out, counts = torch.randn(4 * 10, 512).bfloat16(), torch.empty(4 * 10, 256).bfloat16(), torch.zeros(4)
    launcher.grouped(a, out, counts)
    grid, params = launches[-1]
    f = _fields(kernel, params)
    assert grid == kernel.plan.grid(40)
    assert (f["a"], f["c"], f["m"], f["expert_layout"]) == (a.data_ptr(), out.data_ptr(), 40, counts.data_ptr())


def test_tma_launch_packs_the_activation_map_first(launches, monkeypatch):
    """A dense warp-specialized kernel of 16-bit activations (a_load='tma') takes the tensor map of a as its first,
    64-byte aligned field: encoded for (address, rows, columns K, row stride, box rows = block_m) once per
    (address, rows, row stride), the struct padded to 64 bytes as C pads Params."""
    import humming_gen.runtime.tensor_map as tensor_map

    encoded = []

    def encode(address, dtype, rows, cols, row_stride, box_rows):
        encoded.append((address, dtype, rows, cols, row_stride, box_rows))
        return struct.pack("<QQQQQQ", address, rows, cols, row_stride, box_rows, len(encoded)).ljust(128, b"\0")

    monkeypatch.setattr(tensor_map, "encode_activation_map", encode)
    layer = LayerConfig(n=512, k=1024, scheme="w4a16-int4-g128")
    kernel, launcher, weight = _launcher(layer, ComputeConfig(), 300, pipeline="warp_specialized")
    assert kernel.plan.tuning.a_load == "tma" and kernel.plan.args[0].name == "a_map"
    assert kernel._struct.size % 64 == 0
    a, out = torch.randn(300, 1032).bfloat16()[:, :1024], torch.empty(300, 512).bfloat16()
    for _ in range(2):
        launcher(a, out)
    f = _fields(kernel, launches[-1][1])
    assert encoded == [(a.data_ptr(), "bfloat16", 300, 1024, 1032, kernel.plan.tuning.block_m)]  # once, then kept
    assert f["a_map"][:48] == struct.pack("<QQQQQQ", a.data_ptr(), 300, 1024, 1032, kernel.plan.tuning.block_m, 1)
    assert (f["a"], f["c"], f["m"], f["lda"], f["ldc"]) == (a.data_ptr(), out.data_ptr(), 300, 1032, 512)
    b = torch.randn(17, 1024).bfloat16()
    launcher(b, out[:17])
    assert encoded[-1] == (b.data_ptr(), "bfloat16", 17, 1024, 1024, kernel.plan.tuning.block_m)


def test_tensor_map_encoder_refuses_what_tma_cannot_address():
    from humming_gen.runtime.tensor_map import encode_activation_map

    with pytest.raises(ValueError, match="16-byte aligned address and row stride"):
        encode_activation_map(0x1008, "bfloat16", 4, 64, 64, 128)
    with pytest.raises(ValueError, match="16-byte aligned address and row stride"):
        encode_activation_map(0x1000, "bfloat16", 4, 60, 60, 128)
    with pytest.raises(ValueError, match="box_rows=300"):
        encode_activation_map(0x1000, "bfloat16", 4, 64, 64, 300)
    with pytest.raises(ValueError, match="tensor map dtype 'float32'"):
        encode_activation_map(0x1000, "float32", 4, 64, 64, 128)

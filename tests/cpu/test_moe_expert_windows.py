"""MoE GEMM1 into expert windows (ComputeConfig.output_rows="expert_windows"): the config's checks, which kernels
generate it, the generated source, compilation for sm_90a, and the launcher's argument checks. The kernels' values
are checked on the GPU (tests/gpu/test_quant_moe_grouped_down.py: bit for bit against the per-assignment GEMM1
compacted by the torch reference)."""

from __future__ import annotations

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import build_many, generate
from humming_gen.pipelines.base import ComposeError
from humming_gen.pipelines.warp_specialized.heuristics import moe_tuning_for
from humming_gen.targets import get_target

WINDOWS = "expert_windows"
TARGET = get_target("sm_90a")


def _layer(scheme: str = "w4a16-int4-g128", **kwargs) -> LayerConfig:
    return LayerConfig(n=512, k=1024, scheme=hg.scheme(scheme), num_experts=8, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"gemm": "dense"}, "needs gemm='indexed'"),
    ({"gemm": "indexed", "topk_weight": True}, "without topk_weight"),
    ({"gemm": "grouped_contiguous"}, "needs gemm='indexed'"),
    ({"gemm": "indexed", "output_rows": "windows"}, "output_rows"),
])
def test_config_refuses_what_has_no_windows(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ComputeConfig(**{"output_rows": WINDOWS, **kwargs})


def test_config_lists_the_field_only_when_set():
    plain = ComputeConfig(gemm="indexed")
    windowed = ComputeConfig(gemm="indexed", output_rows=WINDOWS)
    assert "output_rows" not in plain.to_dict() and windowed.to_dict()["output_rows"] == WINDOWS
    assert ComputeConfig.from_dict(windowed.to_dict()) == windowed
    assert "rows:expert_windows" in windowed.summary() and "rows:" not in plain.summary()


def test_only_the_warp_specialized_16_bit_kernels_write_windows():
    compute = ComputeConfig(gemm="indexed", epilogue_activation="silu_mul", output_rows=WINDOWS)
    layer = _layer()
    standard = choose_tunings(layer, TARGET, pipeline="standard").for_m(64)
    assert standard.pipeline == "standard"
    with pytest.raises(ComposeError, match="writes one row per assignment"):
        compose(layer, compute, standard, TARGET)
    a8 = _layer("w8a8-fp8-channel")
    with pytest.raises(ComposeError, match="with quantized activations writes one row per assignment"):
        compose(a8, compute, moe_tuning_for(a8, TARGET, 128), TARGET)


@pytest.mark.parametrize("activation, bias", [("silu_mul", False), ("swiglu_oai", True), (None, False)])
def test_windowed_source_and_compile(activation, bias):
    layer = _layer(has_bias=bias)
    tuning = moe_tuning_for(layer, TARGET, 128)
    windowed = ComputeConfig(gemm="indexed", epilogue_activation=activation, output_rows=WINDOWS)
    plan = compose(layer, windowed, tuning, TARGET)
    plain = compose(layer, attrs.evolve(windowed, output_rows=None), tuning, TARGET)
    assert plan.kernel_name == plain.kernel_name + "_windows"
    assert plan.layout == plain.layout, "the same packed weight as the per-assignment GEMM1"
    names = [a.name for a in plan.args]
    assert "expert_offsets" in names and "compact_offsets" in names
    assert "expert_offsets" not in [a.name for a in plain.args]
    source = generate(plan, "nvrtc")
    store = source[source.index("__device__ __forceinline__ void store_output"):]
    store = store[:store.index("\n}\n")]
    assert "sorted_ids" not in store, "the windowed store writes tile rows, no assignment lookup"
    assert "expert_window(for_expert(p, tc.expert), window)" in source
    # the window is read when the unit starts, before the main loop
    consume = source[source.index("void consume("):]
    assert consume.index("window_of(p, tc.expert)") < consume.index("wgmma_m64n")
    assert "sorted_ids" in source, "the producer still gathers the activation rows through the routing"
    kernel, = build_many([plan], compiler="nvrtc")
    assert "0 bytes spill" in kernel.compiled.log


def test_launcher_checks_the_window_offsets(monkeypatch):
    import humming_gen.layer.moe as moe_module

    monkeypatch.setattr(moe_module, "WINDOWED_GEMM1", True)
    scheme = hg.QuantScheme("int4", group_size=128)
    q13, q2 = scheme.quantize(torch.randn(4, 256, 1024) * 0.05), scheme.quantize(torch.randn(4, 1024, 128) * 0.05)
    moe = hg.QuantMoE.from_quantized(q13, q2, target="sm_90a", device="cpu", down_gemm="grouped_contiguous")
    bucket = len(moe.buckets) - 1  # the open-ended, warp-specialized bucket
    assert moe._windowed[bucket]
    routing = hg.moe_align(torch.zeros(8, 2, dtype=torch.int32), 4, moe.block_ms[bucket])
    x, out = torch.zeros(8, 1024, dtype=torch.bfloat16), torch.zeros(16, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="writes expert windows; pass window_offsets"):
        moe._window_gemm1[bucket].moe(x, out, routing, 2)
    with pytest.raises(ValueError, match="window_offsets given, but this kernel writes one row per assignment"):
        moe._launchers[bucket][0].moe(x, out, routing, 2, window_offsets=torch.zeros(5, dtype=torch.int32))

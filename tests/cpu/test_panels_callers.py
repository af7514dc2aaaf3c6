"""Callers of the dense 8-bit kernels hand each kernel its codes in the layout it reads (Kernel.activation_layout:
"panels" for TuningConfig.a_load='tma', else "rows"), checked on the CPU with the driver stubbed: autotune's timed
launches, and the launcher's refusal of codes that are not panels."""

from __future__ import annotations

import functools
import struct
import sys
import types

import attrs
import pytest
import torch

import humming_gen as hg
import humming_gen.bench.timing as timing
import humming_gen.activation.api as api
import humming_gen.kernel as kernel_mod
import humming_gen.runtime as runtime
import humming_gen.tuning.autotune as autotune_mod
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import heuristic_tunings
from humming_gen.runtime.module import LoadedKernel
from humming_gen.targets import Target, get_target
from humming_gen.tuning import store

launch_mod = sys.modules["humming_gen.runtime.launch"]
SM90 = get_target("sm_90a")


@pytest.fixture
def launches(monkeypatch):
    """The driver below runtime.launch stubbed (as tests/cpu/test_host_path.py does), quantize_activation's CUDA
    path on CPU tensors, GEMM kernels built without compiling; the list of (kernel name, grid, params) launched."""
    calls = []

    def load(compiled, smem=0):
        return LoadedKernel(compiled=compiled, function=compiled.kernel_name, device=0, dynamic_smem_bytes=smem,
                            num_regs=0, static_smem_bytes=0, max_dynamic_smem_bytes=1 << 20, local_bytes=0,
                            max_threads_per_block=1024, param_size=None)

    def spy(fn, grid, block, smem, params, **kw):
        calls.append((getattr(fn, "kernel_name", fn), grid, bytes(params)))

    monkeypatch.setattr(runtime, "launch", spy)
    monkeypatch.setattr(runtime, "load", load)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(api, "_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(api, "_target", lambda device: SM90)
    monkeypatch.setattr(api, "build", functools.lru_cache(maxsize=None)(api.build.__wrapped__))
    monkeypatch.setattr(api, "_plans", {})
    monkeypatch.setattr(kernel_mod.Launcher, "_load", lambda self: setattr(self, "_fn", self.kernel.name))
    monkeypatch.setattr(kernel_mod, "build_many", lambda plans, compiler=None: [
        kernel_mod.build(p, compile=False) for p in plans])
    return calls


class _TorchOnCpu:
    """autotune's `torch` with its CUDA device and graph calls on the CPU."""
    cuda = types.SimpleNamespace(current_device=lambda: 0, empty_cache=lambda: None)

    @staticmethod
    def device(*args, **kwargs):
        return torch.device("cpu")

    def __getattr__(self, name):
        return getattr(torch, name)


@pytest.mark.parametrize("fmt", ["w8a8-fp8-channel", "w8a8-fp8-block128"])
def test_autotune_times_each_kernel_on_codes_of_its_layout(launches, monkeypatch, fmt):
    """autotune quantizes the timing inputs once per M; a dense 8-bit layer's heuristic kernels on sm_90a read
    panels (K % 128 == 0) while a cp.async candidate reads rows: each candidate must get codes in its own layout
    (the launcher refuses the other one), with lda the panel stride m * 128 or the row stride K."""
    monkeypatch.setattr(store, "device_identity", lambda device=None: ("NVIDIA H200", "13000"))
    monkeypatch.setattr(Target, "current", staticmethod(lambda index=None: SM90))
    monkeypatch.setattr(autotune_mod, "torch", _TorchOnCpu())
    monkeypatch.setattr(timing, "cold_layer_count", lambda *args, **kwargs: 1)
    monkeypatch.setattr(timing, "graph_time_us", lambda fns, x, replays=20: [f(x) for f in fns] and 1.0)
    n = k = 256
    m = 4096
    layer = LayerConfig(n=n, k=k, scheme=hg.scheme(fmt))
    own = heuristic_tunings(layer, SM90).for_m(m)
    assert own.a_load == "tma"
    rows = attrs.evolve(own, a_load="cp_async")
    kernels = {}
    for t in (own, rows):
        kern = kernel_mod.build(compose(layer, ComputeConfig(), t, SM90), compile=False)
        kernels[kern.name] = kern
    assert [kern.activation_layout for kern in kernels.values()] == ["panels", "rows"]
    autotune_mod.autotune(layer, [m], candidates=[rows], rounds=1, replays=1, store=False, log=None)
    gemms = [(name, params) for name, _, params in launches if name in kernels]
    assert sorted(name for name, _ in gemms) == sorted(kernels), [name for name, _, _ in launches]
    for name, params in gemms:
        kern = kernels[name]
        fields = dict(zip([a.name for a in kern.plan.args], kern._struct.unpack(params)))
        assert fields["m"] == m
        assert fields["lda"] == (m * 128 if kern.activation_layout == "panels" else k), (name, fields["lda"])
        # the codes: those a quantize kernel of that layout wrote (names of panels quantize kernels hold "_p_")
        writers = [q for q, _, qp in launches if q.startswith("act_quantize")
                   and fields["a"] in struct.unpack(f"<{len(qp) // 8}Q", qp)]
        assert writers and all(("_p_" in q) == (kern.activation_layout == "panels") for q in writers), (name, writers)


def test_launcher_refuses_row_codes_of_3d_activations(launches):
    """quantize_activation of (B, S, K) activations returns row codes of shape (B, S, K): three dimensions, like
    panels, but no (K / 128, m, 128) panels; a panels kernel must refuse them rather than read S rows of garbage
    (lda B's stride). Panels of the same rows, and a view of fewer of their rows, are taken."""
    torch.manual_seed(0)
    n = k = 256
    layer = hg.QuantLinear.from_quantized(hg.scheme("w8a8-fp8-channel").quantize(torch.randn(n, k) * 0.05),
                                          target="sm_90a", device="cpu")
    _, launcher = layer._launchers[-1]
    assert launcher.kernel.activation_layout == "panels"
    x = torch.randn(2, 8, k).bfloat16()
    out = torch.empty(16, n, dtype=torch.bfloat16)
    rows = hg.quantize_activation(x, layer.activation_scheme)
    assert rows.codes.shape == (2, 8, k)
    launches.clear()
    with pytest.raises(ValueError, match="panels"):
        launcher(rows.codes, out, rows.scales)
    assert not launches
    panels = hg.quantize_activation(x.reshape(16, k), layer.activation_scheme, layout="panels")
    launches.clear()
    launcher(panels.codes, out, panels.scales)
    launcher(panels.codes[:, :5], out[:5], panels.scales[:5])  # the first 5 rows: lda stays the panel stride
    kern = launcher.kernel
    got = [dict(zip([a.name for a in kern.plan.args], kern._struct.unpack(p))) for _, _, p in launches]
    assert [(f["m"], f["lda"]) for f in got] == [(16, 16 * 128), (5, 16 * 128)]

"""What load/launch do without a GPU: clear errors, and launch-shape validation before any driver call."""

from __future__ import annotations

import struct

import pytest

from humming_gen.runtime.compile import CompiledKernel
from humming_gen.runtime.launch import launch
from humming_gen.runtime.module import LoadedKernel, driver, driver_call, load


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


no_gpu_only = pytest.mark.skipif(_has_gpu(), reason="checks the behaviour without a GPU")

COMPILED = CompiledKernel(
    kernel_name="k", arch="sm_90a", cubin=b"\x7fELF", log="", compiler="fake 1.0", options=(),
    resources={"registers": 8}, compile_seconds=0.0,
)
PARAMS = struct.pack("<Qi4x", 0x1000, 7)  # struct { float* out; int n; } with its tail padding


def fake_loaded(**overrides) -> LoadedKernel:
    """A LoadedKernel with made-up figures (its function handle is null: it is never launched for real)."""
    fields = dict(
        compiled=COMPILED, function=driver().CUfunction(0), device=0, dynamic_smem_bytes=0, num_regs=8,
        static_smem_bytes=0, max_dynamic_smem_bytes=48 * 1024, local_bytes=0, max_threads_per_block=256,
        param_size=len(PARAMS),
    )
    fields.update(overrides)
    return LoadedKernel(**fields)


@no_gpu_only
def test_load_without_gpu_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="no CUDA device"):
        load(COMPILED, 0)


def test_load_argument_checks() -> None:
    with pytest.raises(TypeError, match="CompiledKernel"):
        load(b"cubin", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dynamic_smem_bytes=-1"):
        load(COMPILED, -1)


@no_gpu_only
def test_driver_call_without_driver_names_the_call() -> None:
    with pytest.raises(RuntimeError, match="^cuInit failed"):
        driver_call("cuInit", 0)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(grid=(1, 1)), ValueError, "grid="),
        (dict(grid=(0, 1, 1)), ValueError, "grid="),
        (dict(grid=(1.0, 1, 1)), ValueError, "grid="),
        (dict(block=(512, 1, 1)), ValueError, "512 threads"),
        (dict(dynamic_smem=64 * 1024), ValueError, "load it with dynamic_smem_bytes >= 65536"),
        (dict(dynamic_smem=-4), ValueError, "dynamic_smem=-4"),
        (dict(grid=(3, 1, 1), cluster=(2, 1, 1)), ValueError, "not divisible by cluster"),
        (dict(cluster=(2, 1)), ValueError, "cluster="),
        (dict(params=PARAMS[:-4]), ValueError, "12 bytes.*16-byte struct"),
        (dict(params=12345), TypeError, "bytes-like"),
        (dict(stream="default"), TypeError, "stream must be an int"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_launch_validation(kwargs: dict, error: type, match: str) -> None:
    args = dict(grid=(2, 1, 1), block=(128, 1, 1), dynamic_smem=0, params=PARAMS, stream=0, cluster=None)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        launch(fake_loaded(), **args)


def test_launch_rejects_non_kernels() -> None:
    with pytest.raises(TypeError, match="LoadedKernel"):
        launch(COMPILED, (1, 1, 1), (32, 1, 1), 0, PARAMS, stream=0)  # type: ignore[arg-type]


@no_gpu_only
def test_launch_without_driver_raises_runtime_error() -> None:
    kernel = fake_loaded()
    for cluster in (None, (2, 1, 1)):
        with pytest.raises(RuntimeError, match="^cuLaunchKernelEx failed"):
            launch(kernel, (2, 1, 1), (128, 1, 1), 0, PARAMS, stream=0, cluster=cluster)
    with pytest.raises(RuntimeError, match="cuLaunchKernelEx failed"):
        launch(kernel, [2, 1, 1], [128, 1, 1], 1024, bytearray(PARAMS), stream=0, pdl=True)  # lists work too
    assert len(kernel._launch_configs) == 2  # built once per shape, reused after


def test_unknown_param_size_trusts_the_first_launch() -> None:
    kernel = fake_loaded(param_size=None)
    params = PARAMS + b"\0" * 8
    if not _has_gpu():
        with pytest.raises(RuntimeError, match="cuLaunchKernelEx"):
            launch(kernel, (1, 1, 1), (32, 1, 1), 0, params, stream=0)
        with pytest.raises(ValueError, match="16 bytes.*24-byte struct"):
            launch(kernel, (1, 1, 1), (32, 1, 1), 0, PARAMS, stream=0)
    with pytest.raises(ValueError, match="params is empty"):
        launch(fake_loaded(param_size=None), (1, 1, 1), (32, 1, 1), 0, b"", stream=0)


def test_params_buffer_is_per_thread() -> None:
    """Two threads launching one kernel must not share the buffer the driver reads from."""
    import threading

    kernel = fake_loaded()
    seen = []
    both_recorded = threading.Barrier(2)  # keep each thread (and its buffer) alive until both are seen

    def first_launch() -> None:
        try:
            launch(kernel, (2, 1, 1), (128, 1, 1), 0, PARAMS, stream=0)
        except RuntimeError:
            pass  # no driver here; the buffer is set up before the call
        seen.append(kernel._params_slots.slot[1])
        both_recorded.wait(timeout=10)

    threads = [threading.Thread(target=first_launch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(seen)) == 2


def test_loaded_kernel_figures() -> None:
    kernel = fake_loaded(static_smem_bytes=512, dynamic_smem_bytes=1024)
    assert (kernel.kernel_name, kernel.arch, kernel.shared_bytes) == ("k", "sm_90a", 1536)

"""Load and launch a tiny kernel through its one struct parameter; check what the driver reports."""

from __future__ import annotations

import math
import struct

import pytest

from humming_gen.runtime import compile_source, launch, load

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

SOURCE = r"""
struct Params {
  float* out;
  unsigned int n;
  float scale;
  unsigned int dyn_words;  // dynamic shared memory in 4-byte words
};

extern "C" __global__ void __launch_bounds__(128) fill(Params p) {
  extern __shared__ float dyn_smem[];
  __shared__ float lane_bias[32];
  const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (threadIdx.x < 32) lane_bias[threadIdx.x] = float(threadIdx.x);
  // Touch the top of the dynamic allocation: a launch without the requested size would fault.
  dyn_smem[p.dyn_words - 1 - threadIdx.x] = p.scale * float(i);
  __syncthreads();
  if (i < p.n) p.out[i] = dyn_smem[p.dyn_words - 1 - threadIdx.x] + lane_bias[threadIdx.x % 32];
}
"""
PARAMS_FORMAT = "<QIfI4x"  # pointer, n, scale, dyn_words, tail padding to the struct's 8-byte alignment
BLOCK = (128, 1, 1)
DYN_SMEM = 64 * 1024  # above the 48 KiB default: load() must opt in


def _device_arch() -> str | None:
    major, minor = torch.cuda.get_device_capability()
    return {
        (7, 5): "sm_75", (8, 0): "sm_80", (8, 6): "sm_86", (8, 9): "sm_89", (9, 0): "sm_90a",
        (10, 0): "sm_100a", (10, 3): "sm_103a", (12, 0): "sm_120a", (12, 1): "sm_121a",
    }.get((major, minor))


@pytest.fixture(scope="module")
def compiled():
    arch = _device_arch()
    if arch is None:
        pytest.skip(f"no target for compute capability {torch.cuda.get_device_capability()}")
    return compile_source(SOURCE, "fill", arch)


def _run(kernel, n: int, scale: float, *, grid=None, stream=None, cluster=None, pdl=False):
    out = torch.full((n,), float("nan"), device="cuda", dtype=torch.float32)  # poisoned
    params = struct.pack(PARAMS_FORMAT, out.data_ptr(), n, scale, DYN_SMEM // 4)
    grid = grid or (math.ceil(n / BLOCK[0]), 1, 1)
    launch(kernel, grid, BLOCK, DYN_SMEM, params, stream=stream, cluster=cluster, pdl=pdl)
    return out


def _expected(n: int, scale: float):
    i = torch.arange(n, device="cuda", dtype=torch.float32)
    return scale * i + (torch.arange(n, device="cuda") % 128 % 32).to(torch.float32)


def test_launch_writes_through_struct_param(compiled) -> None:
    kernel = load(compiled, DYN_SMEM)
    n = 1000
    out = _run(kernel, n, 0.5)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, _expected(n, 0.5), rtol=0, atol=0)


def test_reported_figures_match_request_and_ptxas(compiled) -> None:
    kernel = load(compiled, DYN_SMEM)
    assert kernel.dynamic_smem_bytes == DYN_SMEM
    assert kernel.max_dynamic_smem_bytes == DYN_SMEM
    assert kernel.static_smem_bytes == 128 == compiled.resources["shared_bytes"]
    assert kernel.shared_bytes == 128 + DYN_SMEM
    assert kernel.num_regs == compiled.resources["registers"]
    assert kernel.param_size == struct.calcsize(PARAMS_FORMAT) == 24
    assert kernel.max_threads_per_block >= 128
    assert kernel.device == torch.cuda.current_device()


def test_module_is_loaded_once(compiled) -> None:
    first, second = load(compiled, DYN_SMEM), load(compiled, 0)
    assert int(first.function) == int(second.function)
    assert second.max_dynamic_smem_bytes == DYN_SMEM  # the opt-in never shrinks for a shared function


def test_48_kib_of_dynamic_beside_static_shared_memory_opts_in() -> None:
    """48 KiB of dynamic shared memory beside 128 B of static arrays is above the driver's default allowance (48 KiB
    less the static bytes): load() opts in (it once skipped the opt-in up to 48 KiB, and launch refused an MoE
    kernel of exactly 48 KiB)."""
    arch = _device_arch()
    if arch is None:
        pytest.skip(f"no target for compute capability {torch.cuda.get_device_capability()}")
    dyn = 48 * 1024
    kernel = load(compile_source(SOURCE.replace("fill(", "fill_48k("), "fill_48k", arch), dyn)
    assert kernel.static_smem_bytes == 128 and kernel.max_dynamic_smem_bytes >= dyn
    n = 500
    out = torch.full((n,), float("nan"), device="cuda", dtype=torch.float32)  # poisoned
    launch(kernel, (math.ceil(n / BLOCK[0]), 1, 1), BLOCK, dyn, struct.pack(PARAMS_FORMAT, out.data_ptr(), n, 0.25,
                                                                          dyn // 4))
    torch.cuda.synchronize()
    torch.testing.assert_close(out, _expected(n, 0.25), rtol=0, atol=0)


def test_current_and_explicit_streams(compiled) -> None:
    kernel = load(compiled, DYN_SMEM)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out_current = _run(kernel, 300, 2.0)  # stream=None: torch's current stream, i.e. side
    out_explicit = _run(kernel, 300, 3.0, stream=side.cuda_stream)
    side.synchronize()
    torch.testing.assert_close(out_current, _expected(300, 2.0), rtol=0, atol=0)
    torch.testing.assert_close(out_explicit, _expected(300, 3.0), rtol=0, atol=0)


def test_cluster_and_pdl_launch(compiled) -> None:
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread block clusters and PDL need sm_90+")
    kernel = load(compiled, DYN_SMEM)
    n = 4 * BLOCK[0]
    out = _run(kernel, n, 1.5, grid=(4, 1, 1), cluster=(2, 1, 1))
    out_pdl = _run(kernel, n, 1.5, pdl=True)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, _expected(n, 1.5), rtol=0, atol=0)
    torch.testing.assert_close(out_pdl, _expected(n, 1.5), rtol=0, atol=0)


def test_errors_are_exceptions(compiled) -> None:
    with pytest.raises(ValueError, match="limit"):
        load(compiled, 1 << 20)
    kernel = load(compiled, DYN_SMEM)
    with pytest.raises(ValueError, match="24-byte struct"):
        launch(kernel, (1, 1, 1), BLOCK, DYN_SMEM, b"\0" * 16)
    with pytest.raises(ValueError, match="load it with"):
        launch(kernel, (1, 1, 1), BLOCK, DYN_SMEM + 1024, b"\0" * 24)
    with pytest.raises(RuntimeError, match="cuLaunchKernelEx"):
        launch(kernel, (1 << 31, 1, 1), BLOCK, DYN_SMEM, b"\0" * 24)  # grid.x beyond the limit


def test_wrong_arch_cubin_is_a_clear_error() -> None:
    # SASS runs only within its major version, so pick a target of another major.
    other = "sm_90a" if torch.cuda.get_device_capability()[0] == 8 else "sm_80"
    with pytest.raises(RuntimeError, match=f"compiled for {other}"):
        load(compile_source(SOURCE, "fill", other), DYN_SMEM)

"""Launch a ``LoadedKernel`` with ``cuLaunchKernelEx`` on torch's current stream.

Kernel convention: every generated kernel takes exactly one by-value struct argument, and ``params``
are that struct's bytes (packed by the caller, e.g. with ``struct.pack``; alignment and padding are
the caller's job, the size is checked against what the driver reports).

Host overhead is part of performance, so the hot path does little: the ``CUlaunchConfig`` (grid,
block, shared memory, cluster and PDL attributes, stream) is built and validated once per distinct
launch shape and kept on the kernel. Each thread gets, once per kernel, a params buffer and a
one-element ``void*`` array pointing at it; a call copies ``params`` into that buffer and passes
the array's address as an int for ``kernelParams``, which ``cuda.bindings`` takes as a ready
``void**`` without inspecting it (a tuple of values and ctypes types would be repacked per call).
"""

from __future__ import annotations

import ctypes
from typing import Any

from humming_gen.runtime.module import LoadedKernel, driver, error_string

#: Distinct launch shapes kept per kernel; past this many the cache starts over (a bound on memory).
MAX_CONFIGS_PER_KERNEL = 256

_VoidPtrArray1 = ctypes.c_void_p * 1

_launch_fn: Any = None
_success: Any = None
_stream_getter: Any = None


def _bind_driver() -> None:
    global _launch_fn, _success
    drv = driver()
    _launch_fn = drv.cuLaunchKernelEx
    _success = drv.CUresult.CUDA_SUCCESS


def current_stream() -> int:
    """Handle of torch's current stream on the current device (what ``launch`` uses by default)."""
    global _stream_getter
    if _stream_getter is None:
        try:
            import torch
        except Exception as exc:
            raise RuntimeError(f"no stream given and torch could not be imported ({exc})") from exc
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        get_device = getattr(torch._C, "_cuda_getDevice", None)
        if raw is not None and get_device is not None:
            # NOTE: the private entry points skip building a torch.cuda.Stream object per launch.
            _stream_getter = lambda: raw(get_device())  # noqa: E731
        else:
            _stream_getter = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    try:
        return _stream_getter()
    except Exception as exc:  # e.g. a CPU-only torch build
        raise RuntimeError(f"could not get torch's current CUDA stream: {type(exc).__name__}: {exc}") from exc


def _dims(name: str, value: Any) -> tuple[int, int, int]:
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        raise ValueError(f"{name}={value!r} must be a tuple of three ints >= 1")
    return (value[0], value[1], value[2])


def _make_config(
    kernel: LoadedKernel,
    grid: Any,
    block: Any,
    dynamic_smem: Any,
    cluster: Any,
    pdl: bool,
    stream: int,
) -> Any:
    """Validate one launch shape and build its CUlaunchConfig (once; launch() reuses it)."""
    if not isinstance(kernel, LoadedKernel):
        raise TypeError(f"kernel must be a LoadedKernel (from load()), got {type(kernel).__name__}")
    grid = _dims("grid", grid)
    block = _dims("block", block)
    threads = block[0] * block[1] * block[2]
    if threads > kernel.max_threads_per_block:
        raise ValueError(
            f"block={block} has {threads} threads; kernel {kernel.kernel_name!r} allows at most "
            f"{kernel.max_threads_per_block} (registers / __launch_bounds__)"
        )
    if not isinstance(dynamic_smem, int) or isinstance(dynamic_smem, bool) or dynamic_smem < 0:
        raise ValueError(f"dynamic_smem={dynamic_smem!r} must be an int >= 0")
    if dynamic_smem > kernel.max_dynamic_smem_bytes:
        raise ValueError(
            f"dynamic_smem={dynamic_smem} B is above the {kernel.max_dynamic_smem_bytes} B kernel "
            f"{kernel.kernel_name!r} was loaded for; load it with dynamic_smem_bytes >= {dynamic_smem}"
        )
    if not isinstance(stream, int):
        raise TypeError(f"stream must be an int handle (torch.cuda.Stream.cuda_stream), got {type(stream).__name__}")

    drv = driver()
    attrs = []
    if cluster is not None:
        cluster = _dims("cluster", cluster)
        if any(g % c for g, c in zip(grid, cluster)):
            raise ValueError(f"grid={grid} is not divisible by cluster={cluster}")
        if cluster[0] * cluster[1] * cluster[2] > 8:  # beyond the portable cluster size
            from humming_gen.runtime.module import driver_call

            driver_call(
                "cuFuncSetAttribute", kernel.function,
                drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1,
            )
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
        attrs.append(attr)
    if pdl:
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)

    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = dynamic_smem
    config.hStream = drv.CUstream(stream)
    if attrs:
        config.attrs = attrs
        config.numAttrs = len(attrs)
    return config, attrs  # attrs kept alive beside the config that points at them


def _params_error(kernel: LoadedKernel, params: Any, expected: int | None) -> Exception:
    try:
        size = len(params)
    except TypeError:
        return TypeError(f"params must be bytes-like (struct.pack output), got {type(params).__name__}")
    if size == 0:
        return ValueError(f"params is empty; kernel {kernel.kernel_name!r} takes one by-value struct")
    return ValueError(
        f"params is {size} bytes but kernel {kernel.kernel_name!r} takes a {expected}-byte "
        "struct (check the struct.pack format, padding included)"
    )


def _params_slot(kernel: LoadedKernel, params: Any) -> tuple[bytearray, int]:
    """This thread's params buffer for ``kernel`` and the address of the void*[1] that points at it.

    Where the driver cannot report the parameter size, the first launch's size is taken.
    """
    size = kernel.param_size
    if size is None:
        try:
            size = len(params)
        except TypeError:
            raise _params_error(kernel, params, None) from None
    if size <= 0:
        raise _params_error(kernel, params, size)
    buf = bytearray(size)
    view = (ctypes.c_char * size).from_buffer(buf)  # pins buf: it can no longer be resized
    argv = _VoidPtrArray1(ctypes.addressof(view))
    kernel._params_slots.slot = (buf, ctypes.addressof(argv))
    kernel._params_slots.keep_alive = (view, argv)
    return buf, ctypes.addressof(argv)


def max_active_clusters(kernel: LoadedKernel, block: tuple[int, int, int], dynamic_smem: int,
                        cluster: tuple[int, int, int]) -> int:
    """How many clusters of `cluster` CTAs the device holds at once (a persistent grid of clusters walks its units
    in one wave only if every cluster is resident: CTAs of a cluster share a GPC, which may leave SMs idle)."""
    from humming_gen.runtime.module import driver_call

    size = cluster[0] * cluster[1] * cluster[2]
    config, _attrs = _make_config(kernel, (size, 1, 1), block, dynamic_smem, cluster, False, 0)
    return int(driver_call("cuOccupancyMaxActiveClusters", kernel.function, config))


def launch(
    kernel: LoadedKernel,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    dynamic_smem: int,
    params: bytes,
    stream: int | None = None,
    cluster: tuple[int, int, int] | None = None,
    *,
    pdl: bool = False,
) -> None:
    """Launch ``kernel`` with its one struct argument given as ``params`` bytes.

    Args:
        grid, block: launch dimensions (3-tuples of ints).
        dynamic_smem: dynamic shared memory in bytes (at most what ``load`` allowed).
        params: the bytes of the kernel's struct parameter.
        stream: CUstream handle as an int; default torch's current stream.
        cluster: thread block cluster dimensions (sm_90+), dividing ``grid``.
        pdl: allow programmatic dependent launch (overlap with the previous kernel in the stream).

    Raises:
        ValueError / TypeError: bad launch shape or params size (checked once per shape).
        RuntimeError: the launch failed (names cuLaunchKernelEx and the CUDA error).
    """
    if stream is None:
        stream = current_stream()
    key = (grid, block, dynamic_smem, cluster, pdl, stream)
    try:
        config, _ = kernel._launch_configs[key]
    except (KeyError, TypeError, AttributeError):  # new shape, or unhashable / wrong-type arguments
        entry = _make_config(kernel, grid, block, dynamic_smem, cluster, pdl, stream)
        configs = kernel._launch_configs
        if len(configs) >= MAX_CONFIGS_PER_KERNEL:
            configs.clear()
        try:
            configs[key] = entry
        except TypeError:  # lists instead of tuples: valid, just not cacheable
            pass
        config = entry[0]

    try:
        buf, argv_addr = kernel._params_slots.slot
    except AttributeError:  # this thread's first launch of this kernel
        buf, argv_addr = _params_slot(kernel, params)
    try:
        # Same-size copy into this thread's buffer. The driver copies kernel parameters during
        # the launch call, so the buffer is free again when the call returns.
        buf[:] = params
    except (TypeError, ValueError, BufferError):
        raise _params_error(kernel, params, len(buf)) from None
    if _launch_fn is None:
        _bind_driver()
    try:
        (result,) = _launch_fn(config, kernel.function, argv_addr, 0)
    except Exception as exc:
        raise RuntimeError(f"cuLaunchKernelEx failed: {type(exc).__name__}: {exc}") from exc
    if result != _success:
        raise RuntimeError(
            f"cuLaunchKernelEx failed: {error_string(result)} (kernel {kernel.kernel_name!r}, grid={grid}, "
            f"block={block}, dynamic_smem={dynamic_smem}, cluster={cluster}, stream={stream:#x})"
        )

"""Cubin -> ``LoadedKernel``: load a compiled kernel into the CUDA context torch uses.

``cuda.bindings.driver`` and torch are imported on first use, never at import time: on a machine
without a driver (CI) everything up to compilation must work, and importing the runtime must not
touch the driver. Loaded modules are cached per (cubin sha256, device) for the life of the process.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs

from humming_gen.runtime.compile import CompiledKernel

_driver_module: Any = None
_driver_initialised = False
_state_lock = threading.RLock()
_modules: dict[tuple[str, int], Any] = {}  # (cubin sha256, device) -> CUmodule
_functions: dict[tuple[str, int, str], Any] = {}  # (cubin sha256, device, name) -> CUfunction
_primary_contexts: dict[int, Any] = {}  # device -> retained primary CUcontext


def driver() -> Any:
    """``cuda.bindings.driver``, imported on first use (so importing the runtime never needs a driver)."""
    global _driver_module
    if _driver_module is None:
        try:
            from cuda.bindings import driver as drv
        except Exception as exc:
            raise RuntimeError(f"cuda.bindings.driver could not be imported ({exc}); install cuda-python") from exc
        _driver_module = drv
    return _driver_module


def error_string(result: Any) -> str:
    """``CUDA_ERROR_NAME (description)`` for a CUresult, without raising if the lookup itself fails."""
    drv = driver()
    try:
        _, name = drv.cuGetErrorName(result)
        _, text = drv.cuGetErrorString(result)
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = text.decode() if isinstance(text, bytes) else str(text)
        return f"{name} ({text})"
    except Exception:
        return str(result)


def driver_call(name: str, *args: Any) -> Any:
    """Call ``cuda.bindings.driver.<name>`` and check its CUresult.

    Returns the call's outputs (None, one value, or a tuple). Raises ``RuntimeError`` naming the call
    and the error, also when the binding itself raises (no driver library, wrong argument type).
    """
    drv = driver()
    try:
        out = getattr(drv, name)(*args)
    except Exception as exc:
        raise RuntimeError(f"{name} failed: {type(exc).__name__}: {exc}") from exc
    result = out[0]
    if result != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{name} failed: {error_string(result)}")
    if len(out) == 1:
        return None
    return out[1] if len(out) == 2 else out[1:]


def _ensure_driver() -> None:
    global _driver_initialised
    if not _driver_initialised:
        driver_call("cuInit", 0)
        _driver_initialised = True


def _ensure_context() -> int:
    """Make torch's context for its current device current on this thread; return the device index."""
    try:
        import torch
    except Exception as exc:
        raise RuntimeError(f"torch could not be imported ({exc}); loading kernels needs torch with CUDA") from exc
    if not torch.cuda.is_available():
        raise RuntimeError(
            "no CUDA device: torch.cuda.is_available() is False. Compiling works without a GPU; "
            "loading and launching kernels need one"
        )
    device = torch.cuda.current_device()  # also makes torch initialise CUDA
    _ensure_driver()
    ctx = driver_call("cuCtxGetCurrent")
    if int(ctx) != 0 and int(driver_call("cuCtxGetDevice")) == device:
        return device
    # torch has not made a context current on this thread yet: use the device's primary context,
    # which is the one torch's runtime calls use, so tensors and kernels share one context.
    with _state_lock:
        primary = _primary_contexts.get(device)
        if primary is None:
            primary = driver_call("cuDevicePrimaryCtxRetain", driver_call("cuDeviceGet", device))
            _primary_contexts[device] = primary
    driver_call("cuCtxSetCurrent", primary)
    return device


def _device_arch(device: int) -> str:
    drv = driver()
    dev = driver_call("cuDeviceGet", device)
    major = driver_call("cuDeviceGetAttribute", drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    minor = driver_call("cuDeviceGetAttribute", drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return f"sm_{major}{minor}"


def _func_attribute(function: Any, name: str) -> int:
    drv = driver()
    return int(driver_call("cuFuncGetAttribute", getattr(drv.CUfunction_attribute, name), function))


def _param_size(function: Any, kernel_name: str) -> int | None:
    """Size of the kernel's single by-value struct parameter; None if the driver cannot say."""
    drv = driver()
    if not hasattr(drv, "cuFuncGetParamInfo"):
        return None
    try:
        first = drv.cuFuncGetParamInfo(function, 0)
        second = drv.cuFuncGetParamInfo(function, 1)
    except Exception:
        return None
    ok = drv.CUresult.CUDA_SUCCESS
    if first[0] == drv.CUresult.CUDA_ERROR_NOT_SUPPORTED:
        return None
    if first[0] != ok:
        raise ValueError(
            f"kernel {kernel_name!r} takes no parameters; generated kernels take exactly one by-value struct"
        )
    if second[0] == ok:
        raise ValueError(
            f"kernel {kernel_name!r} takes more than one parameter; generated kernels take exactly one "
            "by-value struct (pack all arguments into it)"
        )
    return int(first[2])


@attrs.frozen(eq=False)
class LoadedKernel:
    """A kernel function loaded on one device, with the figures the driver reports for it.

    ``dynamic_smem_bytes`` is what ``load`` was asked for; ``max_dynamic_smem_bytes`` is what the driver
    now allows (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``); ``static_smem_bytes`` is the
    kernel's ``__shared__`` arrays (``CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES``). ``param_size`` is the
    size of the one struct parameter (None where the driver cannot report it).
    """

    compiled: CompiledKernel = attrs.field(repr=False)
    function: Any
    device: int
    dynamic_smem_bytes: int
    num_regs: int
    static_smem_bytes: int
    max_dynamic_smem_bytes: int
    local_bytes: int
    max_threads_per_block: int
    param_size: int | None
    # Launch configs built by launch(), keyed by (grid, block, smem, cluster, pdl, stream).
    _launch_configs: dict[tuple[Any, ...], Any] = attrs.field(init=False, factory=dict, repr=False)
    # Per-thread params buffer and the void*[1] pointing at it, built on a thread's first launch.
    _params_slots: threading.local = attrs.field(init=False, factory=threading.local, repr=False)

    @property
    def kernel_name(self) -> str:
        return self.compiled.kernel_name

    @property
    def arch(self) -> str:
        return self.compiled.arch

    @property
    def shared_bytes(self) -> int:
        """Shared memory per block at the requested size: static plus dynamic."""
        return self.static_smem_bytes + self.dynamic_smem_bytes


def load(compiled: CompiledKernel, dynamic_smem_bytes: int = 0) -> LoadedKernel:
    """Load ``compiled`` on torch's current device and allow it ``dynamic_smem_bytes`` of dynamic smem.

    Above the driver's default allowance (48 KiB less the kernel's static arrays) it opts in
    (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``); the
    attribute only ever grows, because other ``LoadedKernel`` objects share the same function. Every function
    also asks for the largest shared-memory carveout (the generated kernels read global memory past L1).

    Raises:
        ValueError: bad size, or static + dynamic shared memory above the device's opt-in limit.
        RuntimeError: no GPU, or a driver call failed (the message names the call and the error).
    """
    if not isinstance(compiled, CompiledKernel):
        raise TypeError(f"compiled must be a CompiledKernel, got {type(compiled).__name__}")
    if not isinstance(dynamic_smem_bytes, int) or isinstance(dynamic_smem_bytes, bool) or dynamic_smem_bytes < 0:
        raise ValueError(f"dynamic_smem_bytes={dynamic_smem_bytes!r} must be an int >= 0")
    device = _ensure_context()
    drv = driver()
    sha = compiled.cubin_sha256
    name = compiled.kernel_name
    with _state_lock:
        module = _modules.get((sha, device))
        if module is None:
            try:
                module = driver_call("cuModuleLoadData", compiled.cubin)
            except RuntimeError as exc:
                raise RuntimeError(
                    f"{exc}\n  kernel {name!r} was compiled for {compiled.arch}; device {device} is "
                    f"{_device_arch(device)} (a cubin runs only on the arch it was built for)"
                ) from exc
            _modules[(sha, device)] = module
        function = _functions.get((sha, device, name))
        if function is None:
            try:
                function = driver_call("cuModuleGetFunction", module, name.encode())
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}\n  no extern \"C\" kernel named {name!r} in the cubin") from exc
            # The kernels stage everything in shared memory and read global memory past L1 (cp.async.cg):
            # the largest carveout lets CTAs share an SM (ctas_per_sm, and the next kernel's under PDL).
            driver_call("cuFuncSetAttribute", function,
                        drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
            _functions[(sha, device, name)] = function

        static = _func_attribute(function, "CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES")
        dev = driver_call("cuDeviceGet", device)
        optin = int(driver_call(
            "cuDeviceGetAttribute", drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev
        ))
        if static + dynamic_smem_bytes > optin:
            raise ValueError(
                f"kernel {name!r} needs {static} B static + {dynamic_smem_bytes} B dynamic shared memory = "
                f"{static + dynamic_smem_bytes} B, above device {device}'s limit of {optin} B per block"
            )
        # the default allowance is 48 KiB less the static arrays: a kernel with both can need the opt-in at or even
        # below 48 KiB of dynamic memory
        current = _func_attribute(function, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES")
        if dynamic_smem_bytes > current:
            driver_call(
                "cuFuncSetAttribute", function,
                drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem_bytes,
            )
        return LoadedKernel(
            compiled=compiled,
            function=function,
            device=device,
            dynamic_smem_bytes=dynamic_smem_bytes,
            num_regs=_func_attribute(function, "CU_FUNC_ATTRIBUTE_NUM_REGS"),
            static_smem_bytes=static,
            max_dynamic_smem_bytes=_func_attribute(function, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"),
            local_bytes=_func_attribute(function, "CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
            max_threads_per_block=_func_attribute(function, "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
            param_size=_param_size(function, name),
        )

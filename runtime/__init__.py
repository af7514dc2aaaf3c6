"""Compile + run: source -> cubin (NVRTC / NVCC) -> cache -> module load -> launch.

Importing this package touches neither the CUDA driver nor torch; ``load`` and ``launch`` import
them on first use, so everything up to compilation works on a machine without a GPU.
"""

from humming_gen.runtime.cache import (
    CacheKey,
    KernelCache,
    compile_cached,
    compile_many,
    default_cache,
)
from humming_gen.runtime.compile import (
    ARCHS,
    CompileCancelled,
    CompiledKernel,
    CompileError,
    CompilerUnavailableError,
    compile_source,
    compiler_version,
)
from humming_gen.runtime.launch import launch
from humming_gen.runtime.module import LoadedKernel, load

__all__ = [
    "ARCHS",
    "CacheKey",
    "CompileCancelled",
    "CompileError",
    "CompiledKernel",
    "CompilerUnavailableError",
    "KernelCache",
    "LoadedKernel",
    "compile_cached",
    "compile_many",
    "compile_source",
    "compiler_version",
    "default_cache",
    "launch",
    "load",
]

"""NVRTC / NVCC compilation to cubin for every target, the ptxas report, and compile errors."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from humming_gen.runtime.compile import (
    ARCHS,
    CompiledKernel,
    CompileError,
    CompilerUnavailableError,
    compile_source,
    compiler_version,
    parse_ptxas_resources,
    resolve_compiler,
    resolve_options,
)
from humming_gen.runtime.cubin import cubin_resources, entry_functions

_PARAMS = """\
// Header-free on purpose: generated kernels include nothing and bring their own bit types.
typedef unsigned short hg_f16_bits;

struct Params {
  const unsigned int* a;  // packed f16x2 A fragments, 4 words per lane
  const unsigned int* b;  // packed f16x2 B fragments, 2 words per lane
  float* c;
  int lanes;
};

__device__ __forceinline__ unsigned int smem_addr(const void* ptr) {
  unsigned int addr;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(ptr));
  return addr;
}
"""

# Turing has no cp.async and only the k8 f16 MMA; Ampere and later get cp.async and m16n8k16.
_STAGE_PLAIN = """\
  #pragma unroll
  for (int i = 0; i < 4; ++i) a_smem[lane * 4 + i] = p.a[lane * 4 + i];
  __syncthreads();
"""
_STAGE_CP_ASYNC = """\
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_addr(&a_smem[lane * 4])), "l"(&p.a[lane * 4]));
  asm volatile("cp.async.commit_group;");
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();
"""
_MMA_K8 = """\
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(a0), "r"(a1), "r"(b0));
"""
_MMA_K16 = """\
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
"""


def tiny_kernel(arch: str, name: str = "tiny_mma") -> str:
    """A one-warp kernel with a struct parameter, 512 B of static smem, an MMA and (sm_80+) cp.async."""
    turing = arch == "sm_75"
    stage = _STAGE_PLAIN if turing else _STAGE_CP_ASYNC
    mma = _MMA_K8 if turing else _MMA_K16
    return (
        _PARAMS
        + f'\nextern "C" __global__ void __launch_bounds__(32) {name}(Params p) {{\n'
        + "  __shared__ __align__(16) unsigned int a_smem[4 * 32];\n"
        + "  const int lane = threadIdx.x;\n"
        + stage
        + "  unsigned int a0 = a_smem[lane * 4 + 0], a1 = a_smem[lane * 4 + 1];\n"
        + "  unsigned int a2 = a_smem[lane * 4 + 2], a3 = a_smem[lane * 4 + 3];\n"
        + "  unsigned int b0 = p.b[lane * 2 + 0], b1 = p.b[lane * 2 + 1];\n"
        + "  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;\n"
        + mma
        + "  (void)a2; (void)a3; (void)b1;\n"
        + "  if (lane < p.lanes) {\n"
        + "    p.c[lane * 4 + 0] = d0; p.c[lane * 4 + 1] = d1; p.c[lane * 4 + 2] = d2; p.c[lane * 4 + 3] = d3;\n"
        + "  }\n}\n"
    )


BROKEN = 'struct Params { int n; };\nextern "C" __global__ void broken(Params p) { p.n = undefined_thing; }\n'

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[None]:
    """Cache and system temp dir inside tmp_path; afterwards the temp dir holds no compiler leftovers."""
    for var in ("HUMMING_GEN_COMPILER", "HUMMING_GEN_DEBUG", "HUMMING_GEN_NO_CACHE", "HUMMING_GEN_DUMP"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HUMMING_GEN_CACHE_DIR", str(tmp_path / "cache"))
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(systmp))  # children (nvcc, python) follow it
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))  # this process follows this
    yield
    leftovers = [p.name for p in systmp.iterdir() if not p.name.startswith("humming_gen-failed-")]
    assert not leftovers, f"left in the system temp dir: {leftovers}"


def _check_compiled(kernel: CompiledKernel, arch: str, compiler: str) -> None:
    assert kernel.kernel_name == "tiny_mma"
    assert kernel.arch == arch
    assert kernel.cubin[:4] == b"\x7fELF"  # a cubin (SASS), not PTX text
    assert kernel.compiler.startswith(compiler + " ")
    assert f"-arch={arch}" in kernel.options
    assert kernel.resources["registers"] > 0
    assert kernel.resources["shared_bytes"] == 512
    assert kernel.resources["spill_store_bytes"] == 0
    assert kernel.resources["stack_bytes"] >= 0
    assert kernel.compile_seconds > 0
    assert "tiny_mma" in kernel.log


@pytest.mark.parametrize("arch", ARCHS)
def test_nvrtc_compiles_every_arch_to_cubin(arch: str) -> None:
    _check_compiled(compile_source(tiny_kernel(arch), "tiny_mma", arch, compiler="nvrtc"), arch, "nvrtc")


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvcc_compiles_to_cubin(arch: str) -> None:
    _check_compiled(compile_source(tiny_kernel(arch), "tiny_mma", arch, compiler="nvcc"), arch, "nvcc")


@pytest.mark.parametrize("compiler", ["nvrtc", pytest.param("nvcc", marks=needs_nvcc)])
def test_compile_error_carries_log_and_saved_source(compiler: str, tmp_path) -> None:
    with pytest.raises(CompileError) as info:
        compile_source(BROKEN, "broken", "sm_80", compiler=compiler)
    err = info.value
    assert "undefined_thing" in err.log
    assert "undefined_thing" in str(err)
    assert err.source_path is not None and err.source_path.read_text() == BROKEN
    assert str(err.source_path) in str(err)
    assert err.source_path.is_relative_to(tmp_path / "cache" / "failed")
    assert err.source_path.with_suffix(".log").read_text() == err.log
    assert (err.kernel_name, err.arch) == ("broken", "sm_80")


def _assert_private_dir(path: Path) -> None:
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700, path


def test_failed_source_goes_to_a_private_temp_dir_without_disk_cache(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Not the predictable <tmp>/humming_gen-failed another user could create first, or link elsewhere."""
    monkeypatch.setenv("HUMMING_GEN_NO_CACHE", "1")
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    (tmp_path / "systmp" / "humming_gen-failed").symlink_to(attacker, target_is_directory=True)
    with pytest.raises(CompileError) as info:
        compile_source(BROKEN, "broken", "sm_80")
    path = info.value.source_path
    assert path is not None and path.read_text() == BROKEN
    assert path.parent.parent == tmp_path / "systmp" and path.parent.name.startswith("humming_gen-failed-")
    _assert_private_dir(path.parent)
    assert not list(attacker.iterdir())
    with pytest.raises(CompileError) as again:  # one private directory per process, reused
        compile_source(BROKEN.replace("p.n", "p.n "), "broken", "sm_80")
    assert again.value.source_path is not None and again.value.source_path.parent == path.parent
    (tmp_path / "systmp" / "humming_gen-failed").unlink()  # the planted link is no leftover of ours


def test_failed_source_never_follows_a_planted_link(tmp_path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    failed = tmp_path / "cache" / "failed"
    failed.mkdir(parents=True)
    digest = hashlib.sha256(BROKEN.encode()).hexdigest()[:12]
    (failed / f"broken-{digest}.cu").symlink_to(victim)
    (failed / f"broken-{digest}.log").symlink_to(victim)
    with pytest.raises(CompileError) as info:
        compile_source(BROKEN, "broken", "sm_80")
    assert victim.read_text() == "precious"
    path = info.value.source_path
    assert path == failed / f"broken-{digest}.cu"
    assert not path.is_symlink() and path.read_text() == BROKEN
    assert not path.with_suffix(".log").is_symlink()
    _assert_private_dir(failed)


def test_failed_dir_that_is_a_link_is_not_used(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "failed").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(CompileError) as info:
        compile_source(BROKEN, "broken", "sm_80")
    assert not list(elsewhere.iterdir())
    path = info.value.source_path
    assert path is not None and path.read_text() == BROKEN
    _assert_private_dir(path.parent)


def test_missing_entry_function_is_a_compile_error() -> None:
    with pytest.raises(CompileError, match="no entry function named 'other'.*extern \"C\""):
        compile_source(tiny_kernel("sm_80"), "other", "sm_80")


def test_zhenwu_is_generate_only() -> None:
    with pytest.raises(CompilerUnavailableError, match="zhenwu810e.*not available here.*only be generated"):
        compile_source(tiny_kernel("sm_80"), "tiny_mma", "zhenwu810e")


@pytest.mark.parametrize("arch", ["sm_70", "sm_90", "compute_80", ""])
def test_unknown_arch_names_allowed_values(arch: str) -> None:
    with pytest.raises(ValueError, match="allowed: sm_75, sm_80"):
        compile_source(tiny_kernel("sm_80"), "tiny_mma", arch)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="compiler='clang'"):
        compile_source(tiny_kernel("sm_80"), "tiny_mma", "sm_80", compiler="clang")
    with pytest.raises(ValueError, match="kernel_name"):
        compile_source(tiny_kernel("sm_80"), "tiny mma", "sm_80")
    with pytest.raises(TypeError, match="source"):
        compile_source(b"bytes", "tiny_mma", "sm_80")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="options"):
        compile_source(tiny_kernel("sm_80"), "tiny_mma", "sm_80", options=(3,))  # type: ignore[arg-type]


def test_compiler_env_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_compiler(None) == "nvrtc"
    monkeypatch.setenv("HUMMING_GEN_COMPILER", "nvcc")
    assert resolve_compiler(None) == "nvcc"
    assert resolve_compiler("nvrtc") == "nvrtc"  # an explicit argument wins
    monkeypatch.setenv("HUMMING_GEN_COMPILER", "gcc")
    with pytest.raises(ValueError, match="HUMMING_GEN_COMPILER='gcc'"):
        resolve_compiler(None)


@pytest.mark.parametrize("compiler", ["nvrtc", "nvcc"])
def test_default_and_debug_options(compiler: str, monkeypatch: pytest.MonkeyPatch) -> None:
    release = resolve_options("sm_90a", compiler)
    assert "-arch=sm_90a" in release and "--std=c++17" in release and "-DNDEBUG" in release
    assert "-lineinfo" not in release
    assert any("-v" in o and "ptxas" in o.lower() for o in release)  # ptxas verbose feeds resources
    debug = resolve_options("sm_90a", compiler, debug=True)
    assert "-lineinfo" in debug and "-DNDEBUG" not in debug
    monkeypatch.setenv("HUMMING_GEN_DEBUG", "1")
    assert resolve_options("sm_90a", compiler) == debug
    assert resolve_options("sm_90a", compiler, ("-DX=1",))[-1] == "-DX=1"  # extras come last


def test_debug_build_and_extra_options_compile() -> None:
    source = tiny_kernel("sm_80").replace("p.lanes)", "p.lanes + LANE_BIAS)")
    kernel = compile_source(source, "tiny_mma", "sm_80", options=("-DLANE_BIAS=0",), debug=True)
    assert "-lineinfo" in kernel.options and "-DLANE_BIAS=0" in kernel.options
    with pytest.raises(CompileError, match="LANE_BIAS"):
        compile_source(source, "tiny_mma", "sm_80")


def test_keep_ptx() -> None:
    kernel = compile_source(tiny_kernel("sm_80"), "tiny_mma", "sm_80", keep_ptx=True)
    assert kernel.ptx is not None and ".entry tiny_mma" in kernel.ptx
    assert compile_source(tiny_kernel("sm_80"), "tiny_mma", "sm_80").ptx is None


def test_compiler_version_strings() -> None:
    assert compiler_version("nvrtc").startswith("nvrtc 1")
    if shutil.which("nvcc"):
        assert compiler_version("nvcc").startswith("nvcc 1")


def test_parse_ptxas_resources() -> None:
    log = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for helper_fn
ptxas         .     24 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'gemm' for 'sm_90a'
ptxas info    : Function properties for gemm
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 16 bytes smem, 904 bytes cmem[0]
ptxas info    : Compiling entry function 'other' for 'sm_90a'
ptxas info    : Function properties for other
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, 368 bytes cmem[0]
"""
    entries = parse_ptxas_resources(log)
    assert set(entries) == {"gemm", "other"}  # helper_fn is no kernel
    assert entries["gemm"] == {
        "registers": 168, "shared_bytes": 16, "barriers": 1,
        "stack_bytes": 16, "spill_store_bytes": 8, "spill_load_bytes": 12,
    }
    assert entries["other"] == {
        "registers": 12, "shared_bytes": 0, "stack_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0,
    }
    assert parse_ptxas_resources("") == {}


STACK_KERNEL = """\
struct Params { float* out; int n; };
extern "C" __global__ void with_stack(Params p) {
  __shared__ double staging[100];
  float local[40];  // indexed at run time: lives on the stack
  for (int i = 0; i < 40; ++i) local[i] = p.out[i * p.n];
  staging[threadIdx.x % 100] = p.n;
  __syncthreads();
  p.out[threadIdx.x] = local[p.n % 40] + staging[p.n % 100];
}
"""


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source, name", [(STACK_KERNEL, "with_stack"), ("tiny", "tiny_mma")], ids=["stack", "mma"])
def test_cubin_figures_match_ptxas(arch: str, source: str, name: str) -> None:
    """The fallback reader of the cubin agrees with ptxas on every target."""
    kernel = compile_source(tiny_kernel(arch) if source == "tiny" else source, name, arch)
    from_cubin = cubin_resources(kernel.cubin, name)
    assert from_cubin == {k: kernel.resources[k] for k in ("registers", "shared_bytes", "stack_bytes")}
    assert cubin_resources(kernel.cubin, "not_there") is None
    assert name in entry_functions(kernel.cubin)


def test_resources_without_ptxas_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVRTC 13.0 often returns an empty log: the figures then come from the cubin."""
    from humming_gen.runtime import compile as compile_mod

    monkeypatch.setattr(compile_mod, "_nvrtc_log", lambda nvrtc, prog: "")
    kernel = compile_source(tiny_kernel("sm_90a"), "tiny_mma", "sm_90a")
    assert kernel.log == ""
    assert kernel.resources["registers"] > 0 and kernel.resources["shared_bytes"] == 512
    assert "spill_store_bytes" not in kernel.resources
    with pytest.raises(CompileError, match="no entry function named 'other'.*found: tiny_mma"):
        compile_source(tiny_kernel("sm_90a"), "other", "sm_90a")


def test_cubin_reader_never_raises() -> None:
    for junk in (b"", b"\x7fELF", b"\x7fELF\x02\x01" + b"\xff" * 100, b"not an elf at all" * 10):
        assert cubin_resources(junk, "k") is None
        assert entry_functions(junk) is None


def test_compiled_kernel_is_frozen() -> None:
    kernel = compile_source(tiny_kernel("sm_80"), "tiny_mma", "sm_80")
    with pytest.raises(AttributeError):
        kernel.cubin = b""  # type: ignore[misc]
    assert len(kernel.cubin_sha256) == 64
    assert "bytes>" in repr(kernel)  # the cubin is summarised, not dumped


def test_import_and_compile_never_touch_the_driver() -> None:
    """Importing the runtime and compiling must work where cuInit fails (CI): the driver is bound lazily."""
    code = (
        "import humming_gen.runtime as rt, sys; "
        "module = sys.modules['humming_gen.runtime.module']; launch = sys.modules['humming_gen.runtime.launch']; "
        "rt.compile_source('extern \"C\" __global__ void k(int p) {}', 'k', 'sm_80'); "
        "untouched = module._driver_module is None and not module._driver_initialised and launch._launch_fn is None; "
        "sys.exit(0 if untouched else 1)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # find the checkout
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("body, meaning", [
    ('namespace cfg { constexpr int kB = 4294967296; }\nextern "C" __global__ void k(int* p) { p[0] = cfg::kB; }\n',
     "does not fit"),
    ('namespace cfg { constexpr int kG = 0; }\nextern "C" __global__ void k(int* p) { p[0] = 5 / cfg::kG; }\n',
     "division by zero"),
])
def test_truncation_and_division_by_zero_warnings_fail_the_compile(body: str, meaning: str, tmp_path, monkeypatch):
    """Out-of-range shapes once compiled "successfully" with these warnings; they are errors now."""
    monkeypatch.setenv("HUMMING_GEN_CACHE_DIR", str(tmp_path))
    from humming_gen.runtime.compile import CompileError, compile_source

    with pytest.raises(CompileError, match=meaning):
        compile_source(body, "k", "sm_90a")


def test_wgmma_serialization_warning_is_fatal() -> None:
    from humming_gen.runtime.compile import fatal_warnings

    log = ("ptxas warning : Potential Performance Loss: wgmma.mma_async instructions are serialized due to the "
           "presence of Extern calls in the function 'k'\nptxas info    : Used 168 registers\n")
    assert fatal_warnings(log) == [f"ptxas serializes wgmma: {log.splitlines()[0]}"]
    assert fatal_warnings("ptxas info    : Used 168 registers\n") == []

"""Source -> cubin: the NVRTC and NVCC back ends, the resource report, and the compile errors.

Kernels are compiled to a cubin (SASS) for one exact architecture, never to PTX: PTX from an NVRTC
newer than the driver's CUDA version does not JIT on that driver, while SASS runs on any driver that
knows the GPU. Nothing here touches the CUDA driver, so all of it works on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import attrs

from humming_gen.runtime import env
from humming_gen.runtime.cubin import cubin_resources, entry_functions

#: Architectures that can be compiled here, spelled as ``-arch`` takes them. The ``a`` targets are the
#: arch-specific ones that wgmma, tcgen05 and the block-scaled MMAs need.
ARCHS: tuple[str, ...] = (
    "sm_75", "sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_103a", "sm_120a", "sm_121a",
)

#: Targets whose source can be generated but whose compiler driver is not available here.
GENERATE_ONLY_TARGETS: dict[str, str] = {
    "zhenwu810e": "the T-Head PPU compiler driver",
}

COMPILERS: tuple[str, ...] = ("nvrtc", "nvcc")

_KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class CompileError(RuntimeError):
    """The compiler rejected a source; carries the compiler log and where the source was saved."""

    def __init__(
        self,
        message: str,
        *,
        log: str = "",
        source_path: Path | None = None,
        kernel_name: str = "",
        arch: str = "",
        compiler: str = "",
    ) -> None:
        super().__init__(message)
        self.log = log
        self.source_path = source_path
        self.kernel_name = kernel_name
        self.arch = arch
        self.compiler = compiler


class CompilerUnavailableError(RuntimeError):
    """The compiler a target needs is not installed (or does not exist for this machine at all)."""


class CompileCancelled(RuntimeError):
    """A compile was stopped through its ``cancel`` event (an interrupted batch); nothing was recorded."""


#: How often a running nvcc is checked for cancellation, in seconds.
CANCEL_POLL_S = 0.05


def _cubin_repr(cubin: bytes) -> str:
    return f"<{len(cubin)} bytes>"


@attrs.frozen
class CompiledKernel:
    """A compiled kernel: the cubin plus everything needed to cache, load and inspect it.

    ``resources`` holds what ptxas reported for the entry function: ``registers``, ``shared_bytes``
    (static shared memory), ``stack_bytes``, ``spill_store_bytes``, ``spill_load_bytes``, and
    ``barriers`` where reported. When the compiler returns no ptxas report (NVRTC 13.0 often does
    not), ``registers``, ``shared_bytes`` and ``stack_bytes`` are read from the cubin and the spill
    keys are absent. ``ptx`` is only kept when asked for (``HUMMING_GEN_DUMP``).
    """

    kernel_name: str
    arch: str
    cubin: bytes = attrs.field(repr=_cubin_repr)
    log: str = attrs.field(repr=False)
    compiler: str
    options: tuple[str, ...] = attrs.field(converter=tuple)
    resources: dict[str, int] = attrs.field(converter=dict)
    compile_seconds: float
    ptx: str | None = attrs.field(default=None, repr=False)

    @property
    def cubin_sha256(self) -> str:
        """Content hash of the cubin: the identity of a loaded module and the cache's integrity check."""
        return hashlib.sha256(self.cubin).hexdigest()


# --------------------------------------------------------------------------------------------------
# arguments


def resolve_compiler(compiler: str | None) -> str:
    """Return the compiler to use: the argument, else ``HUMMING_GEN_COMPILER``, else ``nvrtc``."""
    name = compiler if compiler is not None else env.default_compiler()
    if not isinstance(name, str) or name.lower() not in COMPILERS:
        origin = "compiler" if compiler is not None else "HUMMING_GEN_COMPILER"
        raise ValueError(f"{origin}={name!r} is not a known compiler; allowed: {', '.join(COMPILERS)}")
    return name.lower()


def check_arch(arch: str) -> None:
    """Raise unless ``arch`` can be compiled here (a clear message for generate-only targets)."""
    if arch in GENERATE_ONLY_TARGETS:
        raise CompilerUnavailableError(
            f"arch={arch!r}: {GENERATE_ONLY_TARGETS[arch]} is not available here; kernels for {arch} can "
            "only be generated (their source), not compiled, loaded or launched"
        )
    if arch not in ARCHS:
        allowed = ", ".join(ARCHS + tuple(GENERATE_ONLY_TARGETS))
        raise ValueError(f"arch={arch!r} is not a known target; allowed: {allowed}")


def resolve_options(
    arch: str, compiler: str | None = None, options: tuple[str, ...] = (), debug: bool = False
) -> tuple[str, ...]:
    """The full option list a compile uses (defaults, debug switches, then the caller's extras).

    It is part of the cache key, so everything that changes the cubin must show up here.
    """
    check_arch(arch)
    compiler = resolve_compiler(compiler)
    extra = tuple(options)
    for opt in extra:
        if not isinstance(opt, str):
            raise TypeError(f"options must be strings, got {opt!r} ({type(opt).__name__})")
    debug = debug or env.debug()
    # Release builds drop device asserts (-DNDEBUG); debug builds keep them and add line info.
    mode = ("-lineinfo",) if debug else ("-DNDEBUG",)
    if compiler == "nvrtc":
        base = (
            f"-arch={arch}", "--std=c++17", "-default-device",
            "--ptxas-options=-O3", "--ptxas-options=-v",
        )
    else:
        base = ("-cubin", f"-arch={arch}", "--std=c++17", "-O3", "-Xptxas=-O3", "-Xptxas=-v")
    return base + mode + extra


# --------------------------------------------------------------------------------------------------
# toolchains


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except Exception as exc:  # missing package or missing libnvrtc
        raise CompilerUnavailableError(
            f"NVRTC is not available ({exc}); install cuda-python and nvidia-cuda-nvrtc, or use compiler='nvcc'"
        ) from exc
    return nvrtc


def _nvcc_path() -> str:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    raise CompilerUnavailableError(
        "nvcc was not found on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin; install the CUDA toolkit "
        "or use compiler='nvrtc'"
    )


@functools.lru_cache(maxsize=None)
def _compiler_version(compiler: str) -> str:
    if compiler == "nvrtc":
        nvrtc = _nvrtc()
        try:
            result, major, minor = nvrtc.nvrtcVersion()
        except Exception as exc:
            raise CompilerUnavailableError(f"NVRTC could not be loaded: {exc}") from exc
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompilerUnavailableError(f"nvrtcVersion failed: {result}")
        return f"nvrtc {major}.{minor}"
    nvcc = _nvcc_path()
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise CompilerUnavailableError(f"{nvcc} --version failed: {exc}") from exc
    match = re.search(r"\bV(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    if not match:
        raise CompilerUnavailableError(f"could not read the version from `{nvcc} --version`:\n{out}")
    return f"nvcc {match.group(1)}"


def compiler_version(compiler: str | None = None) -> str:
    """Name and version of a compiler, e.g. ``"nvrtc 13.5"`` or ``"nvcc 13.0.88"``.

    The string goes into the cache key (a toolchain update must not reuse old cubins) and into
    ``CompiledKernel.compiler``. Raises ``CompilerUnavailableError`` when the compiler is missing.
    """
    return _compiler_version(resolve_compiler(compiler))


# --------------------------------------------------------------------------------------------------
# ptxas report

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


def parse_ptxas_resources(log: str) -> dict[str, dict[str, int]]:
    """Parse ``ptxas -v`` output into ``{entry function: resources}``.

    Only entry functions (kernels) are returned; the stack frame of a non-inlined device function is
    reported under its own name and not attributed to the kernel.
    """
    entries: dict[str, dict[str, int]] = {}
    frames: dict[str, dict[str, int]] = {}
    entry: str | None = None
    properties_of: str | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            entries.setdefault(entry, {})
            continue
        if m := _PROPERTIES.search(line):
            properties_of = m.group(1)
            continue
        if (m := _FRAME.search(line)) and properties_of is not None:
            frames[properties_of] = {
                "stack_bytes": int(m.group(1)),
                "spill_store_bytes": int(m.group(2)),
                "spill_load_bytes": int(m.group(3)),
            }
            properties_of = None
            continue
        if (m := _USED.search(line)) and entry is not None:
            res = entries[entry]
            res["registers"] = int(m.group(1))
            res["shared_bytes"] = int(s.group(1)) if (s := _SMEM.search(line)) else 0
            if b := _BARRIERS.search(line):
                res["barriers"] = int(b.group(1))
    for name, res in entries.items():
        res.update(frames.get(name, {"stack_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0}))
    return entries


# --------------------------------------------------------------------------------------------------
# compile


#: Private per-process directories for failed sources when there is no disk cache, by temp root.
_private_failed_dirs: dict[str, Path] = {}
_private_failed_lock = threading.Lock()


def _own_dir(path: Path, *, private: bool) -> bool:
    """Whether ``path`` is a real directory (not a link) owned by this user; ``private``: also mode 0700."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    return not (private and st.st_mode & 0o077)


def _failed_source_dir() -> Path:
    """Where failed sources go: ``<cache>/failed`` (mode 0700), else a private ``mkdtemp`` directory.

    Never a predictable shared path under the system temp dir: another user could create it first or
    plant links in it. A ``failed`` directory that is a link, or not ours, is not used.
    """
    if not env.no_cache():
        path = env.cache_dir() / "failed"
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
            if _own_dir(path, private=False):
                os.chmod(path, 0o700)  # a directory an older version made with the umask's mode
                if os.access(path, os.W_OK):
                    return path
        except OSError:
            pass
    root = tempfile.gettempdir()
    with _private_failed_lock:
        path = _private_failed_dirs.get(root)
        if path is None or not _own_dir(path, private=True):
            path = Path(tempfile.mkdtemp(prefix="humming_gen-failed-", dir=root))  # 0700, unpredictable name
            _private_failed_dirs[root] = path
        return path


def write_text_no_follow(directory: Path, name: str, text: str) -> None:
    """Write ``directory/name`` without following links: a fresh private file renamed over the name."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        tmp_name = f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp_name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # replaces a link, never follows it
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


def _save_failed_source(source: str, kernel_name: str, log: str) -> Path | None:
    """Write a source that failed to compile where a person can open it (with its log beside it)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    try:
        directory = _failed_source_dir()
        path = directory / f"{kernel_name}-{digest}.cu"
        write_text_no_follow(directory, path.name, source)
        write_text_no_follow(directory, path.with_suffix(".log").name, log)
        return path
    except OSError:
        return None


def _fail(message: str, source: str, kernel_name: str, arch: str, compiler: str, log: str) -> CompileError:
    path = _save_failed_source(source, kernel_name, log)
    where = str(path) if path is not None else "(could not be saved)"
    return CompileError(
        f"{message}\n  kernel: {kernel_name}  arch: {arch}  compiler: {compiler}\n  source: {where}\n"
        f"--- compiler log ---\n{log.strip()}",
        log=log, source_path=path, kernel_name=kernel_name, arch=arch, compiler=compiler,
    )


def _nvrtc_log(nvrtc, prog) -> str:
    result, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = bytearray(size)  # NOTE: never b" " * size: that can be a shared immutable object
    (result,) = nvrtc.nvrtcGetProgramLog(prog, buf)
    return bytes(buf).rstrip(b"\x00").decode(errors="replace")


def _nvrtc_check(nvrtc, result, call: str) -> None:
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(result)
        raise RuntimeError(f"{call} failed: {text.decode(errors='replace') if isinstance(text, bytes) else text}")


def _compile_nvrtc(
    source: str, kernel_name: str, arch: str, options: tuple[str, ...], keep_ptx: bool, compiler: str,
    cancel: threading.Event | None = None,
) -> tuple[bytes, str, str | None]:
    nvrtc = _nvrtc()
    result, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{kernel_name}.cu".encode(), 0, [], [])
    _nvrtc_check(nvrtc, result, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in options]
        # NVRTC releases the GIL here, so several threads compile in parallel.
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if cancel is not None and cancel.is_set():  # NVRTC cannot be stopped midway: drop its result
            raise CompileCancelled("the NVRTC compile was cancelled")
        log = _nvrtc_log(nvrtc, prog)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, text = nvrtc.nvrtcGetErrorString(result)
            raise _fail(f"NVRTC failed ({text.decode(errors='replace')})", source, kernel_name, arch, compiler, log)
        result, size = nvrtc.nvrtcGetCUBINSize(prog)
        _nvrtc_check(nvrtc, result, "nvrtcGetCUBINSize")
        cubin_buf = bytearray(size)
        (result,) = nvrtc.nvrtcGetCUBIN(prog, cubin_buf)
        _nvrtc_check(nvrtc, result, "nvrtcGetCUBIN")
        cubin = bytes(cubin_buf)
        ptx = None
        if keep_ptx:
            result, size = nvrtc.nvrtcGetPTXSize(prog)
            _nvrtc_check(nvrtc, result, "nvrtcGetPTXSize")
            buf = bytearray(size)
            (result,) = nvrtc.nvrtcGetPTX(prog, buf)
            _nvrtc_check(nvrtc, result, "nvrtcGetPTX")
            ptx = bytes(buf).rstrip(b"\x00").decode(errors="replace")
        return cubin, log, ptx
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL nvcc and its children (cicc, ptxas): it runs as the leader of its own process group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _run_nvcc(args: list[str], cwd: str, tmpdir: str, cancel: threading.Event | None) -> subprocess.CompletedProcess:
    """Run nvcc in its own session with ``TMPDIR=tmpdir``; kill its whole group when cancelled or interrupted.

    Its own session keeps a terminal's Ctrl-C away from it (so an interrupted compile is not mistaken
    for a failed one): whoever interrupts this process kills the group here, within ``CANCEL_POLL_S``.
    """
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", cwd=cwd,
        env={**os.environ, "TMPDIR": tmpdir}, start_new_session=True,
    )
    try:
        while True:
            if cancel is not None and cancel.is_set():
                raise CompileCancelled("nvcc was stopped: the compile was cancelled")
            try:
                out, _ = proc.communicate(timeout=CANCEL_POLL_S)
                return subprocess.CompletedProcess(args, proc.returncode, out)
            except subprocess.TimeoutExpired:
                continue
    except BaseException:
        _kill_group(proc)
        raise


def _compile_nvcc(
    source: str, kernel_name: str, arch: str, options: tuple[str, ...], keep_ptx: bool, compiler: str,
    cancel: threading.Event | None = None,
) -> tuple[bytes, str, str | None]:
    nvcc = _nvcc_path()
    # A private directory per compile (0700) that also holds nvcc's intermediates (tmpxft_*, through
    # TMPDIR), removed afterwards, also when the compile is cancelled or interrupted.
    with tempfile.TemporaryDirectory(prefix="humming_gen-nvcc-") as tmp:
        src = Path(tmp) / f"{kernel_name}.cu"
        out = Path(tmp) / f"{kernel_name}.cubin"
        scratch = Path(tmp) / "tmp"
        scratch.mkdir()
        src.write_text(source)
        try:
            proc = _run_nvcc([nvcc, *options, "-o", str(out), str(src)], tmp, str(scratch), cancel)
        except OSError as exc:
            raise CompilerUnavailableError(f"could not run {nvcc}: {exc}") from exc
        # Name the source as NVRTC does: the temporary path means nothing once it is deleted.
        log = proc.stdout.replace(str(src), src.name)
        if proc.returncode < 0:  # killed from outside (OOM killer, kill): not the source's fault, keep no copy
            name = signal.Signals(-proc.returncode).name if -proc.returncode in signal.valid_signals() else "?"
            raise CompileError(
                f"nvcc was killed by signal {-proc.returncode} ({name})\n  kernel: {kernel_name}  arch: {arch}  "
                f"compiler: {compiler}\n--- compiler log ---\n{log.strip()}",
                log=log, kernel_name=kernel_name, arch=arch, compiler=compiler,
            )
        if proc.returncode != 0 or not out.exists():
            raise _fail(f"nvcc failed (exit code {proc.returncode})", source, kernel_name, arch, compiler, log)
        cubin = out.read_bytes()
        ptx = None
        if keep_ptx:
            ptx_path = Path(tmp) / f"{kernel_name}.ptx"
            ptx_opts = [o for o in options if o != "-cubin" and not o.startswith("-Xptxas")]
            proc = _run_nvcc([nvcc, "-ptx", *ptx_opts, "-o", str(ptx_path), str(src)], tmp, str(scratch), cancel)
            ptx = ptx_path.read_text() if proc.returncode == 0 and ptx_path.exists() else None
    return cubin, log, ptx


# Compiler warnings that mean a generated kernel is wrong or slow beyond repair, so they fail the compile: a
# constant that does not fit its type, a division by zero (both seen from out-of-range shapes), and ptxas
# serializing wgmma (cutlass#1840: accumulators touched in flight, registers short), which costs the pipeline.
FATAL_WARNINGS = (
    ("a value does not fit its type", re.compile(r"integer conversion resulted in truncation|"
                                                 r"integer operation result is out of range", re.I)),
    ("division by zero", re.compile(r"division by zero", re.I)),
    ("ptxas serializes wgmma", re.compile(r"wgmma[^\n]*serializ", re.I)),
)


def fatal_warnings(log: str) -> list[str]:
    """The log lines that FATAL_WARNINGS turn into errors, each prefixed with what it means."""
    found = []
    for line in log.splitlines():
        for meaning, pattern in FATAL_WARNINGS:
            if pattern.search(line):
                found.append(f"{meaning}: {line.strip()}")
                break
    return found


def compile_source(
    source: str,
    kernel_name: str,
    arch: str,
    *,
    compiler: str | None = None,
    options: tuple[str, ...] = (),
    debug: bool = False,
    keep_ptx: bool = False,
    cancel: threading.Event | None = None,
) -> CompiledKernel:
    """Compile a header-free CUDA source to a cubin for exactly ``arch`` (no cache; see ``cache.py``).

    Args:
        source: the whole translation unit; it includes no headers.
        kernel_name: the ``extern "C"`` entry point (also names the saved source on failure).
        arch: one of ``ARCHS``; generate-only targets such as ``zhenwu810e`` raise.
        compiler: ``"nvrtc"`` (default, or ``HUMMING_GEN_COMPILER``) or ``"nvcc"``.
        options: extra compiler options, appended after the defaults.
        debug: line info and device asserts (also switched on by ``HUMMING_GEN_DEBUG=1``).
        keep_ptx: also return the PTX (for ``HUMMING_GEN_DUMP``).
        cancel: once set, the compile stops (an nvcc process group is killed; an NVRTC compile, which
            cannot be stopped midway, has its result dropped) and raises ``CompileCancelled``.

    Raises:
        CompileError: the compiler rejected the source (message holds the log and the saved source path).
        CompilerUnavailableError: the compiler is missing, or the target cannot be compiled here.
        CompileCancelled: ``cancel`` was set; no source was saved.
        ValueError / TypeError: bad arguments.
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    if not isinstance(kernel_name, str) or not _KERNEL_NAME.match(kernel_name):
        raise ValueError(f"kernel_name={kernel_name!r} is not a C identifier (the extern \"C\" entry point)")
    check_arch(arch)
    compiler = resolve_compiler(compiler)
    full_options = resolve_options(arch, compiler, options, debug)
    version = compiler_version(compiler)

    if cancel is not None and cancel.is_set():
        raise CompileCancelled(f"the compile of {kernel_name} was cancelled before it started")
    start = time.perf_counter()
    back_end = _compile_nvrtc if compiler == "nvrtc" else _compile_nvcc
    cubin, log, ptx = back_end(source, kernel_name, arch, full_options, keep_ptx, version, cancel)
    seconds = time.perf_counter() - start

    if not cubin:
        raise _fail(f"{version} produced an empty cubin", source, kernel_name, arch, version, log)
    fatal = fatal_warnings(log)
    if fatal:
        raise _fail("compiler warnings treated as errors:\n  " + "\n  ".join(fatal), source, kernel_name, arch,
                    version, log)
    entries = parse_ptxas_resources(log)
    resources = entries.get(kernel_name)
    if resources is None:
        functions = entry_functions(cubin)
        known = sorted(set(entries) | (functions or set()))
        if known and kernel_name not in known:
            raise _fail(
                f"no entry function named {kernel_name!r} in the compiled source (found: {', '.join(known)}); "
                "the kernel must be declared extern \"C\" __global__",
                source, kernel_name, arch, version, log,
            )
        # NVRTC 13.0 often returns an empty log despite -v: read what the cubin records instead
        # (no spill counts there).
        resources = cubin_resources(cubin, kernel_name) or {}
    return CompiledKernel(
        kernel_name=kernel_name,
        arch=arch,
        cubin=cubin,
        log=log,
        compiler=version,
        options=full_options,
        resources=resources,
        compile_seconds=seconds,
        ptx=ptx,
    )

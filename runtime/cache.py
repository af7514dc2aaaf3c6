"""Source -> cubin cache, in memory and on disk, plus parallel compilation of many kernels.

The source includes no headers, so the key is a sha256 of everything that decides the cubin: the
source, the entry name, the compiler's name and version, the full option list and the arch. Nothing
else is hashed (no mtimes). A disk entry is a directory ``<kernel-name>-<hash12>/`` holding
``kernel.cu``, ``kernel.cubin``, ``meta.json`` and ``compile.log``; it is built in a temporary directory
inside the cache directory and renamed into place while holding a per-entry ``flock``, so when several
processes ask for the same kernel one compiles and the others wait and read its entry. An entry that
fails its checks (missing cubin, unreadable meta, size or sha256 mismatch) is rebuilt.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

import attrs

from humming_gen.runtime import compile as _compile
from humming_gen.runtime import env
from humming_gen.runtime.compile import CompiledKernel

#: Version of the on-disk entry layout; entries of another version are rebuilt.
ENTRY_FORMAT = 1

#: compile_many shows its progress bar only once it has run this long.
PROGRESS_DELAY_S = 1.0

_ENTRY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*-[0-9a-f]{12}\Z")


@attrs.frozen
class CacheKey:
    """Identity of one compiled kernel; ``entry_name`` is its readable disk directory name."""

    kernel_name: str
    digest: str

    @property
    def entry_name(self) -> str:
        return f"{self.kernel_name}-{self.digest[:12]}"


def make_key(
    source: str, kernel_name: str, arch: str, compiler: str, options: tuple[str, ...]
) -> CacheKey:
    """Hash (source, entry name, compiler name + version, full options, arch) into a ``CacheKey``.

    ``compiler`` is the versioned id (``compiler_version()``) and ``options`` the resolved list
    (``resolve_options()``), so a toolchain update or a debug build never reuses another cubin.
    """
    blob = json.dumps(
        {"source": source, "kernel_name": kernel_name, "compiler": compiler, "options": list(options), "arch": arch},
        sort_keys=True,
    )
    return CacheKey(kernel_name, hashlib.sha256(blob.encode()).hexdigest())


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive ``flock`` on ``path``: serialises builders of one entry across processes and threads."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _sass(cubin_path: Path) -> str | None:
    """Disassemble a cubin with cuobjdump (or nvdisasm); None when neither tool is installed."""
    for tool, args in (("cuobjdump", ["-sass"]), ("nvdisasm", [])):
        exe = shutil.which(tool)
        if exe is None:
            continue
        try:
            proc = subprocess.run([exe, *args, str(cubin_path)], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            continue
        if proc.returncode == 0:
            return proc.stdout
    return None


class KernelCache:
    """Memory + disk cache of compiled kernels (see the module docstring for the disk protocol).

    Args:
        directory: disk cache directory; ``None`` follows ``HUMMING_GEN_CACHE_DIR`` at each call.
        disk: ``False`` keeps this cache in memory only; ``None`` follows ``HUMMING_GEN_NO_CACHE``.

    Counters ``memory_hits``, ``disk_hits`` and ``misses`` (compiles) count ``get_or_compile`` and ``get``.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, disk: bool | None = None) -> None:
        self._directory = Path(directory).expanduser() if directory is not None else None
        self._disk = disk
        self._memory: dict[str, CompiledKernel] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._disk_warned = False
        self.memory_hits = 0
        self.disk_hits = 0
        self.misses = 0

    def __repr__(self) -> str:
        where = str(self.directory) if self.disk_enabled else "memory only"
        return (
            f"KernelCache({where}: {len(self._memory)} in memory, hits={self.hits} "
            f"(memory {self.memory_hits}, disk {self.disk_hits}), misses={self.misses})"
        )

    def __len__(self) -> int:
        return len(self._memory)

    @property
    def directory(self) -> Path:
        return self._directory if self._directory is not None else env.cache_dir()

    @property
    def disk_enabled(self) -> bool:
        return self._disk if self._disk is not None else not env.no_cache()

    @property
    def hits(self) -> int:
        return self.memory_hits + self.disk_hits

    def entry_path(self, key: CacheKey) -> Path:
        """Directory of ``key``'s disk entry (whether or not it exists)."""
        return self.directory / key.entry_name

    def key(
        self,
        source: str,
        kernel_name: str,
        arch: str,
        *,
        compiler: str | None = None,
        options: tuple[str, ...] = (),
        debug: bool = False,
    ) -> CacheKey:
        """The key ``get_or_compile`` would use for these arguments."""
        compiler = _compile.resolve_compiler(compiler)
        full_options = _compile.resolve_options(arch, compiler, tuple(options), debug)
        return make_key(source, kernel_name, arch, _compile.compiler_version(compiler), full_options)

    # ---- get / put / clear -------------------------------------------------------------------------

    def get(self, key: CacheKey) -> CompiledKernel | None:
        """Look ``key`` up in memory, then on disk; None on a miss (counted)."""
        compiled = self._memory.get(key.digest)
        if compiled is not None:
            self.memory_hits += 1
            return compiled
        if self.disk_enabled:
            compiled = self._read_entry(key)
            if compiled is not None:
                self.disk_hits += 1
                self._memory[key.digest] = compiled
                return compiled
        self.misses += 1
        return None

    def put(self, key: CacheKey, compiled: CompiledKernel, source: str) -> None:
        """Store a compiled kernel in memory and (unless disabled) on disk, replacing any old entry."""
        self._memory[key.digest] = compiled
        if self.disk_enabled:
            try:
                with self._entry_lock(key):
                    self._write_entry(key, compiled, source)
            except OSError as exc:
                self._warn_disk(exc)

    def clear(self, *, disk: bool = False) -> None:
        """Forget the in-memory entries and the counters; with ``disk=True`` also delete disk entries.

        Only directories that look like entries (``<name>-<hash12>/``) and the cache's own scratch
        directories are removed, never other files that happen to share the directory.
        """
        with self._lock:
            self._memory.clear()
            self.memory_hits = self.disk_hits = self.misses = 0
        if not disk or not self.directory.is_dir():
            return
        for child in self.directory.iterdir():
            scratch = child.name.startswith((".tmp-", ".trash-")) or child.name in (".locks", "failed")
            if child.is_dir() and (scratch or _ENTRY_NAME.match(child.name)):
                shutil.rmtree(child, ignore_errors=True)

    # ---- compile through the cache -----------------------------------------------------------------

    def get_or_compile(
        self,
        source: str,
        kernel_name: str,
        arch: str,
        *,
        compiler: str | None = None,
        options: tuple[str, ...] = (),
        debug: bool = False,
    ) -> CompiledKernel:
        """Memory hit -> disk hit -> compile (once across threads and processes) and store."""
        key = self.key(source, kernel_name, arch, compiler=compiler, options=options, debug=debug)
        compiled = self._memory.get(key.digest)
        if compiled is not None:
            self.memory_hits += 1
            return compiled
        with self._thread_lock(key):
            compiled = self._memory.get(key.digest)
            if compiled is not None:  # another thread compiled it while we waited
                self.memory_hits += 1
                return compiled
            if self.disk_enabled:
                try:
                    compiled = self._disk_get_or_compile(key, source, kernel_name, arch, compiler, options, debug)
                except OSError as exc:  # unwritable cache directory: carry on in memory
                    self._warn_disk(exc)
                    compiled = None
            if compiled is None:
                compiled = self._compile(source, kernel_name, arch, compiler, options, debug)
                self.misses += 1
            self._memory[key.digest] = compiled
            return compiled

    def _disk_get_or_compile(
        self, key: CacheKey, source: str, kernel_name: str, arch: str,
        compiler: str | None, options: tuple[str, ...], debug: bool,
    ) -> CompiledKernel:
        compiled = self._read_entry(key)  # the common case: no lock needed, entries appear atomically
        if compiled is not None:
            self.disk_hits += 1
            if env.dump():
                with self._entry_lock(key):
                    self._write_dump(
                        self.entry_path(key), compiled, source, _compile.resolve_compiler(compiler), options, debug
                    )
            return compiled
        with self._entry_lock(key):
            compiled = self._read_entry(key)  # another process may have built it while we waited
            if compiled is not None:
                self.disk_hits += 1
                return compiled
            compiled = self._compile(source, kernel_name, arch, compiler, options, debug)
            self.misses += 1
            try:
                self._write_entry(key, compiled, source)
            except OSError as exc:  # e.g. disk full: the kernel is still good, keep it in memory
                self._warn_disk(exc)
            return compiled

    def _compile(
        self, source: str, kernel_name: str, arch: str, compiler: str | None, options: tuple[str, ...], debug: bool
    ) -> CompiledKernel:
        # Looked up at call time so tests can substitute a fake compiler.
        return _compile.compile_source(
            source, kernel_name, arch, compiler=compiler, options=tuple(options), debug=debug,
            keep_ptx=env.dump() and self.disk_enabled,
        )

    # ---- disk entries ------------------------------------------------------------------------------

    def _thread_lock(self, key: CacheKey) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key.digest, threading.Lock())

    @contextlib.contextmanager
    def _entry_lock(self, key: CacheKey) -> Iterator[None]:
        locks = self.directory / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with _file_lock(locks / f"{key.entry_name}.lock"):
            yield

    def _read_entry(self, key: CacheKey) -> CompiledKernel | None:
        """Load and verify a disk entry; None if it is absent or fails any check."""
        path = self.entry_path(key)
        try:
            meta = json.loads((path / "meta.json").read_text())
            cubin = (path / "kernel.cubin").read_bytes()
        except (OSError, ValueError):
            return None
        try:
            if (
                meta["format"] != ENTRY_FORMAT
                or meta["key"] != key.digest
                or meta["cubin_size"] != len(cubin)
                or meta["cubin_sha256"] != hashlib.sha256(cubin).hexdigest()
            ):
                return None
            try:
                log = (path / "compile.log").read_text()
            except OSError:
                log = ""
            return CompiledKernel(
                kernel_name=meta["kernel_name"],
                arch=meta["arch"],
                cubin=cubin,
                log=log,
                compiler=meta["compiler"],
                options=tuple(meta["options"]),
                resources={k: int(v) for k, v in meta["resources"].items()},
                compile_seconds=float(meta["compile_seconds"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def _write_entry(self, key: CacheKey, compiled: CompiledKernel, source: str) -> None:
        """Build the entry in a scratch directory, then rename it into place (caller holds the lock)."""
        directory = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key.entry_name}-", dir=directory))
        try:
            (tmp / "kernel.cu").write_text(source)
            (tmp / "kernel.cubin").write_bytes(compiled.cubin)
            (tmp / "compile.log").write_text(compiled.log)
            meta = {
                "format": ENTRY_FORMAT,
                "key": key.digest,
                "kernel_name": compiled.kernel_name,
                "arch": compiled.arch,
                "compiler": compiled.compiler,
                "options": list(compiled.options),
                "resources": compiled.resources,
                "compile_seconds": compiled.compile_seconds,
                "cubin_sha256": compiled.cubin_sha256,
                "cubin_size": len(compiled.cubin),
                "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
                "created": time.time(),
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            if env.dump():
                self._write_dump(tmp, compiled, source, None, (), False)
            final = self.entry_path(key)
            if final.exists() or final.is_symlink():  # a broken entry: move it away, then delete it
                trash = directory / f".trash-{key.entry_name}-{uuid.uuid4().hex[:8]}"
                os.rename(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            try:
                os.rename(tmp, final)
            except OSError:
                # Only possible if the lock does not hold (some network file systems): keep the
                # entry another process finished, as long as it is whole.
                if self._read_entry(key) is None:
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _write_dump(
        self, path: Path, compiled: CompiledKernel, source: str,
        compiler: str | None, options: tuple[str, ...], debug: bool,
    ) -> None:
        """HUMMING_GEN_DUMP: PTX and SASS beside the cubin (SASS skipped when no disassembler exists)."""
        ptx_path, sass_path = path / "kernel.ptx", path / "kernel.sass"
        if not ptx_path.exists():
            ptx = compiled.ptx
            if ptx is None and compiler is not None:  # a disk hit: the PTX was not kept, so recompile once
                try:
                    ptx = _compile.compile_source(
                        source, compiled.kernel_name, compiled.arch, compiler=compiler,
                        options=tuple(options), debug=debug, keep_ptx=True,
                    ).ptx
                except Exception:  # the dump is best effort, never a reason to fail a load
                    ptx = None
            if ptx is not None:
                ptx_path.write_text(ptx)
        if not sass_path.exists():
            sass = _sass(path / "kernel.cubin")
            if sass is not None:
                sass_path.write_text(sass)

    def _warn_disk(self, exc: OSError) -> None:
        if not self._disk_warned:
            self._disk_warned = True
            warnings.warn(
                f"humming_gen: disk cache at {self.directory} is unusable ({exc}); caching in memory only",
                RuntimeWarning, stacklevel=3,
            )


#: The process-wide cache that ``compile_cached`` and ``compile_many`` use by default.
default_cache = KernelCache()


def compile_cached(
    source: str,
    kernel_name: str,
    arch: str,
    compiler: str | None = None,
    options: tuple[str, ...] = (),
    *,
    debug: bool = False,
) -> CompiledKernel:
    """Compile through the default cache: memory hit -> disk hit -> compile."""
    return default_cache.get_or_compile(source, kernel_name, arch, compiler=compiler, options=options, debug=debug)


class _Progress:
    """One-line progress bar on stderr, drawn only once the work has lasted ``delay`` seconds."""

    def __init__(self, total: int, stream: TextIO | None = None, delay: float | None = None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.delay = PROGRESS_DELAY_S if delay is None else delay
        self.start = time.perf_counter()
        self.last = 0.0
        self.shown = False

    def update(self, done: int, *, force: bool = False) -> None:
        now = time.perf_counter()
        elapsed = now - self.start
        if elapsed < self.delay or (not force and now - self.last < 0.1):
            return
        self.last = now
        width = 30
        filled = width * done // max(self.total, 1)
        self.stream.write(
            f"\rhumming_gen: compiling [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} kernels {elapsed:.1f}s"
        )
        self.stream.flush()
        self.shown = True

    def close(self, done: int) -> None:
        if self.shown:
            self.update(done, force=True)
            self.stream.write("\n")
            self.stream.flush()


def compile_many(
    jobs: Sequence[tuple[str, str, str]],
    compiler: str | None = None,
    options: tuple[str, ...] = (),
    *,
    debug: bool = False,
    cache: KernelCache | None = None,
    max_workers: int | None = None,
    progress: bool = True,
) -> list[CompiledKernel]:
    """Compile ``(source, kernel_name, arch)`` jobs in parallel through the cache, results in job order.

    NOTE: threads, not processes: NVRTC's compile call releases the GIL (measured here: four NVRTC
    compiles on two cores took about half the serial time in a thread pool), and NVCC runs as a
    subprocess. A progress bar appears on stderr once the batch has run for ``PROGRESS_DELAY_S``.
    If some jobs fail, the others still finish and are cached; the first failure is raised with a
    note naming how many others failed.
    """
    cache = cache if cache is not None else default_cache
    jobs = list(jobs)
    if not jobs:
        return []
    for job in jobs:
        if not (isinstance(job, tuple) and len(job) == 3):
            raise TypeError(f"each job must be a (source, kernel_name, arch) tuple, got {job!r:.80}")
    workers = max_workers if max_workers is not None else min(len(jobs), os.cpu_count() or 1)
    results: list[CompiledKernel | None] = [None] * len(jobs)
    errors: list[BaseException] = []
    bar = _Progress(len(jobs)) if progress else None
    done = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(workers, 1), thread_name_prefix="humming_gen-compile") as pool:
        futures = {
            pool.submit(cache.get_or_compile, source, name, arch, compiler=compiler, options=options, debug=debug): i
            for i, (source, name, arch) in enumerate(jobs)
        }
        pending = set(futures)
        try:
            while pending:
                finished, pending = concurrent.futures.wait(
                    pending, timeout=0.1, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in finished:
                    done += 1
                    exc = future.exception()
                    if exc is not None:
                        errors.append(exc)
                    else:
                        results[futures[future]] = future.result()
                if bar is not None:
                    bar.update(done)
        finally:
            if bar is not None:
                bar.close(done)
    if errors:
        first = errors[0]
        if len(errors) > 1:
            first.add_note(f"{len(errors) - 1} other kernel(s) of this compile_many call also failed")
        raise first
    return results  # type: ignore[return-value]

"""Source -> cubin cache, in memory and on disk, plus parallel compilation of many kernels.

The source includes no headers, so the key is a sha256 of everything that decides the cubin: the
source, the entry name, the compiler's name and version, the full option list and the arch. Nothing
else is hashed (no mtimes). A disk entry is a directory ``<kernel-name>-<hash12>/`` holding
``kernel.cu``, ``kernel.cubin``, ``meta.json`` and ``compile.log``; it is built in a temporary directory
inside the cache directory and renamed into place while holding a per-entry ``flock``, so when several
processes ask for the same kernel one compiles and the others wait and read its entry. An entry that
fails its checks (missing cubin, unreadable meta, size or sha256 mismatch, a link or a special file
where a file should be) is rebuilt. Entry files are opened without following links and without
blocking, and checked to be regular files of the size ``meta.json`` records before they are read.

After each new entry, ``prune`` removes scratch left by killed processes, old lock files and failed
sources, and evicts the least recently used entries beyond ``HUMMING_GEN_CACHE_MAX_BYTES``. The
cache is per user: its directories are private (0700); a directory shared by several users is not
supported (another user's entries cannot be read, and the cache then works in memory only).
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
import stat
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
from humming_gen.runtime.compile import CompileCancelled, CompiledKernel

#: Version of the on-disk entry layout; entries of another version are rebuilt.
ENTRY_FORMAT = 1

#: compile_many shows its progress bar only once it has run this long.
PROGRESS_DELAY_S = 1.0

#: Largest ``meta.json`` / ``compile.log`` read from an entry; a larger file is no entry of ours.
MAX_META_BYTES = 1 << 20
MAX_LOG_BYTES = 64 << 20

#: ``prune``: a ``.tmp-*`` build directory this old was left by a killed process.
STALE_SCRATCH_S = 3600.0
#: ``prune``: a lock file unused this long is removed.
STALE_LOCK_S = 86400.0
#: ``prune``: failed sources are kept this long.
FAILED_KEEP_S = 7 * 86400.0

#: How often a thread waiting for another process's entry lock checks its cancel event, in seconds.
LOCK_POLL_S = 0.05

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
def _file_lock(path: Path, cancel: threading.Event | None = None) -> Iterator[None]:
    """Exclusive ``flock`` on ``path``: serialises builders of one entry across processes and threads.

    With ``cancel``, the wait polls so that a cancelled batch does not sit behind another process.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if cancel is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if cancel.is_set():
                        raise CompileCancelled(f"cancelled while waiting for {path}") from None
                    time.sleep(LOCK_POLL_S)
        with contextlib.suppress(OSError):
            os.utime(fd)  # a lock file's mtime says when it was last used (prune removes old ones)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _remove(path: Path) -> None:
    """Delete a file, link or directory tree without following links (best effort)."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)  # fd-based on Linux: never follows links inside
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _read_regular(dir_fd: int, name: str, max_bytes: int, expected_size: int | None = None) -> bytes:
    """Read ``name`` in ``dir_fd``: no link followed, no blocking on a FIFO, only a regular file whose
    size is ``expected_size`` (else at most ``max_bytes``). Anything else raises ``OSError``.
    """
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{name} is not a regular file")
        if expected_size is not None and st.st_size != expected_size:
            raise OSError(f"{name} has {st.st_size} bytes, meta.json says {expected_size}")
        if st.st_size > max_bytes:
            raise OSError(f"{name} has {st.st_size} bytes, more than {max_bytes}")
        data = f.read(st.st_size + 1)  # one byte more shows a file that grew while read
    if len(data) != st.st_size:
        raise OSError(f"{name} changed while it was read")
    return data


def _tree_bytes(path: str) -> int:
    """Bytes of the regular files directly in an entry directory (entries hold no subdirectories)."""
    total = 0
    with contextlib.suppress(OSError), os.scandir(path) as it:
        for child in it:
            with contextlib.suppress(OSError):
                total += child.stat(follow_symlinks=False).st_size
    return total


def _cuda_tool(name: str) -> str | None:
    """`name` on PATH, else in a bin folder of the NVIDIA CUDA wheels (nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm
    put theirs in site-packages/nvidia/cu13/bin, which is not on PATH)."""
    import importlib.util

    exe = shutil.which(name)
    if exe is not None:
        return exe
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        for candidate in sorted(Path(root).glob(f"*/bin/{name}")):
            if os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def _sass(cubin_path: Path) -> str | None:
    """Disassemble a cubin with cuobjdump (or nvdisasm); None when neither tool is installed."""
    for tool, args in (("cuobjdump", ["-sass"]), ("nvdisasm", [])):
        exe = _cuda_tool(tool)
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
                self.prune()
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
            if scratch or _ENTRY_NAME.match(child.name):
                _remove(child)

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
        cancel: threading.Event | None = None,
    ) -> CompiledKernel:
        """Memory hit -> disk hit -> compile (once across threads and processes) and store.

        Once ``cancel`` is set the compile stops and raises ``CompileCancelled``; nothing is stored.
        """
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
                    compiled = self._disk_get_or_compile(
                        key, source, kernel_name, arch, compiler, options, debug, cancel
                    )
                except OSError as exc:  # unwritable cache directory: carry on in memory
                    self._warn_disk(exc)
                    compiled = None
            if compiled is None:
                compiled = self._compile(source, kernel_name, arch, compiler, options, debug, cancel)
                self.misses += 1
            self._memory[key.digest] = compiled
            return compiled

    def _disk_get_or_compile(
        self, key: CacheKey, source: str, kernel_name: str, arch: str,
        compiler: str | None, options: tuple[str, ...], debug: bool, cancel: threading.Event | None = None,
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
        with self._entry_lock(key, cancel):
            compiled = self._read_entry(key)  # another process may have built it while we waited
            if compiled is not None:
                self.disk_hits += 1
                return compiled
            compiled = self._compile(source, kernel_name, arch, compiler, options, debug, cancel)
            if cancel is not None and cancel.is_set():  # finished just as the batch was interrupted
                raise CompileCancelled(f"the compile of {kernel_name} was cancelled; its result is not stored")
            self.misses += 1
            try:
                self._write_entry(key, compiled, source)
            except OSError as exc:  # e.g. disk full: the kernel is still good, keep it in memory
                self._warn_disk(exc)
                return compiled
        with contextlib.suppress(OSError):
            self.prune()
        return compiled

    def _compile(
        self, source: str, kernel_name: str, arch: str, compiler: str | None, options: tuple[str, ...], debug: bool,
        cancel: threading.Event | None = None,
    ) -> CompiledKernel:
        # Looked up at call time so tests can substitute a fake compiler.
        return _compile.compile_source(
            source, kernel_name, arch, compiler=compiler, options=tuple(options), debug=debug,
            keep_ptx=env.dump() and self.disk_enabled, cancel=cancel,
        )

    # ---- disk entries ------------------------------------------------------------------------------

    def _thread_lock(self, key: CacheKey) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key.digest, threading.Lock())

    @contextlib.contextmanager
    def _entry_lock(self, key: CacheKey, cancel: threading.Event | None = None) -> Iterator[None]:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: the cache is per user
        locks = self.directory / ".locks"
        locks.mkdir(mode=0o700, exist_ok=True)
        with _file_lock(locks / f"{key.entry_name}.lock", cancel):
            yield

    def _read_entry(self, key: CacheKey) -> CompiledKernel | None:
        """Load and verify a disk entry; None if it is absent or fails any check.

        Nothing is followed or read that is not a regular file inside a real entry directory: a link
        (to ``/dev/zero``, or an entry directory linked elsewhere), a FIFO or an oversize file makes
        the entry corrupt, and it is rebuilt.
        """
        try:
            dir_fd = os.open(self.entry_path(key), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            meta = json.loads(_read_regular(dir_fd, "meta.json", MAX_META_BYTES))
            size = meta["cubin_size"]
            if (
                meta["format"] != ENTRY_FORMAT
                or meta["key"] != key.digest
                or type(size) is not int
                or size <= 0
            ):
                return None
            cubin = _read_regular(dir_fd, "kernel.cubin", size, expected_size=size)
            if meta["cubin_sha256"] != hashlib.sha256(cubin).hexdigest():
                return None
            try:
                log = _read_regular(dir_fd, "compile.log", MAX_LOG_BYTES).decode(errors="replace")
            except FileNotFoundError:
                log = ""
            compiled = CompiledKernel(
                kernel_name=meta["kernel_name"],
                arch=meta["arch"],
                cubin=cubin,
                log=log,
                compiler=meta["compiler"],
                options=tuple(meta["options"]),
                resources={k: int(v) for k, v in meta["resources"].items()},
                compile_seconds=float(meta["compile_seconds"]),
            )
            with contextlib.suppress(OSError):
                os.utime(dir_fd)  # the directory's mtime is the entry's last use (prune evicts the oldest)
            return compiled
        except (OSError, KeyError, TypeError, ValueError, AttributeError):
            return None
        finally:
            os.close(dir_fd)

    def _write_entry(self, key: CacheKey, compiled: CompiledKernel, source: str) -> None:
        """Build the entry in a scratch directory, then rename it into place (caller holds the lock)."""
        directory = self.directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
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
            if os.path.lexists(final):  # a broken entry (or a link): move it away, then delete it
                trash = directory / f".trash-{key.entry_name}-{uuid.uuid4().hex[:8]}"
                os.rename(final, trash)
                _remove(trash)
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
        if not os.path.lexists(ptx_path):
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
                _compile.write_text_no_follow(path, ptx_path.name, ptx)
        if not os.path.lexists(sass_path):
            sass = _sass(path / "kernel.cubin")
            if sass is not None:
                _compile.write_text_no_follow(path, sass_path.name, sass)

    def _warn_disk(self, exc: OSError) -> None:
        if not self._disk_warned:
            self._disk_warned = True
            hint = ""
            if isinstance(exc, PermissionError):
                hint = (
                    "; the cache is per user, so a directory another user made cannot be shared: point "
                    "HUMMING_GEN_CACHE_DIR at a directory of your own"
                )
            warnings.warn(
                f"humming_gen: disk cache at {self.directory} is unusable ({exc}); caching in memory only{hint}",
                RuntimeWarning, stacklevel=3,
            )

    # ---- housekeeping ------------------------------------------------------------------------------

    def prune(self, *, max_bytes: int | None = None, now: float | None = None) -> int:
        """Tidy the disk cache; returns how many entries were evicted. Runs after each new entry.

        Removes ``.trash-*`` (always), ``.tmp-*`` older than ``STALE_SCRATCH_S`` (left by a killed
        writer), lock files unused for ``STALE_LOCK_S`` and not held, failed sources older than
        ``FAILED_KEEP_S``; then, while the entries take more than ``max_bytes`` (default
        ``HUMMING_GEN_CACHE_MAX_BYTES``; 0: no cap), evicts the least recently used entry (by its
        directory's mtime, which every disk hit refreshes). Entries being built are skipped.
        """
        directory = self.directory
        if not self.disk_enabled or not directory.is_dir():
            return 0
        now = time.time() if now is None else now
        cap = env.cache_max_bytes() if max_bytes is None else max_bytes
        entries: list[tuple[float, str, int]] = []  # (last use, name, bytes)
        with os.scandir(directory) as it:
            children = list(it)
        for child in children:
            try:
                st = child.stat(follow_symlinks=False)
            except OSError:
                continue
            if child.name.startswith(".trash-"):
                _remove(Path(child.path))
            elif child.name.startswith(".tmp-"):
                if now - st.st_mtime > STALE_SCRATCH_S:
                    _remove(Path(child.path))
            elif _ENTRY_NAME.match(child.name) and stat.S_ISDIR(st.st_mode):
                entries.append((st.st_mtime, child.name, _tree_bytes(child.path)))
        self._prune_locks(directory / ".locks", now)
        self._prune_failed(directory / "failed", now)
        if cap <= 0:
            return 0
        total = sum(size for _, _, size in entries)
        evicted = 0
        for _, name, size in sorted(entries):
            if total <= cap:
                break
            if self._evict(name):
                total -= size
                evicted += 1
        return evicted

    def _evict(self, name: str) -> bool:
        """Delete entry ``name`` unless another thread or process holds its lock (it is being built)."""
        locks = self.directory / ".locks"
        locks.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(locks / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            trash = self.directory / f".trash-{name}-{uuid.uuid4().hex[:8]}"
            try:
                os.rename(self.directory / name, trash)
            except OSError:
                return False
            _remove(trash)
            return True
        finally:
            os.close(fd)

    @staticmethod
    def _prune_locks(locks: Path, now: float) -> None:
        """Unlink lock files unused for ``STALE_LOCK_S`` that nobody holds (taken while unlinking)."""
        if not locks.is_dir() or locks.is_symlink():
            return
        for child in list(os.scandir(locks)):
            try:
                if not child.name.endswith(".lock") or now - child.stat(follow_symlinks=False).st_mtime <= STALE_LOCK_S:
                    continue
                fd = os.open(child.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(child.path)
            except OSError:
                pass
            finally:
                os.close(fd)

    @staticmethod
    def _prune_failed(failed: Path, now: float) -> None:
        """Delete failed sources (and their logs) older than ``FAILED_KEEP_S``."""
        if not failed.is_dir() or failed.is_symlink():
            return
        for child in list(os.scandir(failed)):
            with contextlib.suppress(OSError):
                if now - child.stat(follow_symlinks=False).st_mtime > FAILED_KEEP_S:
                    _remove(Path(child.path))


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
    """Progress of a batch compile on stderr, shown only once the work has lasted ``delay`` seconds: a one-line bar
    redrawn in place on a terminal; elsewhere (CI logs, pipes) no carriage-return updates, one summary line."""

    def __init__(self, total: int, stream: TextIO | None = None, delay: float | None = None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.delay = PROGRESS_DELAY_S if delay is None else delay
        self.start = time.perf_counter()
        self.last = 0.0
        self.shown = False
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty())

    def update(self, done: int, *, force: bool = False) -> None:
        now = time.perf_counter()
        elapsed = now - self.start
        if elapsed < self.delay or (not force and now - self.last < 0.1):
            return
        self.last = now
        self.shown = True
        if not self.terminal:
            return
        width = 30
        filled = width * done // max(self.total, 1)
        self.stream.write(
            f"\rhumming_gen: compiling [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} kernels {elapsed:.1f}s"
        )
        self.stream.flush()

    def close(self, done: int) -> None:
        if not self.shown:
            return
        if self.terminal:
            self.update(done, force=True)
            self.stream.write("\n")
        else:
            self.stream.write(f"humming_gen: compiled {done}/{self.total} kernels in "
                              f"{time.perf_counter() - self.start:.1f}s\n")
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
    note naming how many others failed. An interrupt (Ctrl-C) takes effect at once: queued jobs are
    cancelled, running nvcc processes killed, and nothing is recorded for an interrupted kernel.
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
    cancel = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(workers, 1), thread_name_prefix="humming_gen-compile")
    try:
        futures = {
            pool.submit(
                cache.get_or_compile, source, name, arch, compiler=compiler, options=options, debug=debug,
                cancel=cancel,
            ): i
            for i, (source, name, arch) in enumerate(jobs)
        }
        pending = set(futures)
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
    except BaseException:
        # Ctrl-C (KeyboardInterrupt) or any other escape: queued jobs never start, running nvcc
        # process groups are killed, a running NVRTC compile has its result dropped, and nothing of
        # an interrupted kernel is stored. The worker threads finish on their own, within a poll
        # interval for nvcc (an NVRTC call cannot be stopped midway).
        cancel.set()
        raise
    finally:
        pool.shutdown(wait=not cancel.is_set(), cancel_futures=True)
        if bar is not None:
            bar.close(done)
    if errors:
        first = errors[0]
        if len(errors) > 1:
            first.add_note(f"{len(errors) - 1} other kernel(s) of this compile_many call also failed")
        raise first
    return results  # type: ignore[return-value]

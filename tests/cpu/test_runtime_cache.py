"""The cubin cache protocol, with a fake compiler that counts its calls in files.

Counting through files (not a Python counter) lets the same count see compiles made in child
processes, which is what the concurrency test needs.
"""

from __future__ import annotations

import io

import fcntl
import hashlib
import json
import multiprocessing
import os
import stat
import threading
import time
import uuid
from pathlib import Path

import pytest

from humming_gen.runtime import cache as cache_mod
from humming_gen.runtime import compile as compile_mod
from humming_gen.runtime.cache import KernelCache, compile_cached, compile_many, make_key
from humming_gen.runtime.compile import CompiledKernel, CompileError

SOURCE = 'struct Params { float* out; };\nextern "C" __global__ void k(Params p) { p.out[threadIdx.x] = 1.f; }\n'

# Set by the fake_compiler fixture; module globals so that forked children see them too.
_CALLS_DIR: Path | None = None
_DELAY_S = 0.0
_FAIL_NAMES: set[str] = set()


def _fake_compile_source(
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
    assert _CALLS_DIR is not None
    (_CALLS_DIR / f"{os.getpid()}-{uuid.uuid4().hex}").write_text(kernel_name)
    if _DELAY_S:
        time.sleep(_DELAY_S)  # like an NVRTC call: cannot be stopped midway
    if cancel is not None and cancel.is_set():
        raise compile_mod.CompileCancelled(f"fake compile of {kernel_name} cancelled")
    if kernel_name in _FAIL_NAMES:
        raise CompileError(f"fake failure of {kernel_name}", log="fake log", kernel_name=kernel_name, arch=arch)
    digest = hashlib.sha256(f"{source}|{arch}|{options}".encode()).digest()
    return CompiledKernel(
        kernel_name=kernel_name,
        arch=arch,
        cubin=b"\x7fELF" + digest * 16,
        log=f"fake ptxas log for {kernel_name}",
        compiler="fake 1.0",
        options=compile_mod.resolve_options(arch, compiler, tuple(options), debug),
        resources={"registers": 32, "shared_bytes": 0, "stack_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0},
        compile_seconds=0.001,
        ptx="// fake ptx\n" if keep_ptx else None,
    )


class Calls:
    """Counts the fake compiler's calls (in this process and in children)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __len__(self) -> int:
        return len(list(self.directory.iterdir()))

    def set_delay(self, seconds: float) -> None:
        global _DELAY_S
        _DELAY_S = seconds

    def fail(self, *names: str) -> None:
        _FAIL_NAMES.update(names)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Calls:
    global _CALLS_DIR, _DELAY_S
    for var in ("HUMMING_GEN_COMPILER", "HUMMING_GEN_DEBUG", "HUMMING_GEN_NO_CACHE", "HUMMING_GEN_DUMP"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HUMMING_GEN_CACHE_DIR", str(tmp_path / "env-cache"))
    _CALLS_DIR = tmp_path / "calls"
    _CALLS_DIR.mkdir()
    _DELAY_S = 0.0
    _FAIL_NAMES.clear()
    monkeypatch.setattr(compile_mod, "compile_source", _fake_compile_source)
    # The key needs the toolchain version; a fixed one keeps these tests independent of NVRTC.
    monkeypatch.setattr(compile_mod, "compiler_version", lambda compiler=None: "fake 1.0")
    return Calls(_CALLS_DIR)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _entry(cache: KernelCache, kernel_name: str = "k", arch: str = "sm_80") -> Path:
    return cache.entry_path(cache.key(SOURCE, kernel_name, arch))


# ---- hits ------------------------------------------------------------------------------------------


def test_memory_hit(calls: Calls, cache_dir: Path) -> None:
    cache = KernelCache(cache_dir)
    first = cache.get_or_compile(SOURCE, "k", "sm_80")
    second = cache.get_or_compile(SOURCE, "k", "sm_80")
    assert second is first
    assert len(calls) == 1
    assert (cache.misses, cache.memory_hits, cache.disk_hits, cache.hits) == (1, 1, 0, 1)


def test_disk_hit_in_fresh_cache_is_fast(calls: Calls, cache_dir: Path) -> None:
    built = KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80")
    fresh = KernelCache(cache_dir)
    start = time.perf_counter()
    loaded = fresh.get_or_compile(SOURCE, "k", "sm_80")
    elapsed = time.perf_counter() - start
    assert len(calls) == 1
    assert (fresh.disk_hits, fresh.misses) == (1, 0)
    assert elapsed < 0.05, f"disk hit took {elapsed * 1e3:.1f} ms"
    assert loaded == built  # every field survives the round trip through disk


def test_entry_layout(calls: Calls, cache_dir: Path) -> None:
    cache = KernelCache(cache_dir)
    compiled = cache.get_or_compile(SOURCE, "k", "sm_80")
    key = cache.key(SOURCE, "k", "sm_80")
    entry = cache_dir / f"k-{key.digest[:12]}"
    assert entry == cache.entry_path(key)
    assert {p.name for p in entry.iterdir()} == {"kernel.cu", "kernel.cubin", "meta.json", "compile.log"}
    assert (entry / "kernel.cu").read_text() == SOURCE
    assert (entry / "kernel.cubin").read_bytes() == compiled.cubin
    assert (entry / "compile.log").read_text() == compiled.log
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["cubin_sha256"] == hashlib.sha256(compiled.cubin).hexdigest()
    assert meta["cubin_size"] == len(compiled.cubin)
    assert meta["key"] == key.digest
    assert (meta["arch"], meta["compiler"], meta["kernel_name"]) == ("sm_80", "fake 1.0", "k")
    assert meta["options"] == list(compiled.options)
    assert meta["resources"] == compiled.resources
    assert not [p for p in cache_dir.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


def test_key_covers_source_options_arch_compiler(calls: Calls, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = KernelCache(disk=False)
    base = cache.key(SOURCE, "k", "sm_80")
    assert cache.key(SOURCE, "k", "sm_80") == base
    others = [
        cache.key(SOURCE + " ", "k", "sm_80"),
        cache.key(SOURCE, "k", "sm_86"),
        cache.key(SOURCE, "k", "sm_80", options=("-DX=1",)),
        cache.key(SOURCE, "k", "sm_80", debug=True),
        cache.key(SOURCE, "k", "sm_80", compiler="nvcc"),
        make_key(SOURCE, "k", "sm_80", "fake 1.1", compile_mod.resolve_options("sm_80")),
    ]
    assert len({k.digest for k in others} | {base.digest}) == len(others) + 1
    assert base.digest == make_key(SOURCE, "k", "sm_80", "fake 1.0", compile_mod.resolve_options("sm_80")).digest


# ---- concurrency -----------------------------------------------------------------------------------


def _compile_in_child(cache_dir: str, barrier, out_dir: str) -> None:
    barrier.wait(timeout=30)
    compiled = KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80")
    Path(out_dir, f"{os.getpid()}.sha").write_text(compiled.cubin_sha256)


def test_concurrent_processes_compile_once(calls: Calls, cache_dir: Path, tmp_path: Path) -> None:
    calls.set_delay(0.3)  # long enough that all four ask while the first is still compiling
    ctx = multiprocessing.get_context("fork")  # children inherit the fake compiler
    barrier = ctx.Barrier(4)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    procs = [ctx.Process(target=_compile_in_child, args=(str(cache_dir), barrier, str(out_dir))) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    assert len(calls) == 1
    shas = {p.read_text() for p in out_dir.iterdir()}
    assert len(list(out_dir.iterdir())) == 4 and len(shas) == 1


def test_concurrent_threads_compile_once(calls: Calls, cache_dir: Path) -> None:
    calls.set_delay(0.2)
    cache = KernelCache(cache_dir)
    results = compile_many([(SOURCE, "k", "sm_80")] * 4, cache=cache, max_workers=4)
    assert len(calls) == 1
    assert all(r is results[0] for r in results)


# ---- healing ---------------------------------------------------------------------------------------


def _truncate_cubin(entry: Path) -> None:
    data = (entry / "kernel.cubin").read_bytes()
    (entry / "kernel.cubin").write_bytes(data[: len(data) // 2])


def _flip_cubin_byte(entry: Path) -> None:  # same size, different content: only the sha catches it
    data = bytearray((entry / "kernel.cubin").read_bytes())
    data[-1] ^= 0xFF
    (entry / "kernel.cubin").write_bytes(bytes(data))


def _patch_meta(entry: Path, **changes) -> None:
    meta = json.loads((entry / "meta.json").read_text())
    meta.update(changes)
    (entry / "meta.json").write_text(json.dumps(meta))


def _replace_with_fifo(entry: Path, name: str) -> None:
    (entry / name).unlink()
    os.mkfifo(entry / name)  # reading it would block forever: nobody ever writes to it


def _link_cubin_to_dev_zero(entry: Path) -> None:
    (entry / "kernel.cubin").unlink()
    (entry / "kernel.cubin").symlink_to("/dev/zero")  # reading it would grow memory without bound


def _link_cubin_outside(entry: Path) -> None:  # a good cubin, but outside the cache: must not be read
    outside = entry.parent.parent / "outside.cubin"
    (entry / "kernel.cubin").rename(outside)
    (entry / "kernel.cubin").symlink_to(outside)


def _link_entry_outside(entry: Path) -> None:  # a whole good entry, but outside the cache
    outside = entry.parent.parent / "outside-entry"
    entry.rename(outside)
    entry.symlink_to(outside, target_is_directory=True)


CORRUPTIONS = {
    "cubin-fifo": lambda entry: _replace_with_fifo(entry, "kernel.cubin"),
    "meta-fifo": lambda entry: _replace_with_fifo(entry, "meta.json"),
    "log-fifo": lambda entry: _replace_with_fifo(entry, "compile.log"),
    "cubin-link-to-dev-zero": _link_cubin_to_dev_zero,
    "cubin-link-outside": _link_cubin_outside,
    "entry-link-outside": _link_entry_outside,
    "truncated-cubin": _truncate_cubin,
    "missing-cubin": lambda entry: (entry / "kernel.cubin").unlink(),
    "sha-mismatch": _flip_cubin_byte,
    "missing-meta": lambda entry: (entry / "meta.json").unlink(),
    "invalid-meta-json": lambda entry: (entry / "meta.json").write_text('{"format": 1, "key": '),
    "meta-not-an-object": lambda entry: (entry / "meta.json").write_text("[]"),
    "meta-missing-field": lambda entry: _patch_meta(entry, resources=None),
    "meta-other-key": lambda entry: _patch_meta(entry, key="0" * 64),
    "empty-entry": lambda entry: [p.unlink() for p in entry.iterdir()],
}


def _within(seconds: float, fn):
    """Run ``fn`` in a daemon thread: a hang (a FIFO read) fails the test instead of stalling the suite."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s (blocked on a special file?)"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
def test_broken_entry_is_rebuilt(calls: Calls, cache_dir: Path, corrupt) -> None:
    good = KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80")
    entry = _entry(KernelCache(cache_dir))
    corrupt(entry)
    healed = _within(10, lambda: KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80"))
    assert len(calls) == 2
    assert healed.cubin == good.cubin
    again = KernelCache(cache_dir)
    assert again.get_or_compile(SOURCE, "k", "sm_80") == healed
    assert again.disk_hits == 1 and len(calls) == 2  # the rebuilt entry is whole
    assert not [p for p in cache_dir.iterdir() if p.name.startswith((".tmp-", ".trash-"))]
    assert not entry.is_symlink() and not (entry / "kernel.cubin").is_symlink()
    outside = cache_dir.parent / "outside-entry"
    if outside.exists():  # healing replaced the link, and left what it pointed at alone
        assert (outside / "kernel.cubin").read_bytes() == good.cubin


def test_dump_never_writes_through_a_planted_link(calls: Calls, cache_dir: Path, monkeypatch, tmp_path) -> None:
    KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80")
    entry = _entry(KernelCache(cache_dir))
    victim = tmp_path / "victim.ptx"
    (entry / "kernel.ptx").symlink_to(victim)  # dangling: a write through it would create the victim
    monkeypatch.setenv("HUMMING_GEN_DUMP", "1")
    KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80")  # a disk hit writes the dump
    assert not victim.exists()


# ---- switches --------------------------------------------------------------------------------------


def test_no_cache_env_disables_disk(calls: Calls, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUMMING_GEN_NO_CACHE", "1")
    cache = KernelCache(cache_dir)
    assert not cache.disk_enabled
    cache.get_or_compile(SOURCE, "k", "sm_80")
    cache.get_or_compile(SOURCE, "k", "sm_80")  # the memory cache still works
    assert not cache_dir.exists()
    assert len(calls) == 1
    KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80")
    assert len(calls) == 2


def test_disk_false_and_env_cache_dir(calls: Calls, tmp_path: Path) -> None:
    KernelCache(disk=False).get_or_compile(SOURCE, "k", "sm_80")
    assert not (tmp_path / "env-cache").exists()
    cache = KernelCache()  # follows HUMMING_GEN_CACHE_DIR
    cache.get_or_compile(SOURCE, "k", "sm_80")
    assert _entry(cache).is_relative_to(tmp_path / "env-cache") and _entry(cache).is_dir()


def test_disassemblers_are_found_in_the_cuda_wheels_bin_folder(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """HUMMING_GEN_DUMP's SASS: cuobjdump on PATH, else where the nvidia-cuda-cuobjdump wheel puts it
    (site-packages/nvidia/cu13/bin, not on PATH); a file there that is not executable does not count."""
    import importlib.util
    import types

    from humming_gen.runtime import cache as cache_mod

    tool = tmp_path / "nvidia" / "cu13" / "bin" / "cuobjdump"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path / "nvidia")])
    monkeypatch.setattr(cache_mod.shutil, "which", lambda name: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "nvidia" else None)
    assert cache_mod._cuda_tool("cuobjdump") is None  # not executable yet
    tool.chmod(0o755)
    assert cache_mod._cuda_tool("cuobjdump") == str(tool)
    assert cache_mod._cuda_tool("nvdisasm") is None
    monkeypatch.setattr(cache_mod.shutil, "which", lambda name: "/usr/bin/" + name)
    assert cache_mod._cuda_tool("cuobjdump") == "/usr/bin/cuobjdump"  # PATH first


def test_dump_writes_ptx(calls: Calls, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUMMING_GEN_DUMP", "1")
    cache = KernelCache(cache_dir)
    cache.get_or_compile(SOURCE, "k", "sm_80")
    entry = _entry(cache)
    assert (entry / "kernel.ptx").read_text() == "// fake ptx\n"
    # kernel.sass appears only where cuobjdump/nvdisasm can read the cubin; the fake one they cannot.
    (entry / "kernel.ptx").unlink()
    KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80")  # a disk hit restores the dump
    assert (entry / "kernel.ptx").exists()


def test_unusable_cache_dir_falls_back_to_memory(calls: Calls, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    cache = KernelCache(not_a_dir / "cache")
    with pytest.warns(RuntimeWarning, match="memory only"):
        compiled = cache.get_or_compile(SOURCE, "k", "sm_80")
    assert cache.get_or_compile(SOURCE, "k", "sm_80") is compiled
    assert len(calls) == 1


# ---- get / put / clear -----------------------------------------------------------------------------


def test_get_put_clear(calls: Calls, cache_dir: Path) -> None:
    cache = KernelCache(cache_dir)
    key = cache.key(SOURCE, "k", "sm_80")
    assert cache.get(key) is None and cache.misses == 1
    compiled = _fake_compile_source(SOURCE, "k", "sm_80")
    cache.put(key, compiled, SOURCE)
    assert cache.get(key) is compiled and cache.memory_hits == 1
    assert KernelCache(cache_dir).get(key) == compiled
    (cache_dir / "keep.txt").write_text("not ours")
    cache.clear()
    assert len(cache) == 0 and cache.hits == 0 and cache.entry_path(key).exists()
    cache.clear(disk=True)
    assert not cache.entry_path(key).exists()
    assert (cache_dir / "keep.txt").exists()
    assert KernelCache(cache_dir).get(key) is None


def test_compile_cached_uses_default_cache(calls: Calls, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_mod, "default_cache", KernelCache(cache_dir))
    first = compile_cached(SOURCE, "k", "sm_80")
    assert compile_cached(SOURCE, "k", "sm_80") is first
    assert cache_mod.default_cache.memory_hits == 1 and len(calls) == 1


# ---- compile_many ----------------------------------------------------------------------------------


def _jobs(n: int) -> list[tuple[str, str, str]]:
    return [(SOURCE.replace("void k(", f"void k{i}("), f"k{i}", "sm_80") for i in range(n)]


def test_compile_many_keeps_order(calls: Calls, cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = _jobs(6)
    results = compile_many(jobs, cache=KernelCache(cache_dir), max_workers=3)
    assert [r.kernel_name for r in results] == [name for _, name, _ in jobs]
    assert len(calls) == 6
    assert capsys.readouterr().err == ""  # fast batches draw no progress bar
    assert compile_many([]) == []


def test_compile_many_progress_bar(calls: Calls, cache_dir: Path, monkeypatch, capsys) -> None:
    """Not a terminal (a CI log): no carriage-return redraws, one summary line."""
    monkeypatch.setattr(cache_mod, "PROGRESS_DELAY_S", 0.0)
    calls.set_delay(0.15)
    compile_many(_jobs(4), cache=KernelCache(cache_dir), max_workers=2)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.count("\n") == 1 and "compiled 4/4 kernels" in err and err.endswith("\n")


def test_progress_bar_redraws_in_place_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    bar = cache_mod._Progress(4, stream=stream, delay=0.0)
    bar.update(1, force=True)
    bar.update(3, force=True)
    bar.close(4)
    text = stream.getvalue()
    assert text.count("\r") == 3 and "4/4 kernels" in text and text.endswith("\n")


def test_compile_many_raises_first_failure_after_the_rest(calls: Calls, cache_dir: Path) -> None:
    """Two kernels of a batch fail: the user gets the first one's own CompileError, with a note on the other."""
    calls.fail("k1", "k3")
    cache = KernelCache(cache_dir)
    with pytest.raises(CompileError, match=r"fake failure of k[13]") as info:
        compile_many(_jobs(5), cache=cache, max_workers=2)
    assert type(info.value) is CompileError and info.value.log == "fake log"
    assert info.value.__notes__ == ["1 other kernel(s) of this compile_many call also failed"]
    assert len(cache) == 3  # the good ones are cached


def test_compile_many_rejects_bad_jobs(calls: Calls) -> None:
    with pytest.raises(TypeError, match="source, kernel_name, arch"):
        compile_many([(SOURCE, "k")])  # type: ignore[list-item]


# ---- the real compiler through the cache -----------------------------------------------------------


def test_real_nvrtc_disk_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HUMMING_GEN_COMPILER", "HUMMING_GEN_DEBUG", "HUMMING_GEN_NO_CACHE", "HUMMING_GEN_DUMP"):
        monkeypatch.delenv(var, raising=False)
    built = KernelCache(tmp_path).get_or_compile(SOURCE, "k", "sm_90a")
    fresh = KernelCache(tmp_path)
    start = time.perf_counter()
    loaded = fresh.get_or_compile(SOURCE, "k", "sm_90a")
    elapsed = time.perf_counter() - start
    assert fresh.disk_hits == 1 and loaded == built and loaded.compiler.startswith("nvrtc ")
    assert elapsed < 0.05, f"disk hit took {elapsed * 1e3:.1f} ms"


# ---- housekeeping and the size cap -----------------------------------------------------------------


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_new_entry_prunes_scratch_old_locks_and_old_failed_sources(calls: Calls, cache_dir: Path) -> None:
    KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80")
    (cache_dir / ".trash-k-000000000000-dead").mkdir()  # left by a process killed while deleting
    old_tmp, new_tmp = cache_dir / ".tmp-k-000000000000-old", cache_dir / ".tmp-k-000000000000-new"
    old_tmp.mkdir()
    new_tmp.mkdir()  # another process may be building this one right now
    _age(old_tmp, cache_mod.STALE_SCRATCH_S + 60)
    locks = cache_dir / ".locks"
    old_lock, held_lock, new_lock = locks / "old-0.lock", locks / "held-0.lock", locks / "new-0.lock"
    for lock in (old_lock, held_lock, new_lock):
        lock.write_text("")
    _age(old_lock, cache_mod.STALE_LOCK_S + 60)
    _age(held_lock, cache_mod.STALE_LOCK_S + 60)
    failed = cache_dir / "failed"
    failed.mkdir(exist_ok=True)
    old_failed, new_failed = failed / "old-000000000000.cu", failed / "new-000000000000.cu"
    old_failed.write_text("")
    new_failed.write_text("")
    _age(old_failed, cache_mod.FAILED_KEEP_S + 60)
    with open(held_lock) as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # someone waits on or holds this lock: it must stay
        KernelCache(cache_dir).get_or_compile(SOURCE.replace("1.f", "2.f"), "k", "sm_80")  # a new entry
    assert not (cache_dir / ".trash-k-000000000000-dead").exists()
    assert not old_tmp.exists() and new_tmp.exists()
    assert not old_lock.exists() and held_lock.exists() and new_lock.exists()
    assert not old_failed.exists() and new_failed.exists()


def test_size_cap_evicts_least_recently_used(calls: Calls, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sources = {f"k{i}": SOURCE.replace("void k(", f"void k{i}(") for i in range(4)}
    cache = KernelCache(cache_dir)
    for name in ("k0", "k1", "k2"):
        cache.get_or_compile(sources[name], name, "sm_80")
    entries = {name: cache.entry_path(cache.key(src, name, "sm_80")) for name, src in sources.items()}
    size = max(cache_mod._tree_bytes(str(entries[name])) for name in ("k0", "k1", "k2"))
    for age, name in ((400, "k0"), (300, "k1"), (200, "k2")):
        _age(entries[name], age)
    assert KernelCache(cache_dir).get_or_compile(sources["k0"], "k0", "sm_80")  # a disk hit: k0 is used again
    monkeypatch.setenv("HUMMING_GEN_CACHE_MAX_BYTES", str(3 * size + size // 2))
    cache.get_or_compile(sources["k3"], "k3", "sm_80")  # four entries, room for three
    assert [entries[n].exists() for n in ("k0", "k1", "k2", "k3")] == [True, False, True, True]
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".trash-")]
    monkeypatch.setenv("HUMMING_GEN_CACHE_MAX_BYTES", "0")  # no cap
    assert cache.prune(now=time.time()) == 0
    assert cache.prune(max_bytes=1) == 3  # everything beyond one byte goes


def test_bad_cache_cap_names_the_variable(calls: Calls, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUMMING_GEN_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match=r"HUMMING_GEN_CACHE_MAX_BYTES='lots' is not a size; allowed: .*500M"):
        KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80")
    monkeypatch.setenv("HUMMING_GEN_CACHE_MAX_BYTES", "3M")
    assert cache_mod.env.cache_max_bytes() == 3 * 1024**2


def test_cache_directories_are_private(calls: Calls, cache_dir: Path) -> None:
    """The cache is per user (README): what it creates, others can neither read nor plant into."""
    KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80")
    for path in (cache_dir, cache_dir / ".locks", _entry(KernelCache(cache_dir))):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


def test_someone_elses_cache_warns_that_the_cache_is_per_user(
    calls: Calls, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(cache_dir / ".locks" / "k.lock"))

    monkeypatch.setattr(cache_mod, "_file_lock", denied)
    cache = KernelCache(cache_dir)
    with pytest.warns(RuntimeWarning, match="memory only; the cache is per user.*HUMMING_GEN_CACHE_DIR"):
        compiled = cache.get_or_compile(SOURCE, "k", "sm_80")
    assert cache.get_or_compile(SOURCE, "k", "sm_80") is compiled

"""The cubin cache protocol, with a fake compiler that counts its calls in files.

Counting through files (not a Python counter) lets the same count see compiles made in child
processes, which is what the concurrency test needs.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
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
) -> CompiledKernel:
    assert _CALLS_DIR is not None
    (_CALLS_DIR / f"{os.getpid()}-{uuid.uuid4().hex}").write_text(kernel_name)
    if _DELAY_S:
        time.sleep(_DELAY_S)
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


CORRUPTIONS = {
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


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
def test_broken_entry_is_rebuilt(calls: Calls, cache_dir: Path, corrupt) -> None:
    good = KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80")
    entry = _entry(KernelCache(cache_dir))
    corrupt(entry)
    healed = KernelCache(cache_dir).get_or_compile(SOURCE, "k", "sm_80")
    assert len(calls) == 2
    assert healed.cubin == good.cubin
    again = KernelCache(cache_dir)
    assert again.get_or_compile(SOURCE, "k", "sm_80") == healed
    assert again.disk_hits == 1 and len(calls) == 2  # the rebuilt entry is whole
    assert not [p for p in cache_dir.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


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
    monkeypatch.setattr(cache_mod, "PROGRESS_DELAY_S", 0.0)
    calls.set_delay(0.15)
    compile_many(_jobs(4), cache=KernelCache(cache_dir), max_workers=2)
    err = capsys.readouterr().err
    assert "humming_gen: compiling [" in err and "4/4 kernels" in err and err.endswith("\n")


def test_compile_many_raises_first_failure_after_the_rest(calls: Calls, cache_dir: Path) -> None:
    calls.fail("k1", "k3")
    cache = KernelCache(cache_dir)
    with pytest.raises(CompileError, match="fake failure") as info:
        compile_many(_jobs(5), cache=cache, max_workers=2)
    assert any("1 other kernel(s)" in note for note in getattr(info.value, "__notes__", []))
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

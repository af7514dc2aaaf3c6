"""Ctrl-C during a batch compile, and nvcc's intermediates, tried on a child process with stand-in compilers.

The child runs ``compile_many`` in its own session; the test sends SIGINT to that whole process group,
as a terminal's Ctrl-C does, and checks that the child exits promptly, that queued kernels never
started, that no compiler process is left running, and that nothing was recorded: no cache entry, no
saved "failed" source, nothing in the system temp dir. Two stand-ins: a Python compile that cannot
be stopped midway (as an NVRTC call) and a shell script on PATH named ``nvcc`` that writes an
intermediate into ``$TMPDIR`` and waits on a child process (as nvcc waits on cicc and ptxas).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from humming_gen.runtime import compile as compile_mod
from humming_gen.runtime.cache import KernelCache

JOBS = 12
WORKERS = 2

_CHILD = r"""
import sys, time
from pathlib import Path
from humming_gen.runtime import cache as cache_mod, compile as compile_mod

mode, cache_dir, calls_dir = sys.argv[1:4]
if mode == "python":
    def fake_compile_source(source, kernel_name, arch, *, compiler=None, options=(), debug=False,
                            keep_ptx=False, cancel=None):
        Path(calls_dir, kernel_name).write_text("")
        time.sleep(1.0)  # as an NVRTC call: cannot be stopped midway
        if cancel is not None and cancel.is_set():
            raise compile_mod.CompileCancelled(kernel_name)
        return compile_mod.CompiledKernel(kernel_name=kernel_name, arch=arch, cubin=b"\x7fELF" + b"\0" * 60,
                                          log="", compiler="fake 1.0", options=(), resources={},
                                          compile_seconds=1.0)
    compile_mod.compile_source = fake_compile_source
    compile_mod.compiler_version = lambda compiler=None: "fake 1.0"
jobs = [(f'extern "C" __global__ void k{i}(int p) {{}}\n', f"k{i}", "sm_80") for i in range(%(jobs)d)]
cache_mod.compile_many(jobs, compiler="nvcc" if mode == "nvcc" else "nvrtc", cache=cache_mod.KernelCache(cache_dir),
                       max_workers=%(workers)d, progress=False)
print("finished without interruption")
""" % {"jobs": JOBS, "workers": WORKERS}

# Stands in for nvcc: records its pid and its child's, leaves an intermediate in $TMPDIR, and waits.
_FAKE_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0; fi
: > "${TMPDIR:-/tmp}/tmpxft_$$_fake.cpp"
sleep 60 &
echo $! > "$HG_CALLS/$$.child"
echo $$ > "$HG_CALLS/$$.nvcc"
wait
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a reaper does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    paths = {name: tmp_path / name for name in ("cache", "calls", "systmp", "bin")}
    for name in ("calls", "systmp", "bin"):
        paths[name].mkdir()
    nvcc = paths["bin"] / "nvcc"
    nvcc.write_text(_FAKE_NVCC)
    nvcc.chmod(0o755)
    return paths


def _start(mode: str, world: dict[str, Path]) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "PATH": f"{world['bin']}{os.pathsep}{os.environ.get('PATH', '')}",
        "TMPDIR": str(world["systmp"]),
        "HG_CALLS": str(world["calls"]),
    }
    for var in ("HUMMING_GEN_NO_CACHE", "HUMMING_GEN_DUMP", "HUMMING_GEN_COMPILER", "HUMMING_GEN_CACHE_DIR"):
        env.pop(var, None)
    env["HUMMING_GEN_CACHE_DIR"] = str(world["cache"])  # failed sources would land in cache/failed
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, mode, str(world["cache"]), str(world["calls"])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,  # its own process group, so the test can Ctrl-C exactly that group
    )


def _started(world: dict[str, Path], mode: str) -> list[Path]:
    pattern = "*.nvcc" if mode == "nvcc" else "k*"
    return sorted(world["calls"].glob(pattern))


@pytest.mark.parametrize("mode", ["python", "nvcc"])
def test_ctrl_c_stops_a_batch_at_once_and_records_nothing(mode: str, world: dict[str, Path]) -> None:
    proc = _start(mode, world)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60  # the child imports torch first
        while len(_started(world, mode)) < WORKERS:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.05)
        time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        sent = time.monotonic()
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("the batch went on compiling for 10 s after Ctrl-C")
        took = time.monotonic() - sent
        pids = [int(p.read_text()) for p in world["calls"].glob("*.nvcc")]
        pids += [int(p.read_text()) for p in world["calls"].glob("*.child") if p.read_text().strip()]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for pid in pids:  # clean up after a failure; a passing run left nothing to kill
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGINT, out
    assert "KeyboardInterrupt" in out and "finished without interruption" not in out
    assert took < 3.0, f"exit took {took:.1f} s after Ctrl-C"
    assert len(_started(world, mode)) == WORKERS, "queued kernels were compiled after Ctrl-C"
    assert not [pid for pid in pids if _alive(pid)], "compiler processes outlived the interrupt"
    cache = world["cache"]
    recorded = sorted(p.name for p in cache.iterdir() if p.name != ".locks") if cache.exists() else []
    assert not recorded, f"recorded for interrupted kernels: {recorded}"
    assert not list(world["systmp"].iterdir()), "left in the system temp dir"


def test_nvcc_intermediates_stay_in_a_private_dir_removed_afterwards(
    world: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvcc runs with TMPDIR inside the compile's own temporary directory, which is removed, also on failure."""
    monkeypatch.setenv("PATH", f"{world['bin']}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("TMPDIR", str(world["systmp"]))
    monkeypatch.setenv("HG_CALLS", str(world["calls"]))
    monkeypatch.setenv("HUMMING_GEN_CACHE_DIR", str(world["cache"]))
    monkeypatch.setattr(compile_mod.tempfile, "tempdir", str(world["systmp"]))
    compile_mod._compiler_version.cache_clear()
    # A stand-in that leaves its intermediate behind and fails at once.
    (world["bin"] / "nvcc").write_text(_FAKE_NVCC.replace("sleep 60 &", "echo 'fake error'; exit 1\nsleep 60 &"))
    try:
        with pytest.raises(compile_mod.CompileError, match="fake error"):
            compile_mod.compile_source('extern "C" __global__ void k(int p) {}\n', "k", "sm_80", compiler="nvcc")
    finally:
        compile_mod._compiler_version.cache_clear()
    assert not list(world["systmp"].iterdir()), "nvcc's intermediates were left in the system temp dir"


def test_cancel_event_stops_get_or_compile_and_stores_nothing(world: dict[str, Path], monkeypatch) -> None:
    """The in-process side of the same promise: a set cancel event records nothing."""
    monkeypatch.setattr(compile_mod, "compiler_version", lambda compiler=None: "fake 1.0")
    cancel = threading.Event()
    cancel.set()
    cache = KernelCache(world["cache"])
    with pytest.raises(compile_mod.CompileCancelled):
        cache.get_or_compile('extern "C" __global__ void k(int p) {}\n', "k", "sm_80", cancel=cancel)
    assert len(cache) == 0
    assert not world["cache"].exists() or not [p for p in world["cache"].iterdir() if p.name != ".locks"]


def test_nvcc_killed_from_outside_is_no_failed_source(world: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """An nvcc killed by a signal (OOM killer, kill) says so, and its source is not kept as a failed one."""
    monkeypatch.setenv("PATH", f"{world['bin']}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("HG_CALLS", str(world["calls"]))
    monkeypatch.setenv("HUMMING_GEN_CACHE_DIR", str(world["cache"]))
    monkeypatch.setattr(compile_mod.tempfile, "tempdir", str(world["systmp"]))
    compile_mod._compiler_version.cache_clear()
    (world["bin"] / "nvcc").write_text(_FAKE_NVCC.replace("sleep 60 &", "kill -9 $$\nsleep 60 &"))
    try:
        with pytest.raises(compile_mod.CompileError, match=r"nvcc was killed by signal 9 \(SIGKILL\)") as info:
            compile_mod.compile_source('extern "C" __global__ void k(int p) {}\n', "k", "sm_80", compiler="nvcc")
    finally:
        compile_mod._compiler_version.cache_clear()
    assert info.value.source_path is None
    assert not (world["cache"] / "failed").exists()
    assert not list(world["systmp"].iterdir())

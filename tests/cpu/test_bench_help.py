"""Every bench/ and scripts/ Python script answers --help with its usage and exit 0 on a machine without a GPU:
a new user's first command must neither touch CUDA, compile a kernel nor mistake --help for a preset or an M."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*REPO.glob("bench/*.py"), *REPO.glob("scripts/*.py")])
# script (relative to the repository) -> why it cannot answer --help; keep empty unless a script truly cannot
EXCLUDED: dict[str, str] = {}
TIMEOUT_S = 60  # one --help imports torch and humming_gen (2-3 s); a script that runs instead of parsing hangs here


def _help(script: Path, cache: Path) -> tuple[int, str]:
    """(exit code, stdout + stderr) of `python <script> --help` with no GPU visible and the kernel cache in `cache`."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO), "HUMMING_GEN_CACHE_DIR": str(cache)}
    try:
        result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, env=env,
                                cwd=REPO, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return -1, f"no answer within {TIMEOUT_S} s: the script ran instead of printing its usage"
    return result.returncode, result.stdout + result.stderr


@pytest.fixture(scope="module")
def help_outputs(tmp_path_factory) -> dict[str, tuple[int, str]]:
    """All the --help runs at once, in parallel: each is mostly torch's import, so serially they take a minute.
    A script that compiled a kernel before parsing its arguments would leave it in its own cache directory."""
    root = tmp_path_factory.mktemp("bench_help")
    scripts = [s for s in SCRIPTS if str(s.relative_to(REPO)) not in EXCLUDED]
    caches = [root / s.parent.name / s.stem for s in scripts]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(_help, scripts, caches))
    for i, cache in enumerate(caches):
        if cache.exists() and any(cache.rglob("*")):
            results[i] = (-1, f"--help compiled or cached something: {sorted(cache.rglob('*'))[:5]}")
    return {str(s.relative_to(REPO)): r for s, r in zip(scripts, results)}


def test_scripts_are_found():
    assert len(SCRIPTS) > 20 and all(name in {str(s.relative_to(REPO)) for s in SCRIPTS} for name in EXCLUDED)


@pytest.mark.parametrize("script", [str(s.relative_to(REPO)) for s in SCRIPTS])
def test_help_prints_usage_and_exits_0(help_outputs, script):
    if script in EXCLUDED:
        pytest.skip(EXCLUDED[script])
    rc, output = help_outputs[script]
    assert rc == 0 and "usage" in output.lower(), f"{script} --help: rc {rc}\n{output[-1500:]}"

"""scripts/gpu_test_part.py: the GPU suite dealt into parts for device calls too short for all of it."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("gpu_test_part",
                                               Path(__file__).parents[2] / "scripts" / "gpu_test_part.py")
gpu_test_part = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_test_part)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_parts_cover_every_file_once_and_balance_the_counts(n: int) -> None:
    counts = {f"tests/gpu/t{i}.py": c for i, c in enumerate([90, 73, 60, 41, 40, 33, 9, 6, 1, 1])}
    parts = gpu_test_part.parts(counts, n)
    files = [f for p in parts for f in p]
    assert sorted(files) == sorted(counts) and len(files) == len(set(files))
    loads = [sum(counts[f] for f in p) for p in parts]
    assert max(loads) - min(loads) <= max(counts.values())  # greedy: within one file of each other
    assert parts == gpu_test_part.parts(dict(reversed(list(counts.items()))), n)  # deterministic


def test_the_real_suite_splits_in_two_halves() -> None:
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    halves = [subprocess.run([sys.executable, "scripts/gpu_test_part.py", f"{i}/2"], cwd=root, capture_output=True,
                             text=True, check=True).stdout.split() for i in (1, 2)]
    assert halves[0] and halves[1] and not set(halves[0]) & set(halves[1])
    every = sorted(str(p.relative_to(root)) for p in (root / "tests/gpu").glob("test_*.py"))
    assert sorted(halves[0] + halves[1]) == every
    empty = subprocess.run([sys.executable, "scripts/gpu_test_part.py", f"{len(every) + 1}/{len(every) + 1}"],
                           cwd=root, capture_output=True, text=True)
    assert empty.returncode == 2 and not empty.stdout and "more parts than" in empty.stderr

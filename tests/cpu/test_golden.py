"""The generator reproduces the golden sources of tests/golden/ byte for byte (the line recording the local
toolchain version and flags aside). A change to a template or to compose() that alters them must come with
regenerated files: run `python tests/golden/regenerate.py` and review the diff like any code change."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"


def _regenerate_module():
    spec = importlib.util.spec_from_file_location("golden_regenerate", GOLDEN_DIR / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REGEN = _regenerate_module()


def test_golden_set() -> None:
    assert len(REGEN.GOLDEN) >= 3
    on_disk = {p.name for p in GOLDEN_DIR.glob("*.cu")}
    assert on_disk == set(REGEN.GOLDEN), "golden .cu files and regenerate.GOLDEN disagree"


@pytest.mark.parametrize("name", sorted(REGEN.GOLDEN))
def test_generator_reproduces_golden(name: str, tmp_path: Path) -> None:
    golden = (GOLDEN_DIR / name).read_text()
    fresh = REGEN.emit(name, tmp_path / name).read_text()
    want, got = REGEN.mask_toolchain(golden), REGEN.mask_toolchain(fresh)
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"golden/{name}",
                                            "generated", n=2))
        lines = diff.splitlines()
        shown = "\n".join(lines[:80]) + (f"\n... ({len(lines) - 80} more diff lines)" if len(lines) > 80 else "")
        pytest.fail(f"the generator no longer reproduces tests/golden/{name}. If the change is intended, run "
                    f"`python tests/golden/regenerate.py` and review the diff of tests/golden/.\n{shown}",
                    pytrace=False)


def test_masking_touches_only_the_toolchain_line() -> None:
    name = sorted(REGEN.GOLDEN)[0]
    golden = (GOLDEN_DIR / name).read_text()
    masked = REGEN.mask_toolchain(golden)
    changed = [(a, b) for a, b in zip(golden.splitlines(), masked.splitlines()) if a != b]
    assert len(changed) == 1 and changed[0][0].startswith("// target ") and "<toolchain>" in changed[0][1]
    assert len(golden.splitlines()) == len(masked.splitlines())

"""The built wheel ships the templates and the runtime inside the package (no checkout paths), and the
declared Python version is the one the code and the test requirements need."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: What the wheel is built from; copied out of the checkout so that the build leaves nothing in it.
_BUILD_INPUTS = ("pyproject.toml", "README.md", "humming_gen", "runtime", "templates")


def test_wheel_holds_templates_and_runtime(tmp_path):
    """Built offline from a copy (setuptools comes with torch), so no build/ in the checkout and no index."""
    src = tmp_path / "src"
    src.mkdir()
    for name in _BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, src / name)
    build_existed = (ROOT / "build").exists()
    env = {**os.environ, "PIP_NO_INDEX": "1"}  # as on a machine without network
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=600, env=env)
    assert build_existed or not (ROOT / "build").exists(), "the build left build/ in the checkout"
    wheel = next((tmp_path / "dist").glob("humming_gen-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = sorted(p.relative_to(ROOT / "templates").as_posix() for p in (ROOT / "templates").rglob("*.j2"))
    assert templates, "no templates found in the checkout"
    missing = [t for t in templates if f"humming_gen/templates/{t}" not in names]
    assert not missing, f"templates missing from the wheel: {missing}"
    runtime = sorted(p.name for p in (ROOT / "runtime").glob("*.py"))
    missing = [r for r in runtime if f"humming_gen/runtime/{r}" not in names]
    assert not missing, f"runtime modules missing from the wheel: {missing}"
    assert not any(n.startswith("runtime/") or n.startswith("templates/") for n in names), "top-level modules leaked"
    assert "humming_gen/cli.py" in names


def test_declared_python_is_the_one_the_code_needs():
    """3.11+: the runtime uses 3.11 APIs (BaseException.add_note, tomllib here) and the pinned test
    requirements (numpy 2.4) need 3.11; pyproject and the README must say the same."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert declared == ">=3.11"
    said = set(re.findall(r"Python (3\.\d+)\+", (ROOT / "README.md").read_text()))
    assert said == {"3.11"}, f"the README names Python {sorted(said)}"
    assert sys.version_info >= (3, 11)

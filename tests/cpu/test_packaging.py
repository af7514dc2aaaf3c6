"""The built wheel ships the templates and the runtime inside the package (no checkout paths)."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_holds_templates_and_runtime(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    wheel = next(tmp_path.glob("humming_gen-*.whl"))
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

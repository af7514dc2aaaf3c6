"""The README's environment-variable table names exactly the switches the code reads."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_table_matches_the_switches_read() -> None:
    read = set()
    for path in [*(ROOT / "humming_gen").rglob("*.py"), *(ROOT / "runtime").glob("*.py")]:
        read |= set(re.findall(r"[\"'](HUMMING_GEN_[A-Z_]+)[\"']", path.read_text()))
    readme = (ROOT / "README.md").read_text()
    table = set(re.findall(r"^\| `(HUMMING_GEN_[A-Z_]+)` \|", readme, flags=re.MULTILINE))
    assert read, "no switch found in the code"
    assert table == read, f"README only: {sorted(table - read)}; code only: {sorted(read - table)}"

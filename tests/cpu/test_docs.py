"""The project's docs stand on their own: every Markdown file a comment, docstring or doc cites is in the
repository, and every cited section of docs/FORMATS.md exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MD_REF = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
SECTION_REF = re.compile(r"docs/FORMATS\.md,? (?:section )?(\d+(?:\.\d+)?)")


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / n for n in names if n.endswith((".py", ".md", ".sh", ".j2", ".txt", ".toml")) or "/" not in n]


def test_cited_markdown_files_exist():
    missing = []
    for path in _tracked_text_files():
        if not path.is_file():
            continue
        for ref in MD_REF.findall(path.read_text(errors="replace")):
            if not (ROOT / ref).is_file() and not (path.parent / ref).is_file():
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not missing, "cited but not in the repository:\n" + "\n".join(sorted(set(missing)))


def test_cited_formats_sections_exist():
    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", (ROOT / "docs/FORMATS.md").read_text(), re.M))
    missing = []
    for path in _tracked_text_files():
        if path.is_file():
            missing += [f"{path.relative_to(ROOT)}: {s}" for s in SECTION_REF.findall(path.read_text(errors="replace"))
                        if s not in headings]
    assert not missing, "sections of docs/FORMATS.md cited but missing:\n" + "\n".join(missing)

"""The repository stands on its own: no file points to design notes or machine paths outside
it, and every relative link in its Markdown resolves to a file in the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\b(PROBES|RELIABILITY|PERFORMANCE|ARCHITECTURE)\.md\b|shared/design|"
                     r"(?<![\w.])/(work|home|root|Users)/[\w.-]+")
TEXT = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".ini")


def _files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [ROOT / f for f in listed if f.endswith(TEXT) or Path(f).name == "run"]


def test_nothing_points_outside_the_repository():
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}"
            for p in _files() if p.is_file() and p.name != "test_self_contained.py"
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if OUTSIDE.search(line)]
    assert not hits, "\n".join(hits)


def test_relative_markdown_links_resolve():
    broken = []
    for p in _files():
        if p.suffix != ".md" or not p.is_file():
            continue
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", p.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (p.parent / target).exists():
                broken.append(f"{p.relative_to(ROOT)} -> {target}")
    assert not broken, broken

"""Files a reader can hold: no source file of blocklab over 400 lines (split along a real seam
when one grows past it: docs/contributing.md)."""

from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LIMIT = 400


def long_files(root: Path, limit: int = LIMIT) -> list[str]:
    """``path: lines`` of every ``.py`` file under ``root`` longer than ``limit`` lines."""
    out = []
    for path in sorted(root.rglob("*.py")):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out.append(f"{path.relative_to(root)}: {n} lines")
    return out


def test_no_source_file_is_over_400_lines() -> None:
    assert not long_files(SRC), "split these along a seam: " + "; ".join(long_files(SRC))


def test_the_check_sees_a_long_file(tmp_path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * LIMIT)
    assert long_files(tmp_path) == [f"pkg/long.py: {LIMIT + 1} lines"]

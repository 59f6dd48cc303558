"""The one atomic directory writer (files.write_dir_atomic), crash-consistent at every point:
a writer really killed (SIGKILL, through its fault points, docs: faults.py) before it fills its
temporary, half-way through filling it, once it is complete but not renamed, between the two
renames of a replacement, and once it is in place — leaves the old content in place or
recoverable, never half of the new one; the next write (or :func:`recover_leftovers`) puts
back or removes what it left. Its users (checkpoints, probe reports, exports and imports,
prepared corpora) each have a test that a fault inside the writer reaches them:
tests/train/test_checkpoint.py, tests/test_process_faults.py, tests/convert/test_import_faults.py,
tests/data/test_prepare_faults.py."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from blocklab import files
from blocklab.errors import StorageError
from blocklab.files import STAGES, recover_leftovers, write_dir_atomic

OLD = {"a.txt": b"old a", "sub/b.txt": b"old b"}
NEW = {"a.txt": b"new a", "sub/b.txt": b"new b", "c.txt": b"new c"}

# A writer of NEW into argv[1] (replacing what is there when argv[2] == "1"); argv[3] == "1"
# kills it half-way through filling its temporary (one file written, one half-written).
WRITER = """
import os, signal, sys
from pathlib import Path
from blocklab.files import write_dir_atomic

out, overwrite, mid = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"

def fill(tmp):
    (tmp / "a.txt").write_bytes(b"new a")
    (tmp / "sub").mkdir()
    if mid:
        (tmp / "sub" / "b.txt").write_bytes(b"ne")
        os.kill(os.getpid(), signal.SIGKILL)
    (tmp / "sub" / "b.txt").write_bytes(b"new b")
    (tmp / "c.txt").write_bytes(b"new c")

write_dir_atomic(out, fill, what="w", overwrite=overwrite)
print(os.getpid())
"""


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith((".tmp-", ".old-")))


def _write(out: Path, *, overwrite: bool, fault: str | None = None, mid: bool = False
           ) -> subprocess.CompletedProcess:
    env = {**os.environ, "BLOCKLAB_FAULT": fault or ""}
    return subprocess.run([sys.executable, "-c", WRITER, str(out), "1" if overwrite else "0",
                           "1" if mid else "0"], capture_output=True, text=True, timeout=300,
                          env=env)


def _old(out: Path) -> None:
    for name, data in OLD.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)


# where each kill lands: (fault, killed mid-fill, what ``out`` holds right after the kill —
# for a replacement / for a new directory — and what it holds once the leftovers are recovered)
KILLS = {
    "before-fill": ("SIGKILL@dir-tmp:1", False, ("old", "none"), ("old", "none")),
    "mid-fill": (None, True, ("old", "none"), ("old", "none")),
    "before-rename": ("SIGKILL@dir-filled:1", False, ("old", "none"), ("old", "none")),
    "between-renames": ("SIGKILL@dir-aside:1", False, ("none", None), ("old", None)),
    "after-rename": ("SIGKILL@dir-placed:1", False, ("new", "new"), ("new", "new")),
}
STATES = {"old": OLD, "new": NEW}


CASES = [pytest.param(point, overwrite, id=f"{point}-{'replacing' if overwrite else 'new'}")
         for point in KILLS for overwrite in (True, False)
         if KILLS[point][2][0 if overwrite else 1] is not None]  # new: nothing to move aside


@pytest.mark.parametrize(("point", "overwrite"), CASES)
def test_a_writer_killed_at_any_point_leaves_the_old_content_or_the_new_whole(tmp_path, point,
                                                                              overwrite):
    fault, mid, right_after, recovered = KILLS[point]
    after, then = right_after[0 if overwrite else 1], recovered[0 if overwrite else 1]
    out = tmp_path / "out"
    if overwrite:
        _old(out)
    r = _write(out, overwrite=overwrite, fault=fault, mid=mid)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert (_tree(out) if out.exists() else None) == STATES.get(after), point  # never half
    if point == "between-renames":  # the only complete old copy is the one moved aside
        (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith(".old-out-")]
        assert _tree(aside) == OLD
    recover_leftovers(out)  # what the next write does first
    assert (_tree(out) if out.exists() else None) == STATES.get(then)
    assert _leftovers(tmp_path) == []
    again = _write(out, overwrite=True)  # and the next write goes through
    assert again.returncode == 0, again.stderr[-2000:]
    assert _tree(out) == NEW and _leftovers(tmp_path) == []


def test_the_fault_points_fire_in_order_numbered_per_write(tmp_path, monkeypatch):
    """``dir-<stage>:N`` (N: this process's N-th directory write) and the caller's own hook
    are reached at the same points, in order: tmp, filled, aside, placed."""
    seen: list[tuple[str, int]] = []
    hooked: list[str] = []
    monkeypatch.setattr(files, "maybe_fault", lambda point, n: seen.append((point, n)))
    out = tmp_path / "out"
    _old(out)
    write_dir_atomic(out, lambda d: (d / "x").write_text("x"), what="w", overwrite=True,
                     fault=hooked.append)
    write_dir_atomic(tmp_path / "other", lambda d: None, what="w")
    n = seen[0][1]
    assert seen == [(f"dir-{s}", n) for s in STAGES] + [
        (f"dir-{s}", n + 1) for s in STAGES if s != "aside"]
    assert hooked == list(STAGES)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   ValueError("bad"), KeyboardInterrupt()],
                         ids=["disk-full", "error", "ctrl-c"])
def test_a_failed_fill_removes_its_temporary_and_keeps_the_old_content(tmp_path, error):
    out = tmp_path / "out"
    _old(out)

    def fill(tmp: Path) -> None:
        (tmp / "a.txt").write_text("half")
        raise error

    with pytest.raises(StorageError if isinstance(error, OSError) else type(error)) as ei:
        write_dir_atomic(out, fill, what=f"w {out}", overwrite=True,
                         full=lambda: "it needs 3 bytes; the old content is intact")
    if isinstance(error, OSError):
        assert ei.value.strerror == (f"w {out}: no space left on device; it needs 3 bytes; the "
                                     "old content is intact") and ei.value.exit_code == 6
    assert _tree(out) == OLD and _leftovers(tmp_path) == []


def test_an_owner_recovers_every_leftover_a_pid_check_would_keep(tmp_path):
    """A caller holding the lock every writer of the path holds (a run's owner, a preparer of
    that corpus) recovers leftovers whatever their pid: a live pid there is a reused one."""
    out, live = tmp_path / "out", os.getppid()
    (tmp_path / f".tmp-out-{live}").mkdir()
    (tmp_path / f".old-out-{live}").mkdir()
    (tmp_path / f".old-out-{live}" / "a.txt").write_text("the only copy")
    (tmp_path / f".tmp-outer-{live}").mkdir()  # another path's: not ``out``'s
    assert recover_leftovers(out) == [] and not out.exists()
    assert recover_leftovers(out, owner=True) == [tmp_path / f".tmp-out-{live}"]
    assert _tree(out) == {"a.txt": b"the only copy"}
    assert _leftovers(tmp_path) == [f".tmp-outer-{live}"]

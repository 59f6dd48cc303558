"""Run directories and output folders: usable before any work starts, and one owner at a time.

:func:`writable_dir` creates a folder and proves it writable (an unusable one is an I/O error,
exit code 6, before anything is built). :func:`run_lock` is an OS file lock on
``<run dir>/.lock``.

Training, resuming and ``blocklab-eval`` writing into a run all take it; a second process is
refused in one line naming the owner (pid, host, what it does, since when). The lock is the
kernel's ``flock``: it dies with its process — ``kill -9`` and power loss included — so a
crashed run can never leave a directory locked; the pid/host written into the file are only
there to name the owner. (``flock`` is per host: on a network file system shared by several
hosts, give concurrent jobs different run directories, as sweeps do.)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from blocklab.errors import StorageError

LOCK = ".lock"


class RunDirBusy(StorageError):
    """Another process owns the run directory (exit code 6)."""


def writable_dir(path: str | Path, what: str) -> Path:
    """Create ``path`` (and parents) and check that a file can be written in it; ``what``
    names it in the error ("run directory", "out="...). Nothing of the check is left behind:
    its test file is removed whatever happens, and on failure so are the directories it
    created (never one that existed before)."""
    path = Path(path)
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.is_dir():
            raise StorageError(errno.ENOTDIR, f"I/O error: {what} {path}: {parent} is a file, "
                               "not a directory")
    created = [p for p in [path, *path.parents] if not p.exists()]  # deepest first
    probe = path / f".write-test-{os.getpid()}"
    try:
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe.write_text("ok")
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()
    except OSError as e:
        for made in created:  # only what this check made, and only while empty
            with contextlib.suppress(OSError):
                made.rmdir()
        raise StorageError(e.errno, f"I/O error: {what} {path}: not writable "
                           f"({e.strerror})") from None
    return path


@contextlib.contextmanager
def run_lock(run_dir: str | Path, purpose: str) -> Iterator[Path]:
    """Hold the run directory for the duration of the block (``purpose``: "train", "resume",
    "eval", ... — shown to whoever is refused)."""
    path = Path(run_dir) / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirBusy(errno.EBUSY, f"I/O error: run directory {run_dir} is in use by "
                             f"{_owner(path)}; wait for it to finish, or use another "
                             "directory (run_dir=/out=)") from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "purpose": purpose,
                 "since": dt.datetime.now().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner).encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock


def _owner(path: Path) -> str:
    try:
        o = json.loads(path.read_text())
        return f"{o['purpose']} (pid {o['pid']} on {o['host']}, since {o['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"

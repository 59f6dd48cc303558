"""Small file-system helpers shared by checkpoints, probe reports, prepared corpora and
converted models: content hashes, keeping a corrupt directory aside instead of deleting it,
one-line storage errors, and the one writer of a whole directory (:func:`write_dir_atomic`)
with its leftovers recovery."""

from __future__ import annotations

import errno
import glob
import hashlib
import itertools
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from blocklab.errors import ConfigError, StorageError
from blocklab.faults import maybe_fault


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file beside it and one rename: a reader
    sees the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def set_aside(path: Path) -> Path:
    """Rename ``path`` to the first free ``<name>.corrupt-<k>`` beside it (kept, not deleted)."""
    k = 1
    while (aside := path.with_name(f"{path.name}.corrupt-{k}")).exists():
        k += 1
    path.rename(aside)
    return aside


def storage_error(e: OSError, what: str, full: str) -> StorageError:
    """A one-line :class:`StorageError` for a failed write of ``what``; ``full`` says what a
    full disk means there (what is needed, what is intact)."""
    if e.errno == errno.ENOSPC:
        return StorageError(errno.ENOSPC, f"{what}: no space left on device; {full}")
    return StorageError(e.errno, f"{what}: cannot write: {e.strerror or e}")


# --------------------------------------------------------------- directories written whole


def write_file(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` and fsync it: on disk before a rename publishes it."""
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: str | Path) -> None:
    """fsync a directory (the names created or renamed in it are on disk), or a file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_destination(path: str | Path, key: str, *, overwrite: bool = False,
                      reads: tuple[str | Path, ...] = ()) -> None:
    """Refuse a destination a command would create before any work starts: a file in the way
    (itself or a parent; I/O error, exit 6), a directory that holds anything unless
    ``overwrite`` (config error, exit 2), or one that is or holds a path in ``reads`` (what the
    command reads: replacing it would delete the command's own input; config error). A
    missing or empty directory is fine."""
    path = Path(path)
    for source in reads:
        if Path(source).resolve().is_relative_to(path.resolve()):
            raise ConfigError(f"config error: {key}={str(path)!r}: is or holds {source}, which "
                              "this command reads; choose another destination")
    for p in [path, *path.parents]:
        if p.exists() and not p.is_dir():
            what = "is a file" if p == path else f"{p} is a file"
            raise StorageError(errno.ENOTDIR, f"I/O error: {key}={str(path)!r}: {what}, not a "
                               "directory; choose a directory path (nothing was written)")
    if path.is_dir() and not overwrite:
        held = sorted(e.name for e in path.iterdir())
        if held:
            shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
            raise ConfigError(
                f"config error: {key}={str(path)!r}: holds {len(held)} "
                f"{'entry' if len(held) == 1 else 'entries'} ({shown}); the destination must "
                f"be new or empty (nothing is overwritten), or pass overwrite=true to replace "
                "it whole")


# One writer for every directory blocklab publishes whole (checkpoints, probe reports, exports
# and imports, prepared corpora), with one temp-name scheme and one leftovers rule:
#
# - the content goes into the hidden sibling ``.tmp-<name>-<pid>``; a replaced directory is
#   moved aside to ``.old-<name>-<pid>`` for the moment between the two renames;
# - leftovers (a ``.tmp-``/``.old-`` sibling whose writer is gone: its pid is dead, or the
#   caller holds the lock every writer of that path holds) are recovered before a write: an
#   ``.old-`` whose ``<name>`` is missing is renamed back (its swap was cut between the two
#   renames), anything else is deleted (a ``.tmp-`` is never a user's).

LEFTOVER = re.compile(r"\.(tmp|old)-(.+)-(\d+)")  # a temporary's whole name: kind, name, pid
STAGES = ("tmp", "filled", "aside", "placed")  # the writer's fault points, in order
_WRITES = itertools.count(1)  # directories this process has begun to write (fault points' N)


def temp_path(path: Path, kind: str, pid: int | None = None) -> Path:
    """The temporary sibling of ``path`` of ``kind`` (``tmp`` or ``old``) for process ``pid``
    (default: this one)."""
    return path.with_name(f".{kind}-{path.name}-{os.getpid() if pid is None else pid}")


def write_dir_atomic(path: str | Path, fill: Callable[[Path], None], *, what: str,
                     full: str | Callable[[], str] = "", key: str | None = "out",
                     overwrite: bool = False, reads: tuple[str | Path, ...] = (),
                     owner: bool = False, fault: Callable[[str], None] | None = None) -> Path:
    """Create the directory ``path`` whole or not at all: ``fill(tmp)`` writes the content into
    the (existing, empty) temporary ``.tmp-<name>-<pid>``; every file and folder in it is
    fsynced; one rename publishes it (onto a missing or empty ``path``); the parent is fsynced.

    ``overwrite=True`` replaces a ``path`` that holds anything: the old directory is moved to
    ``.old-<name>-<pid>``, the new one renamed in, and only then is the old one deleted; if the
    second rename fails the old one is renamed back. So a failure — or a kill — at any point
    leaves the old content in place or recoverable. Leftovers of a writer that is gone are
    recovered first (see above; ``owner``: the caller holds the lock every writer of ``path``
    holds, so every leftover is a dead writer's, whatever its pid).

    With ``key`` (the setting naming ``path``), a non-empty ``path`` without ``overwrite``, a
    file in the way, or a ``path`` that is or holds one of ``reads`` is refused first
    (:func:`check_destination`); ``key=None`` checks nothing. An error or Ctrl-C removes the
    temporary (anything else unwinding the stack leaves it, as a kill would, to the next
    write's recovery); an ``OSError`` becomes a one-line :class:`StorageError` "``what``: ..."
    (``full`` says, for a full disk, what is needed and what is intact).

    Fault points (faults.py): ``dir-<stage>:N`` for the stages ``tmp`` (before ``fill``),
    ``filled`` (complete and synced, before the rename), ``aside`` (the old copy moved aside,
    the new one not yet in), ``placed`` (renamed in, the old copy not yet deleted); N counts
    this process's directory writes. ``fault(stage)`` is called there too (a caller's own
    points: a checkpoint's ``aside:<step>``, a preparation's ``publish:N``)."""
    path = Path(path)
    recover_leftovers(path, owner=owner)
    if key is not None:
        check_destination(path, key, overwrite=overwrite, reads=reads)
    n = next(_WRITES)

    def at(stage: str) -> None:
        maybe_fault(f"dir-{stage}", n)
        if fault is not None:
            fault(stage)

    tmp = temp_path(path, "tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        at("tmp")
        fill(tmp)
        _fsync_tree(tmp)
        at("filled")
        _publish(tmp, path, overwrite, at)
        fsync_dir(path.parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise storage_error(e, what, full() if callable(full) else full) from None
    except (Exception, KeyboardInterrupt):
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _publish(tmp: Path, path: Path, overwrite: bool, at: Callable[[str], None]) -> None:
    """Rename the complete ``tmp`` to ``path``; with ``overwrite``, swap out what is there."""
    if not (overwrite and path.is_dir() and any(path.iterdir())):
        tmp.rename(path)  # onto an empty directory too: atomic, refused if filled
        at("placed")
        return
    old = temp_path(path, "old")
    path.rename(old)
    at("aside")
    try:
        tmp.rename(path)
    except OSError:
        old.rename(path)
        raise
    at("placed")
    shutil.rmtree(old, ignore_errors=True)


def recover_leftovers(path: str | Path, *, owner: bool = False) -> list[Path]:
    """Put back or remove what a writer that is gone left beside ``path`` (see above): a live
    process's temporaries are left alone, unless ``owner``. Returns what was removed."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    removed = []
    for kind in ("old", "tmp"):  # an interrupted swap's old content first
        for p in sorted(path.parent.glob(f".{kind}-{glob.escape(path.name)}-*")):
            match = LEFTOVER.fullmatch(p.name)
            if match is None or match.group(2) != path.name or (
                    not owner and _alive(int(match.group(3)))):
                continue
            if kind == "old" and not path.exists():
                p.rename(path)
                print(f"warning: {path}: restored from {p.name}, left by an interrupted "
                      "replacement", file=sys.stderr)
            else:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def recover_all(folder: str | Path, *, owner: bool = False) -> list[Path]:
    """:func:`recover_leftovers` for every path of ``folder`` that has temporaries beside it."""
    folder = Path(folder)
    names = sorted({m.group(2) for p in (folder.iterdir() if folder.is_dir() else ())
                    if (m := LEFTOVER.fullmatch(p.name))})
    return [p for name in names for p in recover_leftovers(folder / name, owner=owner)]


def _alive(pid: int) -> bool:
    if pid == os.getpid():  # ours, left by an earlier call that failed: nobody writes it now
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _fsync_tree(root: Path) -> None:
    """Every file and folder under ``root`` on disk (whoever wrote them, synced or not)."""
    for folder, _, names in os.walk(root):
        for name in names:
            fsync_dir(os.path.join(folder, name))
        fsync_dir(folder)

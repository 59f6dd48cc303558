"""Small file-system helpers shared by checkpoints, prepared corpora and converted models:
content hashes, keeping a corrupt directory aside instead of deleting it, one-line storage
errors, and writing a whole directory atomically (:func:`write_dir_atomic`)."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from blocklab.errors import ConfigError, StorageError


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
    """fsync a directory: the names created or renamed in it are on disk."""
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


def write_dir_atomic(path: str | Path, fill: Callable[[Path], None], *, what: str,
                     full: str = "", key: str = "out", overwrite: bool = False,
                     reads: tuple[str | Path, ...] = ()) -> Path:
    """Create the directory ``path`` whole or not at all: ``fill(tmp)`` writes the content into
    the hidden sibling ``.tmp-<name>-<pid>``; every file and folder in it is fsynced; one
    rename publishes it (onto a missing or empty ``path``); the parent is fsynced.

    ``overwrite=True`` replaces a ``path`` that holds anything: the old directory is renamed to
    ``.old-<name>-<pid>``, the new one renamed in, and only then is the old one deleted; if the
    second rename fails the old one is renamed back. So a failure at any point leaves the old
    content as it was. Leftovers of a process that died (``.tmp-``/``.old-`` siblings whose pid
    is gone) are recovered first: an ``.old-`` whose ``path`` is missing is renamed back (its
    swap was cut between the two renames), any other is deleted (``.tmp-`` is never a user's).

    A non-empty ``path`` without ``overwrite``, a file in the way, or a ``path`` that is or
    holds one of ``reads`` is refused by :func:`check_destination` (``key`` names the setting). Any failure removes the temporary
    directory; an ``OSError`` becomes a one-line :class:`StorageError` "``what``: ..." (``full``
    says, for a full disk, what is needed and what is intact); other errors pass through."""
    path = Path(path)
    recover_leftovers(path)
    check_destination(path, key, overwrite=overwrite, reads=reads)
    pid = os.getpid()
    tmp, old = (path.with_name(f".{kind}-{path.name}-{pid}") for kind in ("tmp", "old"))
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        fill(tmp)
        _fsync_tree(tmp)
        if overwrite and path.is_dir() and any(path.iterdir()):
            os.rename(path, old)
            try:
                os.rename(tmp, path)
            except OSError:
                os.rename(old, path)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)  # onto an empty directory too: atomic, refused if filled
        fsync_dir(path.parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise storage_error(e, what, full) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def recover_leftovers(path: str | Path) -> list[Path]:
    """Put back or remove what a dead process's :func:`write_dir_atomic` left beside ``path``
    (see there); a live process's temporaries are left alone. Returns what was removed."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    removed = []
    for kind in ("old", "tmp"):  # an interrupted swap's old content first
        for p in sorted(path.parent.glob(f".{kind}-{path.name}-*")):
            pid = p.name.rsplit("-", 1)[-1]
            if not pid.isdigit() or _alive(int(pid)):
                continue
            if kind == "old" and not path.exists():
                p.rename(path)
                print(f"warning: {path}: restored from {p.name}, left by an interrupted "
                      "replacement", file=sys.stderr)
            else:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


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
    for folder, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)

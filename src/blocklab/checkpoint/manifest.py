"""A checkpoint's manifest (``manifest.json``: the sha256 and size of every other file of the
directory, written last) and the two steps of reading it safely: :func:`verify` checks every
file against it before any byte is deserialized, :func:`unpickle` loads exactly the verified
bytes of ``state.pt`` with ``weights_only=True``. The directory's names and the format version
live here too; the package (writing, choosing, reading once) re-exports them."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

import torch

from blocklab.errors import CheckpointError

FORMAT_VERSION = 1
STATE, META, CONFIG, TOKENIZER, MANIFEST = (
    "state.pt", "meta.json", "config.yaml", "tokenizer.json", "manifest.json")


class Refused(CheckpointError):
    """A complete, verified checkpoint whose content is refused — an unsafe pickle, a stored
    config holding instructions, readable copies that disagree with the state: an error to
    report, never a reason to fall back to an older checkpoint."""


def verify(path: str | Path, *, keep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check the manifest of checkpoint ``path``; return it or raise :class:`CheckpointError`.

    With ``keep`` (a dict), what was verified is what the caller reads: the small files' bytes
    and an open, rewound handle on ``state.pt`` (the caller closes it) are put there, so a save
    or a prune replacing the directory afterwards changes nothing for the reader."""
    path = Path(path)
    manifest = _manifest(path)
    opened: dict[str, Any] = {}
    try:
        for name, info in manifest["files"].items():
            opened[name] = _verified(path, name, info, handle=keep is not None and name == STATE)
    except BaseException:
        _close(opened)
        raise
    if keep is not None:
        keep.update(opened)
    return manifest


def _manifest(path: Path) -> dict[str, Any]:
    try:
        with _open_regular(path, MANIFEST) as f:
            manifest = json.loads(f.read())
        files = manifest["files"]
        version = manifest.get("format_version", 0)
        if not isinstance(version, int) or not all(
                isinstance(i, dict) and isinstance(i.get("sha256"), str)
                and isinstance(i.get("bytes"), int) for i in files.values()):
            raise ValueError("malformed entries")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise CheckpointError(f"checkpoint {path}: no {MANIFEST} (incomplete or not a blocklab "
                              "checkpoint)") from None
    except OSError as e:
        raise CheckpointError(f"checkpoint {path}: cannot read {MANIFEST} ({e.strerror})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} unreadable ({e})") from None
    if STATE not in files:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} does not cover {STATE}")
    # A file of the checkpoint, never a path elsewhere (``../../etc/passwd``) opened for it.
    bad = next((n for n in files if n in (MANIFEST, ".", "..") or Path(n).name != n), None)
    if bad is not None:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} names {bad!r}: not a file of this "
                              "directory (refused)")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path}: format version {version} is newer than this "
                              f"blocklab understands ({FORMAT_VERSION}); upgrade blocklab")
    return manifest


def verified_file(path: str | Path, name: str) -> bytes:
    """One small file of checkpoint ``path`` (``meta.json``), checked against its manifest
    entry alone: what reading a record needs, without hashing ``state.pt``."""
    path = Path(path)
    info = _manifest(path)["files"].get(name)
    if not isinstance(info, dict):
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} does not cover {name}")
    return _verified(path, name, info, handle=False)


def _verified(path: Path, name: str, info: dict[str, Any], *, handle: bool) -> Any:
    """One file checked against its manifest entry: its bytes (or, with ``handle``, the open
    file, rewound). Its type and size are checked before it is opened or hashed."""
    try:
        f = _open_regular(path, name, want=info["bytes"])
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointError(f"checkpoint {path}: {name} missing") from None
    except OSError as e:
        raise CheckpointError(f"checkpoint {path}: cannot read {name} ({e.strerror})") from None
    handed = False
    try:
        data = None if handle else f.read()
        digest = (hashlib.sha256(data) if data is not None
                  else hashlib.file_digest(f, "sha256")).hexdigest()
        if digest != info["sha256"]:
            raise CheckpointError(f"checkpoint {path}: {name} sha256 mismatch (corrupted)")
        if handle:
            f.seek(0)
            handed = True
            return f
        return data
    finally:
        if not handed:
            f.close()


#: What a checkpoint file is when it is not a regular file (``stat.S_IFMT`` -> words).
_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO (named pipe)",
          stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def _open_regular(path: Path, name: str, want: int | None = None) -> BinaryIO:
    """``path / name`` opened for reading if it is a regular file of the checkpoint itself —
    checked with ``lstat`` before opening (a FIFO would block ``open``, a symbolic link would
    read a file outside the checkpoint: both refused, as are devices and directories), opened
    without following a link or blocking, and checked again on the open handle (the same
    file, still regular: nothing swapped in between). With ``want`` (the manifest's size) a
    file of another size is refused before a byte of it is read."""
    where = path / name
    before = os.lstat(where)
    _regular(path, name, before)
    if want is not None:
        _sized(path, name, before.st_size, want)
    fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # never blocks, never follows
    f = os.fdopen(fd, "rb")
    try:
        after = os.fstat(fd)
        _regular(path, name, after)
        if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise CheckpointError(f"checkpoint {path}: {name} was replaced while being read")
        if want is not None:
            _sized(path, name, after.st_size, want)
    except BaseException:
        f.close()
        raise
    return f


def _regular(path: Path, name: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        link = ""
        if stat.S_ISLNK(st.st_mode):
            with contextlib.suppress(OSError):
                link = f" to {os.readlink(path / name)}"
        raise Refused(f"checkpoint {path}: {name} is {kind}{link}; a checkpoint's files are "
                      "regular files inside it, never links, pipes or devices (refused)")


def _sized(path: Path, name: str, size: int, want: int) -> None:
    if size < want:
        raise CheckpointError(f"checkpoint {path}: {name} truncated ({size:,} of {want:,} bytes)")
    if size != want:
        raise CheckpointError(f"checkpoint {path}: {name} sha256 mismatch (corrupted: "
                              f"{size:,} bytes where the manifest says {want:,})")


def _close(opened: dict[str, Any]) -> None:
    for v in opened.values():
        if hasattr(v, "close"):
            v.close()


def unpickle(path: Path, kept: dict[str, Any], map_location: Any) -> dict[str, Any]:
    """``state.pt`` from the handle verification left open (exactly the verified bytes)."""
    f = kept.pop(STATE)
    try:
        return torch.load(f, map_location=map_location, weights_only=True)
    except Exception as e:  # unpickling errors come in many types
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "GLOBAL" in ln), type(e).__name__)
        raise CheckpointError(f"checkpoint {path}: refused to load {STATE} with "
                              f"weights_only=True (it needs an unsafe global): {why}") from None
    finally:
        f.close()
        _close(kept)

"""The data cache's own files: locks, temporaries of unfinished preparations, manifests.

Preparers of one corpus or tokenizer take turns on a kernel file lock (``.<name>.lock`` under
the cache root) — it dies with its holder, ``kill -9`` included — and write into a temporary
that is renamed into place only when complete, after a manifest of every file's size and
sha256. What a killed preparer left (its temporary) is recognised by its free lock and removed
by the next preparation (:func:`sweep`); a prepared corpus is checked against its manifest
before use (:func:`verify`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from blocklab.errors import StorageError
from blocklab.files import LEFTOVER, recover_leftovers, sha256_file, write_file


def sweep(root: Path) -> None:
    """Remove what killed preparations left under ``root``: a corpus's temporary folder
    ``.tmp-<fingerprint>-<pid>`` or a tokenizer's ``tokenizers/.<bpe|char>-<key>.json.tmp-<pid>``
    whose lock nobody holds. Whoever writes one holds that lock until its rename, and the
    kernel drops the lock of a killed process, so a free lock means a dead writer; a live
    preparer (another fingerprint, another process) keeps its lock and its temporary."""
    if not root.is_dir():
        return
    corpora = {m.group(2) for p in root.iterdir() if (m := LEFTOVER.fullmatch(p.name))}
    for name in sorted(corpora):
        with locked(root, name, wait=False) as free:
            if free:  # its writers hold this lock: every temporary of ``name`` is a dead one's
                recover_leftovers(root / name, owner=True)
    for kind in ("bpe", "char"):
        for path in sorted((root / "tokenizers").glob(f".{kind}-*.json.tmp-*")):
            with locked(root, path.name[1:].split(".json.tmp-")[0], wait=False) as free:
                if free:
                    path.unlink(missing_ok=True)


def verify(path: Path) -> str | None:
    """None when every file of a prepared corpus matches its manifest, else what is wrong."""
    try:
        files = json.loads((path / "manifest.json").read_text())["files"]
    except (OSError, ValueError, KeyError):
        return "no readable manifest.json (incomplete)"
    for name, info in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} missing"
        if f.stat().st_size != info["bytes"]:
            return f"{name} truncated or grown ({f.stat().st_size:,} of {info['bytes']:,} bytes)"
        if sha256_file(f) != info["sha256"]:
            return f"{name} sha256 mismatch (corrupted)"
    return None


def write_synced(path: Path, data: bytes, files: dict[str, dict[str, Any]] | None) -> None:
    """Write ``data`` to ``path`` and fsync it; its size and sha256 go to ``files`` (the
    manifest being built), unless None."""
    write_file(path, data)
    if files is not None:
        files[path.name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@contextlib.contextmanager
def locked(root: Path, name: str, *, wait: bool = True) -> Iterator[bool]:
    """Processes preparing the same thing take turns (the kernel lock dies with its holder).
    Yields whether the lock is held (always, when ``wait``; else only if it was free)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StorageError(e.errno, f"I/O error: data cache {root}: not writable "
                           f"({e.strerror}); set data.cache_dir") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)

"""Small file-system helpers shared by checkpoints and prepared corpora: content hashes, keeping
a corrupt directory aside instead of deleting it, and one-line storage errors."""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path

from blocklab.errors import StorageError


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

"""Self-describing, atomic, verified checkpoints.

A checkpoint is a directory::

    step-000500/
      state.pt        Lightning's checkpoint dict (weights, optimizer, scheduler, loops) plus
                      checkpoint["blocklab"]: resolved config (plain dict), architecture hash,
                      tokenizer, format version, library versions, git commit + dirty flag, data
                      fingerprint, step / tokens / batches seen, RNG state
      meta.json       the same metadata, readable without torch
      config.yaml     the resolved config
      tokenizer.json  the tokenizer
      manifest.json   sha256 and size of every other file, written last

Writes go to a hidden temporary sibling, every file is fsynced, the manifest comes last and the
directory is renamed into place, so a crash mid-save leaves the previous checkpoints intact and
only a ``.tmp-*`` directory that the next start removes. A save onto a checkpoint directory that
fails verification never fails or silently drops the new state: the corrupt directory is kept,
renamed ``<name>.corrupt-<k>``, and reported. Loads verify the manifest before any
byte is deserialized, and use ``torch.load(weights_only=True)``: a checkpoint that needs an
unsafe global is refused, never loaded with ``weights_only=False``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from blocklab.errors import StorageError  # noqa: F401  (re-exported: checkpoint.StorageError)
from blocklab.files import set_aside, sha256_file, storage_error

FORMAT_VERSION = 1
STATE, META, CONFIG, TOKENIZER, MANIFEST = (
    "state.pt", "meta.json", "config.yaml", "tokenizer.json", "manifest.json")
PREFIX = "step-"
NAME = re.compile(r"step-(\d+)")  # a checkpoint directory's whole name


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, unsafe or incompatible (exit code 4)."""

    exit_code = 4


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(path: str | Path, checkpoint: dict[str, Any]) -> Path:
    """Atomically write ``checkpoint`` (a Lightning checkpoint dict) as a checkpoint directory."""
    path = Path(path)
    meta = checkpoint.get("blocklab", {})
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    files = {STATE: buf.getvalue()}
    if meta:
        readable = {k: v for k, v in meta.items() if k not in ("rng", "rng_ranks", "tokenizer")}
        files[META] = json.dumps(readable, indent=2, sort_keys=True).encode()
        files[CONFIG] = meta.get("config_yaml", "").encode()
        files[TOKENIZER] = meta.get("tokenizer", "").encode()
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}"
    needed = sum(len(b) for b in files.values())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        manifest = {"format_version": FORMAT_VERSION, "files": {}}
        for name, data in files.items():
            _write(tmp / name, data)
            manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(),
                                       "bytes": len(data)}
        _write(tmp / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())
        _fsync_dir(tmp)
        if path.exists() and not is_valid(path):
            _set_aside(path)
        if path.exists():  # re-saving a step: move the old one aside, never delete it first
            old = path.parent / f".old-{path.name}-{os.getpid()}"
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(path)
        _fsync_dir(path.parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise storage_error(e, f"checkpoint {path}", f"the checkpoint needs {needed:,} bytes "
                            "free; previous checkpoints are intact") from None
    from blocklab.faults import maybe_fault

    match = NAME.fullmatch(path.name)
    if match:
        maybe_fault("save", int(match.group(1)))  # tests: a crash right after this save
    return path


def is_valid(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint whose manifest verifies."""
    try:
        verify(path)
        return True
    except CheckpointError:
        return False


def _set_aside(path: Path) -> Path:
    """Rename a corrupt checkpoint directory out of the way (kept for inspection)."""
    aside = set_aside(path)
    print(f"warning: checkpoint {path} failed verification; kept as {aside.name}, writing the "
          "new state in its place", file=sys.stderr)
    return aside


def prune(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints of a run (0 = keep all), counting every
    checkpoint in the directory — those of earlier launches too; corrupt ones set aside are
    never touched. Returns what was deleted."""
    if keep <= 0:
        return []
    doomed = list_checkpoints(run_dir)[:-keep]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def verify(path: str | Path) -> dict[str, Any]:
    """Check the manifest of checkpoint ``path``; return it or raise :class:`CheckpointError`."""
    path = Path(path)
    if not (path / MANIFEST).is_file():
        raise CheckpointError(f"checkpoint {path}: no {MANIFEST} (incomplete or not a blocklab "
                              "checkpoint)")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} unreadable ({e})") from None
    if STATE not in files:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} does not cover {STATE}")
    version = manifest.get("format_version", 0)
    if version > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path}: format version {version} is newer than this "
                              f"blocklab understands ({FORMAT_VERSION}); upgrade blocklab")
    for name, info in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: {name} missing")
        size = f.stat().st_size
        if size < info["bytes"]:
            raise CheckpointError(f"checkpoint {path}: {name} truncated ({size:,} of "
                                  f"{info['bytes']:,} bytes)")
        if size != info["bytes"] or sha256_file(f) != info["sha256"]:
            raise CheckpointError(f"checkpoint {path}: {name} sha256 mismatch (corrupted)")
    return manifest


def load(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Verify, then load the checkpoint dict with ``weights_only=True``."""
    path = Path(path)
    verify(path)
    try:
        return torch.load(path / STATE, map_location=map_location, weights_only=True)
    except Exception as e:  # unpickling errors come in many types
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "GLOBAL" in ln), type(e).__name__)
        raise CheckpointError(f"checkpoint {path}: refused to load {STATE} with "
                              f"weights_only=True (it needs an unsafe global): {why}") from None


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoint directories of a run (``step-<N>``), oldest first; temporary and set-aside
    directories are not checkpoints."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.iterdir() if p.is_dir() and NAME.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(NAME.fullmatch(p.name).group(1)))


def clean_partial(run_dir: str | Path) -> list[Path]:
    """Remove temporary directories left by a save that was killed; return what was removed."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    removed = []
    if ckpt_dir.is_dir():
        # A re-save killed between its two renames leaves the old copy as `.old-<name>-<pid>`:
        # put it back before anything is deleted.
        for p in ckpt_dir.iterdir():
            if p.name.startswith(".old-"):
                original = ckpt_dir / p.name.removeprefix(".old-").rsplit("-", 1)[0]
                if not original.exists():
                    p.rename(original)
        for p in ckpt_dir.iterdir():
            if p.name.startswith((".tmp-", ".old-")):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def resolve(target: str | Path) -> Path:
    """A checkpoint directory, or a run directory's newest *valid* checkpoint (falling back past
    corrupt ones with a warning)."""
    target = Path(target)
    if not target.exists():
        raise CheckpointError(f"checkpoint {target}: no such file or directory")
    if (target / MANIFEST).exists() or target.name.startswith(PREFIX) or \
            (target / STATE).exists():
        verify(target)
        return target
    candidates = list_checkpoints(target)
    if not candidates:
        raise CheckpointError(f"checkpoint {target}: no checkpoints under {target / 'checkpoints'}")
    for ckpt in reversed(candidates):
        try:
            verify(ckpt)
            return ckpt
        except CheckpointError as e:
            warnings.warn(f"{e}; falling back to the previous checkpoint", stacklevel=2)
    raise CheckpointError(f"checkpoint {target}: every checkpoint failed verification")


def metadata(path: str | Path) -> dict[str, Any]:
    """The ``blocklab`` metadata of a verified checkpoint."""
    meta = load(path).get("blocklab")
    if not meta:
        raise CheckpointError(f"checkpoint {path}: no blocklab metadata")
    return meta


def load_model(path: str | Path, map_location: Any = "cpu"):
    """Rebuild the model and tokenizer from a checkpoint alone (run directory or checkpoint
    directory): ``model, tokenizer, meta = load_model("outputs/default/<run>")``. The stored
    config is plain data checked against the schema, never instantiated."""
    from blocklab.data.tokenizer import tokenizer_from_json
    from blocklab.model import build_model

    path = resolve(path)
    state = load(path, map_location=map_location)
    meta = state.get("blocklab")
    if not meta:
        raise CheckpointError(f"checkpoint {path}: no blocklab metadata")
    model = build_model(meta["config"]["model"])
    weights = {k.removeprefix("model."): v for k, v in state["state_dict"].items()
               if k.startswith("model.")}
    model.load_state_dict(weights)
    return model.eval(), tokenizer_from_json(meta["tokenizer"]), meta

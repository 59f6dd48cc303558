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

A checkpoint may come from someone else, so what it holds is data, never instructions:
:func:`read` resolves, verifies and loads it once (what was verified is what is unpickled, even
if a running training replaces or prunes the directory meanwhile) and checks its stored config
with :func:`stored_config` — no interpolation is resolved, nothing is instantiated, and the
readable copies (``config.yaml``, ``meta.json``, ``tokenizer.json``) must say what ``state.pt``
says.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from blocklab.checkpoint.best import BEST, best_name, best_record, split_target
from blocklab.checkpoint.manifest import (
    CONFIG,
    FORMAT_VERSION,
    MANIFEST,
    META,
    STATE,
    TOKENIZER,
    Refused,
    unpickle,
    verify,
)
from blocklab.config import TrainConfig
from blocklab.config.stored import check_copies, readable_meta, stored_config
from blocklab.errors import (
    CheckpointError,
    StorageError,  # noqa: F401  (re-exported: checkpoint.StorageError)
)
from blocklab.faults import maybe_fault
from blocklab.files import recover_all, set_aside, write_dir_atomic, write_file

PREFIX = "step-"
NAME = re.compile(r"step-(\d+)")  # a checkpoint directory's whole name
OLD = re.compile(r"\.old-(step-\d+)-\d+")  # a re-saved step's previous copy, moved aside
T = TypeVar("T")


_write = write_file  # every file of a checkpoint is written (and fsynced) through this


def _fault(point: str, path: Path) -> None:
    match = NAME.fullmatch(path.name)
    if match:
        maybe_fault(point, int(match.group(1)))


def write_checkpoint(path: str | Path, checkpoint: dict[str, Any]) -> Path:
    """Atomically write ``checkpoint`` (a Lightning checkpoint dict) as a checkpoint directory
    (files.write_dir_atomic; a re-save of a step replaces it, a corrupt copy in its way is set
    aside once the new state is complete)."""
    path = Path(path)
    meta = checkpoint.get("blocklab", {})
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    files = {STATE: buf.getvalue()}
    if meta:
        files[META] = json.dumps(readable_meta(meta), indent=2, sort_keys=True).encode()
        files[CONFIG] = meta.get("config_yaml", "").encode()
        files[TOKENIZER] = meta.get("tokenizer", "").encode()

    def fill(tmp: Path) -> None:
        manifest = {"format_version": FORMAT_VERSION, "files": {}}
        for name, data in files.items():
            _write(tmp / name, data)
            manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(),
                                       "bytes": len(data)}
        _write(tmp / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())
        if path.exists() and not is_valid(path):
            _set_aside(path)

    needed = sum(len(b) for b in files.values())
    write_dir_atomic(path, fill, what=f"checkpoint {path}", key=None, overwrite=True,
                     full=f"the checkpoint needs {needed:,} bytes free; previous checkpoints "
                     "are intact", fault=lambda stage: stage == "aside" and _fault(stage, path))
    _fault("save", path)  # tests: a crash right after this save
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


def prune(run_dir: str | Path, keep: int, *, protect: list[str] | tuple[str, ...] = ()
          ) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints of a run (0 = keep all), counting every
    checkpoint in the directory — those of earlier launches too — and never those named in
    ``protect`` (the best checkpoint); corrupt ones set aside are never touched. Returns what
    was deleted."""
    if keep <= 0:
        return []
    doomed = [p for p in list_checkpoints(run_dir)[:-keep] if p.name not in protect]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def load(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Verify, then load the checkpoint dict with ``weights_only=True``."""
    path = Path(path)
    kept: dict[str, Any] = {}
    verify(path, keep=kept)
    return unpickle(path, kept, map_location)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoint directories of a run (``step-<N>``), oldest first; temporary and set-aside
    directories are not checkpoints."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.iterdir() if p.is_dir() and NAME.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(NAME.fullmatch(p.name).group(1)))


def clean_partial(run_dir: str | Path) -> list[Path]:
    """Recover what saves that were killed left (files.recover_all: a re-save cut between its
    two renames gets its old copy back, every other temporary is deleted); return what was
    removed. Only the run's owner calls it (it renames and deletes; a save in progress holds
    the same run lock): readers use :func:`readable`."""
    return recover_all(Path(run_dir) / "checkpoints", owner=True)


def readable(run_dir: str | Path) -> list[Path]:
    """What a reader may take, newest first: the run's checkpoints, and for a step whose
    directory is missing, the copy a re-save moved aside (``.old-step-N-<pid>``: a save in
    progress, or one killed between its renames), read where it is — a reader renames
    nothing in a directory a training may own."""
    found = {p.name: p for p in list_checkpoints(run_dir)}
    ckpt_dir = Path(run_dir) / "checkpoints"
    for p in sorted(ckpt_dir.iterdir()) if ckpt_dir.is_dir() else []:
        match = OLD.fullmatch(p.name)
        if match and match.group(1) not in found and p.is_dir():
            found[match.group(1)] = p
    return [found[k] for k in sorted(found, key=lambda k: int(k.removeprefix(PREFIX)),
                                     reverse=True)]


def step_name(path: Path) -> str:
    """The checkpoint name of ``path`` (``step-N`` also for its moved-aside copy)."""
    match = OLD.fullmatch(path.name)
    return match.group(1) if match else path.name


def _is_checkpoint(target: Path) -> bool:
    return (target / MANIFEST).exists() or target.name.startswith(PREFIX) or \
        (target / STATE).exists() or OLD.fullmatch(target.name) is not None


def run_dir_of(target: str | Path) -> Path:
    """The run directory of a checkpoint target (a run directory is its own, and
    ``<run>:best``'s is ``<run>``), unread."""
    target, _ = split_target(target)
    return target.parent.parent if _is_checkpoint(target) else target


def _pick_best(run_dir: Path, take: Callable[[Path], T]) -> T:
    """``take`` the run's best checkpoint, verified like any other; a best checkpoint that
    fails is an error (never another one in its place), one that vanished (pruned by a
    training still running, which recorded a better one meanwhile) is looked up again."""
    if not run_dir.is_dir() or _is_checkpoint(run_dir):
        raise CheckpointError(f"checkpoint {run_dir}{BEST}: {BEST} follows a run directory "
                              "(not a checkpoint, nor a path that does not exist)")
    seen = None
    while True:
        record, holder = best_record(run_dir, readable(run_dir), step_name)
        path = run_dir / "checkpoints" / best_name(record)
        try:
            return _pick(path, take)
        except Refused:
            raise
        except CheckpointError as e:
            if path.exists() or record == seen:  # corrupt, or missing for good
                what = f"{record.get('metric')} {record.get('score')}"
                raise CheckpointError(f"checkpoint {run_dir}{BEST}: the best checkpoint "
                                      f"{path.name} ({what}, recorded by {step_name(holder)}) "
                                      f"cannot be read: {e}") from None
            seen = record


def _pick(target: str | Path, take: Callable[[Path], T]) -> T:
    """``take`` the checkpoint ``target`` names: itself, or a run directory's newest one that
    ``take`` accepts — falling back past corrupt ones with a warning, and choosing again when
    the chosen one disappears meanwhile (pruned or replaced by a training still running) —, or
    with ``:best`` the run's best one."""
    target, best = split_target(target)
    if best:
        return _pick_best(target, take)
    if not target.exists():
        moved = [p for p in readable(target.parent.parent) if p.name.startswith(".old-")
                 and step_name(p) == target.name] if NAME.fullmatch(target.name) else []
        if not moved:
            raise CheckpointError(f"checkpoint {target}: no such file or directory")
        target = moved[0]
    if _is_checkpoint(target):
        return take(target)
    failed: set[Path] = set()
    for _ in range(100):  # a bound: choices are only retried when one vanished
        todo = [p for p in readable(target) if p not in failed]
        if not todo:
            break
        _fault("read", Path(step_name(todo[0])))  # tests: a reader has chosen, not yet read
        try:
            return take(todo[0])
        except Refused:
            raise
        except CheckpointError as e:
            if todo[0].exists():  # still there: corrupt; otherwise gone, so choose again
                failed.add(todo[0])
                warnings.warn(f"{e}; falling back to the previous checkpoint", stacklevel=3)
    if not failed:
        raise CheckpointError(f"checkpoint {target}: no checkpoints under {target / 'checkpoints'}")
    raise CheckpointError(f"checkpoint {target}: every checkpoint failed verification")


def resolve(target: str | Path) -> Path:
    """A checkpoint directory, or a run directory's newest *valid* checkpoint (falling back past
    corrupt ones with a warning)."""
    def check(path: Path) -> Path:
        verify(path)
        return path

    return _pick(target, check)


def metadata(path: str | Path) -> dict[str, Any]:
    """The ``blocklab`` metadata of a verified checkpoint."""
    meta = load(path).get("blocklab")
    if not meta:
        raise CheckpointError(f"checkpoint {path}: no blocklab metadata")
    return meta


# ------------------------------------------------------------------- reading a checkpoint once


@dataclass(frozen=True)
class Loaded:
    """A checkpoint read once — resolved, verified, unpickled with ``weights_only=True`` — and
    its stored config checked as data: what a reader passes down instead of reading again.
    Only the model's weights are kept of the training state (no optimizer), unless it was read
    ``full``: then the whole state waits for :meth:`take_state` (a resume hands it to Lightning
    instead of reading the checkpoint again)."""

    path: Path
    meta: dict[str, Any]
    config: TrainConfig
    weights: dict[str, torch.Tensor]  # the model's parameter names (no "model." prefix)
    held: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        return step_name(self.path)

    @property
    def run_dir(self) -> Path:
        return self.path.parent.parent

    def take_state(self) -> dict[str, Any] | None:
        """The whole checkpoint dict of a ``full`` read, once: handed over, not kept (a
        training would otherwise hold a second copy of the optimizer state to its end);
        None after the first call or without ``full``."""
        return self.held.pop(STATE, None)


def read(target: str | Path, map_location: Any = "cpu", *, full: bool = False) -> Loaded:
    """The checkpoint ``target`` names (a run directory: its newest complete one), resolved,
    verified and loaded once; ``full`` keeps the whole state for :meth:`Loaded.take_state`."""
    return _pick(target, lambda path: _read_one(path, map_location, full))


def _read_one(path: Path, map_location: Any, full: bool) -> Loaded:
    kept: dict[str, Any] = {}
    verify(path, keep=kept)
    texts = {k: v.decode("utf-8", "replace") for k, v in kept.items() if k != STATE}
    try:
        state = unpickle(path, kept, map_location)
        meta = state.get("blocklab") if isinstance(state, dict) else None
        if not meta or not isinstance(meta, dict):
            raise CheckpointError(f"checkpoint {path}: no blocklab metadata")
        config = stored_config(meta.get("config"), f"checkpoint {path}")
        check_copies(f"checkpoint {path}", meta, texts)
        weights = state.get("state_dict")
        if not isinstance(weights, dict):
            raise CheckpointError(f"checkpoint {path}: {STATE} holds no model weights")
    except CheckpointError as e:
        raise Refused(str(e)) from None
    return Loaded(path, meta, config, {k.removeprefix("model."): v for k, v in weights.items()
                                       if str(k).startswith("model.")},
                  {STATE: state} if full else {})


def model_of(loaded: Loaded) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) of a loaded checkpoint."""
    from blocklab.data.tokenizer import tokenizer_from_json
    from blocklab.model import build_model

    model = build_model(loaded.config.model)
    try:
        model.load_state_dict(loaded.weights)
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {loaded.path}: the weights do not fit its model "
                              f"config ({str(e).splitlines()[0]})") from None
    return model.eval(), tokenizer_from_json(loaded.meta["tokenizer"])


def load_model(path: str | Path, map_location: Any = "cpu"):
    """Rebuild the model and tokenizer from a checkpoint alone (run directory or checkpoint
    directory): ``model, tokenizer, meta = load_model("outputs/default/<run>")``. The stored
    config is plain data checked against the schema, never instantiated."""
    loaded = read(path, map_location)
    model, tokenizer = model_of(loaded)
    return model, tokenizer, loaded.meta

"""A stored run's relative paths, read from another directory (resume, ``blocklab-eval
run_data=true``).

A run keeps the paths it was given: ``data.files=[corpus.txt]`` is relative to the directory
the training was started in. Resumed or evaluated from another working directory, such a path
names another file (or none). :func:`relocate` resolves each relative path the run stored that
is missing from here against the run's *directory of origin* (:func:`run_origin`): the
directory recorded with the run (``cwd`` in its metadata, where recorded), else the one its
stored relative ``run_dir`` says (``runs/x`` found at ``/srv/proj/runs/x`` was started in
``/srv/proj``). What it finds there is used by its absolute path (said in a note); the
data fingerprint, which reads resolved paths, is unchanged, so the resume stays exact. A path
found nowhere is refused in one line naming the key, the value, both directories and the
override that names the data's location now."""

from __future__ import annotations

import dataclasses
import glob
import os
from pathlib import Path
from typing import Any

from blocklab.config import DataConfig, TokenizerConfig, TokenizerName
from blocklab.errors import DataError


def run_origin(meta: dict[str, Any], run_dir: str | Path) -> Path | None:
    """The directory a run was started in: recorded (``meta["cwd"]``), else the one its
    stored relative ``run_dir`` implies at ``run_dir``'s place now; None when neither says."""
    cwd = meta.get("cwd")
    if isinstance(cwd, str) and Path(cwd).is_absolute():
        return Path(cwd)
    stored = meta.get("run_dir")
    if not isinstance(stored, str) or not stored or Path(stored).is_absolute():
        return None
    parts = [p for p in Path(stored).parts if p != "."]
    here = Path(os.path.normpath(Path(run_dir).absolute())).parts
    if not parts or ".." in parts or len(parts) >= len(here) or list(here[-len(parts):]) != parts:
        return None
    return Path(*here[:-len(parts)])


def _found(entry: str, base: Path | None = None) -> bool:
    path = str(base / entry) if base is not None else entry
    if any(ch in entry for ch in "*?["):
        return bool(glob.glob(path, recursive=True))
    return Path(path).exists()


@dataclasses.dataclass
class Relocated:
    """The configs with their paths resolved, and a note for each key that was."""

    data: DataConfig
    tokenizer: TokenizerConfig | None
    notes: list[str]


def relocate(data: DataConfig, tokenizer: TokenizerConfig | None, origin: Path | None,
             what: str, skip: frozenset[str] = frozenset(),
             fix: str = "{key}={value}") -> Relocated:
    """``data`` (and ``tokenizer``, a ``tokenizer=file`` path) with every relative path that is
    missing from the current directory but present under ``origin`` made absolute there; the
    dotted keys in ``skip`` (set anew on the command line) are left alone. ``what`` names the
    command in notes and errors (``resume``), ``fix`` the override its refusal suggests. A
    relative source found in neither place is a :class:`DataError`; a relative
    ``data.cache_dir`` found in neither is left as it is (a cache is made where it is
    missing)."""
    here = Path.cwd()
    notes: list[str] = []

    def moved(key: str, entry: str, required: bool) -> str:
        if Path(entry).is_absolute() or _found(entry):
            return entry
        if origin is not None and origin != here and _found(entry, origin):
            new = str(origin / entry)
            notes.append(f"{what}: {key}: {entry!r} is not in {here}; read from the directory "
                         f"the run was started in: {new}")
            return new
        if not required:
            return entry
        start = (f"nor from {origin}, where the run was started" if origin is not None
                 else "and the run does not say where it was started")
        raise DataError(f"data error: {what}: {key}={_value(key, data, tokenizer)}: {entry!r} is "
                        f"relative and not found from {here} (the current directory), {start}; "
                        "name where it is now: "
                        + fix.format(key=key, value=_hint(key, data, tokenizer)))

    lists = ("val_files",) if data.corpus or data.hub_dataset else ("files", "val_files")
    new: dict[str, Any] = {k: [moved(f"data.{k}", e, True) for e in getattr(data, k)]
                           for k in lists if f"data.{k}" not in skip}
    if data.cache_dir and "data.cache_dir" not in skip:
        new["cache_dir"] = moved("data.cache_dir", data.cache_dir, False)
    tok = tokenizer
    if (tokenizer is not None and tokenizer.name is TokenizerName.file and tokenizer.path
            and "tokenizer.path" not in skip):
        tok = dataclasses.replace(tokenizer, path=moved("tokenizer.path", tokenizer.path, True))
    return Relocated(dataclasses.replace(data, **new), tok, notes)


def _value(key: str, data: DataConfig, tokenizer: TokenizerConfig | None) -> str:
    leaf = key.split(".", 1)[1]
    value = getattr(tokenizer if key.startswith("tokenizer.") else data, leaf)
    return f"[{','.join(value)}]" if isinstance(value, list) else str(value)


def _hint(key: str, data: DataConfig, tokenizer: TokenizerConfig | None) -> str:
    """The override naming the data's place now: each relative entry under a placeholder."""
    leaf = key.split(".", 1)[1]
    value = getattr(tokenizer if key.startswith("tokenizer.") else data, leaf)

    def place(e: str) -> str:
        return e if Path(e).is_absolute() else f"/path/to/{e}"

    return f"[{','.join(place(e) for e in value)}]" if isinstance(value, list) else place(value)

"""Where a result came from, without torch: configs as plain data (flatten, diff, hash), the
bookkeeping keys, git state and library versions.

Everything that compares configs — resume checks, the config hash on every probe row, the
varied axes of ``blocklab-compare`` — reads the one list :data:`BOOKKEEPING`, so "what counts
as the experiment" is decided once.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Config keys that say where and how a run is kept, not what it computes: output paths,
#: resume bookkeeping, logging, checkpoint and probe cadence, the training length and the
#: metric a sweeper reads. They may change on resume without a warning, they are left out of
#: the config hash (a run and its exact resume share one hash), and ``blocklab-compare`` never
#: lists them as an experimental axis. Entries ending in "." are prefixes.
BOOKKEEPING: tuple[str, ...] = (
    "run_dir", "resume", "out_root", "allow_data_change", "objective",
    "logger.", "probes.", "checkpoint_probes.", "monitors.",
    "trainer.max_steps", "trainer.progress_bar", "trainer.quiet", "trainer.log_every_steps",
    "trainer.val_every_steps", "trainer.ckpt_every_steps", "trainer.keep_checkpoints",
    "trainer.keep_best", "trainer.best_monitor",
)


def is_bookkeeping(key: str) -> bool:
    """Whether dotted config ``key`` is (or lies under) a :data:`BOOKKEEPING` entry."""
    return any(key == b.rstrip(".") or (b.endswith(".") and key.startswith(b))
               for b in BOOKKEEPING)


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; empty mappings stay as values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old value, new value)`` for every key that differs, sorted by key; a key
    missing on one side reads ``"<absent>"``."""
    a, b = flatten(old), flatten(new)
    return [(k, a.get(k, "<absent>"), b.get(k, "<absent>"))
            for k in sorted(set(a) | set(b)) if a.get(k, "<absent>") != b.get(k, "<absent>")]


def without_bookkeeping(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The nested config with every bookkeeping key removed."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if is_bookkeeping(key):
            continue
        out[k] = without_bookkeeping(v, key + ".") if isinstance(v, Mapping) else v
    return out


def digest(data: Any) -> str:
    """Short sha256 of JSON-able data (keys sorted)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_hash(config: Mapping[str, Any]) -> str:
    """Hash of a training config without its bookkeeping keys: equal for a run and its exact
    resume, different for any change to the model, data, optimizer or seed."""
    return digest(without_bookkeeping(config))


def arch_hash(model: Mapping[str, Any]) -> str:
    """Hash of a plain model config (``model_to_dict``): same hash, same architecture."""
    return digest(dict(model))


def text_hash(text: str) -> str:
    """Short sha256 of a string (tokenizers are identified by the hash of their JSON)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def git_info() -> dict[str, Any]:
    """Commit and dirty flag of the blocklab source tree when it is a git checkout (an
    installed wheel has none: both are None)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return {"commit": None, "dirty": None}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD") or None,
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def versions() -> dict[str, str]:
    """Python and the versions of the libraries a result depends on."""
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for pkg in ("blocklab", "torch", "lightning", "hydra-core", "omegaconf", "tokenizers",
                "datasets"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "absent"
    return out

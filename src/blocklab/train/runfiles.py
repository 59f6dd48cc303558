"""The files a run directory holds besides its checkpoints and logs: the resolved config of
each launch (``config.yaml``, ``config.resume-<step>.yaml``) and ``run.json`` (what the run is,
readable without torch: the first launch's provenance, and every key its resumes changed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from blocklab import checkpoint as ckpt
from blocklab.eval.report import strict_json
from blocklab.files import write_text_atomic
from blocklab.train.metrics import reconcile


def write_run_files(run_dir: Path, meta: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Clean a killed save's leftovers, write the resolved config (one per resume) and
    ``run.json``; on resume, set aside log rows the resumed run writes again."""
    ckpt.clean_partial(run_dir)
    name = "config.yaml" if old is None else f"config.resume-{old['step']:06d}.yaml"
    (run_dir / name).write_text(meta["config_yaml"])
    info = run_dir / "run.json"  # what the run is, readable without torch
    if not info.exists():
        keep = ("params", "arch_hash", "config_hash", "tokenizer_hash", "data_fingerprint",
                "versions", "git", "overrides", "created", "run_dir", "resume_changes")
        info.write_text(strict_json({k: meta[k] for k in keep}, indent=2))
    elif old is not None and (first := _json_object(info)) is not None:
        # the first launch's record, with what every resume changed since (an unreadable one
        # is left as it is: the checkpoints and summary.json hold the same record)
        write_text_atomic(info, strict_json({**first, "resume_changes": meta["resume_changes"]},
                                            indent=2))
    if old is not None:
        moved = reconcile(run_dir, int(old["step"]))
        if moved:
            print(f"resume: {moved} log rows from step {old['step']} on (written before the "
                  "interruption) moved to logs/*/metrics.superseded.csv; the resumed run "
                  "writes them again", file=sys.stderr)


def _json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (None when it holds none)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None

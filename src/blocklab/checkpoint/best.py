"""``<run dir>:best``: the run's best checkpoint (blocklab.train.best keeps it and records it
in every checkpoint's metadata). The newest checkpoint whose ``meta.json`` verifies against its
manifest holds the record; the checkpoint it names is then verified and read like any other
(``checkpoint._pick``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blocklab.checkpoint.manifest import META, Refused, verified_file
from blocklab.errors import CheckpointError

PREFIX = "step-"


#: ``<run dir>:best`` names the run's best checkpoint (train/best.py), wherever a checkpoint is
#: taken (``blocklab-eval ckpt=``, ``init_from=``, ``resume=``, ``blocklab-generate``, ...).
BEST = ":best"


def split_target(target: str | Path) -> tuple[Path, bool]:
    """(the path, whether ``:best`` follows it)."""
    text = str(target)
    return (Path(text.removesuffix(BEST)), True) if text.endswith(BEST) else (Path(text), False)


def best_name(record: dict[str, Any]) -> str:
    """The checkpoint directory a best record names (from its step: never a path it holds)."""
    return f"{PREFIX}{int(record['step']):06d}"


def best_record(run_dir: str | Path, newest_first: list[Path], name_of: Callable[[Path], str]
                ) -> tuple[dict[str, Any], Path]:
    """(the best record, the checkpoint that holds it) of a run: the newest checkpoint whose
    ``meta.json`` verifies against its manifest says which of its checkpoints is the best —
    read alone, without hashing any ``state.pt``."""
    where = f"checkpoint {run_dir}{BEST}"
    for path in newest_first:
        try:
            meta = json.loads(verified_file(path, META))
        except (CheckpointError, ValueError):
            continue
        record = meta.get("best") if isinstance(meta, dict) else None
        if record is None:
            raise CheckpointError(f"{where}: {name_of(path)} records no best checkpoint (a run "
                                  "with trainer.keep_best=false or from before blocklab kept "
                                  "one, or no checkpoint yet scored); name a checkpoint instead")
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise Refused(f"{where}: {path / META} holds a malformed best record ({record!r})")
        return record, path
    raise CheckpointError(f"{where}: no checkpoint under {Path(run_dir) / 'checkpoints'} whose "
                          f"{META} verifies")

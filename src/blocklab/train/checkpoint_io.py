"""Lightning's checkpoint I/O routed through blocklab's atomic, verified format, so Lightning's
own save and resume paths use it (and every load is ``weights_only=True``). Retention is done
here too, after every successful save: the newest ``keep`` checkpoints of the run directory
stay, whichever launch wrote them (Lightning's own top-k only knows the checkpoints of the
current launch, so every resume used to leave its starting checkpoint behind), and beside them
the best checkpoint the one just saved records (train/best.py), never pruned while it is the
best.

A resume has read its checkpoint already (train/resume.py: resolved, verified, its config
checked): Lightning's restore gets that very state (``resumed``), not a second read of the
directory. What this launch wrote is remembered (``written``), so the run's end does not hash
a checkpoint it has just written to learn whether it is there."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

from blocklab import checkpoint as ckpt


class BlocklabCheckpointIO(CheckpointIO):
    def __init__(self, keep: int = 0, resumed: ckpt.Loaded | None = None) -> None:
        self.keep = keep  # newest checkpoints kept per run directory (0 = all)
        self.resumed = resumed  # the checkpoint a resume read (its whole state, taken once)
        self.written: set[Path] = set()  # the checkpoints this launch saved, complete

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        path = ckpt.write_checkpoint(Path(path), checkpoint)
        self.written.add(path)
        best = (checkpoint.get("blocklab") or {}).get("best")
        protect = [ckpt.best_name(best)] if isinstance(best, dict) else []
        self.written.difference_update(ckpt.prune(path.parent.parent, self.keep, protect=protect))

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(path)
        if self.resumed is not None and path == self.resumed.path and map_location in (
                None, "cpu"):
            state = self.resumed.take_state()
            if state is not None:
                return state
        return ckpt.load(path, map_location=map_location or "cpu")

    def remove_checkpoint(self, path: Any) -> None:
        path = Path(path)
        self.written.discard(path)
        if path.is_dir() and (path / ckpt.MANIFEST).exists():
            shutil.rmtree(path)

"""Lightning's checkpoint I/O routed through blocklab's atomic, verified format, so Lightning's
own save, resume and pruning paths all use it (and every load is ``weights_only=True``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

from blocklab import checkpoint as ckpt


class BlocklabCheckpointIO(CheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        ckpt.write_checkpoint(Path(path), checkpoint)

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        return ckpt.load(Path(path), map_location=map_location or "cpu")

    def remove_checkpoint(self, path: Any) -> None:
        path = Path(path)
        if path.is_dir() and (path / ckpt.MANIFEST).exists():
            shutil.rmtree(path)

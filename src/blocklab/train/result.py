"""What :func:`blocklab.train.run.train` returns: the run directory, as a :class:`pathlib.Path`
(every existing caller keeps treating it as one), that also knows where the run's outputs are
and reads its summary — so Python users need not know the directory layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class RunDir(type(Path())):  # type: ignore[misc]  # PosixPath / WindowsPath, whichever is native
    """A run directory. ``summary`` (summary.json: final metrics and the probe summary),
    ``checkpoint`` (the newest valid checkpoint), ``best_checkpoint``, ``config_path``, ``metrics_path`` (the newest
    launch's metrics.csv). Read when asked, so the value stays right after a later resume."""

    @property
    def summary(self) -> dict[str, Any]:
        path = self / "summary.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    @property
    def checkpoint(self) -> Path:
        from blocklab.checkpoint import resolve

        return resolve(self)

    @property
    def best_checkpoint(self) -> Path:
        """The best checkpoint (``<run>:best``, train/best.py), verified."""
        from blocklab.checkpoint import BEST, resolve

        return resolve(f"{self}{BEST}")

    @property
    def config_path(self) -> Path:
        return self / "config.yaml"

    @property
    def metrics_path(self) -> Path | None:
        versions = sorted((self / "logs").glob("version_*/metrics.csv"),
                          key=lambda p: int(p.parent.name.split("_")[1]))
        return versions[-1] if versions else None

"""Probes on every checkpoint save, during training.

The callback runs the (coarse) probe spec when Lightning saves a checkpoint, on rank 0, under
``no_grad`` with the model in ``eval()`` (train mode restored after). Probe items are pure
functions of the probe seed — nothing draws from the global random generators — so training
is bit-identical with and without the callback (tested, with dropout on). Results go to
``<run dir>/probes/step-NNNNNN/<spec>-<hash>/``; to the loggers go a few headline numbers, and
(:func:`log_probe_result`) the cells and each probe kind's own tables, and the PNGs as images.
A probe that raises is reported (a warning, and ``probe_error.txt`` beside its results) and
training continues unchanged; the checkpoint is written as usual.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L

from blocklab.eval.evaluate import probe_dir, probe_model


def headline(summary: dict[str, Any]) -> dict[str, float]:
    """A few scalars for the loggers, each probe kind's own (``ProbeKind.headline``: e.g. the
    needle accuracy within / beyond the training length and the effective length, the LitM
    best–worst gap, the pooled accuracy of every variant of a grid kind)."""
    from blocklab.eval.kinds import kinds

    out: dict[str, float] = {}
    for kind in kinds():
        out.update(kind.headline(summary.get(kind.name) or {}))
    return out


def probe_tables(result: Any) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """``name -> (columns, rows)``: every scored cell, then each probe kind's own tables
    (``ProbeKind.tables``: e.g. the effective length per needle variant, each
    lost-in-the-middle curve)."""
    from blocklab.eval.kinds import kinds

    cells = [r for r in result.cells if r.get("probe") != "perplexity"]
    columns = list(dict.fromkeys(k for r in cells for k in r))
    tables = {"cells": (columns, [[_plain(r.get(c)) for c in columns] for r in cells])}
    for kind in kinds():
        tables.update(kind.tables(result.summary.get(kind.name) or {}))
    return tables


def _plain(value: Any) -> Any:
    """A table cell: numbers and strings as they are, anything else as text."""
    return value if value is None or isinstance(value, int | float | str) else str(value)


def log_probe_result(loggers: list, result: Any, step: int) -> None:
    """The probe tables and PNGs to every logger that takes them: ``log_table`` /
    ``log_image`` (wandb, and other Lightning loggers with that API), TensorBoard's writer
    (``add_text`` as markdown tables, ``add_image``). The CSV logger has the files already."""
    prefix = f"probe/{result.summary.get('spec', 'probes')}"  # coarse and full kept apart
    tables = probe_tables(result)
    images = {k.removesuffix("_png"): v for k, v in result.files.items() if k.endswith("_png")}
    for logger in loggers:
        try:
            _log_to(logger, prefix, tables, images, step)
        except Exception as e:  # a logger's failure loses neither the files nor the run
            print(f"warning: probe tables/images for {type(logger).__name__} failed "
                  f"({type(e).__name__}: {e}); the files are under the run directory",
                  file=sys.stderr)


def _log_to(logger: Any, prefix: str, tables: dict[str, tuple[list[str], list[list[Any]]]],
            images: dict[str, str], step: int) -> None:
    writer = getattr(logger, "experiment", None) if _is_tensorboard(logger) else None
    if writer is not None:
        for name, (columns, rows) in tables.items():
            writer.add_text(f"{prefix}/{name}", _markdown(columns, rows), step)
        for name, path in images.items():
            writer.add_image(f"{prefix}/plot/{name}", _read_png(path), step, dataformats="HWC")
        writer.flush()
    elif hasattr(logger, "log_table") and hasattr(logger, "log_image"):
        for name, (columns, rows) in tables.items():
            logger.log_table(f"{prefix}/{name}", columns=columns, data=rows, step=step)
        for name, path in images.items():
            logger.log_image(f"{prefix}/plot/{name}", images=[str(path)], step=step)


def _is_tensorboard(logger: Any) -> bool:
    return type(logger).__name__ == "TensorBoardLogger"


def _markdown(columns: list[str], rows: list[list[Any]]) -> str:
    """A markdown table (TensorBoard's text plugin renders it)."""
    def cell(v: Any) -> str:
        return "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _read_png(path: str | Path) -> Any:
    """An (H, W, 3) uint8 array of a PNG (alpha dropped)."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


class ProbeCallback(L.Callback):
    def __init__(self, spec, tc, meta: dict[str, Any], run_dir: Path, *,
                 run: Callable[..., Any] = probe_model, verbose: bool = False,
                 all_ranks: bool = False, validation: Callable[..., Any] | None = None) -> None:
        self.spec, self.tc, self.meta, self.run_dir = spec, tc, meta, Path(run_dir)
        self.validation = validation  # the run's validation text, for the perplexity probe
        self.run, self.verbose = run, verbose
        # Sharded parameters: every rank must take part in every forward; rank 0 writes.
        self.all_ranks = all_ranks
        self.done: set[int] = set()
        self.errors: list[tuple[int, str]] = []
        self.last: dict[str, Any] | None = None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        step = trainer.global_step
        zero = trainer.is_global_zero
        if not self.spec.enabled or not (zero or self.all_ranks) or step in self.done:
            return
        self.done.add(step)
        name = f"step-{step:06d}"
        out_dir = probe_dir(self.run_dir, name, self.spec)
        was_training = pl_module.model.training
        try:
            extra = {"validation": self.validation} if self.validation is not None else {}
            result = self.run(pl_module.model, self.tc, self.meta, self.spec, step=step,
                              checkpoint=name, out_dir=out_dir if zero else None, plots=True,
                              **extra)
        except Exception as e:
            if not zero:
                pl_module.model.train(was_training)
                return
            # Policy: a failing probe never stops training or touches its state. The
            # checkpoint is written as usual; the error is printed and kept next to it.
            pl_module.model.train(was_training)
            self.errors.append((step, f"{type(e).__name__}: {e}"))
            print(f"warning: probes at step {step} failed ({type(e).__name__}: {e}); training "
                  f"continues, details in {out_dir.parent / 'probe_error.txt'}", file=sys.stderr)
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            (out_dir.parent / "probe_error.txt").write_text(traceback.format_exc())
            return
        if result is None or not zero:
            return
        self.last = result.summary
        scalars = headline(result.summary)
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=step)
        log_probe_result(trainer.loggers, result, step)
        if self.verbose:
            print(f"probes at step {step}: " + ", ".join(
                f"{k.removeprefix('probe/')} {v:.3g}" for k, v in scalars.items()),
                file=sys.stderr)

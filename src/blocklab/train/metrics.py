"""Metrics as durable as checkpoints: every step's row is on disk before any checkpoint that
follows it, and after a crash and resume each step's row exists exactly once.

Lightning logs a step's metrics only after its ``on_train_batch_end`` hooks, where periodic
checkpoints are written, and validates after that: a process killed between the two lost the
rows of the step before its newest checkpoint for good (and its validation), because the
resumed run starts after them. Here the order is reversed: :class:`StepRow` runs first among
the batch-end callbacks and makes the step's row (training metrics on log steps, the validation
loss and accuracy on validation steps); :class:`DurableMetrics`, after the callbacks that may
stop the run, completes the row of its last step (training metrics and validation: every run
reports both for its last step, however it ended) and writes and flushes it; only then are
checkpoints written.

A run that crashed between two checkpoints leaves rows the resumed run writes again (it
restarts at its checkpoint and replays those steps exactly). :func:`reconcile` moves them, when
the run resumes, out of the earlier logs into ``metrics.superseded.csv`` beside them (kept,
never deleted), so ``logs/version_*/metrics.csv`` — what ``blocklab-compare`` and plots read —
holds each step once.
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path
from typing import Any

import lightning as L


class StepRow(L.Callback):
    """First among the batch-end callbacks: closes each optimizer step and makes its row —
    training metrics on log steps, validation loss and accuracy on validation steps — for the
    callbacks after it (``pl_module.last_row``: early stopping reads it); :class:`DurableMetrics`
    writes it."""

    def __init__(self, *, log_every: int, val_every: int, accumulate: int, max_steps: int) -> None:
        self.log_every, self.val_every = log_every, val_every
        self.accumulate, self.max_steps = accumulate, max_steps
        self._last_step = -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % self.accumulate:
            return  # mid-accumulation: the optimizer step is not done
        # A row's step is the number of optimizer steps done, as in the checkpoint names: the
        # row of step 10 and checkpoint step-000010 describe the same model.
        step = trainer.global_step
        if step == self._last_step:
            return  # a skipped (non-finite) step: no new optimizer step, no row
        self._last_step = step
        row = pl_module.finish_step(log=step % self.log_every == 0 or step >= self.max_steps)
        if step % self.val_every == 0:
            row |= validate(pl_module)
        pl_module.last_row, pl_module.last_row_step = row, step


class DurableMetrics(L.Callback):
    """After the callbacks that may end the run (early stopping, ``max_time``, a user's) and
    before any checkpoint: the run's last step — ``max_steps`` reached or a stop asked for,
    not a preemption, which the resumed run continues — gets its training metrics and a
    validation if its row lacks them (never twice); then the row is written and flushed.
    Validation draws nothing from the training's random generators and reads its own fixed
    batches, so it changes neither the data order nor any later step."""

    def __init__(self, *, max_steps: int) -> None:
        self.max_steps = max_steps
        self._written = -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if pl_module.last_row_step != step or self._written == step:
            return  # mid-accumulation, or a skipped step: no new row
        self._written = step
        row = pl_module.last_row
        if step >= self.max_steps or (trainer.should_stop
                                      and not getattr(trainer, "received_sigterm", False)):
            if "train/lr" not in row:
                row |= pl_module.train_row()
            if not any(k.startswith("val/") for k in row):
                row |= validate(pl_module)
        if row:
            write_row(trainer, row, step)
            for name, value in row.items():  # the run summary: each metric's last value, step
                pl_module.latest[name] = (step, float(value))


def validate(pl_module) -> dict[str, float]:
    """The validation metrics of the model as it is now, also shown on the progress bar."""
    val = pl_module.validation_metrics()
    for name, value in val.items():
        pl_module.log(name, value, logger=False, prog_bar=True, batch_size=1)
    return val


def write_row(trainer: L.Trainer, row: dict[str, float], step: int) -> None:
    """Log one row at ``step`` to every logger and flush it to disk now."""
    for logger in trainer.loggers:
        logger.log_metrics(row, step=step)
        logger.save()


def _superseded(row: dict[str, str], resume_step: int) -> bool:
    """Whether a logged row will be written again by a run resuming at ``resume_step`` (the
    checkpoint after that many optimizer steps): the rows of later steps. The row of the
    resumed step itself and its probes were written before its checkpoint and stay."""
    try:
        step = int(float(row.get("step") or ""))
    except ValueError:
        return False
    return step > resume_step


def reconcile(run_dir: str | Path, resume_step: int) -> int:
    """Before a run resumes at ``resume_step``: move rows it will write again out of the
    earlier ``logs/version_*/metrics.csv`` into ``metrics.superseded.csv`` beside each (atomic
    rewrite). Returns the number of rows moved."""
    moved = 0
    for path in sorted(Path(run_dir).glob("logs/version_*/metrics.csv"), key=_version):
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            fields, rows = list(reader.fieldnames or []), list(reader)
        again = [r for r in rows if _superseded(r, resume_step)]
        if not again:
            continue
        side = path.with_name("metrics.superseded.csv")
        new_side = not side.exists()
        with side.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            if new_side:
                w.writeheader()
            w.writerows(again)
        tmp = path.with_name(f".metrics.csv.tmp-{os.getpid()}")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(r for r in rows if not _superseded(r, resume_step))
        tmp.replace(path)
        moved += len(again)
    return moved


def _version(path: Path) -> tuple[int, str]:
    m = re.fullmatch(r"version_(\d+)", path.parent.name)
    return (int(m.group(1)) if m else 1 << 30, path.parent.name)


def read_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every row of the run's ``logs/version_*/metrics.csv``, in version order."""
    rows = []
    for path in sorted(Path(run_dir).glob("logs/version_*/metrics.csv"), key=_version):
        with path.open(newline="") as f:
            rows += list(csv.DictReader(f))
    return rows

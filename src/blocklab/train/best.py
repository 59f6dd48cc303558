"""The best checkpoint: kept beside the newest ``trainer.keep_checkpoints``, never pruned while
it is the best, and chosen with ``<run>:best`` (``blocklab-eval ckpt=``, ``init_from=``, ...).

A checkpoint is scored by the watched metric in its own step's row — the row is made before
any checkpoint of that step (train/metrics.py), the last step's always validates — and the
best so far is recorded in every checkpoint's metadata (``best``: step, metric, mode, score).
Retention protects the checkpoint the newest one records (train/checkpoint_io.py), and
``<run>:best`` reads that record (blocklab.checkpoint), so both follow the same record, which
a resume restores with the rest of the state.

Which metric (``config.validate.best_rule``): ``trainer.best_monitor``, else what early stopping
watches (its ``monitor`` and ``mode``: the checkpoint it reports as best is the one kept),
else ``val/loss``, lower is better. Ties keep the earlier checkpoint.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from blocklab.config import TrainConfig
from blocklab.config.validate import best_rule


def better_record(best: dict[str, Any] | None, rule: tuple[str, str], step: int,
                  row: dict[str, float]) -> dict[str, Any] | None:
    """The best record after scoring the checkpoint of ``step`` by ``row``: the new one when
    the row holds the metric and beats ``best`` (or there is none, or ``best`` watched another
    metric: a resume that changed it starts over), else ``best``."""
    metric, mode = rule
    score = row.get(metric)
    if score is None or not math.isfinite(float(score)):
        return best
    score = float(score)
    same = best is not None and best.get("metric") == metric and best.get("mode") == mode
    if same and best.get("step") != step and not (
            score < best["score"] if mode == "min" else score > best["score"]):
        return best
    return {"step": int(step), "metric": metric, "mode": mode, "score": score}


def cadence_warning(tc: TrainConfig) -> str | None:
    """A line when some periodic checkpoints cannot be the best: their steps' rows lack the
    watched metric (validation every ``val_every_steps``, training rows every
    ``log_every_steps``); None otherwise."""
    rule = best_rule(tc)
    if rule is None:
        return None
    t = tc.trainer
    key = "val_every_steps" if rule[0].startswith("val/") else "log_every_steps"
    every = getattr(t, key)
    if t.ckpt_every_steps % every == 0 or t.ckpt_every_steps >= t.max_steps:
        return None
    return (f"warning: trainer.ckpt_every_steps={t.ckpt_every_steps} is not a multiple of "
            f"trainer.{key}={every}: checkpoints at steps without {rule[0]} in their row cannot "
            "be kept as the best (trainer.keep_best); make it a multiple, or "
            "trainer.keep_best=false")


def describe(best: dict[str, Any] | None) -> str:
    """``step-000010 (val/loss 4.123)``, or ``-``."""
    if not best:
        return "-"
    return f"step-{best['step']:06d} ({best['metric']} {best['score']:.4g})"


def say(line: str | None) -> None:
    if line:
        print(line, file=sys.stderr)

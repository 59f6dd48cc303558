"""What a run gives its trackers: metric rows keyed by the same step numbers as the
checkpoints (the row of step 10 and ``step-000010`` describe the same model)."""

from __future__ import annotations

import csv
from pathlib import Path

from blocklab import checkpoint as ckpt
from blocklab.config import compose
from blocklab.train.run import train


def rows(run_dir: Path) -> list[dict[str, str]]:
    return [r for f in sorted(run_dir.glob("logs/version_*/metrics.csv"))
            for r in csv.DictReader(f.open())]


def steps(rows_: list[dict[str, str]], column: str) -> list[int]:
    return sorted(int(r["step"]) for r in rows_ if r.get(column))


def test_metric_rows_are_keyed_by_the_checkpoint_step_numbers(tmp_path):
    run = train(compose("train", ["experiment=smoke", f"out_root={tmp_path}", "probes=none"]))
    logged = rows(run)
    saved = [int(p.name.removeprefix("step-")) for p in ckpt.list_checkpoints(run)]
    assert saved == [10, 20]
    assert steps(logged, "val/loss") == saved  # validated on exactly the checkpointed models
    assert steps(logged, "train/loss") == [5, 10, 15, 20]  # every log_every_steps=5 steps done
    assert ckpt.metadata(run / "checkpoints" / "step-000020")["step"] == 20


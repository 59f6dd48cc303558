"""SIGTERM (preemption): the current step finishes, its checkpoint is written, the command exits
with the "preempted, resumable" code 7 and says how to resume; resuming gives exactly the
uninterrupted run (per-step losses equal as logged strings), each step logged once.

The signal arrives at a deterministic point — the process sends it to itself as step 23 starts
(``BLOCKLAB_FAULT=SIGTERM@step:23``), through the same handler a cluster's SIGTERM reaches — so
the test never races a signal against a loaded machine."""

from __future__ import annotations

import csv
import os
import subprocess

import pytest

from inprocess import SAFETY_S
from train.test_train_cli import BIN, losses

pytestmark = pytest.mark.slow

ARGS = ["experiment=smoke", "trainer.max_steps=60", "trainer.ckpt_every_steps=10",
        "trainer.val_every_steps=30", "trainer.log_every_steps=1", "model.dropout=0.1",
        "probes=none"]


def test_sigterm_checkpoints_the_step_and_resume_is_exact(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "BLOCKLAB_FAULT": "SIGTERM@step:23"}
    r = subprocess.run([str(BIN / "blocklab-train"), *ARGS, f"run_dir={run}"],
                       capture_output=True, text=True, timeout=SAFETY_S, env=env)
    err = r.stderr
    assert r.returncode == 7, err[-2000:]
    steps = sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").iterdir())
    stopped = steps[-1]
    assert steps == [10, 20, 24], steps  # the step it was in (step 23 -> 24 steps done)
    assert f"resume exactly with: blocklab-train resume={run}" in err

    r = subprocess.run([str(BIN / "blocklab-train"), *ARGS, f"resume={run}"],
                       capture_output=True, text=True, timeout=SAFETY_S)
    assert r.returncode == 0, r.stderr[-2000:]
    straight = tmp_path / "straight"
    r = subprocess.run([str(BIN / "blocklab-train"), *ARGS, f"run_dir={straight}"],
                       capture_output=True, text=True, timeout=SAFETY_S)
    assert r.returncode == 0, r.stderr[-2000:]
    assert losses(run) == losses(straight) and sorted(losses(run)) == list(range(1, 61))
    logged = [[int(row["step"]) for row in csv.DictReader(f.open()) if row.get("train/loss")]
              for f in sorted((run / "logs").glob("version_*/metrics.csv"))]
    assert len(logged) == 2 and not set(logged[0]) & set(logged[1])  # each step once
    assert max(logged[0]) == stopped  # the row of the checkpoint's own step

"""Sweeps run on Hydra's machinery, as users launch them (CLI subprocesses): a failing job
records its error and the others finish; the summary lists it and writes the comparison;
parallel local jobs (joblib), submitit's local executor (the SLURM code path), the Optuna
sweeper, and multirun + DDP, where each job's child process reruns only that job; a job killed
by a signal fails alone under the parallel and the submitit launchers."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from inprocess import SAFETY_S
from train.test_train_cli import cli

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
SMOKE = ["experiment=smoke", "probes=none", "trainer.progress_bar=false"]
# 4 steps a job, not the smoke run's 20: what is checked here is the sweep around the jobs
FOUR = ["trainer.max_steps=4", "trainer.ckpt_every_steps=4", "trainer.val_every_steps=2"]


def sweep_dir(out: Path) -> Path:
    (d,) = (out / "smoke").iterdir()  # exactly one sweep directory
    return d


def statuses(d: Path) -> dict[int, dict]:
    return {int(p.parent.name): json.loads(p.read_text()) for p in d.glob("*/status.json")}


def test_a_failing_job_is_reported_and_the_others_finish_in_parallel(tmp_path):
    r = cli("-m", "hydra/launcher=parallel", *SMOKE, *FOUR, f"out_root={tmp_path}",
            "model/position=rope,alibi", "model.n_heads=4,3")
    assert r.returncode == 0, r.stderr[-3000:]
    d = sweep_dir(tmp_path)
    st = statuses(d)
    assert {k: v["status"] for k, v in st.items()} == {0: "ok", 1: "failed", 2: "ok", 3: "failed"}
    assert "model.n_heads=3: must divide d_model=128" in st[1]["error"]
    assert "4 jobs, 2 failed" in r.stderr and "job 3 (" in r.stderr
    rows = list(csv.DictReader((d / "compare.csv").open()))
    assert len(rows) == 4 and (d / "loss_curves.png").stat().st_size > 0
    ok = {row["model.position.name"] for row in rows if row["status"] == "ok"}
    assert ok == {"rope", "alibi"}
    assert all(math.isfinite(v["objective"]) for v in st.values() if v["status"] == "ok")


def test_submitit_local_executor_runs_the_jobs(tmp_path):
    r = cli("-m", "hydra/launcher=local", *SMOKE, *FOUR, f"out_root={tmp_path}",
            "model/norm=layernorm,rmsnorm")
    assert r.returncode == 0, r.stderr[-3000:]
    d = sweep_dir(tmp_path)
    assert {k: v["status"] for k, v in statuses(d).items()} == {0: "ok", 1: "ok"}
    assert list((d / ".submitit").iterdir())  # went through submitit's job protocol
    norms = {yaml.safe_load((d / f"{j}/config.yaml").read_text())["model"]["norm"]["name"]
             for j in (0, 1)}
    assert norms == {"layernorm", "rmsnorm"}


def test_optuna_sweeper_minimizes_the_objective(tmp_path):
    r = cli("-m", "hydra/sweeper=lr_search", "hydra.sweeper.n_trials=2", *SMOKE, *FOUR,
            f"out_root={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    d = sweep_dir(tmp_path)
    result = yaml.safe_load((d / "optimization_results.yaml").read_text())
    st = statuses(d)
    values = {j: s["objective"] for j, s in st.items()}
    assert len(values) == 2 and result["best_value"] == pytest.approx(min(values.values()))
    lrs = {yaml.safe_load((d / f"{j}/config.yaml").read_text())["optim"]["lr"] for j in st}
    assert len(lrs) == 2  # two different learning rates tried


def test_multirun_with_ddp_runs_each_job_once(tmp_path):
    r = cli("-m", "trainer=ddp", *SMOKE, *FOUR, f"out_root={tmp_path}",
            "model/position=rope,alibi")
    assert r.returncode == 0, r.stderr[-3000:]
    d = sweep_dir(tmp_path)  # a child rerunning the sweep would add sweep directories
    assert sorted(p.name for p in d.iterdir() if p.is_dir()) == ["0", "1"]
    assert {k: v["status"] for k, v in statuses(d).items()} == {0: "ok", 1: "ok"}
    for job, position in ((0, "rope"), (1, "alibi")):
        cfg = yaml.safe_load((d / f"{job}/config.yaml").read_text())
        assert cfg["model"]["position"]["name"] == position and cfg["trainer"]["devices"] == 2
        assert len(list((d / f"{job}/logs").iterdir())) == 1  # one launch, one log version
        assert (d / f"{job}/checkpoints/step-000004").is_dir()


KILLED = "its process was killed by SIGKILL (signal 9) before the job finished; SIGKILL is " \
         "what the OOM killer sends; resume it with: blocklab-train resume="
SHORT = ["trainer.max_steps=4", "trainer.ckpt_every_steps=2", "trainer.val_every_steps=2"]


def fault_cli(fault: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "blocklab-train"), *args], capture_output=True, text=True,
                          timeout=SAFETY_S, env={**os.environ, "BLOCKLAB_FAULT": fault})


def test_a_killed_job_fails_alone_under_the_parallel_launcher(tmp_path):
    """Job 1 SIGKILLed as its step 2 starts (as the OOM killer does it): Hydra's joblib launcher
    lost the job beside it too (loky kills every worker of a broken executor), never started
    job 2, wrote no summary and exited 2 with a traceback. Now job 1 alone is failed, recorded
    by the launching process with the signal, and the summary lists it."""
    r = fault_cli("SIGKILL@step:2#job=1", "-m", "hydra/launcher=parallel", *SMOKE, *SHORT,
                  f"out_root={tmp_path}", "model/position=rope,alibi,learned")
    assert r.returncode == 0, r.stderr[-3000:]
    d = sweep_dir(tmp_path)
    st = statuses(d)
    assert {k: v["status"] for k, v in st.items()} == {0: "ok", 1: "failed", 2: "ok"}
    assert st[1]["error"] == KILLED + str(d / "1")
    assert st[1]["job"] == 1 and "model/position=alibi" in st[1]["overrides"]
    assert "3 jobs, 1 failed" in r.stderr and "job 1 (" in r.stderr
    for job in (0, 2):
        assert (d / f"{job}/checkpoints/step-000004").is_dir()
    assert (d / "1/checkpoints/step-000002").is_dir()  # what the hint resumes from
    assert len(list(csv.DictReader((d / "compare.csv").open()))) == 3


def test_a_killed_job_fails_alone_under_submitits_local_launcher(tmp_path):
    """The same under submitit (the SLURM code path): Hydra's launcher raised at the first job
    without a result, while the other job still ran, and wrote no summary."""
    r = fault_cli("SIGKILL@step:2#job=0", "-m", "hydra/launcher=local", *SMOKE, *SHORT,
                  f"out_root={tmp_path}", "model/norm=layernorm,rmsnorm")
    assert r.returncode == 0, r.stderr[-3000:]
    d = sweep_dir(tmp_path)
    st = statuses(d)
    assert {k: v["status"] for k, v in st.items()} == {0: "failed", 1: "ok"}
    assert st[0]["error"].startswith("its process ended without a result (submitit job ")
    assert st[0]["error"].endswith(f"; resume it with: blocklab-train resume={d / '0'}")
    assert "2 jobs, 1 failed" in r.stderr and (d / "compare.csv").is_file()
    assert (d / "1/checkpoints/step-000004").is_dir()

"""Nothing lost (docs/reliability.md): crashes between and right after saves, Ctrl-C, a corrupt
newest checkpoint, resumes and pruning, and a run directory wanted by two processes — each
driven through the command line at a deterministic point (``BLOCKLAB_FAULT``), never by timing.

After any crash and resume, each step's metrics row is in ``logs/*/metrics.csv`` exactly once
(validation rows included), what the resumed run wrote again is kept aside, and the resumed
run equals the uninterrupted one."""

from __future__ import annotations

import csv
import fcntl
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from blocklab import checkpoint as ckpt
from inprocess import SAFETY_S, run_cli
from train.test_train_cli import BIN, losses

pytestmark = pytest.mark.slow

ARGS = ["experiment=smoke", "trainer.max_steps=16", "trainer.ckpt_every_steps=8",
        "trainer.val_every_steps=4", "trainer.log_every_steps=1", "model.dropout=0.1",
        "probes=none"]


def cli(*args: str, fault: str | None = None, tool: str = "blocklab-train"
        ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "BLOCKLAB_FAULT"}
    if fault:
        env["BLOCKLAB_FAULT"] = fault
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, timeout=SAFETY_S,
                          env=env)


def rows(run: Path, name: str = "metrics.csv") -> list[dict[str, str]]:
    return [r for f in sorted((run / "logs").glob(f"version_*/{name}"))
            for r in csv.DictReader(f.open())]


def steps_of(rows_: list[dict[str, str]], column: str) -> list[int]:
    return sorted(int(r["step"]) for r in rows_ if r.get(column))


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("straight") / "run"
    r = cli(*ARGS, f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    return run


def test_every_step_row_is_written_before_the_checkpoint_that_follows_it(straight):
    logged = rows(straight)
    assert steps_of(logged, "train/loss") == list(range(1, 17))
    assert steps_of(logged, "val/loss") == [4, 8, 12, 16]


@pytest.mark.parametrize("fault", ["SIGKILL@save:8", "SIGKILL@step:11", "SIGINT@step:10"])
def test_after_a_crash_and_resume_each_row_exists_once_and_the_run_is_exact(
        straight, tmp_path, fault):
    run = tmp_path / "run"
    first = cli(*ARGS, f"run_dir={run}", fault=fault)
    if fault.startswith("SIGINT"):  # Ctrl-C: finish the step, checkpoint it, exit 7
        assert first.returncode == 7, first.stderr[-2000:]
        assert "interrupted (SIGINT) after step 11" in first.stderr
        assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-000008", "step-000011"]
    else:
        assert first.returncode == -9
    again = cli(*ARGS, f"resume={run}")
    assert again.returncode == 0, again.stderr[-3000:]
    logged = rows(run)
    assert steps_of(logged, "train/loss") == list(range(1, 17))  # each step once
    assert steps_of(logged, "val/loss") == [4, 8, 12, 16]
    assert losses(run) == losses(straight)
    set_aside = rows(run, "metrics.superseded.csv")
    if fault == "SIGKILL@step:11":  # rows 9..11 were written before the kill, and again after
        assert steps_of(set_aside, "train/loss") == [9, 10, 11]
        assert "moved to logs/*/metrics.superseded.csv" in again.stderr


def test_a_corrupt_newest_checkpoint_is_kept_aside_and_the_final_state_saved(straight, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    state = run / "checkpoints" / "step-000016" / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    r = cli(*ARGS, f"resume={run}")  # falls back to step 8, retrains 8..15, saves step 16
    assert r.returncode == 0, r.stderr[-3000:]
    assert "failed verification; kept as step-000016.corrupt-1" in r.stderr
    assert ckpt.is_valid(run / "checkpoints" / "step-000016")
    assert (run / "checkpoints" / "step-000016.corrupt-1" / "state.pt").read_bytes() == data
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-000008", "step-000016"]
    assert losses(run) == losses(straight)


def test_pruning_counts_the_checkpoints_of_every_launch(tmp_path, capfd):
    run = tmp_path / "run"
    base = ["experiment=smoke", "trainer.ckpt_every_steps=2", "trainer.keep_checkpoints=2",
            "trainer.val_every_steps=100", "probes=none"]
    r = run_cli(capfd, "blocklab-train", *base, "trainer.max_steps=4", f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-2000:]
    for steps in (6, 8):  # each resume starts from the newest checkpoint of the last launch
        r = run_cli(capfd, "blocklab-train", *base, f"trainer.max_steps={steps}", f"resume={run}")
        assert r.returncode == 0, r.stderr[-2000:]
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-000006", "step-000008"]


def _hold(run: Path):
    """Hold the run directory's lock the way a training process does."""
    run.mkdir(parents=True, exist_ok=True)
    fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"pid": 4242, "host": "elsewhere", "purpose": "train",
                             "since": "2026-01-01T00:00:00"}).encode())
    return fd


def test_a_run_directory_has_one_owner(straight, tmp_path, capfd):
    """The lock is held here through another open file (flock: refused as from another
    process); the commands run in process."""
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    fd = _hold(run)  # (a real second training and a resume: the two-process test below)
    try:
        r = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none")  # writing into the run
        assert r.returncode == 6, r.stderr[-2000:]
        assert r.stderr.strip().splitlines()[-1] == (
            f"I/O error: run directory {run} is in use by train (pid 4242 on elsewhere, "
            "since 2026-01-01T00:00:00); wait for it to finish, or use another directory "
            "(run_dir=/out=)")
        before = sorted(p.name for p in run.rglob("*"))
        r = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none",
                    f"out={tmp_path / 'elsewhere'}")
        assert r.returncode == 0, r.stderr[-2000:]  # evaluation elsewhere needs no lock
        assert sorted(p.name for p in run.rglob("*")) == before  # and writes nothing in the run
        assert (tmp_path / "elsewhere" / "val.json").is_file()
    finally:
        os.close(fd)
    # A lock file left by a process that died (no one holds it) does not block anything.
    r = run_cli(capfd, "blocklab-train", *ARGS, "trainer.max_steps=17", f"resume={run}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert [p.name for p in ckpt.list_checkpoints(run)][-1] == "step-000017"


def test_an_unusable_output_root_is_an_io_error_before_anything_is_built(tmp_path, capfd):
    (tmp_path / "file").write_text("x")
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", f"out_root={tmp_path / 'file'}")
    assert r.returncode == 6
    assert r.stderr.strip().splitlines()[-1].startswith("I/O error: run directory ")
    assert "is a file, not a directory" in r.stderr


def test_evaluation_writes_only_where_it_is_told_and_checks_that_first(straight, tmp_path,
                                                                      capfd):
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    out = tmp_path / "out"
    r = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=coarse", f"out={out}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before  # run untouched
    assert json.loads((out / "val.json").read_text())["step"] == 16
    (probe_dir,) = [p for p in out.iterdir() if p.is_dir()]
    assert probe_dir.name.startswith("coarse-") and (probe_dir / "cells.csv").is_file()
    (tmp_path / "a_file").write_text("x")
    r = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=coarse",
                f"out={tmp_path / 'a_file' / 'sub'}")
    assert r.returncode == 6  # refused before the work, not after it
    assert r.stderr.strip().splitlines() == [
        f"I/O error: out= {tmp_path / 'a_file' / 'sub'}: {tmp_path / 'a_file'} is a file, "
        "not a directory"]
    assert "val/loss" not in r.stdout


def test_two_trainings_into_one_directory_one_is_refused(tmp_path, capfd):
    """Two real processes: the first stops itself (SIGSTOP) at step 3 while it owns the run
    (checkpoint 2 written), a second training and a resume (this test's process) are refused
    naming it, and the first then finishes normally."""
    run = tmp_path / "run"
    args = [*ARGS, "trainer.max_steps=4", "trainer.ckpt_every_steps=2"]
    env = {**os.environ, "BLOCKLAB_FAULT": "SIGSTOP@step:3"}
    first = subprocess.Popen([str(BIN / "blocklab-train"), *args, f"run_dir={run}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=env)
    try:
        _, status = os.waitpid(first.pid, os.WUNTRACED)  # returns once it has stopped itself
        assert os.WIFSTOPPED(status), status
        for other in (f"run_dir={run}", f"resume={run}"):  # a second training, a resume
            r = run_cli(capfd, "blocklab-train", *args, other)
            assert r.returncode == 6, r.stderr[-2000:]
            assert f"in use by train (pid {first.pid} on " in r.stderr
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, err = first.communicate(timeout=SAFETY_S)
    assert first.returncode == 0, err[-2000:]
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-000002", "step-000004"]

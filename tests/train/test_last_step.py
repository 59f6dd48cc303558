"""Every run validates its last step, however it ends (issue 41, item 4): ``trainer.max_steps``
short of the first ``val_every_steps``, early stopping between validations, ``max_time``, a
resume's new end — once, never twice — logged like any validation row, before the step's
checkpoint, and in ``summary.json`` with the step each metric comes from. The final validation
draws nothing from the training's random generators: a run resumed from such a step still equals
the uninterrupted one. And ``trainer.compile`` says when it compiles."""

from __future__ import annotations

import json

import pytest

from blocklab import compare
from inprocess import run_cli
from train.test_faults import rows, steps_of
from train.test_train_cli import losses

SMOKE = ["experiment=smoke", "probes=none"]  # val_every 10, ckpt_every 10, log_every 5


def only_run(root):
    (run,) = (root / "smoke").iterdir()
    return run


def summary(run) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_a_run_shorter_than_val_every_validates_its_last_step(tmp_path, capfd):
    r = run_cli(capfd, "blocklab-train", *SMOKE, "trainer.max_steps=4", f"out_root={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(tmp_path)
    logged = rows(run)
    assert steps_of(logged, "val/loss") == [4] and steps_of(logged, "val/accuracy") == [4]
    assert steps_of(logged, "train/loss") == [4]  # its training row too (log_every 5)
    s = summary(run)
    val = next(float(r["val/loss"]) for r in logged if r.get("val/loss"))
    assert s["metrics"]["val/loss"] == val and s["metric_steps"]["val/loss"] == 4
    assert f"val/loss        {val:.4g}\n" in r.stdout  # the step is the last one: unmarked


def test_a_last_step_that_validates_anyway_validates_once(tmp_path, capfd, monkeypatch):
    from blocklab.train.module import LitModel

    validated, real = [], LitModel.validation_metrics

    def counted(self):
        validated.append(self.global_step)
        return real(self)

    monkeypatch.setattr(LitModel, "validation_metrics", counted)
    r = run_cli(capfd, "blocklab-train", *SMOKE, "trainer.max_steps=10",
                "trainer.log_every_steps=1", f"out_root={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert validated == [10]  # not a second time for being the last step
    logged = rows(only_run(tmp_path))
    assert steps_of(logged, "val/loss") == [10]
    assert steps_of(logged, "train/loss") == list(range(1, 11))


def test_early_stopping_between_validations_validates_the_step_it_stops_at(tmp_path, capfd):
    # train/loss is checked on log steps (5, 10): min_delta 100 stops at 10 whatever the losses
    # are; validation every 100 steps would never come
    r = run_cli(capfd, "blocklab-train", *SMOKE, f"out_root={tmp_path}",
                "trainer.val_every_steps=100", "callbacks=[early_stopping]",
                "callbacks.early_stopping.monitor=train/loss",
                "callbacks.early_stopping.patience=1", "callbacks.early_stopping.min_delta=100")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stopped early at step 10 of 20" in r.stderr
    run = only_run(tmp_path)
    assert steps_of(rows(run), "val/loss") == [10]
    assert summary(run)["metric_steps"]["val/loss"] == 10


def test_max_time_validates_the_step_it_stops_at(tmp_path, capfd):
    r = run_cli(capfd, "blocklab-train", *SMOKE, f"out_root={tmp_path}",
                "trainer.max_time='00:00:00:00'")
    assert r.returncode == 0, r.stderr[-3000:]
    logged = rows(only_run(tmp_path))
    assert steps_of(logged, "val/loss") == [1] and steps_of(logged, "train/loss") == [1]


def test_a_resume_validates_its_new_last_step_and_compare_shows_it(tmp_path, capfd):
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", *SMOKE, "trainer.max_steps=10", f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "trainer.max_steps=13")
    assert r.returncode == 0, r.stderr[-3000:]
    assert steps_of(rows(run), "val/loss") == [10, 13]
    (row,) = compare.collect([run])
    assert (row["step"], row["val_loss_step"], row["train_loss_step"]) == (13, 13, 13)
    assert "(step" not in compare.markdown_table([row])


@pytest.mark.slow
def test_a_run_resumed_from_a_final_validation_equals_the_uninterrupted_one(tmp_path, capfd):
    """Step 6 is validated only because it ended the first launch; dropout on, so a validation
    that drew from the global generators would shift every later step's dropout masks."""
    args = [*SMOKE, "trainer.log_every_steps=1", "model.dropout=0.1", "trainer.ckpt_every_steps=6",
            "schedule.min_lr_ratio=1.0"]  # a learning rate that does not depend on max_steps
    straight, run = tmp_path / "straight", tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", *args, "trainer.max_steps=12", f"run_dir={straight}")
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli(capfd, "blocklab-train", *args, "trainer.max_steps=6", f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert steps_of(rows(run), "val/loss") == [6]
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "trainer.max_steps=12")
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(losses(run)) == list(range(1, 13)) and losses(run) == losses(straight)
    assert steps_of(rows(straight), "val/loss") == [10, 12]


def test_a_resume_with_nothing_left_to_train_keeps_the_summary(tmp_path, capfd):
    """The summary is read from the run's rows: a launch that trained no step reports the
    last ones, not an empty summary."""
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", *SMOKE, "trainer.max_steps=4", f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    before = summary(run)
    r = run_cli(capfd, "blocklab-train", f"resume={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    after = summary(run)
    assert after["metrics"]["val/loss"] == before["metrics"]["val/loss"]
    assert after["metric_steps"]["val/loss"] == 4


def test_compile_says_when_it_compiles_and_how_long_the_first_step_took(tmp_path, capfd,
                                                                       monkeypatch):
    """torch.compile compiles at the first step; here it is replaced by a no-op (the lines are
    what is tested, not inductor: tests/model/test_compile.py is)."""
    import torch

    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compiled.append(kw))
    r = run_cli(capfd, "blocklab-train", *SMOKE, "trainer.max_steps=2", "trainer.compile=true",
                f"out_root={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert compiled == [{"dynamic": None}]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("compile:")]
    assert len(lines) == 2, r.stderr[-3000:]
    assert lines[0] == ("compile: compiling the model (torch.compile; the first steps take "
                        "longer) ...")
    assert lines[1].startswith("compile: compiled; the first step took ") and \
        lines[1].endswith(" s")

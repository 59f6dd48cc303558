"""The best checkpoint (issue 41, item 6): kept beside the newest ``trainer.keep_checkpoints``
— never pruned while it is the best —, named in the summary and the printout, and chosen with
``<run>:best`` by ``blocklab-eval``, ``init_from`` and anything that takes a checkpoint; the
choice reads the newest checkpoint's record and verifies the checkpoint it names.

The runs train with a learning rate high enough that the validation loss rises after a few
steps (the issue's case: early stopping's best is older than the newest checkpoints). Which
step is best is read from the logged rows, never written into a test; each test asserts first
that the best is not among the newest (else it would prove nothing)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from blocklab import checkpoint as ckpt
from blocklab.config import ConfigError, compose, validate_train
from blocklab.train.best import better_record
from blocklab.train.run import to_train_config, train
from inprocess import run_cli
from train.test_faults import rows

# validation and a checkpoint every 2 steps, 3 kept; a constant lr of 0.05 without warmup:
# the loss soon rises, whatever trainer.max_steps is
RISING = ["experiment=smoke", "probes=none", "trainer.val_every_steps=2",
          "trainer.ckpt_every_steps=2", "trainer.keep_checkpoints=3", "optim.lr=0.05",
          "schedule=constant", "schedule.warmup_steps=0"]
EARLY = ["callbacks=[early_stopping]", "callbacks.early_stopping.patience=3"]


def kept(run) -> list[int]:
    return [int(p.name.removeprefix("step-")) for p in ckpt.list_checkpoints(run)]


def scores(run, metric: str = "val/loss") -> dict[int, float]:
    return {int(r["step"]): float(r[metric]) for r in rows(run) if r.get(metric)}


def best_step(run, metric: str = "val/loss", mode: str = "min") -> int:
    """The best validated step (the earlier one of a tie), from the logs."""
    s = scores(run, metric)
    return (min if mode == "min" else max)(sorted(s), key=s.get)  # the first of equals


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """The issue's run: early stopping on val/loss fires, its best step long behind."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    overrides = [*RISING, *EARLY, "trainer.max_steps=40", f"run_dir={run}"]
    train(compose("train", overrides), overrides)
    return run


def test_early_stopping_keeps_its_best_checkpoint_beside_the_newest(stopped):
    summary = json.loads((stopped / "summary.json").read_text())
    last, best = summary["step"], best_step(stopped)
    assert last < 40 and best < last - 4  # it stopped early; the best is older than the newest 3
    assert kept(stopped) == [best, last - 4, last - 2, last]
    assert summary["best_checkpoint"]["step"] == best
    assert summary["best_checkpoint"]["score"] == scores(stopped)[best]
    assert summary["best_checkpoint"]["path"] == str(stopped / "checkpoints" / f"step-{best:06d}")
    record = json.loads((stopped / "checkpoints" / f"step-{last:06d}" / "meta.json").read_text())
    assert record["best"] == {"step": best, "metric": "val/loss", "mode": "min",
                              "score": scores(stopped)[best]}


def test_run_best_chooses_it_everywhere(stopped, tmp_path, capfd):
    best = best_step(stopped)
    want = stopped / "checkpoints" / f"step-{best:06d}"
    assert ckpt.resolve(f"{stopped}:best") == want
    assert ckpt.read(f"{stopped}:best").meta["step"] == best
    assert ckpt.run_dir_of(f"{stopped}:best") == stopped
    run = shutil.copytree(stopped, tmp_path / "copy")
    r = run_cli(capfd, "blocklab-eval", f"ckpt={run}:best", "probes=none")
    assert r.returncode == 0, r.stderr[-3000:]
    val = json.loads((run / "eval" / f"step-{best:06d}" / "val.json").read_text())
    assert val["step"] == best and val["val_loss"] == pytest.approx(scores(run)[best], rel=1e-6)
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", "probes=none", "trainer.max_steps=1",
                f"init_from={run}:best", f"run_dir={tmp_path / 'tuned'}")
    assert r.returncode == 0, r.stderr[-3000:]
    meta = ckpt.read(tmp_path / "tuned").meta
    assert meta["init_from"]["checkpoint"] == str(run / "checkpoints" / want.name)
    assert meta["init_from"]["step"] == best


@pytest.mark.parametrize(("args", "metric", "mode"), [
    ([], "val/loss", "min"),  # keep_best without early stopping: val/loss
    (["trainer.best_monitor=val/accuracy"], "val/accuracy", "max"),
])
def test_without_early_stopping_the_best_is_kept_too(tmp_path, capfd, args, metric, mode):
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", *RISING, "trainer.max_steps=12",
                "trainer.keep_checkpoints=2", *args, f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    best = best_step(run, metric, mode)
    assert best < 10, scores(run, metric)  # not among the newest two (else this proves nothing)
    assert kept(run) == [best, 10, 12]
    assert ckpt.read(f"{run}:best").meta["best"]["metric"] == metric
    path = run / "checkpoints" / f"step-{best:06d}"
    assert f"best: step-{best:06d} ({metric} {scores(run, metric)[best]:.4g})" in r.stdout
    assert f"best checkpoint {path} (blocklab-eval ckpt={run}:best)" in r.stdout


def test_keep_best_off_keeps_the_newest_only_and_run_best_says_so(tmp_path, capfd):
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", *RISING, "trainer.max_steps=12",
                "trainer.keep_checkpoints=2", "trainer.keep_best=false", f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert kept(run) == [10, 12]
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.resolve(f"{run}:best")
    assert "\n" not in str(err.value) and "records no best checkpoint" in str(err.value)
    assert "trainer.keep_best=false" in str(err.value)


@pytest.mark.slow
def test_a_resume_restores_the_record_and_keeps_protecting_the_best(tmp_path, capfd):
    run = tmp_path / "run"
    args = [*RISING, "trainer.keep_checkpoints=2"]
    r = run_cli(capfd, "blocklab-train", *args, "trainer.max_steps=8", f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "trainer.max_steps=12")
    assert r.returncode == 0, r.stderr[-3000:]
    best = best_step(run)
    assert best < 8, scores(run)  # scored by the first launch: the record came through
    assert kept(run) == [best, 10, 12]
    assert ckpt.resolve(f"{run}:best").name == f"step-{best:06d}"


# ----------------------------------------------------------------- choosing, without training


def _save(run, step: int, best: dict | None) -> None:
    state = {"state_dict": {"model.w": torch.zeros(1)},
             "blocklab": {"step": step, "config": {}, "best": best}}
    ckpt.write_checkpoint(run / "checkpoints" / f"step-{step:06d}", state)


def _best(step: int, score: float = 1.0) -> dict:
    return {"step": step, "metric": "val/loss", "mode": "min", "score": score}


def test_pruning_never_takes_the_checkpoint_the_newest_calls_best(tmp_path):
    from blocklab.train.checkpoint_io import BlocklabCheckpointIO

    io = BlocklabCheckpointIO(keep=2)
    for step in (2, 4, 6, 8):
        state = {"blocklab": {"step": step, "config": {}, "best": _best(2)}}
        io.save_checkpoint(state, tmp_path / "checkpoints" / f"step-{step:06d}")
    assert kept(tmp_path) == [2, 6, 8]
    state = {"blocklab": {"step": 10, "config": {}, "best": _best(10)}}  # a better one
    io.save_checkpoint(state, tmp_path / "checkpoints" / "step-000010")
    assert kept(tmp_path) == [8, 10]  # the old best goes the way of any old checkpoint
    assert ckpt.prune(tmp_path, 1, protect=["step-000008"]) == []


def test_a_corrupt_best_is_an_error_never_another_checkpoint(tmp_path):
    for step in (2, 4):
        _save(tmp_path, step, _best(2))
    assert ckpt.resolve(f"{tmp_path}:best") == tmp_path / "checkpoints" / "step-000002"
    state = tmp_path / "checkpoints" / "step-000002" / "state.pt"
    data = bytearray(state.read_bytes())
    data[-1] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.resolve(f"{tmp_path}:best")
    msg = str(err.value)
    assert "\n" not in msg and "the best checkpoint step-000002" in msg and "sha256" in msg
    assert "recorded by step-000004" in msg


def test_the_record_is_data_and_best_follows_a_run_directory(tmp_path):
    _save(tmp_path, 2, {"step": "../../etc", "metric": "val/loss"})
    with pytest.raises(ckpt.CheckpointError, match="malformed best record"):
        ckpt.resolve(f"{tmp_path}:best")
    with pytest.raises(ckpt.CheckpointError, match=":best follows a run directory"):
        ckpt.resolve(f"{tmp_path / 'checkpoints' / 'step-000002'}:best")
    with pytest.raises(ckpt.CheckpointError, match=":best follows a run directory"):
        ckpt.resolve(f"{tmp_path / 'nothing'}:best")


def test_a_newest_meta_that_fails_its_manifest_is_passed_over(tmp_path):
    _save(tmp_path, 2, _best(2))
    _save(tmp_path, 4, _best(4))
    meta = tmp_path / "checkpoints" / "step-000004" / "meta.json"
    meta.write_text(meta.read_text().replace('"step": 4', '"step": 2', 1))
    assert ckpt.resolve(f"{tmp_path}:best").name == "step-000002"  # step 4's record unread


def test_the_record_keeps_the_earlier_of_a_tie_and_follows_the_mode():
    rule = ("val/loss", "min")
    best = better_record(None, rule, 2, {"val/loss": 3.0})
    assert better_record(best, rule, 4, {"val/loss": 3.0}) == best
    assert better_record(best, rule, 4, {"train/loss": 1.0}) == best  # not scored
    assert better_record(best, rule, 4, {"val/loss": float("nan")}) == best
    assert better_record(best, rule, 6, {"val/loss": 2.0})["step"] == 6
    up = ("val/accuracy", "max")
    assert better_record(better_record(None, up, 2, {"val/accuracy": 0.5}), up, 4,
                         {"val/accuracy": 0.4})["step"] == 2
    # a resume that changed the watched metric starts the record over
    assert better_record(best, up, 8, {"val/accuracy": 0.1})["metric"] == "val/accuracy"


@pytest.mark.parametrize(("overrides", "key", "words"), [
    (["trainer.best_monitor=val/acc"], "trainer.best_monitor='val/acc'", ("val/accuracy",)),
    ([*EARLY, "callbacks.early_stopping.monitor=train/loss", "trainer.best_monitor=val/loss"],
     "trainer.best_monitor='val/loss'",
     ("early stopping watches train/loss", "callbacks.early_stopping.monitor")),
])
def test_best_monitor_is_refused_in_one_line(overrides, key, words):
    with pytest.raises(ConfigError) as err:
        validate_train(to_train_config(compose("train", ["experiment=smoke", *overrides])))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"config error: {key}:"), msg
    assert all(w in msg for w in words), msg


def test_checkpoints_that_cannot_be_scored_are_said(tmp_path, capfd):
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", "probes=none", "trainer.max_steps=2",
                "trainer.val_every_steps=4", "trainer.ckpt_every_steps=1",
                f"out_root={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [ln for ln in r.stderr.splitlines() if "trainer.keep_best" in ln]
    assert line.startswith("warning: trainer.ckpt_every_steps=1 is not a multiple of "
                           "trainer.val_every_steps=4")

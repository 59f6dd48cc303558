"""``resume=<run>`` continues *that* run: its stored config is the base, the command line's
overrides go on top as a difference (train/resume.py) and are checked as always.

A 20-step smoke run (batch 8, no curriculum, dropout on: the checkpoint's RNG state must win) is
trained once; each test resumes a copy of it and compares per-step losses, as logged strings,
with an uninterrupted 30-step run. The default experiment (batch 32, a curriculum) must never
leak in: before this, ``resume=<smoke run> trainer.max_steps=30`` composed a fresh config from
the command line and was refused for a data fingerprint that only the composition changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from blocklab import checkpoint as ckpt
from blocklab.config import compose
from blocklab.train.resume import apply_delta, merge_overrides, stored_overrides
from blocklab.train.run import train
from inprocess import run_cli
from train.test_train_cli import losses

pytestmark = pytest.mark.slow

# schedule.min_lr_ratio=1.0: the learning rate after the warmup does not depend on
# trainer.max_steps, so a run extended from 20 to 30 steps can equal one trained for 30 at once
SMOKE = ["experiment=smoke", "trainer.log_every_steps=1", "model.dropout=0.1", "probes=none",
         "schedule.min_lr_ratio=1.0"]


def trained(run: Path, *args: str) -> Path:
    """A run trained as the command line would (its overrides recorded)."""
    overrides = [*SMOKE, *args, f"run_dir={run}"]
    train(compose("train", overrides), overrides)
    return run


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    """The smoke run: 20 steps, checkpoints at 10 and 20."""
    return trained(tmp_path_factory.mktemp("smoke") / "run")


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[int, str]:
    """The per-step losses of the same run trained for 30 steps without a break."""
    return losses(trained(tmp_path_factory.mktemp("straight") / "run", "trainer.max_steps=30"))


def copy(run: Path, to: Path, *, drop: tuple[int, ...] = ()) -> Path:
    shutil.copytree(run, to)
    for step in drop:  # as if killed after the save before it
        shutil.rmtree(to / "checkpoints" / f"step-{step:06d}")
    return to


def resumed_config(run: Path, step: int) -> dict:
    return yaml.safe_load((run / f"config.resume-{step:06d}.yaml").read_text())


def notes(stderr: str) -> list[str]:
    """The resume's notes and warnings (not Lightning's chatter, nor the note on log rows a
    resume from the middle writes again, nor warnings about other things)."""
    return [line for line in stderr.splitlines()
            if line.startswith("warning: resume:")
            or (line.startswith("resume:") and " changed " in line)]


def test_more_steps_continue_the_smoke_run_exactly(smoke, straight, tmp_path, capfd):
    run = copy(smoke, tmp_path / "run")
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "trainer.max_steps=30",
                "trainer.keep_checkpoints=5")
    assert r.returncode == 0, r.stderr[-3000:]
    assert notes(r.stderr) == [  # bookkeeping: allowed, no word about exactness
        "resume: trainer.keep_checkpoints changed 3 -> 5 (allowed)",
        "resume: trainer.max_steps changed 20 -> 30 (allowed)"]
    got = losses(run)
    assert sorted(got) == list(range(1, 31)) and got == straight  # steps done, continued
    config = resumed_config(run, 20)
    assert config["data"]["batch_size"] == 8 and config["data"]["curriculum"] == []
    assert config["model"]["dropout"] == 0.1 and config["trainer"]["max_steps"] == 30
    meta = ckpt.read(run).meta
    assert meta["step"] == 30
    assert meta["overrides"] == [*SMOKE, f"run_dir={smoke}", "trainer.max_steps=30",
                                 "trainer.keep_checkpoints=5"]  # what the next resume composes


def test_the_issues_command_line_continues_a_plain_smoke_run(tmp_path, capfd):
    """Issue 21's own case, as typed: before, ``resume=<smoke run> trainer.max_steps=N`` was
    refused ("data_fingerprint differs"), and with allow_data_change=true trained on the
    default experiment's data (batch 32, a curriculum)."""
    short = ["trainer.max_steps=4", "trainer.ckpt_every_steps=4", "trainer.val_every_steps=4",
             "trainer.log_every_steps=1"]
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", *short, f"out_root={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = (tmp_path / "smoke").iterdir()
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "trainer.max_steps=6")
    assert r.returncode == 0, r.stderr[-3000:]
    assert notes(r.stderr) == ["resume: trainer.max_steps changed 4 -> 6 (allowed)"]
    config = resumed_config(run, 4)
    assert config["data"]["batch_size"] == 8 and config["data"]["curriculum"] == []
    assert config["experiment_name"] == "smoke" and sorted(losses(run)) == list(range(1, 7))


@pytest.mark.parametrize("target", ["run", "checkpoint"])
def test_resume_alone_reproduces_the_stored_config(smoke, tmp_path, capfd, target):
    run = copy(smoke, tmp_path / "run", drop=(20,))
    where = run if target == "run" else run / "checkpoints" / "step-000010"
    r = run_cli(capfd, "blocklab-train", f"resume={where}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert notes(r.stderr) == []
    stored = yaml.safe_load((run / "config.yaml").read_text())
    assert resumed_config(run, 10) == {**stored, "resume": str(where)}
    assert losses(run) == losses(smoke)


def test_resume_from_python_continues_the_run(smoke, straight, tmp_path, capfd):
    run = copy(smoke, tmp_path / "run", drop=(20,))
    train(compose("train", [f"resume={run}"]))
    assert notes(capfd.readouterr().err) == []
    assert losses(run) == losses(smoke)
    train(compose("train", [f"resume={run}", "trainer.max_steps=30"]))
    assert "resume: trainer.max_steps changed 20 -> 30 (allowed)" in capfd.readouterr().err
    assert losses(run) == straight


def test_an_architecture_override_is_refused_listing_every_key(smoke, tmp_path, capfd):
    run = copy(smoke, tmp_path / "run")
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "trainer.max_steps=30",
                "model.n_heads=2", "model.d_ff=128")
    assert r.returncode == 4
    assert r.stderr.strip().splitlines()[-1] == (
        "resume refused: the architecture differs from the checkpoint's (2 keys): "
        "model.d_ff: 512 -> 128; model.n_heads: 4 -> 2")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before


def test_a_group_override_changes_only_what_the_group_changes(smoke, tmp_path, capfd):
    run = copy(smoke, tmp_path / "run")
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "trainer.max_steps=30",
                "schedule=constant")
    assert r.returncode == 0, r.stderr[-3000:]
    changed = {line.split("resume: ")[1].split()[0] for line in notes(r.stderr)}
    assert changed == {"trainer.max_steps", "schedule.name"}, r.stderr
    assert "warning: resume: schedule.name changed 'cosine' -> 'constant': the run is no " \
           "longer exactly the uninterrupted one" in r.stderr
    config = resumed_config(run, 20)
    assert config["schedule"]["name"] == "constant" and config["data"]["batch_size"] == 8


def test_changed_data_keys_are_named_with_the_way_back(smoke, tmp_path, capfd):
    run = copy(smoke, tmp_path / "run")
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "trainer.max_steps=30", "data.seed=7")
    assert r.returncode == 4
    msg = r.stderr.strip().splitlines()[-1]
    assert msg.startswith("resume refused: data_fingerprint differs (checkpoint ")
    assert ": the command line changes data.seed: 1234 -> 7; to continue on the run's data " \
           "drop those overrides (the run's values: data.seed=1234); to continue on the new " \
           "data instead (no longer the uninterrupted run) pass allow_data_change=true" in msg
    assert not (run / "config.resume-000020.yaml").exists()


def test_changed_source_files_are_named_with_the_way_back(tmp_path, capfd):
    from data.test_text_runs import corpus, text_args

    data = corpus(tmp_path, n_files=4)
    run = tmp_path / "run"
    args = text_args(tmp_path, data, f"run_dir={run}")
    train(compose("train", args), args)
    edited = data / "doc002.txt"
    edited.write_text(edited.read_text() + "one more line.\n")
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "trainer.max_steps=14")
    assert r.returncode == 4
    msg = r.stderr.strip().splitlines()[-1]
    assert f"the run's source files changed: changed {edited.resolve()} (size " in msg
    assert "to continue on the run's data restore them as they were; to continue on the new " \
           "data instead (no longer the uninterrupted run) pass allow_data_change=true" in msg


def _without_overrides(run: Path) -> None:
    """An older run: neither run.json nor the checkpoint's metadata records its overrides."""
    info = json.loads((run / "run.json").read_text())
    info.pop("overrides")
    (run / "run.json").write_text(json.dumps(info))
    for path in ckpt.list_checkpoints(run):
        state = torch.load(path / ckpt.STATE, weights_only=True)
        state["blocklab"].pop("overrides")
        shutil.rmtree(path)
        ckpt.write_checkpoint(path, state)


def test_a_run_without_recorded_overrides_resumes_from_its_stored_config(smoke, straight,
                                                                        tmp_path, capfd):
    run = copy(smoke, tmp_path / "run")
    _without_overrides(run)
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "trainer.max_steps=30")
    assert r.returncode == 0, r.stderr[-3000:]
    assert notes(r.stderr) == ["resume: trainer.max_steps changed 20 -> 30 (allowed)"]
    assert losses(run) == straight


def test_drift_of_the_config_files_since_the_run_changes_nothing(tmp_path, capfd):
    """The run's experiment file is edited after the run: resuming composes it twice (before
    and after the new overrides), so the edit is in neither difference."""
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    mine = "# @package _global_\ndefaults:\n  - smoke\ndata:\n  batch_size: {}\n"
    (conf / "mine.yaml").write_text(mine.format(6))
    run = tmp_path / "run"
    args = [f"--config-dir={tmp_path / 'conf'}", *SMOKE[1:], "experiment=mine",
            f"run_dir={run}"]
    assert run_cli(capfd, "blocklab-train", *args).returncode == 0
    (conf / "mine.yaml").write_text(mine.format(4))
    r = run_cli(capfd, "blocklab-train", f"--config-dir={tmp_path / 'conf'}", f"resume={run}",
                "trainer.max_steps=22")
    assert r.returncode == 0, r.stderr[-3000:]
    assert notes(r.stderr) == ["resume: trainer.max_steps changed 20 -> 22 (allowed)"]
    assert resumed_config(run, 20)["data"]["batch_size"] == 6
    # without the config directory the run's overrides no longer compose: said once, and the
    # command line's changes are then taken from the defaults
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "trainer.max_steps=24")
    assert r.returncode == 0, r.stderr[-3000:]
    (said,) = [line for line in notes(r.stderr) if "no longer compose" in line]
    assert said.startswith("warning: resume: the run's own overrides [")
    assert resumed_config(run, 22)["data"]["batch_size"] == 6


# ------------------------------------------------------------- the pieces, without training


def test_stored_overrides_are_data():
    where = "checkpoint x"
    assert stored_overrides({}, where) == []
    assert stored_overrides({"overrides": ["a=1", "resume=/r", "+b=2"]}, where) == ["a=1", "+b=2"]
    for bad in ("experiment_name=${oc.env:SECRET}", "+optim._target_=os.system",
                "hydra.searchpath=[file:///elsewhere]"):
        with pytest.raises(ckpt.CheckpointError, match=r"checkpoint x: overrides.*refused"):
            stored_overrides({"overrides": [bad]}, where)
    with pytest.raises(ckpt.CheckpointError, match="not a list of strings"):
        stored_overrides({"overrides": "a=1"}, where)


def test_new_overrides_replace_the_runs_own_by_key():
    orig = ["experiment=smoke", "trainer.max_steps=20", "probes@checkpoint_probes=none",
            "+x.y=1"]
    assert merge_overrides(orig, ["trainer.max_steps=30", "probes=coarse", "x.y=2"]) == [
        "experiment=smoke", "probes@checkpoint_probes=none", "trainer.max_steps=30",
        "probes=coarse", "x.y=2"]


def test_a_difference_sets_and_removes_keys():
    from omegaconf import OmegaConf

    cfg = compose("train", ["experiment=smoke", "+model.mixer.options={}"])
    cfg.model.mixer.options = {"a": 1, "b": {"c": 2}}
    apply_delta(cfg, [("data.batch_size", 8, 4), ("model.mixer.options.a", 1, "<absent>"),
                      ("model.mixer.options.b", "<absent>", {}),
                      ("model.mixer.options.b.c", 2, "<absent>"),
                      ("schedule.name", "cosine", "constant")])
    assert cfg.data.batch_size == 4 and cfg.schedule.name == "constant"
    assert OmegaConf.to_container(cfg.model.mixer.options) == {"b": {}}

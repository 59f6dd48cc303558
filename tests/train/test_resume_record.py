"""A run's record never lies about a resume (issue 43): an override given with ``resume=`` is
what the resumed steps train with — learning rate, schedule, weight decay, betas, eps — never
the optimizer's or scheduler's restored state; each logged ``train/lr`` is the rate its step
ran with; every change is listed with the first step it applied to (``resume_changes`` in
``summary.json``, ``run.json`` and every later checkpoint), accumulated over resumes; a resume
onto another experiment is refused (exit 4) listing what changed, before any data is read; and
a stored override never names a config file outside the config directory."""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from blocklab import checkpoint as ckpt
from blocklab import registry
from blocklab.config import compose
from blocklab.train.module import NonFiniteError
from blocklab.train.optim import SCHEDULES, resolved
from blocklab.train.run import to_train_config, train
from inprocess import run_cli
from train.test_warmup import LrAtStart

pytestmark = pytest.mark.slow

BASE = ["experiment=smoke", "probes=none", "trainer.log_every_steps=1", "trainer.max_steps=10",
        "trainer.ckpt_every_steps=5", "trainer.val_every_steps=5"]


def trained(run: Path, *args: str) -> Path:
    """A run trained as the command line would (its overrides recorded)."""
    overrides = [*BASE, *args, f"run_dir={run}"]
    train(compose("train", overrides), overrides)
    return run


def logged(run: Path, name: str) -> dict[int, float]:
    """Each step's logged ``name`` (later launches win)."""
    out = {}
    for f in sorted((run / "logs").glob("version_*/metrics.csv")):
        for row in csv.DictReader(f.open()):
            if row.get(name):
                out[int(row["step"])] = float(row[name])
    return out


def rates(*overrides: str) -> functools.partial:
    """step -> the learning rate the config of ``overrides`` gives at that step."""
    tc = to_train_config(compose("train", [*BASE, *overrides]))
    n = tc.trainer.max_steps
    fn = functools.partial(SCHEDULES[tc.schedule.name], cfg=resolved(tc.schedule, n), max_steps=n)
    return lambda step: tc.optim.lr * fn(step)


def state(path: Path) -> dict:
    return torch.load(path / ckpt.STATE, weights_only=True)


NEW = ["optim.lr=0.5", "optim.weight_decay=0.01", "optim.betas=[0.8,0.9]", "optim.eps=1e-6",
       "schedule.min_lr_ratio=0.5"]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A 10-step run (the rate of each step's start recorded), resumed from its step-5
    checkpoint with NEW (through the command line's entry): (run, the first launch's rates, the
    resumed launch's rates, the resume's stderr)."""
    registry.register("callback", "lr_at_start")(lambda options: [LrAtStart()])
    try:
        LrAtStart.seen = {}
        run = trained(tmp_path_factory.mktemp("resumed") / "run", "+callbacks.lr_at_start={}")
        straight, LrAtStart.seen = dict(LrAtStart.seen), {}
        overrides = [f"resume={run / 'checkpoints' / 'step-000005'}", *NEW]
        with _stderr() as err:
            train(compose("train", overrides), overrides)
        yield run, straight, dict(LrAtStart.seen), err.getvalue()
    finally:
        registry.table("callback").pop("lr_at_start", None)
        registry._registered.pop(("callback", "lr_at_start"), None)


@contextlib.contextmanager
def _stderr():
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        yield buf


def test_optimizer_and_schedule_overrides_take_effect_from_the_first_resumed_step(resumed):
    """Before, the warning said ``optim.lr changed 0.001 -> 0.5`` while every resumed step ran
    with the restored schedule's rate (and AdamW's restored betas, eps and decay)."""
    run, straight, after, err = resumed
    assert "warning: resume: optim.lr changed 0.001 -> 0.5" in err
    want = rates(*NEW)
    assert after == {s: want(s) for s in range(5, 10)}  # what the steps ran with
    # each row's train/lr is the rate its step ran with (before, the next step's)
    assert logged(run, "train/lr") == {**{s + 1: straight[s] for s in range(5)},
                                       **{s + 1: pytest.approx(want(s), rel=1e-12)
                                          for s in range(5, 10)}}
    saved = state(run / "checkpoints" / "step-000010")
    decay, no_decay = saved["optimizer_states"][0]["param_groups"]
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)
    for group in (decay, no_decay):
        assert tuple(group["betas"]) == (0.8, 0.9) and group["eps"] == 1e-6
        assert group["initial_lr"] == 0.5
    assert saved["lr_schedulers"][0]["base_lrs"] == [0.5, 0.5]


def test_every_change_is_recorded_with_the_step_it_applied_from(resumed, tmp_path, capfd):
    run = tmp_path / "run"
    shutil.copytree(resumed[0], run)
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "trainer.max_steps=12",
                "optim.weight_decay=0.05")
    assert r.returncode == 0, r.stderr[-3000:]
    changes = [
        {"key": "optim.betas", "old": [0.9, 0.98], "new": [0.8, 0.9], "from_step": 6},
        {"key": "optim.eps", "old": 1e-8, "new": 1e-6, "from_step": 6},
        {"key": "optim.lr", "old": 0.001, "new": 0.5, "from_step": 6},
        {"key": "optim.weight_decay", "old": 0.1, "new": 0.01, "from_step": 6},
        {"key": "schedule.min_lr_ratio", "old": 0.1, "new": 0.5, "from_step": 6},
        {"key": "optim.weight_decay", "old": 0.01, "new": 0.05, "from_step": 11},
        {"key": "trainer.max_steps", "old": 10, "new": 12, "from_step": 11}]
    assert json.loads((run / "summary.json").read_text())["resume_changes"] == changes
    assert json.loads((run / "run.json").read_text())["resume_changes"] == changes
    newest = ckpt.list_checkpoints(run)[-1]
    assert newest.name == "step-000012"
    assert json.loads((newest / ckpt.META).read_text())["resume_changes"] == changes
    # the checkpoint the first resume wrote holds its own history only
    assert ckpt.read(run / "checkpoints" / "step-000010").meta["resume_changes"] == changes[:5]


def test_a_diverged_run_resumed_at_a_lower_rate_trains_at_that_rate(tmp_path, capfd):
    """The recovery resume.md describes: a run that diverged at ``optim.lr=3.0`` (NaN, exit 5)
    resumed from an earlier checkpoint with ``optim.lr=0.01``. Before, the resumed steps ran at
    the restored 3.0-schedule and diverged again."""
    run = tmp_path / "run"
    args = [*BASE, "trainer.max_steps=20", "trainer.ckpt_every_steps=2",
            "trainer.keep_checkpoints=20", f"run_dir={run}"]
    with pytest.raises(NonFiniteError):
        train(compose("train", [*args, "optim.lr=3.0"]), [*args, "optim.lr=3.0"])
    r = run_cli(capfd, "blocklab-train", f"resume={run / 'checkpoints' / 'step-000002'}",
                "optim.lr=0.01")
    assert r.returncode == 0, r.stderr[-3000:]
    want = rates("trainer.max_steps=20", "optim.lr=0.01")
    assert {s: v for s, v in logged(run, "train/lr").items() if s > 2} == {
        s: pytest.approx(want(s - 1), rel=1e-12) for s in range(3, 21)}
    losses = logged(run, "train/loss")
    assert sorted(losses) == list(range(1, 21)) and all(math.isfinite(v) for v in losses.values())


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    return trained(tmp_path_factory.mktemp("smoke") / "run", "trainer.max_steps=2",
                   "trainer.ckpt_every_steps=2", "trainer.val_every_steps=2")


def test_resume_onto_another_experiment_is_refused_before_any_data_is_read(smoke, tmp_path,
                                                                          capfd):
    """Before, the other experiment's corpus was read and prepared first, then the resume was
    refused for a ``model.vocab_size`` the user never set (exit 2) — or, for
    ``shakespeare_char``, for the architecture alone (exit 4)."""
    run = tmp_path / "run"
    shutil.copytree(smoke, run)
    before = sorted(p.name for p in run.rglob("*"))
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "experiment=shakespeare",
                cwd=tmp_path, env={"BLOCKLAB_DATA_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 4, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("resume refused: the architecture differs from the checkpoint's ("), last
    for key in ("model.n_layers: 2 -> 4", "data.name: 'synthetic' -> 'text'",
                "data.corpus: None -> 'shakespeare'", "tokenizer.name: 'synthetic' -> "):
        assert key in last, last
    assert "data:" not in r.stderr  # nothing read, nothing prepared
    assert not (tmp_path / "cache").exists() and not (tmp_path / "outputs").exists()
    assert sorted(p.name for p in run.rglob("*")) == before


def test_another_optimizer_is_refused_naming_the_key(smoke, tmp_path, capfd):
    """The checkpoint's optimizer state is AdamW's: before, ``optim=sgd`` resumed SGD over it
    (AdamW's moments kept in its state, its betas and eps in its groups) without a word."""
    run = tmp_path / "run"
    shutil.copytree(smoke, run)
    r = run_cli(capfd, "blocklab-train", f"resume={run}", "optim=sgd", "trainer.max_steps=4")
    assert r.returncode == 4, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == (
        "resume refused: optim.name changed 'adamw' -> 'sgd': the checkpoint's optimizer state "
        f"is adamw's, not sgd's; to train with sgd from these weights start a new run with "
        f"init_from={run}")
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-000002"]


def _with_overrides(src: Path, run: Path, overrides: list[str]) -> Path:
    """``src``'s newest checkpoint as ``run``'s, its recorded overrides replaced (every copy
    agreeing, the manifest re-hashed: as tests/test_stored_data.py crafts one)."""
    newest = ckpt.list_checkpoints(src)[-1]
    saved = state(newest)
    saved["blocklab"]["overrides"] = overrides
    saved["blocklab"]["config_yaml"] = yaml.safe_dump(saved["blocklab"]["config"],
                                                      sort_keys=False)
    return ckpt.write_checkpoint(run / "checkpoints" / newest.name, saved)


@pytest.mark.parametrize("override", ["experiment=../../elsewhere/evil",
                                      "+experiment={tmp}/elsewhere/evil"])
def test_a_stored_override_naming_a_file_outside_the_configs_is_refused(smoke, tmp_path, capfd,
                                                                        override):
    """Before, resume composed the stored override: Hydra opened the YAML file it names, outside
    the run and the config directory (exit 0)."""
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "model").mkdir()
    evil = tmp_path / "elsewhere" / "evil.yaml"
    evil.parent.mkdir()
    evil.write_text("# @package _global_\nexperiment_name: evil\n")
    run = tmp_path / "run"
    override = override.format(tmp=tmp_path)
    path = _with_overrides(smoke, run, ["probes=none", override])
    r = run_cli(capfd, "blocklab-train", f"--config-dir={conf}", f"resume={run}",
                "trainer.max_steps=4")
    assert r.returncode == 4, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == (
        f"checkpoint {path}: overrides[1]={override!r}: a stored override may name a config "
        "group's option, never a file by its path (no '..', no absolute path; refused: edited?)")
    assert not (run / "config.resume-000002.yaml").exists()


def test_stored_overrides_name_options_and_set_values():
    from blocklab.train.resume import stored_overrides

    fine = ["experiment=smoke", "model/position=alibi", "probes@checkpoint_probes=none",
            "callbacks=[early_stopping]", "run_dir=/abs/run", "data.files=[../corpus]",
            "+data.val_files=[/abs/val.txt]", "out_root=../outputs", "model=null"]
    assert stored_overrides({"overrides": fine}, "checkpoint x") == fine
    for bad in ("model=../x", "+experiment=a/../../x", "model/position=/abs/x",
                "callbacks=[early_stopping,../../x]", "experiment=..\\x", "~model=../x"):
        with pytest.raises(ckpt.CheckpointError, match=r"never a file by its path"):
            stored_overrides({"overrides": [bad]}, "checkpoint x")

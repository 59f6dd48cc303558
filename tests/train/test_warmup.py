"""The warmup (issue 41, item 5): ``schedule.warmup_ratio`` — a fraction of ``trainer.max_steps``,
rounded up — or ``schedule.warmup_steps``, one of them (one-line refusals naming both keys); a
warmup of the whole run said in one line before anything is built; and a resume that changes
``trainer.max_steps`` continues on the new length's schedule from its very first step."""

from __future__ import annotations

import functools
import math
from typing import ClassVar

import lightning as L
import pytest

from blocklab import registry
from blocklab.config import ConfigError, ScheduleConfig, TrainConfig, compose, validate_train
from blocklab.train.optim import SCHEDULES, resolved, warmup_steps, warmup_warning
from blocklab.train.run import to_train_config, train
from inprocess import run_cli

SMOKE = ["experiment=smoke", "probes=none"]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_a_ratio_warms_up_over_that_share_of_the_run(name):
    by_ratio = ScheduleConfig(name=name, warmup_steps=None, warmup_ratio=0.1)
    by_steps = ScheduleConfig(name=name, warmup_steps=6, warmup_ratio=None)
    assert warmup_steps(by_ratio, 60) == 6 and warmup_steps(by_ratio, 61) == 7  # rounded up
    assert warmup_steps(ScheduleConfig(warmup_steps=None, warmup_ratio=0.0), 60) == 0
    fn = SCHEDULES[name]
    assert [fn(s, resolved(by_ratio, 60), 60) for s in range(61)] == \
        [fn(s, by_steps, 60) for s in range(61)]
    ramp = [fn(s, resolved(by_ratio, 60), 60) for s in range(6)]
    assert ramp == [(s + 1) / 6 for s in range(6)]


def _validated(*overrides: str) -> TrainConfig:
    return validate_train(to_train_config(compose("train", [*SMOKE, *overrides])))


@pytest.mark.parametrize(("overrides", "key", "words"), [
    (["schedule.warmup_ratio=0.1"], "schedule.warmup_ratio=0.1",
     ("set one of schedule.warmup_steps and schedule.warmup_ratio, not both",
      "schedule.warmup_steps=2", "schedule.warmup_steps=null")),
    (["schedule.warmup_steps=null"], "schedule.warmup_steps=None",
     ("set one of schedule.warmup_steps and schedule.warmup_ratio",)),
    (["schedule.warmup_ratio=1.0", "schedule.warmup_steps=null"], "schedule.warmup_ratio=1.0",
     ("[0, 1)", "trainer.max_steps")),
    (["schedule.warmup_ratio=-0.1", "schedule.warmup_steps=null"], "schedule.warmup_ratio=-0.1",
     ("[0, 1)",)),
])
def test_the_warmup_keys_are_refused_in_one_line(overrides, key, words):
    with pytest.raises(ConfigError) as err:
        _validated(*overrides)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"config error: {key}:"), msg
    assert all(w in msg for w in words), msg


def test_a_ratio_alone_is_valid():
    tc = _validated("schedule.warmup_ratio=0.1", "schedule.warmup_steps=null")
    assert (tc.schedule.warmup_steps, tc.schedule.warmup_ratio) == (None, 0.1)


def test_a_warmup_of_the_whole_run_is_said_in_one_line_naming_the_keys():
    def said(steps, ratio, max_steps):
        return warmup_warning(ScheduleConfig(warmup_steps=steps, warmup_ratio=ratio), max_steps,
                              1e-3)

    line = said(100, None, 60)  # the 2x2 sweep: 60 steps inside 100 of warmup
    assert "\n" not in line and line.startswith("warning: schedule.warmup_steps=100 >= "
                                                "trainer.max_steps=60: the whole run is warmup")
    assert "schedule.warmup_ratio" in line
    assert said(60, None, 60) is not None  # the rate would peak at the last step, no decay
    assert said(59, None, 60) is None and said(0, None, 1) is None
    assert said(None, 0.995, 100) is not None and said(None, 0.05, 60) is None


def test_the_warning_comes_before_the_run_and_a_ratio_silences_it(tmp_path, capfd):
    r = run_cli(capfd, "blocklab-train", *SMOKE, "trainer.max_steps=2", f"out_root={tmp_path / 'a'}")
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [ln for ln in r.stderr.splitlines() if "the whole run is warmup" in ln]
    assert line.startswith("warning: schedule.warmup_steps=2 >= trainer.max_steps=2")  # smoke: 2
    r = run_cli(capfd, "blocklab-train", *SMOKE, "trainer.max_steps=2",
                "schedule.warmup_ratio=0.5", "schedule.warmup_steps=null",
                f"out_root={tmp_path / 'b'}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warmup" not in r.stderr


class LrAtStart(L.Callback):
    """The learning rate each optimizer step runs with, by the step's index (``global_step``
    before it)."""

    seen: ClassVar[dict[int, float]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        LrAtStart.seen[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]


@pytest.fixture
def lr_probe():
    registry.register("callback", "lr_at_start")(lambda options: [LrAtStart()])
    LrAtStart.seen = {}
    yield LrAtStart.seen
    registry.table("callback").pop("lr_at_start", None)
    registry._registered.pop(("callback", "lr_at_start"), None)


@pytest.mark.parametrize("warmup", [["schedule.warmup_steps=2"],
                                    ["schedule.warmup_ratio=0.2", "schedule.warmup_steps=null"]])
def test_a_resume_with_more_steps_continues_on_the_new_lengths_schedule(tmp_path, lr_probe,
                                                                        warmup):
    """A 10-step run resumed to 20: every resumed step, the first included, runs with the rate
    of a 20-step run at that step (before, the first resumed step ran with the 10-step
    schedule's last rate). With warmup_ratio the warmup is that share of the new length."""
    base = [*SMOKE, *warmup, "+callbacks.lr_at_start={}", "trainer.ckpt_every_steps=5"]

    def trained(run, *extra):
        overrides = [*base, *extra, f"run_dir={run}"]
        train(compose("train", overrides), overrides)
        return dict(lr_probe)

    straight = trained(tmp_path / "straight", "trainer.max_steps=20")
    lr_probe.clear()
    first = trained(tmp_path / "run", "trainer.max_steps=10")
    lr_probe.clear()
    resumed = trained(tmp_path / "run", "trainer.max_steps=20", f"resume={tmp_path / 'run'}")
    assert sorted(resumed) == list(range(10, 20))
    assert resumed == {s: straight[s] for s in range(10, 20)}
    tc = to_train_config(compose("train", [*base, "trainer.max_steps=10"]))
    fn = functools.partial(SCHEDULES["cosine"], cfg=resolved(tc.schedule, 10), max_steps=10)
    assert first == {s: tc.optim.lr * fn(s) for s in range(10)}  # the old length's own
    assert not math.isclose(first[9], straight[9])  # the lengths' schedules differ (control)


def test_an_unchanged_length_keeps_the_rates_bit_for_bit(tmp_path, lr_probe):
    """Resumed from its middle checkpoint with the same length, a run's steps run with the
    rates they had (the recomputed rate is the restored one)."""
    run = tmp_path / "run"
    overrides = [*SMOKE, "schedule.warmup_steps=2", "+callbacks.lr_at_start={}",
                 "trainer.ckpt_every_steps=5", "trainer.max_steps=10", f"run_dir={run}"]
    train(compose("train", overrides), overrides)
    straight = dict(lr_probe)
    lr_probe.clear()
    again = [*overrides, f"resume={run / 'checkpoints' / 'step-000005'}"]
    train(compose("train", again), again)
    assert lr_probe == {s: straight[s] for s in range(5, 10)}

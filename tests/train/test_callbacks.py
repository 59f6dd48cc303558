"""Lightning within reach: callbacks chosen by name from the config (built-in and a user's
own, registered like any component), early stopping on a logged metric and ``max_time``
stopping on a whole step (checkpoint written, exit 0, a line saying why), the profiler,
anomaly detection, activation checkpointing (same losses and gradients)."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from blocklab import checkpoint as ckpt
from blocklab import registry
from blocklab.config import compose, model_config
from blocklab.model import build_model
from blocklab.train.module import checkpoint_blocks
from inprocess import run_cli

SMOKE = ["experiment=smoke", "probes=none"]


def steps_saved(run_dir) -> list[int]:
    return [int(p.name.removeprefix("step-")) for p in ckpt.list_checkpoints(run_dir)]


def test_early_stopping_stops_on_a_whole_step_with_its_checkpoint(tmp_path, capfd):
    # min_delta 100: the first check (step 5) sets the best, the second (step 10) cannot
    # improve on it, so patience 1 stops at step 10 whatever the losses are.
    r = run_cli(capfd, "blocklab-train", *SMOKE, f"out_root={tmp_path}",
                "callbacks=[early_stopping]", "callbacks.early_stopping.monitor=train/loss",
                "callbacks.early_stopping.patience=1", "callbacks.early_stopping.min_delta=100")
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = (tmp_path / "smoke").iterdir()
    assert steps_saved(run) == [10]
    assert "stopped early at step 10 of 20" in r.stderr
    assert f"continue with: blocklab-train resume={run}" in r.stderr


@pytest.mark.parametrize(("threshold", "saved"), [(-1, [10]), (2, [10, 20])])
def test_a_stopping_threshold_stops_at_the_first_check_beyond_it(tmp_path, capfd, threshold,
                                                                 saved):
    """val/accuracy is in [0, 1]: beyond -1 at the first validation (step 10), never beyond 2
    (patience alone is too long to end the 20 steps)."""
    r = run_cli(capfd, "blocklab-train", *SMOKE, f"out_root={tmp_path}",
                "callbacks=[early_stopping]", "callbacks.early_stopping.monitor=val/accuracy",
                "callbacks.early_stopping.mode=max", "callbacks.early_stopping.patience=100",
                f"callbacks.early_stopping.stopping_threshold={threshold}")
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = (tmp_path / "smoke").iterdir()
    assert steps_saved(run) == saved
    assert ("stopped early at step 10 of 20: Stopping threshold reached: val/accuracy"
            in r.stderr) == (threshold == -1)


def test_max_time_stops_after_a_whole_step_with_its_checkpoint(tmp_path, capfd):
    r = run_cli(capfd, "blocklab-train", *SMOKE, f"out_root={tmp_path}",
                "trainer.max_time='00:00:00:00'")
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = (tmp_path / "smoke").iterdir()
    assert steps_saved(run) == [1]
    assert "stopped at step 1 of 20: trainer.max_time=00:00:00:00 reached" in r.stderr


@pytest.mark.parametrize(("args", "key", "rule"), [
    (["trainer.max_time=12h"], "trainer.max_time", "DD:HH:MM:SS"),
    (["trainer.profiler=fancy"], "trainer.profiler", "simple, advanced, pytorch"),
    (["trainer.log_grad_norm=all"], "trainer.log_grad_norm", "none, global, layer"),
    (["callbacks=[early_stopping]", "+callbacks.early_stopping.patiense=3"],
     "callbacks.early_stopping.patiense",
     "options: monitor, mode, patience, min_delta, stopping_threshold"),
    (["callbacks=[early_stopping]", "callbacks.early_stopping.monitor=val/acc"],
     "callbacks.early_stopping.monitor", "val/loss, val/accuracy, train/loss, train/grad_norm"),
    (["callbacks=[early_stopping]", "callbacks.early_stopping.stopping_threshold=nan"],
     "callbacks.early_stopping.stopping_threshold", "must be a finite number"),
    (["+callbacks.nosuch={}"], "callbacks.nosuch", "early_stopping, lr_monitor"),
])
def test_bad_callback_and_trainer_options_fail_in_one_line(tmp_path, capfd, args, key, rule):
    r = run_cli(capfd, "blocklab-train", *SMOKE, f"out_root={tmp_path}", *args)
    assert r.returncode == 2, r.stderr[-2000:]
    (line,) = [x for x in r.stderr.splitlines() if x.strip()]
    assert key in line and rule in line, line
    assert not (tmp_path / "smoke").exists()


class Seen(L.Callback):
    """A user's callback: records what the trainer was built with and counts steps."""

    last: Seen | None = None

    def __init__(self, every: int = 1) -> None:
        self.every, self.batches = every, 0
        Seen.last = self

    def on_fit_start(self, trainer, pl_module) -> None:
        self.anomaly = trainer._detect_anomaly
        self.profiler = type(trainer.profiler).__name__

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1


def test_a_registered_callback_the_profiler_and_anomaly_detection(tmp_path, capfd):
    registry.register("callback", "seen")(lambda options: [Seen(**options)])
    try:
        r = run_cli(capfd, "blocklab-train", *SMOKE, f"out_root={tmp_path}",
                    "trainer.max_steps=4", "trainer.ckpt_every_steps=4",
                    "+callbacks.seen.every=2", "trainer.profiler=simple",
                    "trainer.detect_anomaly=true")
    finally:
        registry.table("callback").pop("seen", None)
        registry._registered.pop(("callback", "seen"), None)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = Seen.last
    assert (seen.every, seen.batches, seen.anomaly, seen.profiler) == (2, 4, True, "SimpleProfiler")
    (run,) = (tmp_path / "smoke").iterdir()
    (report,) = (run / "profiler").iterdir()
    assert "run_training_batch" in report.read_text()


def saved_with(saved: list[torch.Tensor]):
    """A pack hook that keeps every tensor autograd saves for backward in ``saved``."""
    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t
    return pack


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    cfg = model_config(compose("train", ["experiment=smoke", "model.dropout=0.1",
                                         "model.vocab_size=64"]).model)
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    results, sizes = [], []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = build_model(cfg)
        if checkpointed:
            assert checkpoint_blocks(model) == cfg.n_layers
        torch.manual_seed(1)  # the same dropout masks, recomputed under checkpointing
        saved: list[torch.Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(saved_with(saved), lambda t: t):
            logits = model(ids)
        sizes.append(sum(t.numel() for t in saved))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (a, ga), (b, gb) = results
    assert sizes[1] < sizes[0] / 2  # the blocks' activations are not kept for backward
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], rtol=1e-6, atol=1e-7)


def test_the_progress_bar_counts_steps_of_max_steps_without_epochs_or_v_num(tmp_path):
    """Lightning's own bar read "Epoch 0/-2" (max_steps runs have max_epochs=-1) and showed
    the logger's "v_num"; blocklab's counts optimizer steps out of ``trainer.max_steps``."""
    from types import SimpleNamespace

    from lightning.pytorch.loggers import CSVLogger

    from blocklab.train.callbacks import progress_bar

    (bar,) = progress_bar(True)
    trainer = SimpleNamespace(max_steps=30, loggers=[CSVLogger(tmp_path)], current_epoch=0,
                              max_epochs=-1, progress_bar_metrics={"train/loss": 5.0})
    bar._trainer = trainer
    assert bar.total_train_batches == 30
    assert bar._get_train_description(0) == "step"
    assert bar.get_metrics(trainer, None) == {"train/loss": 5.0}
    assert progress_bar(False) == []

"""Probes during training change nothing about training: with dropout on (so any draw from the
global generator would show), the per-step losses with the probe callback equal those without
it, bit for bit — and a callback that does draw from the global generator is caught by the same
comparison (the harness can fail). Probe files land next to each checkpoint."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from blocklab.config import compose
from blocklab.train import run as run_mod

pytestmark = pytest.mark.slow

ARGS = ["experiment=smoke", "trainer.log_every_steps=1", "trainer.threads=1",
        "model.dropout=0.1", "probes=none", "checkpoint_probes.needle.n=8",
        "checkpoint_probes.litm.n=8"]


def losses(run_dir) -> list[str]:
    return [r["train/loss"] for f in sorted((run_dir / "logs").glob("version_*/metrics.csv"))
            for r in csv.DictReader(f.open()) if r.get("train/loss")]


def train(tmp_path, name, *extra):
    return run_mod.train(compose("train", [*ARGS, f"out_root={tmp_path / name}", *extra]))


def test_training_is_identical_with_and_without_probes_on_checkpoints(tmp_path, monkeypatch):
    plain = train(tmp_path, "plain", "probes@checkpoint_probes=none")
    probed = train(tmp_path, "probed", "probes@checkpoint_probes=coarse")
    a, b = losses(plain), losses(probed)
    assert len(a) == 20 and a == b
    for step in (10, 20):  # experiment=smoke saves every 10 steps
        (out,) = (probed / "probes" / f"step-{step:06d}").iterdir()
        summary = json.loads((out / "summary.json").read_text())
        assert summary["step"] == step and summary["n_examples"] > 0
        assert (out / "niah.png").exists() and (out / "cells.csv").exists()
    assert not (plain / "probes").exists()
    logged = [r for f in (probed / "logs").glob("version_*/metrics.csv")
              for r in csv.DictReader(f.open()) if r.get("probe/needle_2_distractors/within_train_length")]
    assert {int(r["step"]) for r in logged} == {10, 20}

    # Negative control: the same comparison catches a probe that touches the global RNG.
    from blocklab.eval import callback

    real = callback.ProbeCallback.__init__

    def noisy_init(self, *a, **kw):
        real(self, *a, **kw)
        self.run = lambda *a, **kw: torch.rand(1) and None

    monkeypatch.setattr(callback.ProbeCallback, "__init__", noisy_init)
    noisy = train(tmp_path, "noisy", "probes@checkpoint_probes=coarse")
    c = losses(noisy)
    assert c[:10] == a[:10] and c[10:] != a[10:]


def test_a_failing_probe_is_reported_and_training_continues(tmp_path, monkeypatch):
    """Policy: log and continue. The run finishes, its losses equal a run without probes, every
    checkpoint is written, and the error is kept next to the probe results."""
    from blocklab.eval import callback

    real = callback.ProbeCallback.__init__

    def failing_init(self, *a, **kw):
        real(self, *a, **kw)

        def boom(model, *a, **kw):
            model.eval()  # fail half-way, with the model switched to eval mode
            raise RuntimeError("probe exploded")

        self.run = boom

    monkeypatch.setattr(callback.ProbeCallback, "__init__", failing_init)
    failing = train(tmp_path, "failing", "probes@checkpoint_probes=coarse")
    plain = train(tmp_path, "plain", "probes@checkpoint_probes=none")
    assert losses(failing) == losses(plain)  # train mode restored: dropout still on
    assert (failing / "checkpoints" / "step-000020").is_dir()
    for step in (10, 20):
        assert "probe exploded" in (failing / f"probes/step-{step:06d}/probe_error.txt").read_text()

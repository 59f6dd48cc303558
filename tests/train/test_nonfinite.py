"""Non-finite loss or gradient (RELIABILITY G): by default training stops before the optimizer
step with the step and the quantity named; with ``trainer.skip_nonfinite=N`` up to N such steps
are skipped — no parameter or optimizer-state change — counted in the checkpoint, and a step
beyond the limit stops the run."""

from __future__ import annotations

import csv

import pytest
import torch

from blocklab import checkpoint as ckpt
from blocklab import objectives
from blocklab.config import compose
from blocklab.train.module import NonFiniteError
from blocklab.train.run import train

pytestmark = pytest.mark.slow


class InfGrad(torch.autograd.Function):
    """Identity forward, infinite gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("inf")


def poison(monkeypatch, kind: str, at: tuple[int, ...]) -> None:
    """Make training-step call number ``at`` (0-based) produce a NaN loss or an inf gradient."""
    real = objectives.Objective.loss
    calls = {"n": 0}

    def loss(self, model, batch):
        out = real(self, model, batch)
        if not model.training:
            return out
        i, calls["n"] = calls["n"], calls["n"] + 1
        if i in at:
            value = out.loss * float("nan") if kind == "loss" else InfGrad.apply(out.loss)
            total = out.total * float("nan") if kind == "loss" else out.total
            return objectives.LossOut(value, total, out.count)
        return out

    monkeypatch.setattr(objectives.Objective, "loss", loss)


def run(tmp_path, *extra):
    return train(compose("train", ["experiment=smoke", "trainer.log_every_steps=1",
                                   f"out_root={tmp_path}", "probes=none", *extra]))


def logged_steps(run_dir) -> list[int]:
    return [int(r["step"]) for f in (run_dir / "logs").glob("version_*/metrics.csv")
            for r in csv.DictReader(f.open()) if r.get("train/loss")]


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_default_policy_stops_before_the_step(tmp_path, monkeypatch, kind):
    poison(monkeypatch, kind, at=(13,))
    with pytest.raises(NonFiniteError, match=r"at step 13; no optimizer step taken.*skip_nonfinite"):
        run(tmp_path)
    (run_dir,) = (tmp_path / "smoke").iterdir()
    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == ["step-000010"]


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_skip_policy_skips_counts_and_changes_nothing(tmp_path, monkeypatch, kind):
    poison(monkeypatch, kind, at=(13,))
    before: dict[str, torch.Tensor] = {}
    from blocklab.train.module import LitModel

    real_step = LitModel.on_train_batch_end

    def snapshot(self, outputs, batch, batch_idx):  # parameters and AdamW state around step 13
        if self.batches_seen in (13, 14):
            opt = self.trainer.optimizers[0]
            before[self.batches_seen] = (
                {k: v.clone() for k, v in self.state_dict().items()},
                {k: {n: t.clone() for n, t in s.items() if torch.is_tensor(t)}
                 for k, s in opt.state.items()})
        return real_step(self, outputs, batch, batch_idx)

    monkeypatch.setattr(LitModel, "on_train_batch_end", snapshot)
    run_dir = run(tmp_path, "trainer.skip_nonfinite=2")
    (w13, o13), (w14, o14) = before[13], before[14]
    for k in w13:  # the skipped batch (the 14th) left weights and optimizer state unchanged
        assert torch.equal(w13[k], w14[k]), k
    for p in o13:
        for n in o13[p]:
            assert torch.equal(o13[p][n], o14[p][n]), (p, n)
    meta = ckpt.metadata(ckpt.list_checkpoints(run_dir)[-1])
    assert meta["skipped_steps"] == 1 and meta["batches_seen"] >= 20
    state = ckpt.load(ckpt.list_checkpoints(run_dir)[-1])["state_dict"]
    assert all(torch.isfinite(v).all() for v in state.values())


def test_skips_beyond_the_limit_stop_the_run(tmp_path, monkeypatch):
    poison(monkeypatch, "loss", at=(3, 5, 7))
    with pytest.raises(NonFiniteError, match=r"skipped 2, limit trainer.skip_nonfinite=2"):
        run(tmp_path, "trainer.skip_nonfinite=2")

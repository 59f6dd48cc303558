"""Stability knobs of the optimizer and the loss: weight decay independent of the peak rate
(optim.weight_decay_mode), the z-loss (optim.z_loss), and what trainer.precision can run on
CPU."""

from __future__ import annotations

import csv
import math

import pytest
import torch
import torch.nn.functional as F

from blocklab.config import ConfigError, OptimConfig, TrainerConfig, compose
from blocklab.config.validate import validate_optim, validate_trainer
from blocklab.objectives.core import IGNORE, token_loss
from blocklab.train.optim import build_optimizer

LR, WD = 1e-2, 0.1


def _decayed(name: str, mode: str, lr_now: float) -> tuple[float, float]:
    """(weight after one step with zero gradient, the weight before), the optimizer's rate
    moved to ``lr_now`` as a schedule would."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3, bias=False)
    opt = build_optimizer(model, OptimConfig(name=name, lr=LR, weight_decay=WD,
                                             weight_decay_mode=mode))
    for group in opt.param_groups:
        group["lr"] = lr_now
    before = model.weight.detach().clone()
    model.weight.grad = torch.zeros_like(model.weight)
    opt.step()
    return model.weight.detach(), before


@pytest.mark.parametrize("name", ["adamw", "lion"])
@pytest.mark.parametrize("mode", ["coupled", "independent"])
def test_one_zero_gradient_step_decays_by_the_modes_factor(name, mode):
    lr_now = LR / 4  # a quarter of the peak: the schedule's shape
    after, before = _decayed(name, mode, lr_now)
    # by hand: coupled p · (1 - lr_t · wd); independent p · (1 - wd · lr_t / lr_peak)
    factor = 1 - lr_now * WD if mode == "coupled" else 1 - WD * lr_now / LR
    torch.testing.assert_close(after, before * factor, rtol=1e-6, atol=0)
    other = 1 - WD * lr_now / LR if mode == "coupled" else 1 - lr_now * WD
    assert not torch.allclose(after, before * other, rtol=1e-6, atol=0)  # negative control


def test_adafactor_gets_the_independent_coefficient():
    model = torch.nn.Linear(4, 3)
    groups = build_optimizer(model, OptimConfig(name="adafactor", lr=LR, weight_decay=WD,
                                                weight_decay_mode="independent")).param_groups
    assert [g["weight_decay"] for g in groups] == [pytest.approx(WD / LR), 0.0]


def test_sgd_refuses_independent_decay_in_one_line():
    with pytest.raises(ConfigError) as err:
        validate_optim(OptimConfig(name="sgd", weight_decay_mode="independent"))
    assert str(err.value).startswith("config error: optim.weight_decay_mode='independent'")
    assert "\n" not in str(err.value)
    validate_optim(OptimConfig(name="sgd"))  # coupled: as before


# ------------------------------------------------------------------------------------- z-loss
def _logits_labels():
    torch.manual_seed(0)
    logits = (3 * torch.randn(2, 5, 11)).requires_grad_()
    labels = torch.randint(0, 11, (2, 5))
    labels[0, :2] = IGNORE
    return logits, labels


def test_the_z_term_and_its_gradient_match_autograd_of_a_direct_computation():
    w = 1e-2
    logits, labels = _logits_labels()
    out = token_loss(logits, labels, z=True)
    (out.loss + w * out.z / out.count).backward()
    ours = logits.grad.clone()
    logits.grad = None
    keep = labels != IGNORE
    rows = logits[keep]  # the supervised targets only
    direct = (F.cross_entropy(rows, labels[keep])
              + w * torch.logsumexp(rows, -1).pow(2).mean())
    direct.backward()
    torch.testing.assert_close(ours, logits.grad)
    torch.testing.assert_close(out.loss, F.cross_entropy(rows, labels[keep]))
    torch.testing.assert_close(out.z / out.count, torch.logsumexp(rows, -1).pow(2).mean())
    # negative control: the z term over every position (ignored ones too) is another number
    every = torch.logsumexp(logits.detach(), -1).pow(2).mean()
    assert not torch.allclose(out.z / out.count, every)


def test_without_z_the_loss_is_bit_identical_to_plain_cross_entropy():
    logits, labels = _logits_labels()
    out = token_loss(logits, labels)
    before = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                             ignore_index=IGNORE, reduction="sum")
    assert out.z is None and torch.equal(out.total, before)


def _rows(run_dir) -> list[dict]:
    return [r for f in sorted((run_dir / "logs").glob("version_*/metrics.csv"))
            for r in csv.DictReader(f.open())]


def _train(tmp_path, *extra):
    from blocklab.train.run import train

    return train(compose("train", ["experiment=smoke", "trainer.log_every_steps=1",
                                   "trainer.max_steps=3", "trainer.val_every_steps=3",
                                   f"out_root={tmp_path}", "probes=none", *extra]))


@pytest.mark.slow
def test_a_z_loss_run_logs_train_z_loss_and_keeps_val_loss_pure(tmp_path, monkeypatch):
    from blocklab import objectives

    real, asked = objectives.Objective.loss, []

    def loss(self, model, batch, **kw):
        asked.append((torch.is_grad_enabled(), kw.get("z", False)))
        return real(self, model, batch, **kw)

    plain = _rows(_train(tmp_path / "a"))
    monkeypatch.setattr(objectives.Objective, "loss", loss)
    zed = _rows(_train(tmp_path / "b", "optim.z_loss=0.5"))
    z = [float(r["train/z_loss"]) for r in zed if r.get("train/z_loss")]
    assert len(z) == 3 and all(math.isfinite(v) and v > 0 for v in z)
    assert not any(r.get("train/z_loss") for r in plain)
    # the first step's train/loss is the same cross-entropy (the z term is not logged in it)
    first = [float(next(r for r in rows if r.get("train/loss"))["train/loss"])
             for rows in (plain, zed)]
    assert first[0] == pytest.approx(first[1], rel=1e-6)
    # training steps ask for log²Z, validation (no gradients) never does: val/loss stays pure
    assert {z for grad, z in asked if grad} == {True}
    assert {z for grad, z in asked if not grad} == {False}


# --------------------------------------------------------------------------------- precision
def test_fp16_autocast_on_cpu_is_refused_in_one_line():
    for value in ("16-mixed", "16"):
        with pytest.raises(ConfigError) as err:
            validate_trainer(TrainerConfig(accelerator="cpu", precision=value))
        assert str(err.value).startswith(f"config error: trainer.precision='{value}'")
        assert "bf16-mixed" in str(err.value) and "\n" not in str(err.value)
    validate_trainer(TrainerConfig(accelerator="cpu", precision="bf16-mixed"))


@pytest.mark.slow
def test_a_bf16_mixed_cpu_run_trains_to_a_finite_loss(tmp_path):
    rows = _rows(_train(tmp_path, "trainer.precision=bf16-mixed"))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)


def test_segment_by_segment_the_z_sum_is_the_whole_documents():
    """A segment mode adds every segment's log²Z; with a state that holds the whole document
    (an SSM) that is the plain objective's one forward over everything."""
    from blocklab.config import DataConfig
    from blocklab.data.synthetic import Example
    from blocklab.model import build_model
    from blocklab.objectives import CausalLM, SegmentedLM

    torch.manual_seed(0)
    model = build_model({"vocab_size": 48, "d_model": 32, "n_layers": 2, "n_heads": 2,
                         "d_ff": 64, "max_seq_len": 64, "position": {"name": "none"},
                         "mixer": {"name": "ssm", "chunk": 4}}).eval()
    seg = SegmentedLM.from_config(DataConfig(seq_len=8, segment_mode="split", doc_len=32))
    examples = [Example(list(range(5, 5 + n)), [True] * n) for n in (21, 30, 12)]
    got = seg.loss(model, seg.collate(examples), z=True)
    want = CausalLM().loss(model, CausalLM().collate(examples), z=True)
    assert int(got.count) == int(want.count)
    torch.testing.assert_close(got.z, want.z, atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(got.total, want.total, atol=1e-3, rtol=1e-5)
    assert seg.loss(model, seg.collate(examples)).z is None  # off unless asked

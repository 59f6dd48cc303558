"""Evaluation stands on the floor training stands on: a checkpoint evaluated on its own reports
the validation loss and accuracy its run logged, for every family — including the encoder's masked-LM
objective on a dense (language-modelling) task, whose masked positions depend on the data seed
and masking rate the objective is built with."""

from __future__ import annotations

import csv

import pytest

from blocklab.config import compose
from blocklab.eval.evaluate import validation_loss
from blocklab.registry import builtin_names
from blocklab.train.run import train

pytestmark = pytest.mark.slow

PRESET = {"decoder": "retrieval_tiny", "encoder": "bert_tiny", "encoder_decoder": "t5_tiny"}


@pytest.mark.parametrize("family", builtin_names("family"))
def test_evaluation_reproduces_the_logged_validation_loss(family, tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose("train", [
        "experiment=smoke", f"model={PRESET[family]}", "model.n_layers=1", "model.d_model=64",
        "model.n_heads=2", "model.d_ff=128", "model.family.n_encoder_layers=null",
        "data.tasks.markov_lm=1", "data.mlm_probability=0.3", "data.seed=77",
        "trainer.max_steps=6", "trainer.val_every_steps=6", "trainer.ckpt_every_steps=6",
        "probes=none", "logger=csv", f"run_dir={run_dir}"])
    train(cfg)
    rows = [row for f in sorted((run_dir / "logs").glob("*/metrics.csv"))
            for row in csv.DictReader(f.open()) if row.get("val/loss")]
    assert rows, "the run logged no validation loss"
    got = validation_loss(run_dir)
    assert got["step"] == 6 and got["val_targets"] > 0
    assert got["val_loss"] == pytest.approx(float(rows[-1]["val/loss"]), rel=1e-6, abs=1e-6)
    # correct targets are counted, not summed in floating point: the same ratio exactly
    assert got["val_accuracy"] == pytest.approx(float(rows[-1]["val/accuracy"]), abs=1e-12)

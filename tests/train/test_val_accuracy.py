"""``val/accuracy``: the share of supervised validation targets whose argmax is the target,
checked against a brute-force count (one forward of each target's prefix alone, no batching,
no shift); and ``data.val_tasks`` / ``data.val_len``, validation restricted to named tasks
and one length, with their rules."""

from __future__ import annotations

import csv

import pytest
import torch

from blocklab import checkpoint as ckpt
from blocklab.config import ConfigError, compose, validate_train
from blocklab.data.streams import build_streams
from blocklab.objectives import IGNORE, token_loss
from blocklab.train.run import to_train_config, train


def test_token_loss_counts_argmax_hits_over_valid_targets_only():
    logits = torch.tensor([[[0.0, 5.0, 1.0], [3.0, 3.0, 0.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0]]])
    labels = torch.tensor([[1, 1, IGNORE, 2]])  # a hit, a tie (argmax: the lower id), ignored, miss
    out = token_loss(logits, labels, accuracy=True)
    assert (int(out.count), int(out.correct)) == (3, 1)
    assert token_loss(logits, labels).correct is None  # not asked: not computed


def _rows(run_dir) -> list[dict[str, str]]:
    return [row for f in sorted((run_dir / "logs").glob("*/metrics.csv"))
            for row in csv.DictReader(f.open()) if row.get("val/accuracy")]


@pytest.mark.parametrize("tasks", [["data.tasks.markov_lm=1"],
                                   ["data.tasks.copy=1", "data.tasks.markov_lm=1",
                                    "data.val_tasks=[markov_lm]"]], ids=["markov_lm", "val_tasks"])
def test_the_logged_val_accuracy_is_the_brute_force_share_of_hits(tmp_path, tasks):
    run_dir = tmp_path / "run"
    cfg = compose("train", ["experiment=smoke", "probes=none", "logger=csv", "data.tasks.needle=0",
                            *tasks, "data.batch_size=4", "data.val_batches=2", "data.seq_len=32",
                            "data.min_len=16", "trainer.max_steps=20", f"run_dir={run_dir}"])
    train(cfg)
    row = _rows(run_dir)[-1]
    assert row["step"] == "20"
    loaded = ckpt.read(ckpt.list_checkpoints(run_dir)[-1])
    model, _ = ckpt.model_of(loaded)
    model.eval()
    streams = build_streams(loaded.config.data, loaded.config.tokenizer)
    hits = n = 0
    with torch.no_grad():
        for i in range(2 * 4):  # val_batches x batch_size
            ex = streams.val(i, None)
            for pos in range(1, len(ex.tokens)):
                if ex.targets[pos]:
                    logits = model(torch.tensor([ex.tokens[:pos]]))[0, -1]
                    hits += int(logits.argmax()) == ex.tokens[pos]
                    n += 1
    assert 0 < hits < n, (hits, n)  # a measurement that could have been wrong either way
    assert float(row["val/accuracy"]) == pytest.approx(hits / n, abs=1e-12)


def test_val_tasks_and_val_len_choose_what_validation_draws():
    def streams(*over):
        tc = validate_train(to_train_config(compose("train", [
            "data.tasks.needle=0", "data.tasks.copy=1", "data.tasks.mqar=1", *over])))
        return build_streams(tc.data, tc.tokenizer)

    both, only = streams(), streams("data.val_tasks=[mqar]")
    assert {both.val(i).meta["task"] for i in range(64)} == {"copy", "mqar"}
    assert {only.val(i).meta["task"] for i in range(64)} == {"mqar"}
    # training is the same mixture; the run's data is told apart by its fingerprint
    assert [both.train(i, 0).tokens for i in range(8)] == [only.train(i, 0).tokens
                                                           for i in range(8)]
    assert both.fingerprint != only.fingerprint
    assert streams("data.val_tasks=[]").fingerprint == both.fingerprint
    # data.val_len: every validation sequence at that length (training's lengths unchanged)
    assert len({len(both.val(i).tokens) for i in range(256)}) > 1
    full = streams("data.seq_len=64", "data.min_len=32", "data.val_len=64", "data.mqar_pairs=4",
                   "data.val_tasks=[mqar]")  # MQAR with n pairs is exactly as long as asked
    assert {len(full.val(i).tokens) for i in range(256)} == {64}
    assert len({len(full.train(i, 10**6).tokens) for i in range(2048)}) > 1


@pytest.mark.parametrize(("over", "rule"), [
    (["data.val_tasks=[needle]"], "every validation task must be trained on; 'needle' is not"),
    (["data.val_tasks=[mqar,mqar]"], "names a task twice"),
    (["data.val_len=300"], "must be null or in min_len..seq_len"),
    (["data.name=text", "tokenizer=byte", "data.files=[a.txt]", "data.val_len=64"],
     "synthetic data only"),
    (["data.name=text", "tokenizer=byte", "data.files=[a.txt]", "data.val_tasks=[mqar]"], "synthetic data only"),
])
def test_val_tasks_and_val_len_rules_name_the_key(over, rule):
    with pytest.raises(ConfigError) as e:
        validate_train(to_train_config(compose("train", [
            "data.tasks.needle=0", "data.tasks.copy=1", "data.tasks.mqar=1", *over])))
    key = next(o for o in over if o.startswith("data.val_")).split("=")[0]
    assert key in str(e.value) and rule in str(e.value), str(e.value)

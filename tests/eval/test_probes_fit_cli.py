"""The probes on a user's own small text model, end to end through the commands: the repository's
own ``experiment=shakespeare`` (learned positions, a BPE tokenizer) finishes its default probes
with N/A cells and their reasons, and ``blocklab-eval ckpt=<run> probes=text`` re-runs them
(b861d22: IndexError at the table's end, 97 lines of traceback, exit 1); the final probes'
headline numbers reach the loggers as scalars; run tags reach wandb."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from inprocess import run_cli

SMALL = ("model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64",
         "data.seq_len=64", "model.max_seq_len=64", "data.batch_size=4", "data.val_batches=1",
         "trainer.max_steps=2", "trainer.val_every_steps=1000", "trainer.ckpt_every_steps=2",
         "trainer.progress_bar=false", "probes.needle.n=4", "probes.litm.n=4",
         "probes.perplexity.tokens=256")


@pytest.mark.slow
def test_shakespeare_default_probes_and_eval_on_learned_positions(capfd, tmp_path):
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", "experiment=shakespeare", f"run_dir={run}", *SMALL,
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "final probes failed" not in r.stderr
    summary = json.loads((run / "summary.json").read_text())
    probes = summary["probes"]
    assert probes["spec"] == "text" and probes["train_length"] == 64
    # 2L (128) is past the learned table of 64 positions: N/A with the reason, in the report
    assert "128 > 64 positions the model can index" in r.stdout
    assert "not applicable (N/A above):" in r.stdout
    assert probes["perplexity_text"]["name"].startswith("the run's validation text (")
    ppl = {(p["variant"], p["length"]): p for p in probes["perplexity"]}
    assert ppl[("sliding", 64)]["ppl"] is not None
    assert ppl[("sliding", 128)]["status"].startswith("n/a: length 128 > 64")
    # the rerun the docs suggest: the same grid on the checkpoint on its own
    e = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=text", "probes.needle.n=4",
                "probes.litm.n=4", "probes.perplexity.tokens=256", f"out={tmp_path / 'e'}",
                cwd=tmp_path)
    assert e.returncode == 0, e.stderr[-3000:]
    assert "Traceback" not in e.stderr
    assert "128 > 64 positions the model can index" in e.stdout
    # blocklab-eval reads no run data unasked: the perplexity text is the installed plays, and
    # the report says the run trained on them
    assert "on Shakespeare's plays" in e.stdout and "the run trained on the shakespeare" in e.stdout
    cells = list(csv.DictReader((next((tmp_path / "e").glob("text-*")) / "cells.csv").open()))
    na = [c for c in cells if c["status"].startswith("n/a")]
    assert na and all(len(c["status"]) > len("n/a: ") for c in na)


@pytest.mark.slow
def test_final_probe_headlines_reach_the_loggers_as_scalars(capfd, tmp_path):
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", f"run_dir={run}",
                "trainer.max_steps=4", "trainer.val_every_steps=2", "trainer.ckpt_every_steps=4",
                "probes.needle.n=4", "probes.litm.n=4", "logger.tags=[mine,baseline]",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = list(csv.DictReader(next(Path(run / "logs").glob("version_*/metrics.csv")).open()))
    headline = {k for row in rows for k, v in row.items() if k.startswith("final_probe/") and v}
    assert "final_probe/needle_2_distractors/within_train_length" in headline
    assert any(k.startswith("final_probe/litm_") for k in headline)
    assert "- mine" in (run / "config.yaml").read_text()


def test_wandb_gets_the_run_tags_and_a_sweep_job_one_per_varied_key(tmp_path):
    from omegaconf import OmegaConf

    from blocklab.config import LoggerConfig
    from blocklab.train.loggers import name_sweep_job, wandb

    (lg,) = wandb(LoggerConfig(name="wandb", tags=["mine"]), tmp_path)
    assert lg._wandb_init["tags"] == ["mine"]
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    task: ['model/position=rope,alibi', 'optim.lr=0.01']\n")
    cfg = OmegaConf.structured(LoggerConfig(tags=["mine"]))
    name_sweep_job(cfg, sweep, ["model/position=alibi", "optim.lr=0.01"], 1)
    assert list(cfg.tags) == ["mine", "model/position=alibi"]
    assert cfg.run_name == "model/position=alibi"


def test_an_empty_tag_is_refused_naming_the_key():
    from blocklab.config import ConfigError, LoggerConfig
    from blocklab.config.validate import validate_logger

    with pytest.raises(ConfigError, match=r"logger\.tags=\['ok', ''\]: each tag"):
        validate_logger(LoggerConfig(tags=["ok", ""]))


def test_every_probe_plot_is_titled_with_the_run_and_the_model():
    from blocklab.config import TrainConfig
    from blocklab.eval.evaluate import run_title

    tc = TrainConfig(experiment_name="shakespeare")
    tc.logger.run_name = "model/position=alibi"
    title = run_title({"run_dir": "/x/runs/r1", "params": 3_400_000}, tc)
    assert title.startswith("shakespeare/model/position=alibi · decoder ")
    assert "3.4M params" in title
    tc.logger.run_name = None
    assert run_title({"run_dir": "/x/runs/r1"}, tc).startswith("shakespeare/r1 · ")
    assert run_title({"imported": "SmolLM2", "run_dir": "/x"}, tc).startswith("SmolLM2 · ")


def test_eval_of_a_path_that_does_not_exist_writes_nothing(capfd, tmp_path):
    r = run_cli(capfd, "blocklab-eval", f"ckpt={tmp_path / 'nothing' / 'run'}", "probes=none")
    assert r.returncode != 0 and "no such file or directory" in r.stderr
    assert not (tmp_path / "nothing").exists()  # b861d22 made it, holding a .lock file

"""Every shipped ``experiment=`` config composes and validates; variable tracking's recipe is
the one docs/results.md measured, and its checkpoint probes log the curve by hops."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from inprocess import run_cli

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))


def _train_config(*overrides: str):
    from blocklab.config import compose, validate_train
    from blocklab.train.run import to_train_config
    from hydra_plugins.blocklab_launchers import register

    register()  # hydra/launcher=parallel (experiment=position_extrapolation), as the CLI does;
    # without it the test passed only after another test had run a command in this process
    return validate_train(to_train_config(compose("train", list(overrides))))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_validates(name: str) -> None:
    assert _train_config(f"experiment={name}").experiment_name


def test_variable_tracking_is_the_measured_recipe() -> None:
    """The mix that made variable tracking learnable (docs/results.md, "Variable tracking,
    learned"): multi-query recall and copying beside 1-2 hop chains, validated on chains alone
    at the training length; the hops probe at every checkpoint."""
    c = _train_config("experiment=variable_tracking")
    d = c.data
    weights = {k: v for k, v in vars(d.tasks).items() if v}
    assert weights == {"multihop": 2.0, "mqar": 1.0, "copy": 0.5}
    assert list(d.multihop_hops) == [1, 2] and d.seq_len == 32 and d.val_len == 32
    assert list(d.val_tasks) == ["multihop"]
    assert (c.model.n_layers, c.model.d_model, c.model.n_heads) == (4, 64, 2)
    assert c.trainer.max_steps == 12000 and c.trainer.ckpt_every_steps == 1000
    hops = c.checkpoint_probes.hops
    assert hops.enabled and list(hops.hops) == [1, 2, 3, 4] and list(hops.lengths) == [1.0]
    assert not c.checkpoint_probes.multi_needle.enabled
    assert not c.checkpoint_probes.aggregation.enabled


def test_variable_tracking_logs_accuracy_by_hops_at_each_checkpoint(tmp_path, capfd) -> None:
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", "experiment=variable_tracking", "trainer.max_steps=4",
                "trainer.ckpt_every_steps=2", "trainer.val_every_steps=2", "probes=none",
                "checkpoint_probes.hops.n=4", "logger=csv", f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [row for p in run.glob("logs/version_*/metrics.csv") for row in csv.DictReader(p.open())
            if row.get("probe/hops_1_hops/accuracy")]
    assert [int(row["step"]) for row in rows] == [2, 4]
    for row in rows:
        for h in (1, 2, 3, 4):
            assert 0.0 <= float(row[f"probe/hops_{h}_hops/accuracy"]) <= 1.0

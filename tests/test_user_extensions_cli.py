"""User components and user configs from the command line, as users run them: plugin modules
named in ``$BLOCKLAB_PLUGINS``, chosen by name (``model.ffn.name=...``) or through a YAML file
in a user config directory (``--config-dir`` / ``hydra.searchpath``); user presets and
experiments; a checkpoint that needs a plugin says so in one line when it is missing."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inprocess import SAFETY_S, run_cli

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "docs" / "examples" / "plugin"
FAST = ["trainer.max_steps=4", "trainer.val_every_steps=4", "trainer.ckpt_every_steps=4",
        "probes=none"]


def cli(*args: str, tool: str = "blocklab-train", plugin: bool = True,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("BLOCKLAB_PLUGINS", "PYTHONPATH")}
    if plugin:
        env |= {"BLOCKLAB_PLUGINS": "blocklab_example", "PYTHONPATH": str(PLUGIN)}
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, timeout=SAFETY_S,
                          env=env, cwd=cwd)


def test_plugin_components_train_and_evaluate_from_a_user_config_dir(tmp_path, capfd):
    run = tmp_path / "run"
    r = cli("--config-dir", str(PLUGIN / "configs"), "experiment=example_plugin", *FAST,
            f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    meta = json.loads((run / "checkpoints" / "step-000004" / "meta.json").read_text())
    model = meta["config"]["model"]
    assert (model["ffn"]["name"], model["norm"]["name"], model["block"]["name"]) == (
        "squared_relu", "scalenorm", "parallel")
    assert json.loads((run / "run.json").read_text())["params"] == meta["params"] > 0

    # (in process, where the example plugin is registered by conftest.py: its loading from
    # $BLOCKLAB_PLUGINS is shown by the training above, its absence by the command below)
    r = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=coarse",
                "probes.litm.enabled=false")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "val/loss" in r.stdout

    r = cli(f"ckpt={run}", "probes=none", tool="blocklab-eval", plugin=False)
    assert r.returncode == 2, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("config error: model.norm.name='scalenorm': unknown choice; known: "
                           "layernorm, rmsnorm") and "docs/extending.md" in last


def test_a_registered_component_is_chosen_by_name_without_any_yaml(tmp_path, capfd):
    run = tmp_path / "run"
    # (in process: the plugin named in $BLOCKLAB_PLUGINS is the one conftest.py imported; its
    # loading by a fresh process is the test above, its absence the command below)
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", "model.ffn.name=squared_relu",
                *FAST, f"run_dir={run}", env={"BLOCKLAB_PLUGINS": "blocklab_example"})
    assert r.returncode == 0, r.stderr[-3000:]
    meta = json.loads((run / "checkpoints" / "step-000004" / "meta.json").read_text())
    assert meta["config"]["model"]["ffn"]["name"] == "squared_relu"
    r = cli("experiment=smoke", "model.ffn.name=squared_relu", *FAST,
            f"run_dir={tmp_path / 'other'}", plugin=False)
    assert r.returncode == 2
    assert "model.ffn.name='squared_relu': unknown choice" in r.stderr


def test_user_presets_and_experiments_come_from_a_user_config_dir(tmp_path, capfd):
    configs = tmp_path / "my_configs"
    (configs / "model").mkdir(parents=True)
    (configs / "experiment").mkdir()
    (configs / "model" / "my_tiny.yaml").write_text(
        "defaults:\n  - retrieval_tiny\n  - _self_\nd_model: 48\nn_heads: 2\n")
    (configs / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - smoke\n  - override /model: my_tiny\n"
        "experiment_name: mine\n")
    for flag in (["--config-dir", str(configs)], [f"hydra.searchpath=[file://{configs}]"]):
        r = cli(*flag, "experiment=mine", "--cfg", "job", plugin=False, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "d_model: 48" in r.stdout and "experiment_name: mine" in r.stdout
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", "--config-dir", str(configs), "experiment=mine", *FAST,
                f"run_dir={run}", cwd=tmp_path)  # (in process: no plugin involved)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "d_model: 48" in (run / "config.yaml").read_text()


def test_a_plugin_that_cannot_be_imported_is_one_line_and_exit_2():
    env = {**os.environ, "BLOCKLAB_PLUGINS": "not_a_module_anywhere"}
    r = subprocess.run([str(BIN / "blocklab-train"), "--cfg", "job"], capture_output=True,
                       text=True, timeout=SAFETY_S, env=env)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "plugin error: BLOCKLAB_PLUGINS=not_a_module_anywhere: importing "
        "'not_a_module_anywhere' failed: ModuleNotFoundError: No module named "
        "'not_a_module_anywhere'"]


def test_a_user_probe_kind_runs_end_to_end(tmp_path, capfd):
    """The example plugin's probe kind (``first_value``: its module, its settings dataclass,
    its YAML in the user config directory) goes the whole way like a built-in kind: training
    probes it at every checkpoint (cells, summary, report block, heatmap, headline scalars to
    the logger), ``blocklab-eval`` probes the checkpoint with it, and ``blocklab-compare``
    collects its headline; without the plugin, the spec that asks for it is one line, exit 2."""
    from blocklab.compare.runs import load_run

    run = tmp_path / "run"
    r = cli("--config-dir", str(PLUGIN / "configs"), "experiment=example_plugin", *FAST,
            "probes@checkpoint_probes=first_value", "checkpoint_probes.needle.enabled=false",
            "checkpoint_probes.litm.enabled=false", f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    (report,) = (run / "probes" / "step-000004").iterdir()
    summary = json.loads((report / "summary.json").read_text())
    first = summary["first_value"]["first"]
    assert first["pooled"]["n"] == 2 * 8 and set(first["accuracy_by_length"]) == {"64", "128"}
    assert summary["files"]["first_value_png"] == "first_value.png"
    assert (report / "first_value.png").stat().st_size > 2_000
    with (report / "cells.csv").open() as f:
        cells = list(csv.DictReader(f))
    assert [(c["probe"], c["length"]) for c in cells] == [("first_value", "64"),
                                                          ("first_value", "128")]

    # blocklab-eval with the same YAML (in process: conftest.py registered the plugin)
    out = tmp_path / "eval"
    r = run_cli(capfd, "blocklab-eval", "--config-dir", str(PLUGIN / "configs"), f"ckpt={run}",
                "probes=first_value", "probes.needle.enabled=false",
                "probes.litm.enabled=false", f"out={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "first value (argmax accuracy: the first value of the row):" in r.stdout

    # blocklab-compare: the run's row carries the kind's headline curve (logged by training)
    from blocklab.compare.cli import main as compare

    assert compare([str(run), "--out", str(tmp_path / "cmp"), "--no-plots"]) == 0
    assert (tmp_path / "cmp" / "compare.csv").is_file()
    curves = load_run(run)["curves"]
    assert [s for s, _ in curves["probe/first_value_first/accuracy"]] == [4]

    r = cli("--config-dir", str(PLUGIN / "configs"), f"ckpt={run}", "probes=first_value",
            tool="blocklab-eval", plugin=False)
    assert r.returncode == 2, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "probes.kinds.first_value" in last and "unknown choice" in last, last

"""The training command end to end (as users run it): exact resume, refused and allowed config
changes, validation before anything is written, evaluation of a checkpoint on its own. The
reference run and the exact resume are real subprocesses; the other commands run their console
script's entry function in process (tests/inprocess.py) against them."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from blocklab import checkpoint as ckpt
from inprocess import SAFETY_S, run_cli

BIN = Path(sys.executable).parent
BASE = ["experiment=smoke", "trainer.log_every_steps=1", "model.dropout=0.1",
        "trainer.accumulate=2", "trainer.max_steps=16", "trainer.ckpt_every_steps=8",
        "trainer.val_every_steps=8"]


def cli(*args: str, tool: str = "blocklab-train", cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, timeout=SAFETY_S,
                          cwd=cwd)


def losses(run_dir: Path) -> dict[int, str]:
    """Per-step train losses as logged (strings: compared exactly); later logs win."""
    out = {}
    for f in sorted((run_dir / "logs").glob("version_*/metrics.csv")):
        for row in csv.DictReader(f.open()):
            if row.get("train/loss"):
                out[int(row["step"])] = row["train/loss"]
    return out


def states_equal(a: dict, b: dict, path: str = "") -> list[str]:
    """Paths where two checkpoint dicts differ (tensors compared exactly)."""
    if isinstance(a, torch.Tensor):
        return [] if torch.equal(a, b) else [path]
    if isinstance(a, dict):
        keys = set(a) | set(b)
        return [d for k in keys for d in states_equal(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list | tuple):
        if len(a) != len(b):
            return [path]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in states_equal(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


def assert_resumed_equals_straight(straight: Path, run: Path, meta_keys: tuple[str, ...]) -> None:
    """Same per-step losses (as logged strings) and the same final training state."""
    a, b = losses(straight), losses(run)
    assert sorted(a) == list(range(1, 17)) and a == b  # rows keyed by steps done
    full = torch.load(straight / "checkpoints/step-000016/state.pt", weights_only=True)
    resumed = torch.load(run / "checkpoints/step-000016/state.pt", weights_only=True)
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        assert not states_equal(full[key], resumed[key]), key
    for key in meta_keys:
        assert not states_equal(full["blocklab"][key], resumed["blocklab"][key]), key


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """One uninterrupted 16-step run (dropout on, accumulation 2, checkpoints at 8 and 16)."""
    out = tmp_path_factory.mktemp("straight")
    r = cli(*BASE, f"out_root={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = (out / "smoke").iterdir()
    return run


@pytest.mark.slow
def test_resume_from_the_middle_is_exact(straight, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    shutil.rmtree(run / "checkpoints" / "step-000016")  # as if killed after step 8's save
    # Negative control: a different seed would give different init weights and dropout masks;
    # the checkpoint's weights and RNG state must win.
    r = cli(*BASE, f"resume={run}", "seed=123")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "seed changed 0 -> 123" in r.stderr
    assert_resumed_equals_straight(straight, run,
                                   ("rng", "rng_ranks", "batches_seen", "tokens_seen", "step"))


@pytest.mark.slow
def test_resume_with_another_architecture_is_refused_listing_every_key(straight, tmp_path, capfd):
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    r = run_cli(capfd, "blocklab-train", *BASE, f"resume={run}", "model.n_heads=2",
                "model.d_ff=128")
    assert r.returncode == 4
    msg = r.stderr.strip().splitlines()[-1]
    assert "architecture differs" in msg and "(2 keys)" in msg
    assert "model.n_heads: 4 -> 2" in msg and "model.d_ff: 512 -> 128" in msg
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before


@pytest.mark.slow
def test_resume_with_more_steps_proceeds_with_a_warning(straight, tmp_path, capfd):
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    r = run_cli(capfd, "blocklab-train", *[a for a in BASE if "max_steps" not in a],
                "trainer.max_steps=18", f"resume={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trainer.max_steps changed 16 -> 18 (allowed)" in r.stderr
    assert (run / "checkpoints" / "step-000018").is_dir()


@pytest.mark.slow
def test_resume_on_different_data_is_refused_unless_allowed(straight, tmp_path, capfd):
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    r = run_cli(capfd, "blocklab-train", *BASE, f"resume={run}", "data.seed=7")
    assert r.returncode == 4 and "data_fingerprint differs" in r.stderr


@pytest.mark.slow
def test_evaluating_a_checkpoint_alone_reproduces_the_logged_validation_loss(straight, capfd):
    r = run_cli(capfd, "blocklab-eval", f"ckpt={straight}", "probes=coarse")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (straight / "probes/step-000016").is_dir() and "effective length" in r.stdout
    got = float(r.stdout.split("val/loss ")[1].split()[0])
    logged = [row["val/loss"] for f in (straight / "logs").glob("version_*/metrics.csv")
              for row in csv.DictReader(f.open()) if row.get("val/loss")]
    assert got == pytest.approx(float(logged[-1]), abs=1e-4)
    model, vocab, meta = ckpt.load_model(straight)
    assert meta["step"] == 16 and model.config.vocab_size >= vocab.size
    assert meta["git"]["commit"] and meta["versions"]["torch"] == torch.__version__
    assert (straight / "checkpoints/step-000016/tokenizer.json").is_file()


@pytest.mark.parametrize(("how", "args", "words"), [
    # Hydra composition errors (exit 1 -> 2) fail before the heavy imports: the real command
    ("subprocess", ["data.tasks.neddle=1.0"], "neddle"),
    ("subprocess", ["model.n_layer=3"], "n_layer"),
    # validation errors: the command's entry function in process (the same argument parsing,
    # composition, validation and one-line reporting; test_validation.py runs one for real)
    ("in-process", ["model.n_heads=3"], "config error: model.n_heads=3: must divide d_model=128"),
    ("in-process", ["optim.lr=0"], "config error: optim.lr=0.0: must be > 0"),
    ("in-process", ["data.tasks.needle=0", "data.tasks.mqar=0", "data.tasks.copy=0"],
     "positive sum"),
    ("in-process", ["model.vocab_size=100"],
     "model.vocab_size=100: smaller than the tokenizer's vocabulary (199)"),
])
def test_invalid_configs_fail_in_one_line_before_anything_is_written(tmp_path, capfd, how, args,
                                                                     words):
    argv = ["experiment=smoke", f"out_root={tmp_path / 'out'}", *args]
    r = cli(*argv) if how == "subprocess" else run_cli(capfd, "blocklab-train", *argv)
    assert r.returncode == 2, r.stderr[-2000:]
    assert words in r.stderr
    assert not (tmp_path / "out").exists()  # nothing written at all


def test_an_output_root_that_is_a_file_fails_before_building(tmp_path, capfd):
    (tmp_path / "file").write_text("x")
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", f"out_root={tmp_path / 'file'}")
    assert r.returncode == 6 and "is a file, not a directory" in r.stderr


def test_cfg_job_and_help_are_quick_and_informative():
    r = cli("--cfg", "job", "model/position=alibi")
    assert r.returncode == 0 and "name: alibi" in r.stdout
    r = cli("--help")
    assert r.returncode == 0 and "model/position" in r.stdout


@pytest.mark.slow
def test_wandb_logger_runs_offline_inside_the_run_directory(tmp_path, capfd):
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", f"out_root={tmp_path}",
                "logger=wandb", "trainer.max_steps=4", "trainer.ckpt_every_steps=4",
                "trainer.val_every_steps=4")
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = (tmp_path / "smoke").iterdir()
    assert list((run / "wandb").glob("offline-run-*")), "wandb did not write an offline run"
    assert (run / "logs").is_dir()  # CSV logs are always kept as well

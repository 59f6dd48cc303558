"""Every command's I/O failure is one line with its exit code: standard output on a full disk
(exit 6) or closed by its reader (a quiet exit 141, as SIGPIPE ends Unix tools), for the Hydra
commands and ``blocklab-compare`` / ``blocklab-repro`` alike; wandb's directories that cannot
be written, found before training; an export onto a full disk (nothing half-made left); and a
misspelt callback in a list, named with the choices."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from blocklab import checkpoint as ckpt
from blocklab.config import compose
from blocklab.train.run import train
from inprocess import SAFETY_S, run_cli
from train.test_train_cli import BIN

pytestmark = pytest.mark.slow

SMOKE = ["experiment=smoke", "probes=none", "trainer.max_steps=2", "trainer.ckpt_every_steps=2",
         "trainer.val_every_steps=2"]
FULL = "I/O error: standard output: no space left on device"
TINY_LLAMA = ["model=llama_tiny", "model.n_layers=1", "model.d_model=32", "model.n_heads=2",
              "model/attention=mha", "model.d_ff=64"]  # exports as Hugging Face's Llama


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("io") / "smoke"
    train(compose("train", [*SMOKE, *TINY_LLAMA, f"run_dir={run}"]))
    return run


def _command(tool: str, run: Path, tmp: Path) -> list[str]:
    args = {"blocklab-train": ["--help"],  # printed by Hydra, inside the shared wrapper
            "blocklab-generate": [f"ckpt={run}", "prompt=bos k3", "max_new_tokens=2",
                                  "threads=1"],
            "blocklab-compare": [str(run), "--no-plots", "--out", str(tmp / "compare")],
            "blocklab-repro": ["--list"]}[tool]
    return [str(BIN / tool), *args]


# Each entry point writes through errors.standard_output once: the Hydra commands' shared
# wrapper (train's --help: Hydra's own printing; generate: a command's output), compare's and
# repro's mains. A reader that stops mid-sample: tests/test_generate_faults.py.
@pytest.mark.parametrize("tool", ["blocklab-train", "blocklab-generate", "blocklab-compare",
                                  "blocklab-repro"])
def test_standard_output_on_a_full_disk_is_one_line_exit_6(run, tmp_path, tool):
    with open("/dev/full", "w") as full:
        r = subprocess.run(_command(tool, run, tmp_path), stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=SAFETY_S)
    assert r.returncode == 6, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == FULL
    assert r.stderr.count(FULL) == 1 and "Traceback" not in r.stderr
    assert "Exception ignored" not in r.stderr


@pytest.mark.parametrize("tool", ["blocklab-train", "blocklab-compare"])
def test_standard_output_closed_by_its_reader_exits_quietly(run, tmp_path, tool):
    """The reader is gone before the command writes (its end of the pipe closed first, so the
    first write fails every time): exit 141, no traceback, no "Exception ignored" at exit."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run(_command(tool, run, tmp_path), stdout=write, stderr=subprocess.PIPE,
                           text=True, timeout=SAFETY_S)
    finally:
        os.close(write)
    assert r.returncode == 141, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr
    assert "Broken pipe" not in r.stderr and "Error" not in r.stderr


# ---------------------------------------------------------------------------------- wandb


def _no_wandb_env(monkeypatch) -> None:
    for var in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR",
                "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(var, raising=False)


def test_wandb_checkpoint_artifacts_with_an_unwritable_home_are_refused_before_training(
        tmp_path, capfd, monkeypatch):
    """logger=wandb logger.log_checkpoints=true stages every checkpoint under
    ``~/.local/share/wandb`` (``WANDB_DATA_DIR``): with a home it cannot write there, the run
    once stopped at its first checkpoint. Home is a file here (the suite runs as root, whom a
    read-only mode does not stop): refused before any step, one line naming the path and
    WANDB_DATA_DIR, exit 6."""
    _no_wandb_env(monkeypatch)
    home = tmp_path / "home"
    home.write_text("not a directory")
    run_dir = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", *SMOKE, f"run_dir={run_dir}", "logger=wandb",
                "logger.log_checkpoints=true", env={"HOME": str(home)})
    assert r.returncode == 6, r.stderr[-3000:]
    line = r.stderr.strip().splitlines()[-1]
    staging = home / ".local" / "share" / "wandb" / "artifacts" / "staging"
    assert line.startswith(f"I/O error: logger.log_checkpoints=true: wandb stages checkpoints "
                           f"in {staging}: {home} is a file"), line
    assert "WANDB_DATA_DIR" in line and "Traceback" not in r.stderr
    assert not ckpt.list_checkpoints(run_dir) and not (run_dir / "logs").exists()


def test_a_wandb_directory_that_is_a_file_is_refused_before_training(tmp_path, capfd,
                                                                     monkeypatch):
    _no_wandb_env(monkeypatch)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "wandb").write_text("in the way")
    r = run_cli(capfd, "blocklab-train", *SMOKE, f"run_dir={run_dir}", "logger=many",
                "logger.loggers=[csv,wandb]")
    assert r.returncode == 6, r.stderr[-3000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"I/O error: logger=wandb: wandb's directory {run_dir / 'wandb'}: "
                           f"{run_dir / 'wandb'} is a file"), line
    assert "run_dir=" in line and "Traceback" not in r.stderr
    assert not ckpt.list_checkpoints(run_dir) and not (run_dir / "logs").exists()
    assert (run_dir / "wandb").read_text() == "in the way"


# --------------------------------------------------------------------------------- export


def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(run, tmp_path, capfd,
                                                                   monkeypatch):
    """safetensors writes model.safetensors itself (Rust): a full disk there raised its own
    ``SafetensorError`` — a traceback, past the export's one-line storage errors. Injected as
    safetensors raises it."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full(tensors, filename, metadata=None):
        raise SafetensorError(f"Error while serializing: I/O error: No space left on device "
                              f"(os error {errno.ENOSPC}) at path \"{filename}\"")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    out = tmp_path / "hf"
    r = run_cli(capfd, "blocklab-export", f"ckpt={run}", f"out={out}")
    assert r.returncode == 6, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"storage error: export to {out}: no space left on device; the export needs about ")
    assert "Traceback" not in r.stderr
    assert sorted(os.listdir(tmp_path)) == []  # no out, no temporary beside it


# ------------------------------------------------------------------------------ callbacks


@pytest.mark.parametrize("callbacks, typo", [
    ("[early_stoping]", "early_stoping"),
    ("[early_stopping,lr_monitr]", "lr_monitr"),
])
def test_a_misspelt_callback_in_a_list_names_the_closest_and_the_choices(tmp_path, capfd,
                                                                         callbacks, typo):
    r = run_cli(capfd, "blocklab-train", *SMOKE, f"out_root={tmp_path}",
                f"callbacks={callbacks}")
    assert r.returncode == 2, r.stderr[-3000:]
    near = {"early_stoping": "early_stopping", "lr_monitr": "lr_monitor"}[typo]
    assert r.stderr.strip().splitlines() == [
        f"config error: callbacks={callbacks}: {typo!r} is not an option of callbacks; did you "
        f"mean {near}? options: early_stopping, lr_monitor, none"]
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------- exit codes


def test_a_numerical_error_in_training_is_one_line_exit_5(tmp_path, capfd):
    """The command line's report had caught every exception but its users' classes before it
    reached its numerical clause: training's NaN loss (documented: exit 5) was a traceback."""
    r = run_cli(capfd, "blocklab-train", *SMOKE, f"run_dir={tmp_path / 'run'}", "optim.lr=1e35")
    assert r.returncode == 5, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1].startswith("numerical error: loss is nan at step 1")
    assert "Traceback" not in r.stderr

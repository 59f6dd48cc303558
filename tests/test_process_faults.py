"""Faults of the process around the work: a user plugin that raises or exits while it is imported
(every command: one line, exit 2, nothing written; Ctrl-C still aborts), a ``blocklab-repro``
stopped by SIGTERM (exit 7 and the command that resumes it), an output root that is a file and
a disk that fills while probe results are written (one line, exit 6, nothing half-written)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from blocklab import registry
from inprocess import SAFETY_S, TOOLS, run_cli

BIN = Path(sys.executable).parent

# what each plugin module does at import, and the rule its one line must state
PLUGINS = {
    "exits_zero": ("import sys\nsys.exit(0)\n", "it called sys.exit(0) while being imported"),
    "exits_text": ("raise SystemExit('bye')\n", "it called sys.exit('bye') while being imported"),
    "raises": ("raise RuntimeError('no GPU here\\nsecond line')\n", "RuntimeError: no GPU here"),
}
# a command each tool would run, all of its outputs under the test's directory
ARGS = {"blocklab-train": ["experiment=smoke", "out_root=out"],
        "blocklab-eval": ["ckpt=missing", "out=out"],
        "blocklab-estimate": ["model=gpt2_tiny"],
        "blocklab-prepare": ["data=text_files", "data.files=[corpus.txt]"],
        "blocklab-import": ["from_hf=missing", "out=out"],
        "blocklab-export": ["ckpt=missing", "out=out"],
        "blocklab-generate": ["ckpt=missing", "prompt=a"]}


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch) -> Path:
    """A directory of the failing plugin modules on ``sys.path``, and plugins not loaded yet."""
    d = tmp_path / "plugins"
    d.mkdir()
    for name, (source, _) in PLUGINS.items():
        (d / f"failing_{name}.py").write_text(source)
    (d / "ctrl_c.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(d))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    return d


def _written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if "plugins" not in p.parts)


@pytest.mark.parametrize("plugin", PLUGINS)
@pytest.mark.parametrize("tool", TOOLS)
def test_a_plugin_that_fails_at_import_is_one_line_and_exit_2(tool, plugin, plugin_dir,
                                                              tmp_path, capfd):
    """``sys.exit(0)`` in a plugin used to end blocklab-train with exit 0 and nothing trained
    (SystemExit is no Exception); ``sys.exit('text')`` printed the text and exited 1."""
    work = tmp_path / "work"
    work.mkdir()
    r = run_cli(capfd, tool, *ARGS[tool], cwd=work, env={"BLOCKLAB_PLUGINS": f"failing_{plugin}"})
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == [
        f"plugin error: BLOCKLAB_PLUGINS=failing_{plugin}: importing 'failing_{plugin}' failed: "
        + PLUGINS[plugin][1] + (" (a plugin module only defines and registers components)"
                                if "exit" in plugin else "")]
    assert r.stdout == "" and _written(tmp_path) == ["work"]
    assert not registry._plugins_loaded  # a fixed environment may try again


def test_ctrl_c_while_a_plugin_is_imported_aborts_the_command(plugin_dir, tmp_path, capfd):
    """KeyboardInterrupt is the user stopping the command, not a plugin failure: it goes on
    up (Python's own exit for Ctrl-C), and the command does nothing."""
    with pytest.raises(KeyboardInterrupt):
        run_cli(capfd, "blocklab-train", "experiment=smoke", f"out_root={tmp_path / 'out'}",
                env={"BLOCKLAB_PLUGINS": "ctrl_c"})
    assert not (tmp_path / "out").exists() and not registry._plugins_loaded


def test_blocklab_repro_loads_plugins_first_and_a_failing_one_is_one_line(plugin_dir, tmp_path,
                                                                          monkeypatch, capfd):
    """blocklab-repro used to import plugins only when the first arm was composed: after it had
    created that arm's run directory, and a raising plugin ended in a traceback."""
    from blocklab.repro import main

    for plugin in PLUGINS:
        monkeypatch.setenv("BLOCKLAB_PLUGINS", f"failing_{plugin}")
        with pytest.raises(SystemExit) as e:
            main(["mqar", "--size", "quick", "--root", str(tmp_path / "repro")])
        err = capfd.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1, (e.value.code, err)
        assert err[0].startswith(f"plugin error: BLOCKLAB_PLUGINS=failing_{plugin}: ")
        assert PLUGINS[plugin][1] in err[0]
        assert not (tmp_path / "repro").exists()


@pytest.mark.slow
@pytest.mark.parametrize("tool, args", [("blocklab-train", ["experiment=smoke"]),
                                        ("blocklab-repro", ["mqar", "--size", "quick"])])
def test_the_console_scripts_report_a_failing_plugin_in_one_line(tool, args, plugin_dir,
                                                                 tmp_path):
    env = {**os.environ, "BLOCKLAB_PLUGINS": "failing_exits_zero",
           "PYTHONPATH": str(plugin_dir)}
    r = subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, timeout=SAFETY_S,
                       env=env, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1 and "sys.exit(0)" in r.stderr
    assert _written(tmp_path) == []


# ------------------------------------------------------------------------- small refusals


def _local(family: str, n_layers: int, global_every: int, n_encoder_layers: int | None = None):
    from blocklab.config import FamilyConfig, MixerConfig, ModelConfig

    return ModelConfig(family=FamilyConfig(name=family, n_encoder_layers=n_encoder_layers),
                       n_layers=n_layers, vocab_size=64, d_model=32, n_heads=4, d_ff=40,
                       max_seq_len=64,
                       mixer=MixerConfig(window=3, global_every=global_every))


def test_global_every_past_every_stack_is_refused_not_silently_all_local():
    """global_every=n makes layers n, 2n, ... global; past the depth of every stack no layer is,
    which global_every: 0 says. An encoder-decoder whose deeper stack still gets a global layer
    is fine (its shallower stack is all local)."""
    from blocklab.config import ConfigError, validate_model

    for ok in (_local("decoder", 4, 4), _local("encoder", 4, 2),
               _local("encoder_decoder", 2, 3, n_encoder_layers=4),
               _local("encoder_decoder", 4, 3, n_encoder_layers=2)):
        assert validate_model(ok) is ok
    for bad, depths in ((_local("decoder", 4, 5), "4 layers (model.n_layers=4)"),
                        (_local("encoder", 2, 3), "2 layers (model.n_layers=2)"),
                        (_local("encoder_decoder", 2, 5, n_encoder_layers=4),
                         "4 layers (model.n_layers=2, model.family.n_encoder_layers=4)")):
        with pytest.raises(ConfigError) as err:
            validate_model(bad)
        assert str(err.value) == (
            f"config error: model.mixer.global_every={bad.mixer.global_every}: no layer "
            f"would be global: must be <= the deepest stack's {depths}; global_every: 0 makes "
            "every layer local")


def test_blocklab_train_refuses_global_every_past_the_layers_before_writing(tmp_path, capfd):
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", f"out_root={tmp_path / 'out'}",
                "model.n_layers=2", "model.mixer.window=3", "model.mixer.global_every=3",
                cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "config error: model.mixer.global_every=3: no layer would be global: must be <= the "
        "deepest stack's 2 layers (model.n_layers=2); global_every: 0 makes every layer local"]
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- storage faults


@pytest.mark.parametrize("how", ["run", "multirun"])
def test_an_output_root_that_is_a_file_is_one_line_and_exit_6(how, tmp_path, capfd):
    """A multirun used to end in Hydra's traceback of its sweep-directory mkdir, exit 2."""
    (tmp_path / "afile").write_text("mine")
    r = run_cli(capfd, "blocklab-train", *(["-m"] if how == "multirun" else []),
                "experiment=smoke", f"out_root={tmp_path / 'afile'}", "probes=none", cwd=tmp_path)
    assert r.returncode == 6, r.stderr[-3000:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("I/O error: ") and line.endswith(
        f": {tmp_path / 'afile'} is a file, not a directory"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("flag", ["--root", "--out"])
def test_blocklab_repro_refuses_a_root_or_out_that_is_a_file_before_training(flag, tmp_path,
                                                                             capfd):
    from blocklab.repro import main

    (tmp_path / "afile").write_text("mine")
    other = [] if flag == "--root" else ["--root", str(tmp_path / "repro")]
    with pytest.raises(SystemExit) as e:
        main(["mqar", "--size", "quick", *other, flag, str(tmp_path / "afile" / "sub")])
    err = capfd.readouterr().err.strip().splitlines()
    assert e.value.code == 6 and err == [
        f"I/O error: {flag} {tmp_path / 'afile' / 'sub'}: {tmp_path / 'afile'} is a file, "
        "not a directory"]
    assert not list((tmp_path / "repro").glob("runs/*"))  # nothing trained


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    """A two-step smoke run with one checkpoint (no probes), trained in process."""
    from blocklab.config import compose
    from blocklab.train.run import train

    out = tmp_path_factory.mktemp("run")
    return train(compose("train", ["experiment=smoke", f"out_root={out}", "trainer.max_steps=2",
                                   "trainer.ckpt_every_steps=2", "trainer.val_every_steps=2",
                                   "probes=none"]))


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def test_disk_full_while_probe_results_are_written_is_one_line_and_exit_6(
        smoke_run, tmp_path, capfd, monkeypatch):
    """ENOSPC once the first CSV is in: one line, exit 6, no temporary folder left, and the
    report an earlier evaluation wrote there byte for byte as it was (before: a traceback,
    exit 1, and the half-written temporary folder left beside the report)."""
    import errno

    from blocklab.eval import report

    out = tmp_path / "eval"
    args = [f"ckpt={smoke_run}", "probes=coarse", f"out={out}"]
    assert run_cli(capfd, "blocklab-eval", *args).returncode == 0
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    before = _tree(folder)
    real = report._csv

    def fills_up(path: Path, rows: list) -> None:
        if path.name == "examples.csv":
            path.write_text("probe,varia")
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, rows)

    monkeypatch.setattr(report, "_csv", fills_up)
    r = run_cli(capfd, "blocklab-eval", *args)
    assert r.returncode == 6, r.stderr[-3000:]
    *progress, line = r.stderr.strip().splitlines()  # the probe grid's progress lines first
    assert line == (f"probe results {folder}: no space left on device; nothing of this report "
                    "was kept (an earlier report there is intact)")
    assert progress and all(p.startswith("probes: coarse") for p in progress), progress
    assert sorted(p.name for p in out.iterdir()) == [folder.name, "val.json"]
    assert _tree(folder) == before


class SimulatedKill(BaseException):
    """Stands in for the process dying: not an error, so nothing cleans up."""


def test_a_kill_between_the_renames_of_a_probe_report_leaves_the_old_one(
        smoke_run, tmp_path, capfd, monkeypatch):
    """Probe reports are written by files.write_dir_atomic: a kill at its ``dir-aside`` point
    (the earlier report moved aside, the new one not yet in) leaves the earlier report whole;
    the next evaluation puts it back first, then replaces it."""
    from blocklab import files

    out = tmp_path / "eval"
    args = [f"ckpt={smoke_run}", "probes=coarse", f"out={out}"]
    assert run_cli(capfd, "blocklab-eval", *args).returncode == 0
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    before = _tree(folder)

    def kill(point: str, n: int) -> None:
        if point == "dir-aside":
            raise SimulatedKill

    monkeypatch.setattr(files, "maybe_fault", kill)
    with pytest.raises(SimulatedKill):
        run_cli(capfd, "blocklab-eval", *args)
    monkeypatch.undo()
    assert not folder.exists()
    assert _tree(out / f".old-{folder.name}-{os.getpid()}") == before
    assert files.recover_leftovers(folder) == [out / f".tmp-{folder.name}-{os.getpid()}"]
    assert _tree(folder) == before


# ---------------------------------------------------------------------------- sweep faults


def test_a_fault_can_name_the_one_sweep_job_it_applies_to(monkeypatch):
    """``#job=N``: the fault fires only in the process running multirun job N (named by
    blocklab.sweep while the job runs), so a sweep test can kill one job and watch the rest."""
    import signal

    from blocklab import faults
    from blocklab.sweep import job_env

    monkeypatch.setenv(faults.ENV, "SIGKILL@step:3#job=1,SIGTERM@save:4")
    monkeypatch.delenv(faults.JOB_ENV, raising=False)
    assert faults.faults() == [(signal.SIGTERM, "save", 4)]  # not in a sweep job
    for job, expected in ((0, []), (1, [(signal.SIGKILL, "step", 3)])):
        with job_env(job):
            assert faults.faults() == [*expected, (signal.SIGTERM, "save", 4)]
    assert faults.JOB_ENV not in os.environ  # restored after the job
    monkeypatch.setenv(faults.ENV, "SIGKILL@step:3#node=1")
    with pytest.raises(ValueError, match="#job=<N>"):
        faults.faults()

"""A run trained on relative data paths, resumed and evaluated from another working directory
(issue 41): the stored paths are read from the directory the run was started in and the resume
is exact; a source found nowhere is refused in one line naming the key, the value, both
directories and the override; the same files named another way are no change."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from data.test_text_runs import corpus
from inprocess import run_cli
from train.test_train_cli import losses

pytestmark = pytest.mark.slow

ARGS = ["data=text_files", "data.files=[corpus]", "data.cache_dir=cache", "tokenizer=byte",
        "data.seq_len=32", "data.batch_size=4", "model=llama_tiny", "model.vocab_size=null",
        "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model/attention=mha",
        "model.d_ff=64", "model.dropout=0.1", "trainer.ckpt_every_steps=2",
        "trainer.val_every_steps=2", "trainer.log_every_steps=1", "trainer.progress_bar=false",
        "probes=none", "checkpoint_probes.enabled=false"]


def test_the_directory_a_run_was_started_in():
    from blocklab.data.relocate import run_origin

    assert run_origin({"run_dir": "runs/x"}, "/srv/proj/runs/x") == Path("/srv/proj")
    assert run_origin({"run_dir": "./runs/x"}, "/srv/proj/other/../runs/x") == \
        Path("/srv/proj")
    assert run_origin({"run_dir": "runs/x", "cwd": "/a"}, "/srv/proj/runs/x") == Path("/a")
    for stored, now in (("runs/x", "/srv/proj/runs/y"), ("/abs/runs/x", "/abs/runs/x"),
                        ("../runs/x", "/srv/runs/x"), (None, "/a/b")):
        assert run_origin({"run_dir": stored}, now) is None, stored


def _train(capfd, cwd: Path, *args: str):
    return run_cli(capfd, "blocklab-train", *args, cwd=cwd)


def test_resume_from_another_directory_reads_the_run_s_own_data(tmp_path, capfd):
    project = tmp_path / "project"
    corpus(project, n_files=8, words=120)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for steps, run in ((2, "runs/r"), (4, "runs/straight")):
        r = _train(capfd, project, *ARGS, f"trainer.max_steps={steps}", f"run_dir={run}")
        assert r.returncode == 0, r.stderr[-3000:]
    r = _train(capfd, elsewhere, f"resume={project / 'runs/r'}", "trainer.max_steps=4")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (f"resume: data.files: 'corpus' is not in {elsewhere}; read from the directory the "
            f"run was started in: {project / 'corpus'}") in r.stderr.splitlines()
    assert "no longer exactly" not in r.stderr and "data error" not in r.stderr
    assert losses(project / "runs/r") == losses(project / "runs/straight")  # exact
    assert not (elsewhere / "cache").exists()  # the run's own prepared corpus, reused

    # evaluated on its own data from there (the step-2 checkpoint stores the relative path)
    first = project / "runs/r/checkpoints/step-000002"
    r = run_cli(capfd, "blocklab-eval", f"ckpt={first}", "run_data=true", "probes=none",
                f"out={tmp_path / 'eval'}", cwd=elsewhere)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "val/loss" in r.stdout and "read from the directory the run was started in" in \
        r.stdout + r.stderr


def test_a_source_found_nowhere_is_refused_naming_the_override(tmp_path, capfd):
    project = tmp_path / "project"
    corpus(project, n_files=8, words=120)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = _train(capfd, project, *ARGS, "trainer.max_steps=2", "run_dir=runs/r")
    assert r.returncode == 0, r.stderr[-3000:]
    shutil.move(project / "corpus", tmp_path / "moved")
    r = _train(capfd, elsewhere, f"resume={project / 'runs/r'}", "trainer.max_steps=4")
    assert r.returncode == 3, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == (
        f"data error: resume: data.files=[corpus]: 'corpus' is relative and not found from "
        f"{elsewhere} (the current directory), nor from {project}, where the run was started; "
        "name where it is now: data.files=[/path/to/corpus]")
    # the same files named by their place now: no change (but a moved corpus is other data:
    # the stat fingerprint reads paths), so put it back and name it absolutely
    shutil.move(tmp_path / "moved", project / "corpus")
    r = _train(capfd, elsewhere, f"resume={project / 'runs/r'}", "trainer.max_steps=4",
               f"data.files=[{project / 'corpus'}]", f"data.cache_dir={project / 'cache'}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "no longer exactly" not in r.stderr
    assert "resume: data.files changed ['corpus'] -> " in r.stderr and "the same data" in r.stderr


def test_a_missing_relative_source_names_the_directory_it_was_looked_for_in(tmp_path,
                                                                           monkeypatch):
    from blocklab.config import DataConfig, DataName
    from blocklab.data.sources import resolve_files
    from blocklab.errors import DataError

    monkeypatch.chdir(tmp_path)
    for entry, words in (("nope.txt", "no such file or directory"),
                         ("docs/*.md", "the pattern matches no file")):
        with pytest.raises(DataError) as e:
            resolve_files(DataConfig(name=DataName.text, files=[entry]))
        assert str(e.value) == f"data error: data.files: {entry}: {words} (relative to {tmp_path})"

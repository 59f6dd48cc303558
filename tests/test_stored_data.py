"""A checkpoint from someone else is only data (docs/reliability.md, "Integrity and security").

Every crafted checkpoint is built here: a tiny run trained in process, then its state edited and
written again with ``write_checkpoint`` (every copy agreeing, the manifest re-hashed), or one of
its files edited and only its manifest entry re-hashed. None of them may make blocklab resolve
an interpolation, open a path it names, write where it says, or run something other than what
a user reads; evaluating a run still training takes its newest complete checkpoint."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from blocklab import checkpoint as ckpt
from blocklab.config import compose
from blocklab.train.run import train
from data.test_text_runs import corpus, text_args
from inprocess import SAFETY_S, run_cli
from train.test_train_cli import BIN, losses

pytestmark = pytest.mark.slow

SECRET = "hunter2-must-never-be-printed"
SMOKE = ["experiment=smoke", "trainer.log_every_steps=1", "model.dropout=0.1",
         "trainer.progress_bar=false", "probes=none", "checkpoint_probes.enabled=false"]


def trained(run: Path, *args: str) -> Path:
    train(compose("train", [*args, f"run_dir={run}"]))
    return run


def craft(src: Path, run: Path, edit=None) -> Path:
    """``src``'s newest checkpoint as ``run``'s only checkpoint, with ``edit(meta)`` applied to
    the metadata inside ``state.pt`` and every readable copy written to agree with it."""
    newest = ckpt.list_checkpoints(src)[-1]
    state = torch.load(newest / ckpt.STATE, weights_only=True)
    if edit is not None:
        edit(state["blocklab"])
    state["blocklab"]["config_yaml"] = yaml.safe_dump(state["blocklab"]["config"],
                                                      sort_keys=False)
    return ckpt.write_checkpoint(run / "checkpoints" / newest.name, state)


def rehash(path: Path) -> None:
    """Re-hash a checkpoint's manifest after one of its files was edited in place."""
    manifest = json.loads((path / ckpt.MANIFEST).read_text())
    for name in manifest["files"]:
        data = (path / name).read_bytes()
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (path / ckpt.MANIFEST).write_text(json.dumps(manifest))


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def logged_val(run: Path) -> float:
    return [float(r["val/loss"]) for f in sorted((run / "logs").glob("*/metrics.csv"))
            for r in csv.DictReader(f.open()) if r.get("val/loss")][-1]


def eval_loss(r) -> float:
    return float(r.stdout.split("val/loss ")[1].split()[0])


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """A 4-step synthetic run: checkpoints 2 and 4."""
    return trained(tmp_path_factory.mktemp("synthetic") / "run", *SMOKE, "trainer.max_steps=4",
                   "trainer.ckpt_every_steps=2", "trainer.val_every_steps=4")


# ------------------------------------------------------- 1. a stored config is never resolved


def _interpolate_data_files(meta: dict) -> None:  # old code echoed the variable's value
    meta["config"]["data"].update(name="text", files=["${oc.env:SOME_SECRET}"])
    meta["config"]["tokenizer"]["name"] = "byte"


@pytest.mark.parametrize("where", ["state.pt", "config.yaml", "meta.json"])
def test_an_interpolation_in_a_stored_config_is_refused_never_resolved(synthetic, tmp_path,
                                                                      capfd, where):
    run = tmp_path / "crafted"
    path = craft(synthetic, run, _interpolate_data_files if where == "state.pt" else None)
    if where == "config.yaml":
        text = (path / ckpt.CONFIG).read_text()
        (path / ckpt.CONFIG).write_text(text.replace("experiment_name: smoke",
                                                     "experiment_name: ${oc.env:SOME_SECRET}"))
    elif where == "meta.json":
        meta = json.loads((path / ckpt.META).read_text())
        meta["config"]["experiment_name"] = "${oc.env:SOME_SECRET}"
        (path / ckpt.META).write_text(json.dumps(meta))
    rehash(path)
    r = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none", f"out={tmp_path / 'out'}",
                env={"SOME_SECRET": SECRET})
    assert r.returncode == 4, r.stderr[-2000:]
    key = "config.data.files[0]" if where == "state.pt" else "config.experiment_name"
    assert r.stderr.strip().splitlines() == [
        f"checkpoint {path}: {'' if where == 'state.pt' else where + ': '}{key}="
        "'${oc.env:SOME_SECRET}': an interpolation in a stored config; a stored config is data, "
        "never resolved or instantiated (refused: was it edited?)"]
    assert SECRET not in r.stdout + r.stderr
    assert files_under(tmp_path / "out") == []


def test_a_target_anywhere_in_a_stored_config_is_refused(synthetic, tmp_path, capfd):
    run = tmp_path / "crafted"
    path = craft(synthetic, run, lambda m: m["config"]["optim"].update(_target_="os.system"))
    r = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none", f"out={tmp_path / 'out'}")
    assert r.returncode == 4, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        f"checkpoint {path}: config.optim._target_: '_target_' (an instantiation) in a stored "
        "config; a stored config is data, never resolved or instantiated (refused: was it "
        "edited?)"]
    with pytest.raises(ckpt.CheckpointError, match="_target_"):
        ckpt.load_model(run)


@pytest.mark.parametrize("command", ["init_from", "resume"])
def test_training_from_a_crafted_checkpoint_never_resolves_its_config(synthetic, tmp_path, capfd,
                                                                    command):
    run = tmp_path / "crafted"
    path = craft(synthetic, run, lambda m: m["config"]["model"].update(
        vocab_size="${oc.env:SOME_SECRET}"))
    target = [f"init_from={run}", f"run_dir={tmp_path / 'new'}"] if command == "init_from" \
        else [f"resume={run}"]
    r = run_cli(capfd, "blocklab-train", *SMOKE, "trainer.max_steps=4", *target,
                env={"SOME_SECRET": SECRET})
    assert r.returncode == 4, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"checkpoint {path}: config.model.vocab_size='${{oc.env:SOME_SECRET}}': an "
        "interpolation in a stored config")
    assert SECRET not in r.stdout + r.stderr
    assert not (tmp_path / "new").exists()


# -------------------------------------------- 5. what a user reads is what runs, or refused


@pytest.mark.parametrize(("edit", "named"), [
    ("config.yaml", "config.yaml disagrees with the config in state.pt (the one that runs) at "
                    "1 key(s): data.seed: 99 in config.yaml, 1234 in state.pt"),
    ("meta.json config", "meta.json disagrees with the config in state.pt (the one that runs) "
                         "at 1 key(s): data.seed: 99 in meta.json, 1234 in state.pt"),
    ("meta.json step", "meta.json disagrees with state.pt at step"),
    ("tokenizer.json", "tokenizer.json differs from the tokenizer in state.pt"),
])
def test_an_edited_readable_copy_is_refused_naming_what_differs(synthetic, tmp_path, capfd,
                                                                edit, named):
    run = tmp_path / "edited"
    shutil.copytree(synthetic, run)
    path = ckpt.list_checkpoints(run)[-1]
    if edit == "config.yaml":
        text = (path / ckpt.CONFIG).read_text()
        assert "  seed: 1234\n" in text
        (path / ckpt.CONFIG).write_text(text.replace("  seed: 1234\n", "  seed: 99\n", 1))
    elif edit.startswith("meta.json"):
        meta = json.loads((path / ckpt.META).read_text())
        if edit.endswith("config"):
            meta["config"]["data"]["seed"] = 99
        else:
            meta["step"] = 400
        (path / ckpt.META).write_text(json.dumps(meta))
    else:
        (path / ckpt.TOKENIZER).write_text((path / ckpt.TOKENIZER).read_text().replace(
            '"n_keys": 64', '"n_keys": 65'))
    rehash(path)
    r = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none", f"out={tmp_path / 'out'}")
    assert r.returncode == 4, r.stderr[-2000:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"checkpoint {path}: {named}"), line
    assert "(refused: edited after it was saved?)" in line


# --------------------------------------------- one command reads its checkpoint exactly once


def test_one_evaluation_resolves_verifies_and_loads_its_checkpoint_once(synthetic, tmp_path,
                                                                       capfd, checkpoint_reads):
    r = run_cli(capfd, "blocklab-eval", f"ckpt={synthetic}", "probes=coarse",
                "probes.needle.n=2", f"out={tmp_path / 'out'}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "val/loss" in r.stdout and "probe results" in r.stdout
    assert checkpoint_reads == {"verify": ["step-000004"], "torch.load": 1}


@pytest.mark.parametrize("steps", [6, 4], ids=["on", "already-at-max-steps"])
def test_one_resume_resolves_verifies_and_loads_its_checkpoint_once(synthetic, tmp_path, capfd,
                                                                   checkpoint_reads, steps):
    """The state read (config, fingerprints) is the one handed to Lightning, not read again;
    neither the checkpoint the resumed run writes nor the resumed one is verified back."""
    run = tmp_path / "run"
    shutil.copytree(synthetic, run)
    r = run_cli(capfd, "blocklab-train", *SMOKE, f"trainer.max_steps={steps}",
                "trainer.ckpt_every_steps=2", "trainer.val_every_steps=4", f"resume={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run / "config.resume-000004.yaml").is_file()
    assert ckpt.list_checkpoints(run)[-1].name == f"step-{steps:06d}"
    assert checkpoint_reads == {"verify": ["step-000004"], "torch.load": 1}


def test_one_generation_resolves_verifies_and_loads_its_checkpoint_once(synthetic, capfd,
                                                                       checkpoint_reads):
    r = run_cli(capfd, "blocklab-generate", f"ckpt={synthetic}", "prompt=bos k3 v5 sep k3",
                "max_new_tokens=2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert checkpoint_reads == {"verify": ["step-000004"], "torch.load": 1}


# ---------------------------------------- 6. a save killed between its renames, then resume


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """12 steps with dropout, checkpoints 4, 8 and 12."""
    return trained(tmp_path_factory.mktemp("straight") / "run", *SMOKE, "trainer.max_steps=12",
                   "trainer.ckpt_every_steps=4", "trainer.val_every_steps=4")


def _killed_between_renames(straight: Path, run: Path, step: int) -> None:
    """``run`` as a copy of ``straight`` killed while re-saving ``step``: its checkpoint moved
    aside to ``.old-step-N-<pid>`` and the new copy half-written; nothing newer on disk."""
    shutil.copytree(straight, run)
    ckdir = run / "checkpoints"
    for p in ckpt.list_checkpoints(run):
        if int(p.name.removeprefix("step-")) > step:
            shutil.rmtree(p)
    (ckdir / f"step-{step:06d}").rename(ckdir / f".old-step-{step:06d}-4242")
    (ckdir / f".tmp-step-{step:06d}-4242").mkdir()
    (ckdir / f".tmp-step-{step:06d}-4242" / ckpt.STATE).write_bytes(b"half")


@pytest.mark.parametrize("step", [4, 8], ids=["the-only-checkpoint", "the-newest-checkpoint"])
def test_resume_after_a_kill_between_renames_restores_the_newest_state_first(
        straight, tmp_path, capfd, step):
    run = tmp_path / "run"
    _killed_between_renames(straight, run, step)
    r = run_cli(capfd, "blocklab-train", *SMOKE, "trainer.max_steps=12",
                "trainer.ckpt_every_steps=4", "trainer.val_every_steps=4", f"resume={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run / f"config.resume-{step:06d}.yaml").is_file()  # resumed from the restored one
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    assert losses(run) == losses(straight) and len(losses(run)) == 12


def test_evaluation_reads_a_moved_aside_newest_checkpoint_where_it_is(straight, tmp_path, capfd):
    run = tmp_path / "run"
    _killed_between_renames(straight, run, 8)
    before = files_under(run)
    r = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none", f"out={tmp_path / 'out'}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "(step 8)" in r.stdout and ".old-step-000008-4242" in r.stdout
    assert files_under(run) == before  # a reader renames nothing
    assert json.loads((tmp_path / "out" / "val.json").read_text())["step"] == 8


# ------------------------------------------------- 7. evaluating a run that is still training


def test_evaluating_a_run_still_training_survives_its_checkpoint_being_pruned(tmp_path, capfd,
                                                                            monkeypatch):
    """A real training (keep_checkpoints=1) stops itself right after writing checkpoint 4
    (checkpoint 2 not yet pruned); the evaluation chooses and verifies checkpoint 4, and only
    then does the training go on to its end — pruning 2, then 4 once it has saved 6."""
    run = tmp_path / "run"
    args = [*SMOKE, "trainer.max_steps=6", "trainer.ckpt_every_steps=2",
            "trainer.val_every_steps=100", "trainer.keep_checkpoints=1", f"run_dir={run}"]
    trainer = subprocess.Popen([str(BIN / "blocklab-train"), *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "BLOCKLAB_FAULT": "SIGSTOP@save:4"})
    try:
        _, status = os.waitpid(trainer.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), status
        assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-000002", "step-000004"]
        real_verify = ckpt.verify

        def verify_then_let_training_finish(path, **kw):
            manifest = real_verify(path, **kw)
            if trainer.returncode is None:
                os.kill(trainer.pid, signal.SIGCONT)
                trainer.communicate(timeout=SAFETY_S)
            return manifest

        monkeypatch.setattr(ckpt, "verify", verify_then_let_training_finish)
        r = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none",
                    f"out={tmp_path / 'out'}")
    finally:
        if trainer.returncode is None:  # (the evaluation never verified anything)
            with contextlib.suppress(ProcessLookupError):
                os.kill(trainer.pid, signal.SIGCONT)
            trainer.communicate(timeout=SAFETY_S)
    assert trainer.returncode == 0
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-000006"]  # 4 is gone
    assert r.returncode == 0, r.stderr[-2000:]
    assert "(step 4): val/loss" in r.stdout  # what it verified is what it read
    assert json.loads((tmp_path / "out" / "val.json").read_text())["step"] == 4


def test_a_checkpoint_vanishing_after_it_was_chosen_is_chosen_again(synthetic, tmp_path,
                                                                    monkeypatch):
    """The reader has chosen the newest checkpoint and not yet opened it (the ``read`` fault
    point) when it disappears: it takes the newest complete one left, with no warning."""
    run = tmp_path / "run"
    shutil.copytree(synthetic, run)

    def pruned(point: str, step: int) -> None:
        if (point, step) == ("read", 4):
            shutil.rmtree(run / "checkpoints" / "step-000004")

    monkeypatch.setattr(ckpt, "maybe_fault", pruned)
    with warnings_as_errors():
        loaded = ckpt.read(run)
    assert loaded.path == run / "checkpoints" / "step-000002" and loaded.meta["step"] == 2


def test_a_reader_during_a_resave_takes_the_copy_moved_aside(synthetic, tmp_path, monkeypatch):
    """Between the two renames of a re-save (the ``aside`` fault point) the step's directory
    is missing: a reader takes the moved-aside copy, where it is, and renames nothing."""
    run = tmp_path / "run"
    shutil.copytree(synthetic, run)
    target = run / "checkpoints" / "step-000004"
    state = ckpt.load(target)
    seen = []

    def read_now(point: str, step: int) -> None:
        if (point, step) == ("aside", 4):
            assert not target.exists()
            loaded = ckpt.read(run)
            seen.append((loaded.path.name, loaded.name, loaded.meta["step"]))

    monkeypatch.setattr(ckpt, "maybe_fault", read_now)
    ckpt.write_checkpoint(target, state)
    assert seen == [(f".old-step-000004-{os.getpid()}", "step-000004", 4)]
    assert ckpt.is_valid(target)
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


@contextlib.contextmanager
def warnings_as_errors():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# ------------------------------ 2-4. a text run: its tokenizer, its sources, and their changes


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """(run, corpus, its arguments): a BPE run on 40 small files."""
    tmp = tmp_path_factory.mktemp("text")
    data = corpus(tmp)
    changed = {"tokenizer": "bpe", "trainer.max_steps": "4", "trainer.ckpt_every_steps": "4",
               "trainer.val_every_steps": "4"}
    args = [a for a in text_args(tmp, data) if a.split("=")[0] not in changed]
    args += [f"{k}={v}" for k, v in changed.items()] + ["tokenizer.vocab_size=300",
                                                        "data.num_proc=1"]
    return trained(tmp / "run", *args), data, args


def _trap_tokenizer(tmp_path: Path) -> Path:
    """A valid tokenizer the run never used (the old code tokenized with whatever the stored
    path named)."""
    from blocklab.data.tokenizer import byte_tokenizer

    d = tmp_path / "trap"
    d.mkdir()
    byte_tokenizer().save(str(d / "tokenizer.json"))
    return d


def test_a_text_run_is_not_evaluated_on_files_only_its_checkpoint_names(text, tmp_path, capfd):
    run, _, _ = text
    crafted = tmp_path / "crafted"
    craft(run, crafted, lambda m: m["config"]["data"].update(
        files=[str(tmp_path / "chosen-by-the-checkpoint")], cache_dir=str(tmp_path / "cache")))
    r = run_cli(capfd, "blocklab-eval", f"ckpt={crafted}", "probes=none",
                f"out={tmp_path / 'out'}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines() == [
        f"checkpoint {ckpt.list_checkpoints(crafted)[-1]}: validation loss skipped: the run "
        f"trained on text (data.files=[{tmp_path / 'chosen-by-the-checkpoint'}]) that only the "
        "checkpoint names; to read and evaluate on it pass run_data=true"]
    assert not (tmp_path / "cache").exists() and files_under(tmp_path / "out") == []
    r = run_cli(capfd, "blocklab-eval", f"ckpt={crafted}", "probes=none", "run_data=false",
                f"out={tmp_path / 'out'}")
    assert r.returncode == 0 and "validation loss skipped (run_data=false)" in r.stdout
    r = run_cli(capfd, "blocklab-eval", f"ckpt={crafted}", "probes=none", "run_data=true",
                f"out={tmp_path / 'out'}")  # asked for: the source is gone, in one line
    assert r.returncode == 3, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        "data error: run_data=true: the run's sources changed since checkpoint "
        f"{ckpt.list_checkpoints(crafted)[-1]} was saved (data.files: "
        f"{tmp_path / 'chosen-by-the-checkpoint'}: no such file or directory); its loss on "
        "them would not be the run's — restore the sources as they were to evaluate on the "
        "run's data"]
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("stored_path", ["another tokenizer", "../../../../etc/passwd"])
def test_run_data_uses_the_checkpoints_own_tokenizer_and_caches_only_under_out(
        text, tmp_path, capfd, monkeypatch, stored_path):
    run, data, _ = text
    trap = str(_trap_tokenizer(tmp_path)) if stored_path == "another tokenizer" else stored_path
    crafted = tmp_path / "crafted"
    craft(run, crafted, lambda m: (m["config"]["tokenizer"].update(name="file", path=trap),
                                   m["config"]["data"].update(cache_dir=str(tmp_path / "chosen"))))
    import blocklab.data.prepare as prepare

    opened = []
    real = prepare.load_user_tokenizer
    monkeypatch.setattr(prepare, "load_user_tokenizer",
                        lambda path: opened.append(str(path)) or real(path))
    out = tmp_path / "out"
    r = run_cli(capfd, "blocklab-eval", f"ckpt={crafted}", "probes=none", "run_data=true",
                f"out={out}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert eval_loss(r) == pytest.approx(logged_val(run), rel=1e-5)  # the run's own loss
    assert trap not in opened and all(p.startswith(str(out / "data-cache")) for p in opened)
    assert not (tmp_path / "chosen").exists()
    assert {p.name for p in out.iterdir()} == {"data-cache", "val.json"}
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("run data: ")]
    assert f"data.files=[{data}]" in line and "(40 files, prepared under" in line


@contextlib.contextmanager
def changed_corpus(data: Path, how: str):
    """Change the shared corpus one way, and put it back exactly (content and mtime)."""
    victim = data / "doc001.txt"
    saved, st = victim.read_bytes(), victim.stat()
    try:
        if how == "changed":
            victim.write_bytes(saved + b"one more line.\n")
        elif how == "added":
            (data / "doc999.txt").write_text("a new file.\n")
        else:
            victim.unlink()
        yield victim if how != "added" else data / "doc999.txt"
    finally:
        (data / "doc999.txt").unlink(missing_ok=True)
        victim.write_bytes(saved)
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("how", ["changed", "added", "removed", "unlisted"])
def test_run_data_refuses_sources_that_changed_since_the_run(text, tmp_path, capfd, how):
    run, data, args = text
    target = run
    if how == "unlisted":  # a checkpoint that lists no files: the fingerprint tells
        target = tmp_path / "crafted"
        craft(run, target, lambda m: m.pop("data_sources"))
    with changed_corpus(data, "changed" if how == "unlisted" else how) as victim:
        r = run_cli(capfd, "blocklab-eval", f"ckpt={target}", "probes=none", "run_data=true",
                    f"out={tmp_path / 'out'}")
        again = run_cli(capfd, "blocklab-train", *args, f"resume={run}")
    assert r.returncode == 3, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("data error: run_data=true: the run's sources changed since "
                           f"checkpoint {ckpt.list_checkpoints(target)[-1]} was saved (")
    assert line.endswith("restore the sources as they were to evaluate on the run's data")
    if how == "unlisted":
        assert "data fingerprint " in line
    else:
        assert f"{how} {victim.resolve()}" in line
        assert not (tmp_path / "out" / "data-cache").exists()  # refused before preparing
        assert again.returncode == 4 and f"{how} {victim.resolve()}" in again.stderr
    assert "val/loss" not in r.stdout

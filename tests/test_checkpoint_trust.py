"""A checkpoint from someone else is only data, down to the kind of its files
(docs/reliability.md, "Checkpoints from others, nonsense values"): a file of a checkpoint
that is a symbolic link (to a file outside it, with the very bytes the manifest hashes), a
FIFO or a directory is refused in one line naming it, exit 4, before it is opened — wherever
a checkpoint is read (``blocklab-eval``, ``resume=``, ``init_from=``, ``blocklab-generate``,
``blocklab-export``: all through ``checkpoint.read``'s manifest verification). And the check
that an output folder is writable leaves nothing behind when it fails."""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import subprocess
from pathlib import Path

import pytest

from blocklab import checkpoint as ckpt
from blocklab.config import compose
from blocklab.train.run import train
from data.test_text_runs import corpus
from inprocess import SAFETY_S, run_cli
from train.test_train_cli import BIN

pytestmark = pytest.mark.slow

RULE = ("a checkpoint's files are regular files inside it, never links, pipes or devices "
        "(refused)")
TRAIN = ["data=text_files", "tokenizer=byte", "data.seq_len=16", "data.batch_size=4",
         "model=gpt2_tiny", "model.vocab_size=null", "model.n_layers=1", "model.d_model=16",
         "model.n_heads=2", "model.d_ff=32", "model.max_seq_len=16", "trainer.max_steps=4",
         "trainer.ckpt_every_steps=2", "trainer.val_every_steps=4", "trainer.progress_bar=false",
         "probes=none", "checkpoint_probes.enabled=false"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A 4-step text run (byte tokenizer, 1 layer): checkpoints 2 and 4; and its data keys."""
    root = tmp_path_factory.mktemp("trust")
    data = [f"data.files=[{corpus(root, n_files=8, words=120)}]",
            f"data.cache_dir={root / 'cache'}"]
    train(compose("train", [*TRAIN, *data, f"run_dir={root / 'run'}"]))
    return root / "run", data


def linked_out(src: Path, tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A copy of run ``src`` whose newest checkpoint's ``name`` is a symbolic link to a file
    outside the checkpoint holding the very bytes the manifest hashes (so only the link itself
    is wrong): (the copy, the checkpoint)."""
    copy = tmp_path / "shared"
    shutil.copytree(src, copy)
    path = ckpt.list_checkpoints(copy)[-1]
    outside = tmp_path / f"outside-{name}"
    shutil.move(path / name, outside)
    os.symlink(outside, path / name)
    return copy, path


def command(which: str, run_dir: Path, path: Path, tmp_path: Path, data: list[str]
            ) -> tuple[str, list[str]]:
    """(tool, arguments) reading checkpoint ``path`` (of run ``run_dir``) as ``which`` does."""
    return {
        "eval": ("blocklab-eval", [f"ckpt={path}", "probes=none", f"out={tmp_path / 'out'}"]),
        "eval-run": ("blocklab-eval", [f"ckpt={run_dir}", "probes=none",
                                       f"out={tmp_path / 'out'}"]),
        "resume": ("blocklab-train", [f"resume={run_dir}"]),
        "init_from": ("blocklab-train", [*(a for a in TRAIN if not a.startswith("model")),
                                         *data, f"init_from={path}",
                                         f"run_dir={tmp_path / 'new'}"]),
        "generate": ("blocklab-generate", [f"ckpt={path}", "prompt=the king",
                                           "max_new_tokens=2"]),
        "export": ("blocklab-export", [f"ckpt={path}", f"out={tmp_path / 'hf'}"]),
    }[which]


@pytest.mark.parametrize(("which", "name"), [
    ("eval", ckpt.TOKENIZER), ("eval", ckpt.STATE), ("eval", ckpt.MANIFEST),
    ("eval-run", ckpt.TOKENIZER), ("resume", ckpt.TOKENIZER), ("init_from", ckpt.TOKENIZER),
    ("generate", ckpt.TOKENIZER), ("export", ckpt.CONFIG)])
def test_a_checkpoint_file_linked_out_of_it_is_refused_wherever_it_is_read(
        run, tmp_path, capfd, which, name):
    """The link's target holds exactly the bytes the manifest hashes: it was followed, opened
    and trusted (exit 0). A run directory's newest checkpoint so linked is refused too, never
    skipped for an older one (``eval-run``, ``resume``)."""
    copy, path = linked_out(run[0], tmp_path, name)
    before = sorted(p.name for p in copy.rglob("*"))
    tool, args = command(which, copy, path, tmp_path, run[1])
    r = run_cli(capfd, tool, *args)
    assert r.returncode == 4, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == (
        f"checkpoint {path}: {name} is a symbolic link to {tmp_path / f'outside-{name}'}; "
        f"{RULE}"), r.stderr[-3000:]
    assert sorted(p.name for p in copy.rglob("*")) == before  # resume wrote nothing either
    for made in ("out", "new", "hf"):
        assert not (tmp_path / made).exists() or not any((tmp_path / made).iterdir())


@pytest.mark.parametrize("name", [ckpt.TOKENIZER, ckpt.MANIFEST])
def test_a_checkpoint_file_that_is_a_fifo_is_refused_without_being_opened(run, tmp_path, name):
    """``open()`` of a FIFO blocks until a writer comes: manifest verification hung for ever.
    A subprocess (its timeout only a safety net against that hang): the refusal comes from the
    file's type, before it is opened."""
    copy = tmp_path / "piped"
    shutil.copytree(run[0], copy)
    path = ckpt.list_checkpoints(copy)[-1]
    (path / name).unlink()
    os.mkfifo(path / name)
    r = subprocess.run([str(BIN / "blocklab-eval"), f"ckpt={path}", "probes=none",
                        f"out={tmp_path / 'out'}"], capture_output=True, text=True,
                       timeout=SAFETY_S)
    assert r.returncode == 4, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [
        f"checkpoint {path}: {name} is a FIFO (named pipe); {RULE}"]


def test_a_directory_or_a_resized_file_is_refused_before_it_is_read(run, tmp_path, capfd):
    """A directory in a file's place is named as such; a file whose size differs from the
    manifest's is refused from its size (a grown ``state.pt`` is never hashed)."""
    copy = tmp_path / "odd"
    shutil.copytree(run[0], copy)
    path = ckpt.list_checkpoints(copy)[-1]
    (path / ckpt.TOKENIZER).unlink()
    (path / ckpt.TOKENIZER).mkdir()
    r = run_cli(capfd, "blocklab-eval", f"ckpt={path}", "probes=none", f"out={tmp_path / 'o'}")
    assert r.returncode == 4
    assert r.stderr.strip().splitlines() == [
        f"checkpoint {path}: {ckpt.TOKENIZER} is a directory; {RULE}"]
    size = (path / ckpt.STATE).stat().st_size
    with open(path / ckpt.STATE, "ab") as f:
        f.write(b"\0" * 7)
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.verify(path)
    assert str(e.value) == (f"checkpoint {path}: {ckpt.STATE} sha256 mismatch (corrupted: "
                            f"{size + 7:,} bytes where the manifest says {size:,})")


# ------------------------------------------------------------ the write check of an output


@pytest.mark.parametrize("existed", [False, True], ids=["new-out", "existing-out"])
def test_a_failed_write_check_of_out_leaves_nothing_behind(tmp_path, capfd, monkeypatch,
                                                          existed):
    """``blocklab-eval out=`` on a full disk: the write test file is created, its write fails
    with ENOSPC (injected: the same ``write_text`` the check calls raises once the file is
    there). Exit 6, one line, and no ``.write-test-<pid>`` left; the folders the check made
    are removed, one that existed is kept (empty, as it was)."""
    out = tmp_path / "a" / "b" / "out"
    if existed:
        out.mkdir(parents=True)
    real = pathlib.Path.write_text

    def full(self, data, *args, **kwargs):
        if not self.name.startswith(".write-test-"):
            return real(self, data, *args, **kwargs)
        self.touch()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    r = run_cli(capfd, "blocklab-eval", f"ckpt={tmp_path / 'no-run'}", "probes=none",
                f"out={out}")
    assert r.returncode == 6, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [
        f"I/O error: out= {out}: not writable (No space left on device)"]
    if existed:
        assert out.is_dir() and list(out.iterdir()) == []
    else:
        assert list(tmp_path.iterdir()) == []

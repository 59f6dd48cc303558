"""Segment-ordered training end to end (``data.segment_mode``): a ``stream`` run carries every
layer's state from one training batch to the next and resumes mid-document bit-exactly (the
carried state is in the checkpoint; a resume without it is caught), and ``blocklab-eval``
reads the validation lanes the way training validated (the run's logged ``val/loss``); a
``split`` run trains on whole synthetic documents read segment by segment. The commands run
in process (tests/inprocess.py) at a tiny size."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from inprocess import run_cli
from train.test_train_cli import losses

WORDS = ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with",
         "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but",
         "have", "an", "they", "you", "were", "her", "she", "there", "been", "one", "all", "we"]


def _corpus(root: Path, n_docs: int = 6, words: int = 900) -> Path:
    """Documents of pseudo-text, one per file (a lane crosses document boundaries)."""
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n_docs):
        (root / f"doc{i}.txt").write_text(" ".join(rng.choices(WORDS, k=words)) + ".\n")
    return root


def _stream_args(corpus: Path) -> list[str]:
    return ["experiment=smoke", "data=text_files", f"data.files=[{corpus}]", "tokenizer=byte",
            "data.segment_mode=stream", "data.seq_len=16", "data.batch_size=4",
            "data.val_batches=3", "data.val_fraction=0.2", "trainer.bptt=2",
            "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_layers=2",
            "model/position=rope", "model/mixer=ssm", "model.mixer.chunk=8",
            "'model.mixer.pattern=[ssm,softmax]'", "+model.mixer.window=8",
            "trainer.max_steps=6", "trainer.ckpt_every_steps=3", "trainer.val_every_steps=3",
            "trainer.log_every_steps=1", "probes=none", "probes@checkpoint_probes=none"]


def _args(args: list[str]) -> list[str]:
    return [a.strip("'") for a in args]


@pytest.mark.slow
def test_a_stream_run_resumes_mid_document_exactly_and_evaluates_as_it_validated(
        tmp_path, capfd, monkeypatch):
    args = _args(_stream_args(_corpus(tmp_path / "corpus")))
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", *args, f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    straight = losses(run)
    assert sorted(straight) == [1, 2, 3, 4, 5, 6]
    # the checkpoint holds the carried state (the SSM's state and the window's keys)
    from blocklab import checkpoint as ckpt

    meta = ckpt.read(run / "checkpoints" / "step-000003").meta
    assert meta["carry"], "a stream run's checkpoint saves its carry"

    def resumed(name: str) -> dict[int, str]:
        cut = tmp_path / name
        shutil.copytree(run, cut)
        shutil.rmtree(cut / "checkpoints" / "step-000006")
        shutil.rmtree(cut / "logs")
        r = run_cli(capfd, "blocklab-train", *args, f"resume={cut}")
        assert r.returncode == 0, r.stderr[-3000:]
        return {s: v for s, v in losses(cut).items() if s > 3}

    after = {s: v for s, v in straight.items() if s > 3}
    assert resumed("cut") == after  # bit-exact: the logged strings are equal
    # control: a resume that loses the carry starts step 4 from an empty state: caught
    from blocklab.train.module import LitModel

    load = LitModel.on_load_checkpoint

    def forgetful(self, checkpoint):
        checkpoint["blocklab"].pop("carry", None)
        load(self, checkpoint)

    monkeypatch.setattr(LitModel, "on_load_checkpoint", forgetful)
    with pytest.raises(AssertionError):
        assert resumed("forgot") == after
    monkeypatch.undo()
    # blocklab-eval reads the validation lanes with one carry per pass, as training did
    out = tmp_path / "eval"
    e = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none", "run_data=true",
                f"out={out}")
    assert e.returncode == 0, e.stderr[-3000:]
    logged = json.loads((run / "summary.json").read_text())["metrics"]["val/loss"]
    measured = json.loads((out / "val.json").read_text())["val_loss"]
    assert measured == pytest.approx(logged, rel=1e-5)
    e = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none", "run_data=true",
                "batch_size=2", f"out={tmp_path / 'eval2'}")
    assert e.returncode == 2 and "data.segment_mode=stream" in e.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_split_run_trains_on_whole_documents_read_segment_by_segment(tmp_path, capfd):
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", "data.segment_mode=split",
                "data.seq_len=16", "data.doc_len=48", "trainer.bptt=0", "model.d_model=32",
                "model.n_heads=2", "model.d_ff=64", "model.n_layers=2", "model/position=none",
                "model/mixer=linear", "model.mixer.chunk=8", "trainer.max_steps=4",
                "trainer.val_every_steps=2", "trainer.ckpt_every_steps=2", "probes=none",
                "probes@checkpoint_probes=none", f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    logged = json.loads((run / "summary.json").read_text())["metrics"]["val/loss"]
    out = tmp_path / "eval"
    e = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none", f"out={out}")
    assert e.returncode == 0, e.stderr[-3000:]
    assert json.loads((out / "val.json").read_text())["val_loss"] == pytest.approx(logged,
                                                                                  rel=1e-5)

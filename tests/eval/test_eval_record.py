"""What ``blocklab-eval`` records is what it did (issue 43): ``data.seq_len`` (and every other
reading key) given with another corpus is honoured where the model can read it — said when
beyond the training length, refused naming the position table where it cannot — and recorded
with the result; a data key the evaluation would not read is refused, never silently replaced
by the run's; and every JSON file a run or an evaluation writes is strict JSON (a NaN or inf
written as null and listed under ``non_finite``), which ``jq`` and ``JSON.parse`` read."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from blocklab import checkpoint as ckpt
from data.test_own_data import lines, write
from eval.test_eval_data import _run
from inprocess import run_cli

pytestmark = pytest.mark.slow

PLUGIN = Path(__file__).resolve().parents[2] / "docs" / "examples" / "plugin"


def strict(text: str):
    """``text`` parsed as JSON proper: the bare ``NaN`` / ``Infinity`` tokens Python's json
    writes by default are refused (as ``jq`` and ``JSON.parse`` refuse them)."""
    def refuse(token: str):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two 4-step text runs trained at 32 tokens: learned positions (a table of 64) and rotary
    ones; and a corpus of one long document."""
    tmp = tmp_path_factory.mktemp("runs")
    corpus = write(tmp / "train.txt", "\n".join(lines(200)))
    common = [f"data.files=[{corpus}]", "data.documents=line", "tokenizer=byte"]
    return {"learned": _run(tmp / "learned", *common),
            "rope": _run(tmp / "rope", *common, "model/position=rope"),
            "text": write(tmp / "other.txt", " ".join(lines(60, seed=5)))}


def _eval(capfd, run: Path, out: Path, *args: str):
    return run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none", f"out={out}", *args)


def _result(out: Path) -> dict:
    (file,) = out.glob("data-*.json")
    return strict(file.read_text())


def test_a_longer_sequence_length_is_read_and_said(runs, tmp_path, capfd):
    """Before, ``data.seq_len=256`` was silently replaced by the run's 32."""
    out = tmp_path / "out"
    r = _eval(capfd, runs["rope"], out, f"data.files=[{runs['text']}]", "data.seq_len=256")
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("note: data.seq_len=256 is beyond the run's training length (32): positions past 32 "
            "were never trained") in r.stderr
    assert "eval: reading the corpus with data.seq_len=256 (the command line's) and " \
           "data.packing=False" in r.stderr
    assert "sequences of up to 256 tokens" in r.stderr
    saved = _result(out)
    assert saved["reading"]["seq_len"] == 256 and saved["reading_from_command_line"] == ["seq_len"]
    assert math.isfinite(saved["loss"])
    # the run's own length unless asked: another file, its reading recorded as the run's
    again = _eval(capfd, runs["rope"], tmp_path / "own", f"data.files=[{runs['text']}]")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "beyond the run's training length" not in again.stderr
    own = _result(tmp_path / "own")
    assert own["reading"]["seq_len"] == 32 and own["reading_from_command_line"] == []
    assert own["fingerprint"] != saved["fingerprint"]


def test_a_length_past_a_learned_position_table_is_refused_naming_it(runs, tmp_path, capfd):
    out = tmp_path / "out"
    r = _eval(capfd, runs["learned"], out, f"data.files=[{runs['text']}]", "data.seq_len=4096")
    assert r.returncode == 2, r.stderr[-3000:]
    newest = ckpt.list_checkpoints(runs["learned"])[-1]
    assert r.stderr.strip().splitlines() == [
        f"config error: data.seq_len=4096: checkpoint {newest}'s model has learned positions, a "
        "table of 64 (model.max_seq_len): it reads at most 64 tokens (the run trained at 32)"]
    assert not out.exists() or not list(out.iterdir())
    # within the table, past the training length: read, and said
    r = _eval(capfd, runs["learned"], out, f"data.files=[{runs['text']}]", "data.seq_len=64")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "note: data.seq_len=64 is beyond the run's training length (32)" in r.stderr
    assert _result(out)["reading"]["seq_len"] == 64


@pytest.mark.parametrize(("args", "line"), [
    (["data.val_fraction=0.5"], "config error: data.val_fraction=0.5: not read by blocklab-eval "
                                "data= (it scores every sequence"),
    (["data.batch_size=2", "batch_size=4"], "config error: data.batch_size=2: batch_size=4 is "
                                            "given too; give one"),
    (["data.seq_len=4"], "config error: data.seq_len=4: must be >= 8"),
])
def test_a_data_key_the_evaluation_would_not_honour_is_refused(runs, tmp_path, capfd, args,
                                                               line):
    r = _eval(capfd, runs["rope"], tmp_path / "out", f"data.files=[{runs['text']}]", *args)
    assert r.returncode == 2, r.stderr[-3000:]
    (said,) = r.stderr.strip().splitlines()
    assert said.startswith(line), said


def test_a_data_key_without_a_corpus_is_refused(runs, tmp_path, capfd):
    """Before, ``data.seq_len=4096`` with no corpus was dropped without a word."""
    r = _eval(capfd, runs["rope"], tmp_path / "out", "data.seq_len=4096", "run_data=true")
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [
        "config error: data.seq_len=4096: a data key applies to another corpus (data.files, "
        "data.val_files or data=<option>), and none is named; the run's own validation loss "
        "(run_data) reads the run's data as it was trained"]


def test_the_corpus_batches_follow_data_batch_size_and_val_batches(runs, tmp_path, capfd):
    """Before, ``data.batch_size`` and ``data.val_batches`` were dropped for the run's."""
    out = tmp_path / "out"
    r = _eval(capfd, runs["rope"], out, f"data.files=[{runs['text']}]", "data.batch_size=1",
              "data.val_batches=3")
    assert r.returncode == 0, r.stderr[-3000:]
    assert _result(out)["sequences"] == 3


# ------------------------------------------------------------------------------ strict JSON


def test_a_probe_kinds_nan_is_written_as_strict_json(tmp_path, capfd, monkeypatch):
    """Before, the run's summary.json and the probe report's held a bare ``NaN`` (and
    ``Infinity``), which is not JSON."""
    from blocklab_example.first_value import FirstValue

    real = FirstValue.summary.__func__

    def summary(cls, rows, examples, **kw):
        out = real(cls, rows, examples, **kw)
        out["first"]["pooled"]["accuracy"] = float("nan")
        out["first"]["spread"] = float("inf")
        return out

    monkeypatch.setattr(FirstValue, "summary", classmethod(summary))
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", "--config-dir", str(PLUGIN / "configs"),
                "experiment=smoke", "trainer.max_steps=2", "trainer.val_every_steps=2",
                "trainer.ckpt_every_steps=2", "checkpoint_probes.enabled=false",
                "probes=first_value", "probes.needle.enabled=false", "probes.litm.enabled=false",
                "probes.kinds.first_value.n=2", f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    info = strict((run / "summary.json").read_text())
    first = info["probes"]["first_value"]["first"]
    assert first["pooled"]["accuracy"] is None and first["spread"] is None
    assert info["non_finite"] == {"probes.first_value.first.pooled.accuracy": "nan",
                                  "probes.first_value.first.spread": "inf"}
    (report,) = (run / "probes" / "step-000002").iterdir()
    assert strict((report / "summary.json").read_text())["non_finite"] == {
        "first_value.first.pooled.accuracy": "nan", "first_value.first.spread": "inf"}
    strict((run / "run.json").read_text())


def test_a_nan_validation_loss_is_written_as_strict_json(runs, tmp_path, capfd):
    """A checkpoint whose weights are NaN: its val.json and data-*.json say so in JSON (before:
    a bare ``NaN``)."""
    newest = ckpt.list_checkpoints(runs["rope"])[-1]
    state = torch.load(newest / ckpt.STATE, weights_only=True)
    state["state_dict"] = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                           for k, v in state["state_dict"].items()}
    run = tmp_path / "run"
    ckpt.write_checkpoint(run / "checkpoints" / newest.name, state)
    out = tmp_path / "out"
    r = _eval(capfd, run, out, "run_data=true", f"data.files=[{runs['text']}]")
    assert r.returncode == 0, r.stderr[-3000:]
    saved = strict((out / "val.json").read_text())
    assert saved["val_loss"] is None and saved["non_finite"] == {"val_loss": "nan"}
    corpus = _result(out)
    assert corpus["loss"] is None and corpus["perplexity"] is None
    assert corpus["non_finite"] == {"loss": "nan", "perplexity": "nan"}

"""``blocklab-eval ckpt=<run> data.files=[...]`` (issue 21): the loss and perplexity of a
checkpoint on any corpus, tokenized with the checkpoint's own tokenizer and read at the run's
sequence length, printed in one line with the token count and written with the corpus's
fingerprint in the file name (results on different corpora never overwrite each other) —
checked against the model's mean token NLL over that text computed here; a checkpoint whose
tokenizer cannot tokenize text is refused in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from blocklab.config import compose
from blocklab.train.run import train
from data.test_own_data import direct_nll, documents, lines, pieces, write
from inprocess import run_cli

pytestmark = pytest.mark.slow

LINE = re.compile(r"^checkpoint (?P<ckpt>\S+) \(step 4\) on (?P<data>.+): loss (?P<loss>[\d.]+), "
                  r"perplexity (?P<ppl>[\d.]+) over (?P<tokens>[\d,]+) tokens -> (?P<file>\S+)$")


def _run(tmp: Path, *extra: str) -> Path:
    run = tmp / "run"
    train(compose("train", [
        "experiment=smoke", "data=text_files", "model=gpt2_tiny", "model.n_layers=1",
        "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.max_seq_len=64",
        "data.seq_len=32", "data.batch_size=4", "data.val_batches=2", "data.num_proc=1",
        f"data.cache_dir={tmp / 'cache'}", "trainer.max_steps=4", "trainer.val_every_steps=4",
        "trainer.ckpt_every_steps=4", "probes=none", "checkpoint_probes.enabled=false",
        f"run_dir={run}", *extra]))
    return run


@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("text-run")
    corpus = write(tmp / "train.txt", "\n".join(lines(200)))
    return _run(tmp, f"data.files=[{corpus}]", "data.documents=line", "tokenizer=byte")


def evaluated(r) -> dict:
    """The one line blocklab-eval prints (the run's own loss is not asked for with data=)."""
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = r.stdout.strip().splitlines()
    m = LINE.match(line)
    assert m, line
    return m.groupdict()


def test_the_loss_on_another_corpus_is_the_models_loss_on_that_text(text_run, tmp_path, capfd):
    from blocklab.checkpoint import load_model

    model, tok, _ = load_model(text_run)
    other = lines(9, seed=11)
    f = write(tmp_path / "other.txt", "\n".join(other))
    out = tmp_path / "out"
    r = run_cli(capfd, "blocklab-eval", f"ckpt={text_run}", f"data.files=[{f}]",
                "data.documents=line", "probes=none", f"out={out}")
    got = evaluated(r)
    # never a silent phase: reading the corpus, then its batches counted (b861d22: no output)
    assert f"eval: reading data.files=[{f}] with the checkpoint's tokenizer" in r.stderr
    seqs = pieces(documents(tok, other), 33)  # the run's seq_len + 1
    assert f"eval: loss over {len(seqs)} sequences of up to 32 tokens: batches 0/" in r.stderr
    expected, targets = direct_nll(model, seqs)
    assert float(got["loss"]) == pytest.approx(expected, abs=1e-4)  # printed to 4 decimals
    assert int(got["tokens"].replace(",", "")) == targets
    assert got["data"] == f"data.files=[{f}]"
    saved = json.loads(Path(got["file"]).read_text())
    assert saved["loss"] == pytest.approx(expected, rel=1e-6) and saved["tokens"] == targets
    assert saved["perplexity"] == pytest.approx(2.718281828459045 ** expected, rel=1e-6)
    assert Path(got["file"]).parent == out
    assert Path(got["file"]).name == f"data-{saved['fingerprint']}.json"
    # another corpus: another file beside the first; the same text as data.val_files: the
    # same corpus, the same result
    g = write(tmp_path / "third.txt", "\n".join(lines(5, seed=12)))
    third = evaluated(run_cli(capfd, "blocklab-eval", f"ckpt={text_run}", f"data.files=[{g}]",
                              "data.documents=line", "probes=none", f"out={out}"))
    assert third["file"] != got["file"] and Path(got["file"]).is_file()
    as_val = evaluated(run_cli(capfd, "blocklab-eval", f"ckpt={text_run}", "data=text_files",
                               f"data.val_files=[{f}]", "data.documents=line", "probes=none",
                               f"out={out}"))
    assert as_val["loss"] == got["loss"] and as_val["file"] == got["file"]
    assert sorted(p.name for p in out.glob("data-*.json")) == sorted(
        {Path(got["file"]).name, Path(third["file"]).name})


def test_without_out_the_result_goes_beside_the_checkpoints_evaluation(text_run, tmp_path,
                                                                       capfd):
    from blocklab import checkpoint as ckpt

    f = write(tmp_path / "x.txt", "\n".join(lines(4, seed=13)))
    got = evaluated(run_cli(capfd, "blocklab-eval", f"ckpt={text_run}", f"data.files=[{f}]",
                            f"data.cache_dir={tmp_path / 'cache'}", "probes=none"))
    newest = ckpt.list_checkpoints(text_run)[-1]
    assert Path(got["file"]).parent == text_run / "eval" / newest.name
    assert list((tmp_path / "cache").iterdir())  # prepared where the command line said


def test_a_datasetdict_is_evaluated_on_its_validation_split(text_run, tmp_path, capfd):
    import datasets

    from blocklab.checkpoint import load_model

    val = lines(6, seed=21)
    path = tmp_path / "dsdict"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": lines(50)}),
                          "validation": datasets.Dataset.from_dict({"text": val})}
                         ).save_to_disk(str(path))
    got = evaluated(run_cli(capfd, "blocklab-eval", f"ckpt={text_run}", "data=text_files",
                            f"data.files=[{path}]", "data.format=disk", "probes=none",
                            f"out={tmp_path / 'out'}"))
    model, tok, _ = load_model(text_run)
    expected, targets = direct_nll(model, pieces(documents(tok, val), 33))
    assert float(got["loss"]) == pytest.approx(expected, abs=1e-4)
    assert int(got["tokens"].replace(",", "")) == targets
    assert got["data"] == f"split 'validation' of {path}"


def test_a_checkpoint_whose_tokenizer_reads_no_text_is_refused_in_one_line(tmp_path, capfd):
    run = tmp_path / "synthetic"
    train(compose("train", ["experiment=smoke", "trainer.max_steps=2", "probes=none",
                            "trainer.ckpt_every_steps=2", "trainer.val_every_steps=2",
                            f"run_dir={run}"]))
    f = write(tmp_path / "t.txt", "some text.\n")
    r = run_cli(capfd, "blocklab-eval", f"ckpt={run}", f"data.files=[{f}]", "probes=none",
                f"out={tmp_path / 'out'}")
    assert r.returncode == 2, r.stderr[-2000:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"config error: data=data.files=[{f}]: checkpoint ")
    assert "synthetic task vocabulary, which tokenizes no text" in line
    assert not list((tmp_path / "out").glob("data-*.json"))

"""Your own validation data and tokenizers (issue 21): ``data.val_files``, the validation split
of a saved ``DatasetDict`` / a hub dataset (``data.val_split``; ``data.hub_split`` applies to a
saved DatasetDict and is refused where it does nothing), the held-out fraction only without
them — a single file validated on its last tokens, nanoGPT-style, said in the summary line with
the tokens held out — ``tokenizer=char`` (a character vocabulary built from the corpus and
cached with it), and the model's vocabulary sized from the tokenizer unless set explicitly.

The validation losses a run logs are checked against a direct computation: the checkpoint's
model run on the validation text, tokenized here and cut into pieces here."""

from __future__ import annotations

import csv
import dataclasses
import random
import re
from pathlib import Path

import pytest
import torch

from blocklab.config import DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.data.synthetic import BOS, EOS, SPECIALS
from blocklab.errors import DataError
from inprocess import run_cli

WORDS = ["the", "king", "queen", "crown", "sword", "river", "castle", "night", "day", "storm",
         "love", "war", "peace", "fool", "wise", "old", "young", "green", "gold", "bright",
         "dark", "sea", "moon", "sun", "star"]
BYTE = TokenizerConfig(name=TokenizerName.byte)
CHAR = TokenizerConfig(name=TokenizerName.char)


def lines(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "." for _ in range(n)]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def text_cfg(tmp_path: Path, files: list[Path] | None = None, **kw) -> DataConfig:
    kw = {"seq_len": 32, "batch_size": 2, "num_proc": 1, "cache_dir": str(tmp_path / "cache"),
          **kw}
    return DataConfig(name=DataName.text, files=[str(f) for f in files or []], **kw)


def streams_of(cfg: DataConfig, tok: TokenizerConfig = BYTE):
    from blocklab.data.streams import build_streams

    return build_streams(cfg, tok)


# ------------------------------------------------------------------ the direct computation


def pieces(docs: list[list[int]], width: int) -> list[list[int]]:
    """Documents' ids cut into consecutive pieces of ``width`` tokens, a last piece of one
    token (nothing to predict) dropped — the document-aligned pieces, computed here."""
    out = []
    for ids in docs:
        chunks = [ids[i:i + width] for i in range(0, len(ids), width)]
        out += [c for c in chunks if len(c) > 1]
    return out


def documents(tok, texts: list[str]) -> list[list[int]]:
    """``bos ids eos`` of each text, encoded by the ``tokenizers`` tokenizer ``tok``."""
    return [[BOS, *tok.encode(t, add_special_tokens=False).ids, EOS] for t in texts]


@torch.no_grad()
def direct_nll(model, examples: list[list[int]]) -> tuple[float, int]:
    """The model's mean next-token NLL over the examples, one unpadded row at a time."""
    model.eval()
    total, count = 0.0, 0
    for ids in examples:
        x = torch.tensor([ids])
        logits = model(x)[0, :-1].double()
        total += float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum"))
        count += len(ids) - 1
    return total / count, count


def cycled(examples: list, n: int) -> list:
    """The validation stream's first ``n`` examples: example ``i`` is piece ``i mod pieces``."""
    return [examples[i % len(examples)] for i in range(n)]


def logged_val(run: Path) -> float:
    rows = [row for f in sorted((run / "logs").glob("*/metrics.csv"))
            for row in csv.DictReader(f.open()) if row.get("val/loss")]
    return float(rows[-1]["val/loss"])


def tiny(tmp_path: Path, *extra: str) -> list[str]:
    """A seconds-long text run (smoke sizes) with a GPT-2-like preset."""
    return ["experiment=smoke", "data=text_files", "model=gpt2_tiny", "model.n_layers=1",
            "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.max_seq_len=64",
            "data.seq_len=32", "data.batch_size=4", "data.val_batches=3", "data.num_proc=1",
            f"data.cache_dir={tmp_path / 'cache'}", "trainer.max_steps=4",
            "trainer.val_every_steps=4", "trainer.ckpt_every_steps=4", "probes=none",
            "checkpoint_probes.enabled=false", *extra]


def summary_line(stderr: str) -> str:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("data: ") and "pieces" in ln]
    return line


# --------------------------------------------------------------------- validation sources


@pytest.mark.slow
def test_val_files_validate_a_run_on_that_text(tmp_path, capfd):
    """data.val_files: every document of them validates (none held out of the training
    files); the logged validation loss is the model's loss on that text. tokenizer=byte with a
    preset sizes the model to the tokenizer (263 ids, not the preset's 4096)."""
    from blocklab.checkpoint import load_model

    train = write(tmp_path / "train" / "a.txt", "\n".join(lines(300)))
    val_text = lines(12, seed=5)
    val = write(tmp_path / "val.txt", "\n".join(val_text))
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", *tiny(tmp_path, f"data.files=[{train.parent}]",
                                               f"data.val_files=[{val}]", "data.documents=line",
                                               "tokenizer=byte", f"run_dir={run}"))
    assert r.returncode == 0, r.stderr[-3000:]
    line = summary_line(r.stderr)
    model, tok, meta = load_model(run)
    val_pieces = pieces(documents(tok, val_text), 33)
    tokens = sum(len(d) for d in documents(tok, val_text))
    assert f"validation: data.val_files=[{val}] (prepared corpus " in line
    assert f": 12 documents, {tokens:,} tokens; nothing held out of the training data" in line
    assert meta["config"]["model"]["vocab_size"] == tok.get_vocab_size() == 263
    expected, _ = direct_nll(model, cycled(val_pieces, 3 * 4))
    assert logged_val(run) == pytest.approx(expected, rel=1e-5)
    # the training files lost nothing to validation: every line is a training document
    assert line.startswith("data: 300 documents")


def test_val_files_replace_the_held_out_fraction_and_change_the_fingerprint(tmp_path):
    files = [write(tmp_path / "src" / f"d{i}.txt", t) for i, t in enumerate(lines(60))]
    val = write(tmp_path / "val.txt", "\n".join(lines(5, seed=9)))
    held = streams_of(text_cfg(tmp_path, files))
    own = streams_of(text_cfg(tmp_path, files, val_files=[str(val)]))
    assert "documents held out by a seeded draw" in held.description
    assert "data.val_files=" in own.description and own.fingerprint != held.fingerprint
    from blocklab.data.tokenizer import byte_tokenizer

    val_docs = documents(byte_tokenizer(), ["\n".join(lines(5, seed=9))])  # one document
    assert own.val_examples == len(pieces(val_docs, 33))  # every piece of it, nothing else
    missing = text_cfg(tmp_path, files, val_files=[str(tmp_path / "nope.txt")])
    with pytest.raises(DataError, match=r"^data error: data.val_files: .*nope.txt: no such file"):
        streams_of(missing)


def decoded(streams, i: int) -> str:
    """The text of validation example ``i`` (one whole document), without its bos / eos."""
    from blocklab.data.tokenizer import tokenizer_from_json

    ids = streams.val(i).tokens
    assert ids[0] == BOS and ids[-1] == EOS
    return tokenizer_from_json(streams.tokenizer).decode(ids[1:-1])


def _dataset_dict(tmp_path: Path, splits: dict[str, list[str]]) -> Path:
    import datasets

    path = tmp_path / "dsdict"
    datasets.DatasetDict({k: datasets.Dataset.from_dict({"text": v}) for k, v in splits.items()}
                         ).save_to_disk(str(path))
    return path


@pytest.mark.slow
def test_a_saved_datasetdict_validates_on_its_validation_split(tmp_path, capfd):
    from blocklab.checkpoint import load_model

    val_text = lines(10, seed=3)
    path = _dataset_dict(tmp_path, {"train": lines(200), "validation": val_text,
                                    "test": lines(7, seed=4)})
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", *tiny(tmp_path, f"data.files=[{path}]",
                                               "data.format=disk", "tokenizer=byte",
                                               f"run_dir={run}"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"validation: split 'validation' of {path} (prepared corpus " in summary_line(r.stderr)
    model, tok, _ = load_model(run)
    expected, _ = direct_nll(model, cycled(pieces(documents(tok, val_text), 33), 3 * 4))
    assert logged_val(run) == pytest.approx(expected, rel=1e-5)


def test_named_splits_of_a_saved_datasetdict(tmp_path):
    train, other, test = lines(80), lines(40, seed=1), lines(6, seed=2)
    path = _dataset_dict(tmp_path, {"train": train, "other": other, "test": test})
    cfg = text_cfg(tmp_path, [path], format="disk", seq_len=128)  # a line: one piece
    auto = streams_of(cfg)  # no 'validation' split: held out, and said
    assert f"({path} has no validation split besides the training one (splits: train, other, " \
           "test))" in auto.description
    named = streams_of(dataclasses.replace(cfg, val_split="test"))
    assert f"validation: split 'test' of {path}" in named.description
    assert named.val_examples == len(test)
    assert decoded(named, 0) == test[0]
    # data.hub_split applies to a saved DatasetDict: training reads that split
    on_other = streams_of(dataclasses.replace(cfg, hub_split="other", val_split="test"))
    assert on_other.description.startswith("40 documents")
    with pytest.raises(DataError, match=r"^data error: data.val_split='nosuch': no such split in "
                       r".*dsdict \(splits: train, other, test\)$"):
        streams_of(dataclasses.replace(cfg, val_split="nosuch"))
    with pytest.raises(DataError, match=r"^data error: data.hub_split='nosuch': no such split"):
        streams_of(dataclasses.replace(cfg, hub_split="nosuch"))
    with pytest.raises(DataError, match="that is the training split"):
        streams_of(dataclasses.replace(cfg, val_split="train"))


def test_hub_split_does_not_change_the_fingerprint_of_files_without_splits(tmp_path):
    """data.hub_split picks rows of a hub dataset or a saved DatasetDict only: on text files
    (refused by validation, but prepare() is reachable without it) it is not part of the
    sources' identity; on a saved DatasetDict it is."""
    from blocklab.data.prepare import sources_fingerprint

    files = [write(tmp_path / "a.txt", "some text.")]
    text = text_cfg(tmp_path, files)
    assert sources_fingerprint(dataclasses.replace(text, hub_split="validation"), files) == \
        sources_fingerprint(text, files)
    disk = text_cfg(tmp_path, files, format="disk")
    assert sources_fingerprint(dataclasses.replace(disk, hub_split="validation"), files) != \
        sources_fingerprint(disk, files)


def test_a_single_saved_dataset_has_no_splits_to_name(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": lines(50)}).save_to_disk(str(tmp_path / "one"))
    cfg = text_cfg(tmp_path, [tmp_path / "one"], format="disk")
    assert "documents held out" in streams_of(cfg).description
    for key in ("hub_split", "val_split"):
        with pytest.raises(DataError, match=rf"^data error: data.{key}='x': .*one is a single "
                           "Dataset, not a DatasetDict"):
            streams_of(dataclasses.replace(cfg, **{key: "x"}))


def test_a_hub_datasets_named_validation_split_is_streamed(tmp_path, monkeypatch):
    import datasets

    rows = {"train": lines(60), "validation": lines(4, seed=8)}
    asked = []

    def load_dataset(name, split, streaming):
        asked.append((name, split, streaming))
        return iter([{"text": t} for t in rows[split]])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    cfg = DataConfig(name=DataName.text, hub_dataset="someone/corpus", seq_len=128, batch_size=2,
                     cache_dir=str(tmp_path / "cache"), num_proc=1)
    auto = streams_of(cfg)
    assert "only when named (data.val_split=validation)" in auto.description
    named = streams_of(dataclasses.replace(cfg, val_split="validation"))
    assert ("someone/corpus", "validation", True) in asked
    assert "validation: split 'validation' of hub dataset someone/corpus" in named.description
    got = [decoded(named, i) for i in range(named.val_examples)]
    assert got == rows["validation"]


@pytest.mark.parametrize(("overrides", "key", "rule"), [
    (["data.hub_split=validation"], "data.hub_split",
     "only a hub dataset or a saved DatasetDict (format=disk) has splits"),
    (["data.val_split=validation"], "data.val_split", "data.files in format text have no splits"),
    (["data.format=disk", "data.val_split=test", "data.val_files=[v]"], "data.val_split",
     "is the validation source already"),
])
def test_split_keys_that_would_do_nothing_are_refused_in_one_line(overrides, key, rule):
    from blocklab.config import ConfigError, compose, validate_train
    from blocklab.train.run import to_train_config

    cfg = compose("train", ["data=text_files", "data.files=[a.txt]", "tokenizer=byte",
                            *overrides])
    with pytest.raises(ConfigError) as e:
        validate_train(to_train_config(cfg))
    assert str(e.value).startswith(f"config error: {key}=") and rule in str(e.value)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------ held-out fraction


def test_one_file_validates_on_its_last_tokens_nanogpt_style(tmp_path):
    """Issue 23's Shakespeare character corpus: data.val_fraction=0.1 validates on exactly the
    last 10% of the file's tokens (nanoGPT: ``data[int(n * 0.9):]``), the rest trains."""
    text = "\n".join(lines(400))
    f = write(tmp_path / "input.txt", text)
    s = streams_of(text_cfg(tmp_path, [f], val_fraction=0.1, seq_len=64), CHAR)
    from blocklab.data.tokenizer import tokenizer_from_json

    ids = documents(tokenizer_from_json(s.tokenizer), [text])[0]
    n = len(ids)
    cut = int(n * 0.9)
    val = [t for i in range(s.val_examples) for t in s.val(i).tokens]
    assert val == ids[cut:]
    assert f"the last 10% of the one document's tokens, nanoGPT-style (data.val_fraction=0.1): " \
           f"{n - cut:,} of {n:,} tokens held out" in s.description
    train = pieces([ids[:cut]], 65)  # an epoch of training: every piece before the cut once
    assert sorted(tuple(s.train(i).tokens) for i in range(len(train))) == sorted(map(tuple, train))


def test_few_documents_validate_on_the_corpus_end_and_many_on_whole_documents(tmp_path):
    few = [write(tmp_path / "few" / f"d{i}.txt", "\n".join(lines(30, seed=i))) for i in range(3)]
    s = streams_of(text_cfg(tmp_path, few))
    assert "the last 2% of the corpus's tokens in source order: 3 documents are too few to " \
           "hold out whole ones (fewer than 25 at data.val_fraction=0.02)" in s.description
    many = [write(tmp_path / "many" / f"d{i:02d}.txt", t) for i, t in enumerate(lines(25))]
    s = streams_of(text_cfg(tmp_path, many))
    assert re.search(r"validation: \d+ of 25 documents held out by a seeded draw", s.description)


def test_val_split_last_validates_on_the_last_tokens_of_many_documents(tmp_path):
    """Issue 23's shakespeare_char: the plays are 42 documents, enough for whole documents to
    be held out at data.val_fraction=0.1; data.val_split=last validates on exactly the last 10%
    of the corpus's tokens in source order instead (nanoGPT's cut of input.txt, across
    documents: the one the cut falls in trains up to it), and the rest trains, every token
    once; the rule is part of the fingerprint."""
    from blocklab.data.tokenizer import tokenizer_from_json

    texts = ["\n".join(lines(40, seed=i)) for i in range(12)]
    files = [write(tmp_path / "plays" / f"p{i:02d}.txt", t) for i, t in enumerate(texts)]
    cfg = text_cfg(tmp_path, files, val_fraction=0.1, seq_len=64, packing=True)
    drawn = streams_of(cfg, CHAR)
    assert "documents held out by a seeded draw" in drawn.description  # the default rule
    s = streams_of(dataclasses.replace(cfg, val_split="last"), CHAR)
    ids = [t for d in documents(tokenizer_from_json(s.tokenizer), texts) for t in d]
    cut = int(len(ids) * 0.9)
    val = [t for i in range(s.val_examples) for t in s.val(i).tokens]
    assert val == ids[cut:][:len(val)] and len(ids) - cut - len(val) < 65  # whole windows
    assert f"the last 10% of the corpus's tokens in source order (data.val_split=last): " \
           f"{len(ids) - cut:,} of {len(ids):,} tokens held out" in s.description
    n_train = cut // 65
    train = sorted(tuple(s.train(i).tokens) for i in range(n_train))
    assert train == sorted(tuple(ids[w * 65:(w + 1) * 65]) for w in range(n_train))  # an epoch
    assert s.fingerprint != drawn.fingerprint


def test_val_split_last_with_validation_files_is_refused_in_one_line():
    from blocklab.config import ConfigError, compose, validate_train
    from blocklab.train.run import to_train_config

    cfg = compose("train", ["data=text_files", "data.files=[a.txt]", "tokenizer=byte",
                            "data.val_split=last", "data.val_files=[v.txt]"])
    with pytest.raises(ConfigError) as e:
        validate_train(to_train_config(cfg))
    assert str(e.value).startswith("config error: data.val_split='last'")
    assert "is the validation source already" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_a_single_training_file_trains_out_of_the_box(tmp_path, capfd):
    """The README's own-text recipe with one file (nanoGPT's input.txt), a character
    vocabulary and a preset: trains, says what validates and how many tokens are held out,
    and sizes the model to the tokenizer."""
    from blocklab.checkpoint import load_model

    text = "\n".join(lines(300))
    f = write(tmp_path / "one.txt", text)
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", *tiny(tmp_path, f"data.files=[{f}]", "tokenizer=char",
                                               f"run_dir={run}"))
    assert r.returncode == 0, r.stderr[-3000:]
    model, tok, meta = load_model(run)
    n = len(text) + 2
    line = summary_line(r.stderr)
    assert f"validation: the last 2% of the one document's tokens, nanoGPT-style " \
           f"(data.val_fraction=0.02): {n - int(n * 0.98):,} of {n:,} tokens held out" in line
    assert meta["config"]["model"]["vocab_size"] == tok.get_vocab_size() == 8 + len(set(text))
    ids = documents(tok, [text])[0]
    expected, _ = direct_nll(model, cycled(pieces([ids[int(n * 0.98):]], 33), 3 * 4))
    assert logged_val(run) == pytest.approx(expected, rel=1e-5)


# -------------------------------------------------------------------------------- tokenizers


def test_char_tokenizer_is_the_corpus_characters_after_the_specials(tmp_path):
    """nanoGPT's shakespeare_char vocabulary (sorted characters), shifted past blocklab's
    specials (ids 0..6) and <unk> (7): the same text round-trips; an unseen character is
    <unk>; a special's name in the text stays text."""
    from blocklab.data.prepare import prepare
    from blocklab.data.tokenizer import tokenizer_from_json

    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\tAll: Speak, speak!"
    f = write(tmp_path / "input.txt", text)
    said: list[str] = []
    p = prepare(text_cfg(tmp_path, [f]), CHAR, log=said.append)
    tok = tokenizer_from_json(p.tokenizer_json)
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}  # nanoGPT's data/shakespeare_char/prepare.py
    assert [tok.id_to_token(i) for i in range(8)] == [*SPECIALS, "<unk>"]
    assert tok.encode(text, add_special_tokens=False).ids == [8 + stoi[c] for c in text]
    assert tok.get_vocab_size() == 8 + len(chars)
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text
    assert "~" not in text and tok.encode("F~", add_special_tokens=False).ids == [8 + stoi["F"], 7]
    assert tok.encode("<bos>", add_special_tokens=False).ids[0] != BOS
    assert sum("a character vocabulary of" in s for s in said) == 1
    # cached with the prepared corpus: preparing these sources again (here: their corpus
    # removed) reuses the vocabulary without building it again
    import shutil

    shutil.rmtree(p.path)
    said.clear()
    again = prepare(text_cfg(tmp_path, [f]), CHAR, log=said.append)
    assert again.tokenizer_json == p.tokenizer_json
    assert not any("character vocabulary" in s for s in said)
    assert list((tmp_path / "cache" / "tokenizers").glob("char-*.json"))


def test_text_tokenizers_size_the_model_unless_it_is_set(tmp_path, capfd):
    """A text tokenizer option sets model.vocab_size: null over a preset's number, so training
    fills in the tokenizer's size; a size set on the command line is kept, refused below the
    tokenizer and said when far above it."""
    from omegaconf import OmegaConf

    from blocklab.config import ConfigError, compose
    from blocklab.train.run import size_vocabulary, to_train_config

    base = ["model=gpt2_tiny", "data=text_files", "data.files=[a.txt]"]
    for tok in ("byte", "bpe", "char"):
        cfg = compose("train", [*base, f"tokenizer={tok}"])
        assert cfg.model.vocab_size is None, tok
    cfg = compose("train", [*base, "tokenizer=byte"])
    tc = to_train_config(cfg)
    size_vocabulary(tc, cfg, 263)
    assert tc.model.vocab_size == 263 and OmegaConf.select(cfg, "model.vocab_size") == 263
    assert compose("train", ["model=gpt2_tiny"]).model.vocab_size == 4096  # synthetic: as set
    capfd.readouterr()
    for n, warned in ((320, False), (8192, True)):
        cfg = compose("train", [*base, "tokenizer=byte", f"model.vocab_size={n}"])
        tc = to_train_config(cfg)
        size_vocabulary(tc, cfg, 263)
        err = capfd.readouterr().err
        assert tc.model.vocab_size == n and bool(err) == warned
    assert err.strip() == ("warning: model.vocab_size=8192 is 31.1x the tokenizer's 263 ids: "
                           "7,929 embedding rows no token uses; model.vocab_size=null sizes the "
                           "model from the tokenizer")
    cfg = compose("train", [*base, "tokenizer=byte", "model.vocab_size=100"])
    with pytest.raises(ConfigError, match=r"^config error: model.vocab_size=100: smaller than "
                       r"the tokenizer's vocabulary \(263\)"):
        size_vocabulary(to_train_config(cfg), cfg, 263)

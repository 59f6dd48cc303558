"""Real text (docs/reliability.md, "Bad data"): tokenizers with blocklab's specials at ids 0..6
that round-trip any text, and users' tokenizers with their own special ids; sources read as
documents (files, globs, directories; text per file / line / paragraph, JSON, Parquet, saved
datasets) with bad data counted or named."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from blocklab.config import DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.data.sources import ReadStats, plan, read_documents, resolve_files
from blocklab.data.synthetic import BOS, EOS, SPECIALS
from blocklab.data.tokenizer import (
    byte_tokenizer,
    load_user_tokenizer,
    tokenizer_from_json,
    train_bpe,
)
from blocklab.errors import DataError

BPE = TokenizerConfig(name=TokenizerName.bpe, vocab_size=400)
TEXTS = [
    "plain ASCII, with punctuation: (a+b)*c = d; 'quotes' \"double\"",
    "héllo wörld — naïve café, Straße, ĳ, é (combining)",
    "日本語のテキスト 中文 한국어 עברית العربية",
    "emoji 🎉 👩‍👩‍👧 🏳️‍🌈",
    "tabs\tand\nnewlines\r\n\n\n  indented\n",
    "  leading and trailing spaces  ",
    "control \x00\x01\x7f chars",
    "",
]
CORPUS = [
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n",
    "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate.\n",
    "Now is the winter of our discontent\nMade glorious summer by this sun of York.\n",
] * 5


def random_text(rng: random.Random, n: int) -> str:
    chars = []
    for _ in range(n):
        cp = rng.choice([rng.randrange(32, 127), rng.randrange(0xA0, 0x3000),
                         rng.randrange(0x1F300, 0x1FAFF), rng.choice([9, 10, 13])])
        chars.append(chr(cp))
    return "".join(chars)


def text_cfg(files: list[Path], **kw) -> DataConfig:
    kw = {"seq_len": 8, "batch_size": 2, "val_fraction": 0.2, **kw}
    return DataConfig(name=DataName.text, files=[str(f) for f in files], **kw)


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


def load_docs(cfg: DataConfig) -> tuple[list[str], ReadStats]:
    """Every document the sources of ``cfg`` hold, through the same readers preparation uses."""
    stats = ReadStats()
    docs = [d for item in plan(cfg, resolve_files(cfg)) for d in read_documents(item, cfg, stats)]
    return docs, stats


# --------------------------------------------------------------------------------- tokenizers


@pytest.fixture(scope="module", params=["bpe", "byte"])
def tok(request):
    return train_bpe(BPE, CORPUS) if request.param == "bpe" else byte_tokenizer()


def test_specials_have_ids_0_to_6(tok) -> None:
    assert list(SPECIALS) == ["<pad>", "<bos>", "<eos>", "<sep>", "<mark>", "<rec>", "<mask>"]
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i and tok.id_to_token(i) == s
    assert (BOS, EOS) == (1, 2)


def test_encode_decode_round_trips_any_text(tok) -> None:
    rng = random.Random(0)
    texts = TEXTS + CORPUS[:3] + [random_text(rng, rng.randint(1, 80)) for _ in range(40)]
    for s in texts:
        ids = tok.encode(s, add_special_tokens=False).ids
        assert all(i >= len(SPECIALS) for i in ids), (s, ids)
        assert tok.decode(ids) == s, s


def test_literal_special_strings_are_plain_text(tok) -> None:
    """A document that merely *contains* "<eos>" or "<pad>" must not inject special ids (a
    <pad> inside a document would be masked as padding, an <eos> would end it)."""
    s = "html <pad> and <bos>x<eos> or <mask> tokens"
    ids = tok.encode(s, add_special_tokens=False).ids
    assert not [i for i in ids if i < len(SPECIALS)], ids
    assert tok.decode(ids) == s


def test_byte_tokenizer_is_one_token_per_byte() -> None:
    tok = byte_tokenizer()
    assert tok.get_vocab_size() == len(SPECIALS) + 256
    for s in TEXTS:
        assert len(tok.encode(s, add_special_tokens=False).ids) == len(s.encode("utf-8"))


def test_bpe_learns_merges_within_its_size_from_a_stream() -> None:
    tok = train_bpe(BPE, iter(CORPUS))  # a generator: trained as a stream
    assert len(SPECIALS) + 256 < tok.get_vocab_size() <= BPE.vocab_size
    s = CORPUS[0]
    assert len(tok.encode(s, add_special_tokens=False).ids) < len(s.encode()) / 2
    again = train_bpe(BPE, CORPUS)  # resume compares tokenizer hashes: deterministic
    assert again.to_str() == tok.to_str()


def test_tokenizer_json_round_trip(tok) -> None:
    loaded = tokenizer_from_json(tok.to_str())
    assert type(loaded) is type(tok)
    assert loaded.get_vocab() == tok.get_vocab()
    for s in TEXTS + CORPUS[:3]:
        assert loaded.encode(s, add_special_tokens=False).ids == tok.encode(
            s, add_special_tokens=False).ids
        assert loaded.decode(tok.encode(s, add_special_tokens=False).ids) == s
    assert loaded.to_str() == tok.to_str()


def foreign_tokenizer(tmp_path: Path, *, declared: dict[str, str] | None = None,
                      specials: tuple[str, ...] = ("<|endoftext|>",)) -> Path:
    """A tokenizer not made by blocklab: a BPE whose special tokens sit *after* its merges
    (GPT-2 style), saved as a Hugging Face tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=350, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    t.add_special_tokens(list(specials))
    d = tmp_path / "hf_tokenizer"
    d.mkdir(exist_ok=True)
    t.save(str(d / "tokenizer.json"))
    if declared is not None:
        (d / "special_tokens_map.json").write_text(json.dumps(declared))
    return d


def test_a_users_tokenizer_keeps_its_own_special_ids(tmp_path: Path) -> None:
    d = foreign_tokenizer(tmp_path, declared={"bos_token": "<|endoftext|>",
                                              "eos_token": "<|endoftext|>",
                                              "pad_token": {"content": "<|pad|>"}},
                          specials=("<|endoftext|>", "<|pad|>"))
    tok, sp, notes = load_user_tokenizer(d)
    eot, pad = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|pad|>")
    assert eot >= 300 and (sp.bos, sp.eos, sp.pad) == (eot, eot, pad)  # not blocklab's 0..6
    # no mask token declared or found: one is added at the end of the vocabulary, and said
    assert sp.mask == tok.token_to_id("<mask>") == tok.get_vocab_size() - 1
    assert notes == [f"tokenizer: <mask> added as id {sp.mask} ({d / 'tokenizer.json'} names "
                     "no mask token)"]
    s = "literal <|endoftext|> in text"  # a special's text inside a document stays text
    assert eot not in tok.encode(s, add_special_tokens=False).ids
    _tok2, sp2, _ = load_user_tokenizer(d / "tokenizer.json")  # the file alone: found by name
    assert (sp2.bos, sp2.eos) == (eot, eot)


def test_a_tokenizer_path_that_is_not_a_tokenizer_is_named(tmp_path: Path) -> None:
    from blocklab.config import ConfigError

    with pytest.raises(ConfigError, match=r"tokenizer\.path='.*nothing': no tokenizer\.json"):
        load_user_tokenizer(tmp_path / "nothing")
    bad = write(tmp_path / "tokenizer.json", "{not json")
    with pytest.raises(ConfigError, match="not a tokenizers JSON file"):
        load_user_tokenizer(bad)


# ------------------------------------------------------------------------------------ sources


def test_empty_documents_are_dropped_and_counted(tmp_path: Path) -> None:
    files = [write(tmp_path / "a.txt", "first doc\n"), write(tmp_path / "empty.txt", ""),
             write(tmp_path / "blank.txt", "  \n\t \n\n"), write(tmp_path / "b.txt", "second\n")]
    docs, stats = load_docs(text_cfg(files))
    assert sorted(docs) == ["first doc\n", "second\n"]
    assert (stats.documents, stats.empty_dropped) == (2, 2)


@pytest.mark.parametrize(("split", "expected"), [
    ("file", ["a\nb\n\nc\n"]), ("line", ["a", "b", "c"]), ("paragraph", ["a\nb", "c\n"])])
def test_plain_text_documents_per_file_line_or_paragraph(tmp_path: Path, split, expected):
    f = write(tmp_path / "t.txt", "a\nb\n\nc\n")
    docs, _ = load_docs(text_cfg([f], documents=split))
    assert docs == expected


def test_big_files_are_read_in_aligned_pieces_that_lose_nothing(tmp_path, monkeypatch):
    import blocklab.data.sources as sources

    monkeypatch.setattr(sources, "ITEM_BYTES", 4096)
    rng = random.Random(0)
    lines = [f"line {i} " + "x" * rng.randint(0, 300) for i in range(400)]
    f = write(tmp_path / "big.txt", "\n".join(lines) + "\n")
    cfg = text_cfg([f], documents="line")
    items = plan(cfg, resolve_files(cfg))
    assert len(items) > 10 and all(i.stop - i.start <= 4096 + 1024 for i in items)
    docs, stats = load_docs(cfg)
    assert docs == lines and stats.bytes == f.stat().st_size  # every line once, in order
    jl = write(tmp_path / "big.jsonl", "".join(json.dumps({"text": s}) + "\n" for s in lines))
    jcfg = text_cfg([jl], format="json")
    assert len(plan(jcfg, [jl])) > 10 and load_docs(jcfg)[0] == lines


def test_files_directories_and_globs(tmp_path: Path) -> None:
    a = write(tmp_path / "corpus" / "a.txt", "alpha\n")
    b = write(tmp_path / "corpus" / "sub" / "b.txt", "beta\n")
    write(tmp_path / "corpus" / "notes.bin", b"\x00")  # not a text suffix: skipped in a dir
    assert resolve_files(text_cfg([tmp_path / "corpus"])) == [a, b]
    assert resolve_files(text_cfg([str(tmp_path / "corpus" / "**" / "*.txt")])) == [a, b]
    for entry, words in ((tmp_path / "nope.txt", "no such file or directory"),
                         (str(tmp_path / "*.md"), "the pattern matches no file")):
        with pytest.raises(DataError) as e:
            resolve_files(text_cfg([entry]))
        assert str(entry) in str(e.value) and words in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DataError, match="no text files"):
        resolve_files(text_cfg([tmp_path / "empty_dir"]))


def test_invalid_utf8_is_replaced_and_counted(tmp_path: Path) -> None:
    files = [write(tmp_path / "bad.txt", b"ab\xff\xfecd \xc3( ok\n"),
             write(tmp_path / "good.txt", "fine\n")]
    docs, stats = load_docs(text_cfg(files))
    bad = next(d for d in docs if d.startswith("ab"))
    assert "\ufffd" in bad and bad.endswith("cd \ufffd( ok\n")
    assert stats.documents == 2
    assert stats.invalid_utf8 == bad.count("\ufffd") == 3  # \xff, \xfe, the cut-off \xc3


def test_invalid_utf8_in_strict_mode_names_file_and_offset(tmp_path: Path) -> None:
    files = [write(tmp_path / "good.txt", "fine\n"), write(tmp_path / "bad.txt", b"ab\xffcd\n")]
    with pytest.raises(DataError, match=r"bad.txt: invalid UTF-8 at byte offset 2 "):
        load_docs(text_cfg(files, utf8_errors="strict"))


def test_json_records_with_text_key(tmp_path: Path) -> None:
    rows = [{"body": "one", "id": 1}, {"body": "", "id": 2}, {"body": "  ", "id": 3},
            {"body": "two\nlines", "id": 4}, {"body": None, "id": 6}]
    jl = write(tmp_path / "r.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    arr = write(tmp_path / "r.json", json.dumps([{"body": "three", "id": 5}]))
    cfg = text_cfg([jl, arr], format="json", text_key="body")
    docs, stats = load_docs(cfg)
    assert sorted(docs) == ["one", "three", "two\nlines"]
    assert (stats.documents, stats.empty_dropped) == (3, 3)
    with pytest.raises(DataError) as e:
        load_docs(dataclasses.replace(cfg, text_key="content"))
    msg = str(e.value)
    assert "data.text_key" in msg and "'content'" in msg and "\n" not in msg
    broken = write(tmp_path / "broken.jsonl", '{"body": "ok"}\n{"body": \n')
    with pytest.raises(DataError, match=r"broken.jsonl: invalid JSON at byte offset 15"):
        load_docs(text_cfg([broken], format="json", text_key="body"))


@pytest.mark.parametrize("values", [[0, 1, 2, 3], [0.5, 1.5], [True, False], [["a"], ["b"]]])
def test_a_text_column_holding_numbers_is_refused(tmp_path: Path, values) -> None:
    f = write(tmp_path / "numbers.jsonl",
              "".join(json.dumps({"text": v, "body": "words"}) + "\n" for v in values))
    cfg = text_cfg([f], format="json")
    with pytest.raises(DataError) as err:
        load_docs(cfg)
    msg = str(err.value)
    assert "\n" not in msg and "data.text_key='text'" in msg and "not text" in msg
    assert str(f) in msg
    assert load_docs(dataclasses.replace(cfg, text_key="body"))[0] == ["words"] * len(values)


def test_parquet_and_saved_datasets(tmp_path: Path) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"row {i}" for i in range(50)]
    table = pa.table({"text": texts, "n": list(range(50))})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=16)
    cfg = text_cfg([tmp_path / "t.parquet"], format="parquet")
    assert len(plan(cfg, resolve_files(cfg))) == 4  # one item per row group
    assert load_docs(cfg)[0] == texts
    with pytest.raises(DataError, match=r"data.text_key='n': the column holds int64 values"):
        load_docs(dataclasses.replace(cfg, text_key="n"))
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "saved"))
    disk = text_cfg([tmp_path / "saved"], format="disk")
    assert load_docs(disk)[0] == texts
    with pytest.raises(DataError, match="not a dataset saved with save_to_disk"):
        load_docs(text_cfg([tmp_path / "t.parquet"], format="disk"))


def test_all_empty_is_an_error_naming_the_files(tmp_path: Path) -> None:
    from blocklab.data.prepare import prepare

    files = [write(tmp_path / "e1.txt", ""), write(tmp_path / "e2.txt", " \n ")]
    with pytest.raises(DataError) as e:
        prepare(text_cfg(files, cache_dir=str(tmp_path / "cache")),
                TokenizerConfig(name=TokenizerName.byte))
    msg = str(e.value)
    assert "empty or whitespace only" in msg and str(files[0]) in msg and "\n" not in msg


def test_a_binary_file_is_called_out_by_name(tmp_path: Path) -> None:
    from blocklab.data.prepare import prepare

    bin_file = write(tmp_path / "image.bin", bytes(range(128, 256)) * 64)  # no valid UTF-8
    good = write(tmp_path / "good.txt", b"fine text " * 500 + b"\xff")  # one stray byte
    said: list[str] = []
    p = prepare(text_cfg([bin_file, good], cache_dir=str(tmp_path / "cache")),
                TokenizerConfig(name=TokenizerName.byte), log=said.append)
    assert p.meta["invalid_utf8"] == 128 * 64 + 1
    warnings = [s for s in said if s.startswith("warning:")]
    assert len(warnings) == 1 and str(bin_file) in warnings[0]
    assert "is it a text file?" in warnings[0]


def test_a_hub_dataset_that_cannot_be_streamed_is_named(monkeypatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cfg = DataConfig(name=DataName.text, hub_dataset="nobody/no-such-dataset-anywhere")
    with pytest.raises(DataError) as e:
        load_docs(cfg)
    msg = str(e.value)
    assert msg.startswith("data error: data.hub_dataset='nobody/no-such-dataset-anywhere': "
                          "cannot stream it (") and "\n" not in msg

"""Real text (docs/reliability.md, "Bad data"): tokenizers with blocklab's specials at ids 0..6 that round-trip
any text, documents loaded with bad data counted or named, pieces that cover each document,
disjoint train/val, a seeded epoch order, and a fingerprint that tracks the data files."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from blocklab.config import ConfigError, DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.data.synthetic import BOS, EOS, SPECIALS
from blocklab.data.text import (
    DataError,
    TextPieces,
    build_tokenizer,
    corpus_files,
    load_documents,
    text_data,
)
from blocklab.data.tokenizer import tokenizer_from_json

BYTE = TokenizerConfig(name=TokenizerName.byte)
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
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep `datasets`' arrow cache of these throwaway corpora out of ~/.cache."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")


# --------------------------------------------------------------------------------- tokenizers


@pytest.fixture(scope="module", params=["bpe", "byte"])
def tok(request):
    return build_tokenizer(BPE if request.param == "bpe" else BYTE, CORPUS)


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
    tok = build_tokenizer(BYTE, [])
    assert tok.get_vocab_size() == len(SPECIALS) + 256
    for s in TEXTS:
        assert len(tok.encode(s, add_special_tokens=False).ids) == len(s.encode("utf-8"))


def test_bpe_learns_merges_within_its_size() -> None:
    tok = build_tokenizer(BPE, CORPUS)
    assert len(SPECIALS) + 256 < tok.get_vocab_size() <= BPE.vocab_size
    s = CORPUS[0]
    assert len(tok.encode(s, add_special_tokens=False).ids) < len(s.encode()) / 2
    again = build_tokenizer(BPE, CORPUS)  # resume compares tokenizer hashes: deterministic
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


# ----------------------------------------------------------------------------- load_documents


def test_empty_documents_are_dropped_and_counted(tmp_path: Path) -> None:
    files = [write(tmp_path / "a.txt", "first doc\n"), write(tmp_path / "empty.txt", ""),
             write(tmp_path / "blank.txt", "  \n\t \n\n"), write(tmp_path / "b.txt", "second\n")]
    docs, stats = load_documents(text_cfg(files), files)
    assert sorted(docs) == ["first doc\n", "second\n"]
    assert (stats.documents, stats.empty_dropped) == (2, 2)


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    files = [write(tmp_path / "bad.txt", b"ab\xff\xfecd \xc3( ok\n"),
             write(tmp_path / "good.txt", "fine\n")]
    docs, stats = load_documents(text_cfg(files), files)
    bad = next(d for d in docs if d.startswith("ab"))
    assert "\ufffd" in bad and bad.endswith("cd \ufffd( ok\n")
    assert stats.documents == 2
    assert stats.invalid_utf8 == bad.count("\ufffd") == 3  # \xff, \xfe, the cut-off \xc3


def test_invalid_utf8_in_strict_mode_names_file_and_offset(tmp_path: Path) -> None:
    files = [write(tmp_path / "good.txt", "fine\n"), write(tmp_path / "bad.txt", b"ab\xffcd\n")]
    with pytest.raises(DataError, match=r"bad.txt: invalid UTF-8 at byte offset 2 \(1 invalid"):
        load_documents(text_cfg(files, utf8_errors="strict"), files)


def test_json_records_with_text_key(tmp_path: Path) -> None:
    rows = [{"body": "one", "id": 1}, {"body": "", "id": 2}, {"body": "  ", "id": 3},
            {"body": "two\nlines", "id": 4}]
    jl = write(tmp_path / "r.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    arr = write(tmp_path / "r.json", json.dumps([{"body": "three", "id": 5}]))
    cfg = text_cfg([jl, arr], format="json", text_key="body")
    docs, stats = load_documents(cfg, [jl, arr])
    assert sorted(docs) == ["one", "three", "two\nlines"]
    assert (stats.documents, stats.empty_dropped) == (3, 2)
    with pytest.raises(DataError) as e:
        load_documents(dataclasses.replace(cfg, text_key="content"), [jl])
    msg = str(e.value)
    assert "data.text_key" in msg and "'content'" in msg and "\n" not in msg


def test_missing_file_is_named(tmp_path: Path) -> None:
    good = write(tmp_path / "a.txt", "text\n")
    missing = tmp_path / "sub" / "missing.txt"
    with pytest.raises(DataError) as e:
        corpus_files(text_cfg([good, missing]))
    assert str(missing) in str(e.value) and "\n" not in str(e.value)
    assert corpus_files(text_cfg([good])) == [good]
    with pytest.raises(ConfigError, match=r"data\.files"):
        corpus_files(text_cfg([]))
    with pytest.raises(ConfigError, match=r"data\.corpus"):
        corpus_files(dataclasses.replace(text_cfg([]), corpus="nope"))


def test_all_empty_is_an_error(tmp_path: Path) -> None:
    files = [write(tmp_path / "e1.txt", ""), write(tmp_path / "e2.txt", " \n ")]
    with pytest.raises(DataError, match="empty"):
        load_documents(text_cfg(files), files)


# --------------------------------------------------------------------------------- TextPieces

# Byte tokenizer + ASCII: a document of n characters is exactly BOS + n ids + EOS.
DOC_LENGTHS = [*range(1, 30), 34, 43, 52, 80]  # seq_len 8: width 9; includes len % 9 == 1


def ascii_docs(lengths=DOC_LENGTHS) -> list[str]:
    rng = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyz .,;\n"
    return [f"{i:03d}" + "".join(rng.choice(letters) for _ in range(n))
            for i, n in enumerate(lengths)]


def pieces_for(docs: list[str], tok=None, **kw) -> tuple[TextPieces, DataConfig]:
    from blocklab.data.text import Stats

    cfg = text_cfg([], **kw)
    tok = tok or build_tokenizer(BYTE, docs)
    return TextPieces(cfg, tok, docs, Stats(documents=len(docs))), cfg


def full_ids(tok, doc: str) -> list[int]:
    return [BOS, *tok.encode(doc, add_special_tokens=False).ids, EOS]


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_split_pieces_cover_each_document(tokenizer: str) -> None:
    docs = ascii_docs()
    tok = build_tokenizer(BYTE if tokenizer == "byte" else BPE, docs)
    tp, cfg = pieces_for(docs, tok)
    width = cfg.seq_len + 1
    pieces = tp.train + tp.val
    assert len(pieces) == tp.stats.pieces
    assert all(2 <= len(p) <= width for p in pieces)
    assert not any(BOS in p[1:] for p in pieces) and not any(EOS in p[:-1] for p in pieces)
    assert sum(p[0] == BOS for p in pieces) == len(docs)  # one first piece per document
    expected: Counter = Counter()
    long_docs = 0
    for doc in docs:
        ids = full_ids(tok, doc)
        long_docs += len(ids) > width
        chunks = [ids[i:i + width] for i in range(0, len(ids), width)]
        assert [t for c in chunks for t in c] == ids and chunks[0][0] == BOS
        if len(chunks[-1]) == 1:  # a lone trailing token has no target: dropped
            chunks.pop()
        expected.update(tuple(c) for c in chunks)
    assert Counter(tuple(p) for p in pieces) == expected
    assert tp.stats.split_documents == long_docs > 0 and tp.stats.truncated_documents == 0
    assert tp.stats.tokens == sum(len(full_ids(tok, d)) for d in docs)


def test_truncate_keeps_the_first_piece_and_counts() -> None:
    docs = ascii_docs()
    tp, cfg = pieces_for(docs, long_documents="truncate")
    tok = build_tokenizer(BYTE, docs)
    width = cfg.seq_len + 1
    pieces = tp.train + tp.val
    assert sorted(map(tuple, pieces)) == sorted(tuple(full_ids(tok, d)[:width]) for d in docs)
    long_docs = sum(len(full_ids(tok, d)) > width for d in docs)
    assert tp.stats.truncated_documents == long_docs > 0 and tp.stats.split_documents == 0


def test_train_and_val_are_disjoint() -> None:
    docs = ascii_docs(list(range(10, 200, 3)))
    tp, _ = pieces_for(docs, val_fraction=0.2)
    train, val = {tuple(p) for p in tp.train}, {tuple(p) for p in tp.val}
    assert len(train) == len(tp.train) and len(val) == len(tp.val)  # all pieces are distinct
    assert not train & val
    assert len(train) + len(val) == tp.stats.pieces
    assert 0.1 < len(val) / tp.stats.pieces < 0.3
    tp0, _ = pieces_for(docs, val_fraction=0.0)
    assert len(tp0.val) >= 1  # validation never empty


def test_epoch_order_is_seeded_and_covers_every_piece() -> None:
    docs = ascii_docs(list(range(10, 120, 2)))
    tp, _ = pieces_for(docs)
    n = len(tp.train)
    train = sorted(tuple(p) for p in tp.train)
    epochs = [[tuple(tp.train_example(e * n + i).tokens) for i in range(n)] for e in (0, 1)]
    for seen in epochs:
        assert sorted(seen) == train  # every train piece once per epoch
    assert epochs[0] != epochs[1] and epochs[0] != [tuple(p) for p in tp.train]
    again, _ = pieces_for(docs)
    assert [tuple(again.train_example(i).tokens) for i in range(2 * n)] == epochs[0] + epochs[1]
    # random access across epochs (resume, workers) sees the same stream
    idx = list(range(2 * n))
    random.Random(3).shuffle(idx)
    flat = epochs[0] + epochs[1]
    assert all(tuple(tp.train_example(i).tokens) == flat[i] for i in idx)
    ex = tp.train_example(0)
    assert ex.targets == [False] + [True] * (len(ex.tokens) - 1)
    assert tuple(tp.val_example(0).tokens) in {tuple(p) for p in tp.val}


def test_fewer_pieces_than_a_batch_is_an_error_with_sizes() -> None:
    docs = ascii_docs([5, 6, 7, 8])  # 4 documents, one piece each (+1 val)
    with pytest.raises(DataError) as e:
        pieces_for(docs, batch_size=64)
    msg = str(e.value)
    assert "batch_size=64" in msg and "\n" not in msg
    assert any(0 < int(n) < 64 for n in re.findall(r"\d+", msg)), msg  # the number of pieces


def test_a_single_piece_corpus_fails_at_load_not_at_validation() -> None:
    """One piece cannot be both a training batch and a validation set."""
    docs = ascii_docs([3])
    with pytest.raises(DataError, match="validation"):
        pieces_for(docs, batch_size=1)  # not a ZeroDivisionError at the first validation


# ---------------------------------------------------------------------------- text_data


def test_text_data_fingerprint_tracks_files_and_spec(tmp_path: Path) -> None:
    files = [write(tmp_path / f"d{i}.txt", d) for i, d in enumerate(ascii_docs(
        list(range(20, 60, 4))))]
    cfg = text_cfg(files)
    _, _, tok_json, fp, stats = text_data(cfg, BYTE)
    assert stats.documents == len(files) and stats.pieces > 0
    assert text_data(cfg, BYTE)[3] == fp
    assert text_data(dataclasses.replace(cfg, batch_size=3), BYTE)[3] == fp
    assert text_data(dataclasses.replace(cfg, seq_len=16), BYTE)[3] != fp
    assert tokenizer_from_json(tok_json).token_to_id("<mask>") == 6
    original = files[3].read_text()
    write(files[3], original.replace("3", "X", 1))
    changed = text_data(cfg, BYTE)
    assert changed[3] != fp, "a changed data file must change the fingerprint"
    docs, _ = load_documents(cfg, files)
    assert any(d.startswith("00X") for d in docs), "stale documents after a file change"
    write(files[3], original)
    assert text_data(cfg, BYTE)[3] == fp


@pytest.mark.slow
def test_text_data_on_shakespeare(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = DataConfig(name=DataName.text, corpus="shakespeare", seq_len=128, batch_size=8)
    tcfg = TokenizerConfig(name=TokenizerName.bpe, vocab_size=512)
    train, val, tok_json, fp, stats = text_data(cfg, tcfg)
    assert stats.documents == 42 and stats.empty_dropped == 0
    assert stats.pieces > 1000 and stats.split_documents == 42
    tok = tokenizer_from_json(tok_json)
    assert tok.get_vocab_size() <= 512 and tok.token_to_id("<bos>") == BOS
    ex = train(0)
    assert 2 <= len(ex.tokens) <= 129 and max(ex.tokens) < tok.get_vocab_size()
    assert len(val(0).tokens) <= 129
    # Second call: the same files, spec and tokenizer; cutting into pieces (the slow part,
    # covered above and by the small-corpus tests) is skipped.
    import blocklab.data.text as text

    class NoPieces:
        def __init__(self, cfg, tok, docs, stats) -> None:
            self.train_example = self.val_example = None

    monkeypatch.setattr(text, "TextPieces", NoPieces)
    _, _, tok_json2, fp2, stats2 = text_data(cfg, tcfg)
    assert fp2 == fp and stats2.documents == 42
    assert tok_json2 == tok_json  # the tokenizer hash checked on resume is stable


def test_an_empty_or_whitespace_only_file_is_named(tmp_path: Path) -> None:
    f = tmp_path / "blank.txt"
    f.write_text("   \n\t\n  ")
    with pytest.raises(DataError) as err:
        load_documents(DataConfig(name=DataName.text, files=[str(f)]), [f])
    msg = str(err.value)
    assert "\n" not in msg and str(f) in msg and "empty or whitespace only" in msg


def test_a_binary_file_is_called_out_by_name(tmp_path: Path, capsys) -> None:
    f = tmp_path / "image.bin"
    f.write_bytes(bytes(range(128, 256)) * 64)  # no valid UTF-8 at all
    _, stats = load_documents(DataConfig(name=DataName.text, files=[str(f)]), [f])
    assert stats.invalid_utf8 == 128 * 64
    warning = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert len(warning) == 1 and str(f) in warning[0] and "is it a text file?" in warning[0]
    good = tmp_path / "good.txt"
    good.write_bytes(b"fine text " * 500 + b"\xff")  # one stray byte: counted, not called out
    load_documents(DataConfig(name=DataName.text, files=[str(good)]), [good])
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("values", [[0, 1, 2, 3], [0.5, 1.5], [True, False]])
def test_a_json_text_column_holding_numbers_is_refused(tmp_path: Path, values) -> None:
    f = tmp_path / "numbers.jsonl"
    f.write_text("".join(json.dumps({"text": v, "body": "words"}) + "\n" for v in values))
    cfg = DataConfig(name=DataName.text, format="json", files=[str(f)])
    with pytest.raises(DataError) as err:
        load_documents(cfg, [f])
    msg = str(err.value)
    assert "\n" not in msg and "data.text_key='text'" in msg and "not text" in msg
    assert str(f) in msg
    docs, _ = load_documents(dataclasses.replace(cfg, text_key="body"), [f])
    assert docs == ["words"] * len(values)


def test_bpe_training_on_a_large_corpus_says_what_it_does(monkeypatch, capsys) -> None:
    import blocklab.data.text as text

    monkeypatch.setattr(text, "PROGRESS_CHARS", 1000)
    build_tokenizer(BPE, ["x" * 600, "y" * 600])
    assert "tokenizer: training a byte-level BPE (vocab 400) on 0.0M characters" in \
        capsys.readouterr().err
    build_tokenizer(BPE, ["small"])
    assert "tokenizer:" not in capsys.readouterr().err

"""Prepared corpora (data/prepare.py, data/shards.py): tokenized once into memory-mapped
shards, reused by fingerprint without reading the text again (asserted, not timed), the same
tokens from one process or several, atomic (a failed preparation leaves nothing a later run
uses), changed shards detected and rebuilt, disk full named, concurrent preparers safe; and
read back as document-aligned pieces or packed windows that are seeded, disjoint between train
and validation, and cover the training documents once per epoch."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import blocklab.data.prepare as prep
import blocklab.data.workers as workers
from blocklab.config import DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.data.shards import Pieces, TokenCorpus, Windows
from blocklab.data.synthetic import BOS, EOS
from blocklab.data.tokenizer import byte_tokenizer
from blocklab.errors import DataError, StorageError
from inprocess import SAFETY_S

BYTE = TokenizerConfig(name=TokenizerName.byte)
DOC_LENGTHS = [*range(1, 30), 34, 43, 52, 80]  # seq_len 8: width 9; includes len % 9 == 1


def ascii_docs(lengths=DOC_LENGTHS) -> list[str]:
    rng = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyz .,;"
    return [f"{i:03d}" + "".join(rng.choice(letters) for _ in range(n))
            for i, n in enumerate(lengths)]


def corpus_files(tmp_path: Path, docs: list[str]) -> list[Path]:
    files = []
    for i, d in enumerate(docs):
        f = tmp_path / "src" / f"d{i:04d}.txt"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(d)
        files.append(f)
    return files


def cfg_for(tmp_path: Path, files: list[Path], **kw) -> DataConfig:
    kw = {"seq_len": 8, "batch_size": 2, "val_fraction": 0.2, "num_proc": 1,
          "cache_dir": str(tmp_path / "cache"), **kw}
    return DataConfig(name=DataName.text, files=[str(f) for f in files], **kw)


def full_ids(doc: str) -> list[int]:
    """Byte tokenizer + ASCII: a document of n characters is BOS + n ids + EOS."""
    return [BOS, *byte_tokenizer().encode(doc, add_special_tokens=False).ids, EOS]


@pytest.fixture
def prepared(tmp_path):
    docs = ascii_docs()
    cfg = cfg_for(tmp_path, corpus_files(tmp_path, docs))
    return docs, cfg, prep.prepare(cfg, BYTE, log=lambda s: None)


# ------------------------------------------------------------------------------ preparation


def test_the_shards_hold_every_document_in_order(prepared) -> None:
    docs, _, p = prepared
    corpus = TokenCorpus(p.path)
    assert [corpus.doc(i).tolist() for i in range(len(corpus))] == [full_ids(d) for d in docs]
    assert corpus.shards[0].dtype == np.uint16 and isinstance(corpus.shards[0], np.memmap)
    assert p.meta["tokens"] == sum(len(full_ids(d)) for d in docs)
    assert p.meta["documents"] == len(docs) and prep.verify(p.path) is None
    assert prep.dtype_for(65536) == np.uint16 and prep.dtype_for(65537) == np.uint32


def test_a_second_run_reuses_the_shards_without_reading_the_text(prepared, monkeypatch):
    _docs, cfg, p = prepared

    def must_not_run(*a, **k):
        raise AssertionError("the corpus was prepared again")

    monkeypatch.setattr(prep, "_build", must_not_run)
    monkeypatch.setattr(prep, "read_pieces", must_not_run)
    again = prep.prepare(dataclasses.replace(cfg, seq_len=16, batch_size=3), BYTE,
                         log=lambda s: None)  # reading settings only: the same corpus
    assert again.path == p.path and again.fingerprint == p.fingerprint


def test_the_fingerprint_follows_sources_tokenizer_and_token_fields(prepared, tmp_path):
    _docs, cfg, p = prepared
    quiet = {"log": lambda s: None}
    first = Path(cfg.files[3])
    text = first.read_text()
    first.write_text(text.replace(text[3], "X", 1))  # content and mtime change
    changed = prep.prepare(cfg, BYTE, **quiet)
    assert changed.fingerprint != p.fingerprint
    assert TokenCorpus(changed.path).doc(3).tolist() == full_ids(first.read_text())
    assert prep.prepare(dataclasses.replace(cfg, documents="line"), BYTE,
                        **quiet).fingerprint != changed.fingerprint
    bpe = TokenizerConfig(name=TokenizerName.bpe, vocab_size=300)
    assert prep.prepare(cfg, bpe, **quiet).fingerprint != changed.fingerprint
    os.utime(first, ns=(1, 1))  # same content, other mtime: the stat policy rebuilds ...
    assert prep.prepare(cfg, BYTE, **quiet).fingerprint != changed.fingerprint
    content = dataclasses.replace(cfg, fingerprint="content")  # ... the content policy not
    fp = prep.prepare(content, BYTE, **quiet).fingerprint
    os.utime(first, ns=(2, 2))
    assert prep.prepare(content, BYTE, **quiet).fingerprint == fp


def test_several_processes_write_the_same_corpus_as_one(tmp_path: Path) -> None:
    docs = ascii_docs(list(range(5, 400, 3)))
    files = corpus_files(tmp_path, docs)
    one = prep.prepare(cfg_for(tmp_path / "a", files), BYTE, log=lambda s: None)
    import blocklab.data.sources as sources

    old = sources.ITEM_BYTES
    sources.ITEM_BYTES = 2000  # many work items for two processes
    try:
        two = prep.prepare(cfg_for(tmp_path / "b", files, num_proc=2), BYTE, log=lambda s: None)
    finally:
        sources.ITEM_BYTES = old
    assert two.meta["shards"] > 4
    a, b = TokenCorpus(one.path), TokenCorpus(two.path)
    assert [a.doc(i).tolist() for i in range(len(a))] == [b.doc(i).tolist() for i in range(len(b))]


def test_a_failed_preparation_leaves_nothing_a_later_run_uses(prepared, tmp_path, monkeypatch):
    _docs, cfg, _ = prepared
    cfg = dataclasses.replace(cfg, cache_dir=str(tmp_path / "other_cache"))
    calls = []
    real = workers._work

    def dies_on_the_second(args):
        calls.append(args[0])
        if len(calls) == 2:
            raise KeyboardInterrupt  # a kill in the middle
        return real(args)

    import blocklab.data.sources as sources

    monkeypatch.setattr(sources, "ITEM_BYTES", 200)
    monkeypatch.setattr(workers, "_work", dies_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(cfg, BYTE, log=lambda s: None)
    root = Path(cfg.cache_dir)
    assert not [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert not list(root.glob(".tmp-*"))  # the partial build is gone
    monkeypatch.setattr(workers, "_work", real)
    ok = prep.prepare(cfg, BYTE, log=lambda s: None)
    assert prep.verify(ok.path) is None


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete_manifest"])
def test_a_changed_shard_is_found_before_use_and_rebuilt(prepared, damage) -> None:
    docs, cfg, p = prepared
    shard = p.path / "tokens-00000.bin"
    if damage == "flip":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-3])
    else:
        (p.path / "manifest.json").unlink()
    said: list[str] = []
    again = prep.prepare(cfg, BYTE, log=said.append)
    assert again.path == p.path and prep.verify(again.path) is None
    words = {"flip": "sha256 mismatch", "truncate": "truncated",
             "delete_manifest": "no readable manifest"}[damage]
    assert any(words in s and "preparing it again" in s for s in said), said
    assert list(p.path.parent.glob(f"{p.path.name}.corrupt-1"))  # kept for inspection
    corpus = TokenCorpus(again.path)
    assert [corpus.doc(i).tolist() for i in range(len(corpus))] == [full_ids(d) for d in docs]


def test_disk_full_while_preparing_is_named_and_keeps_nothing(prepared, tmp_path, monkeypatch):
    _docs, cfg, _ = prepared
    cfg = dataclasses.replace(cfg, cache_dir=str(tmp_path / "full_cache"))

    def full(f, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(workers, "_write_tokens", full)
    with pytest.raises(StorageError) as e:
        prep.prepare(cfg, BYTE, log=lambda s: None)
    msg = str(e.value.args[-1])
    assert "no space left on device" in msg and "nothing was kept" in msg and "\n" not in msg
    assert e.value.exit_code == 6
    root = Path(cfg.cache_dir)
    assert not [p for p in root.iterdir() if not p.name.endswith(".lock")]


@pytest.mark.slow
def test_processes_preparing_the_same_corpus_at_once_build_it_once(tmp_path: Path) -> None:
    """Whatever the interleaving, one process builds and the others reuse: every process gets
    a valid corpus and exactly one says it prepared it."""
    docs = ascii_docs(list(range(5, 300, 2)))
    files = corpus_files(tmp_path, docs)
    cfg = cfg_for(tmp_path, files)
    code = ("import sys, dataclasses, json; from blocklab.config import *; "
            "from blocklab.data.prepare import prepare, verify; "
            f"cfg = DataConfig(**json.loads({json.dumps(json.dumps(_plain(cfg)))})); "
            "cfg = dataclasses.replace(cfg, name=DataName.text); "
            "p = prepare(cfg, TokenizerConfig(name=TokenizerName.byte)); "
            "assert verify(p.path) is None; print(p.path)")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=SAFETY_S) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1000:] for o in outs]
    assert len({o[0].strip() for o in outs}) == 1
    assert sum("data: prepared" in o[1] for o in outs) == 1


def _plain(cfg: DataConfig) -> dict:
    d = dataclasses.asdict(cfg)
    d.pop("name")
    d.pop("tasks")
    return d


# ----------------------------------------------------------------------------------- pieces


def stream_for(tmp_path, docs, cls=Pieces, **kw):
    cfg = cfg_for(tmp_path, corpus_files(tmp_path, docs), **kw)
    p = prep.prepare(cfg, BYTE, log=lambda s: None)
    return cls(TokenCorpus(p.path), cfg), cfg


def pieces_of(stream: Pieces, table) -> list[tuple[int, ...]]:
    return [tuple(stream._example(table, i).tokens) for i in range(len(table[0]))]


def test_split_pieces_cover_each_document(tmp_path) -> None:
    docs = ascii_docs()
    stream, cfg = stream_for(tmp_path, docs)
    width = cfg.seq_len + 1
    pieces = pieces_of(stream, stream.train) + pieces_of(stream, stream.val)
    assert all(2 <= len(p) <= width for p in pieces)
    expected: Counter = Counter()
    for doc in docs:
        ids = full_ids(doc)
        chunks = [ids[i:i + width] for i in range(0, len(ids), width)]
        if len(chunks[-1]) == 1:  # a lone trailing token has no target: dropped
            chunks.pop()
        expected.update(tuple(c) for c in chunks)
    assert Counter(pieces) == expected
    assert stream.split_documents == sum(len(full_ids(d)) > width for d in docs) > 0


def test_truncate_keeps_the_first_piece_and_counts(tmp_path) -> None:
    docs = ascii_docs()
    stream, cfg = stream_for(tmp_path, docs, long_documents="truncate")
    width = cfg.seq_len + 1
    pieces = pieces_of(stream, stream.train) + pieces_of(stream, stream.val)
    assert sorted(pieces) == sorted(tuple(full_ids(d)[:width]) for d in docs)
    assert stream.truncated_documents == sum(len(full_ids(d)) > width for d in docs) > 0


def test_validation_holds_out_whole_documents(tmp_path) -> None:
    docs = ascii_docs(list(range(10, 200, 3)))
    stream, _ = stream_for(tmp_path, docs, val_fraction=0.2)
    train, val = set(stream.train[0].tolist()), set(stream.val[0].tolist())
    assert train and val and not train & val and train | val == set(range(len(docs)))
    assert 0.05 < len(val) / len(docs) < 0.4
    again, _ = stream_for(tmp_path / "again", docs, val_fraction=0.2)
    assert set(again.val[0].tolist()) == val  # deterministic


def test_epoch_order_is_seeded_and_covers_every_piece(tmp_path) -> None:
    docs = ascii_docs(list(range(10, 120, 2)))
    stream, _ = stream_for(tmp_path, docs)
    n = len(stream.train[0])
    train = sorted(pieces_of(stream, stream.train))
    epochs = [[tuple(stream.train_example(e * n + i).tokens) for i in range(n)] for e in (0, 1)]
    for seen in epochs:
        assert sorted(seen) == train  # every train piece once per epoch
    assert epochs[0] != epochs[1]
    idx = list(range(2 * n))
    random.Random(3).shuffle(idx)  # random access (resume, workers) sees the same stream
    flat = epochs[0] + epochs[1]
    assert all(tuple(stream.train_example(i).tokens) == flat[i] for i in idx)
    ex = stream.train_example(0)
    assert ex.targets == [False] + [True] * (len(ex.tokens) - 1)


def test_too_little_data_is_an_error_with_sizes(tmp_path) -> None:
    with pytest.raises(DataError) as e:
        stream_for(tmp_path, ascii_docs([5, 6, 7, 8]), batch_size=64)
    assert "batch_size=64" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DataError, match=r"too few to hold out the last data\.val_fraction"):
        stream_for(tmp_path / "one", ascii_docs([0]), batch_size=1)  # 5 tokens: 1 held out


# ---------------------------------------------------------------------------------- windows


def test_packed_windows_lay_the_training_documents_end_to_end(tmp_path) -> None:
    docs = ascii_docs(list(range(3, 60, 2)))
    stream, cfg = stream_for(tmp_path, docs, cls=Windows, packing=True, seq_len=15)
    width = cfg.seq_len + 1
    train_stream = [t for d in stream.train_docs.tolist() for t in full_ids(docs[d])]
    windows = [stream._window(stream.train_spans, stream.train_ends, w)
               for w in range(stream.n_train)]
    assert [t for w in windows for t in w.tokens] == train_stream[: stream.n_train * width]
    for w in windows:
        assert len(w.tokens) == width and len(w.segments) == width
        starts = [i for i in range(1, width) if w.segments[i] != w.segments[i - 1]]
        assert all(w.tokens[i] == BOS for i in starts)  # a new segment is a new document
    n = stream.n_train
    seen = sorted(tuple(stream.train_example(i).tokens) for i in range(n))
    assert seen == sorted(tuple(w.tokens) for w in windows)  # once per epoch
    rows = stream.train_rows()  # all at once, as the repro's seen-in-training check reads them
    assert rows.shape == (n, width) and [list(r) for r in rows] == [w.tokens for w in windows]
    from blocklab.objectives import IGNORE, CausalLM

    batch = CausalLM(pack_to=cfg.seq_len).collate([stream.train_example(i) for i in range(4)])
    assert batch["input_ids"].shape == (4, cfg.seq_len) and "segments" in batch
    boundary = batch["segments"][:, 1:] != batch["segments"][:, :-1]
    assert (batch["labels"][:, :-1][boundary] == IGNORE).all()  # nothing across documents


def test_reading_never_loads_the_token_arrays(prepared) -> None:
    _, _cfg, p = prepared
    corpus = TokenCorpus(p.path)
    assert all(isinstance(s, np.memmap) for s in corpus.shards)
    assert json.loads((p.path / "meta.json").read_text())["dtype"] == "uint16"


def test_ddp_ranks_read_disjoint_examples_that_cover_an_epoch(tmp_path) -> None:
    """Ranks take interleaved example indices (data/datamodule.py): over one epoch of pieces,
    two ranks read disjoint pieces that together are every training piece once."""
    from blocklab.data.datamodule import ResumableBatches

    stream, _ = stream_for(tmp_path, ascii_docs(list(range(10, 200, 2))))
    n, batch = len(stream.train[0]), 2
    per_rank = []
    for rank in (0, 1):
        sampler = iter(ResumableBatches(batch, rank=rank, world=2))
        keys = [k for _ in range(n // (2 * batch)) for k, _ in next(sampler)]
        per_rank.append([stream._permuted(k, n) for k in keys])  # which piece each reads
    a, b = per_rank
    assert not set(a) & set(b) and len(set(a)) == len(a) and len(set(b)) == len(b)
    covered = n // (2 * batch) * 2 * batch
    assert sorted(a + b) == sorted(stream._permuted(i, n) for i in range(covered))
    assert covered > n - 2 * batch  # the whole epoch but a last partial batch

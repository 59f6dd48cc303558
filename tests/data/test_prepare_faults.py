"""Corpus preparation at its edges (issue 20): a preparation killed half-way or just before
its rename leaves temporaries the next one removes (and a live preparer's it leaves alone);
memory does not grow with the size of one document; CRLF and lone-CR line ends cut documents
like LF; dictionary-encoded Parquet text columns are text; BPE training on one enormous
"word" finishes and says so."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import blocklab.data.prepare as prep
from blocklab.config import DataConfig, DataName, TokenizerConfig, TokenizerName
from inprocess import SAFETY_S, run_cli

BIN = Path(sys.executable).parent
BYTE = TokenizerConfig(name=TokenizerName.byte)
WORDS = ["the", "king", "queen", "crown", "sword", "river", "castle", "night", "storm", "sea"]


def word_files(d: Path, n_files: int, size: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        words, total = [], 0
        while total < size:
            words.append(rng.choice(WORDS))
            total += len(words[-1]) + 1
        (d / f"f{i:03d}.txt").write_text(" ".join(words) + "\n")
    return d


def leftovers(cache: Path) -> list[Path]:
    """Temporaries of unfinished preparations (corpus folders and tokenizer files)."""
    return sorted(p for p in cache.rglob("*") if ".tmp-" in p.name)


def prepare_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "blocklab-prepare"), *args], capture_output=True,
                          text=True, timeout=SAFETY_S, env={**os.environ, **env})


# ------------------------------------------------------------------------- killed preparations


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "tokenizer", "left"), [
    ("SIGKILL@shard:1", "byte", "tokens-00000.bin"),  # half-way: one shard of three written
    ("SIGKILL@publish:1", "byte", "manifest.json"),  # complete, just before the rename
    ("SIGKILL@publish:1", "bpe", None),  # the trained tokenizer, just before its rename
    ("SIGKILL@publish:1", "char", None),  # the character vocabulary, just before its rename
])
def test_a_killed_preparation_leaves_temporaries_the_next_one_removes(tmp_path, capfd, fault,
                                                                      tokenizer, left):
    cache = tmp_path / "cache"
    args = ["data=text_files", f"data.files=[{word_files(tmp_path / 'src', 25, 100_000)}]",
            f"tokenizer={tokenizer}", "data.num_proc=1", f"data.cache_dir={cache}"]
    if tokenizer == "bpe":
        args += ["tokenizer.vocab_size=300", "tokenizer.sample_bytes=100000"]
    killed = prepare_cli(*args, env={"BLOCKLAB_FAULT": fault})
    assert killed.returncode == -9, killed.stderr[-2000:]
    (tmp,) = leftovers(cache)  # the fault fired where it says: this is what it left
    if left is not None:
        assert tmp.is_dir() and (tmp / left).is_file()
    else:
        assert tmp.parent.name == "tokenizers" and tmp.name.startswith(f".{tokenizer}-")
    again = run_cli(capfd, "blocklab-prepare", *args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert leftovers(cache) == []
    path = Path(again.stdout.split("prepared corpus ", 1)[1].split(": ", 1)[0])
    assert prep.verify(path) is None and path.parent == cache
    if left is not None:  # the same corpus the killed one was building
        assert tmp.name.startswith(f".tmp-{path.name}-")


def test_a_live_preparers_temporaries_are_left_alone(tmp_path) -> None:
    """A temporary whose lock is held belongs to a live preparer (of another corpus): kept;
    one whose lock is free is a dead one's: removed, whichever corpus it was. (flock locks
    belong to open file descriptions, so a lock held here is as foreign as another process's.)
    """
    cache = tmp_path / "cache"
    cfg = DataConfig(name=DataName.text, files=[str(word_files(tmp_path / "src", 3, 2000))],
                     cache_dir=str(cache), num_proc=1, seq_len=8, batch_size=2)
    live, dead = cache / ".tmp-00112233aabbccdd-424242", cache / ".tmp-99887766aabbccdd-434343"
    dead_tok = cache / "tokenizers" / ".bpe-5566778899aabbcc.json.tmp-444444"
    for d in (live, dead):
        d.mkdir(parents=True)
        (d / "tokens-00000.bin").write_bytes(b"\0" * 64)
    dead_tok.parent.mkdir()
    dead_tok.write_text("{}")
    fd = os.open(cache / ".00112233aabbccdd.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # someone is preparing 00112233aabbccdd right now
        p = prep.prepare(cfg, BYTE, log=lambda s: None)
        assert live.is_dir() and (live / "tokens-00000.bin").is_file()
        assert not dead.exists() and not dead_tok.exists()
    finally:
        os.close(fd)  # ... and now it has stopped (killed: the kernel drops its lock)
    assert prep.prepare(cfg, BYTE, log=lambda s: None).path == p.path  # reused, and swept
    assert leftovers(cache) == []


class SimulatedKill(BaseException):
    """Stands in for the process dying: not an error, so nothing cleans up."""


def test_a_kill_inside_the_writer_before_the_rename_publishes_nothing(tmp_path, monkeypatch):
    """Prepared corpora are written by files.write_dir_atomic: killed at its ``dir-filled``
    point (complete, not yet renamed), nothing is published; the next preparation removes the
    temporary and builds the corpus."""
    from blocklab import files

    cache = tmp_path / "cache"
    cfg = DataConfig(name=DataName.text, files=[str(word_files(tmp_path / "src", 3, 2000))],
                     cache_dir=str(cache), num_proc=1, seq_len=8, batch_size=2)

    def kill(point: str, n: int) -> None:
        if point == "dir-filled":
            raise SimulatedKill

    monkeypatch.setattr(files, "maybe_fault", kill)
    with pytest.raises(SimulatedKill):
        prep.prepare(cfg, BYTE, log=lambda s: None)
    monkeypatch.undo()
    (tmp,) = leftovers(cache)
    assert (tmp / "manifest.json").is_file()
    assert not [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")]
    p = prep.prepare(cfg, BYTE, log=lambda s: None)
    assert leftovers(cache) == [] and prep.verify(p.path) is None
    assert tmp.name == f".tmp-{p.path.name}-{os.getpid()}"


# --------------------------------------------------------------------------- long documents

RSS = """
import json, resource, sys
from blocklab.config import DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.data.prepare import prepare
cfg = DataConfig(name=DataName.text, files=[sys.argv[1]], cache_dir=sys.argv[2], num_proc=1,
                 documents="line", seq_len=128, batch_size=1)
p = prepare(cfg, TokenizerConfig(name=TokenizerName.byte), log=lambda s: None)
print(json.dumps({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "tokens": p.meta["tokens"], "documents": p.meta["documents"]}))
"""


@pytest.mark.slow
def test_memory_does_not_grow_with_the_size_of_one_document(tmp_path) -> None:
    """One line of 2 MB, then of 20 MB (data.documents=line): the peak RSS of the preparing
    process stays within 1.25x. (Before: 0.54 GB and 4.7 GB — every id of the document in a
    Python list and the tokenizer's Encoding of all of it, ~230 bytes a token.)"""
    import json

    out = {}
    for mb in (2, 20):
        f = word_files(tmp_path / f"src{mb}", 1, mb * 1_000_000) / "f000.txt"
        with f.open("a") as fh:
            fh.write("and a short second line\n")
        r = subprocess.run([sys.executable, "-c", RSS, str(f), str(tmp_path / f"cache{mb}")],
                           capture_output=True, text=True, timeout=SAFETY_S)
        assert r.returncode == 0, r.stderr[-3000:]
        out[mb] = json.loads(r.stdout.strip().splitlines()[-1])
    assert out[20]["documents"] == 2 and out[20]["tokens"] > 9 * out[2]["tokens"]
    assert out[20]["peak"] < 1.25 * out[2]["peak"], out


def test_a_long_document_tokenizes_as_a_whole(tmp_path, monkeypatch) -> None:
    """Cut into pieces before a word (data/sources.py), a document of many pieces gets the
    ids a byte-level BPE gives it whole — spaces, runs of spaces and newlines included."""
    import blocklab.data.plaintext as plaintext
    import blocklab.data.sources as sources
    from blocklab.data.shards import TokenCorpus
    from blocklab.data.tokenizer import train_bpe

    monkeypatch.setattr(plaintext, "PIECE_CHARS", 1000)
    monkeypatch.setattr(plaintext, "CUT_WINDOW", 100)
    rng = random.Random(3)
    seps = [" ", " ", " ", "  ", "   ", "\t", " \n", ". ", ", "]
    doc = "".join(rng.choice(WORDS) + rng.choice(seps) for _ in range(6000))  # ~40k chars
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "long.txt").write_text(doc)
    tok = train_bpe(TokenizerConfig(name=TokenizerName.bpe, vocab_size=400), [doc[:20_000]])
    tok_file = tmp_path / "tokenizer.json"
    tok.save(str(tok_file))
    cfg = DataConfig(name=DataName.text, files=[str(tmp_path / "src")], num_proc=1,
                     cache_dir=str(tmp_path / "cache"), seq_len=8, batch_size=1)
    p = prep.prepare(cfg, TokenizerConfig(name=TokenizerName.file, path=str(tok_file)),
                     log=lambda s: None)
    ids = TokenCorpus(p.path).doc(0).tolist()
    assert ids[1:-1] == tok.encode(doc, add_special_tokens=False).ids
    assert (ids[0], ids[-1]) == (p.specials.bos, p.specials.eos)
    pieces = list(sources.read_pieces(sources.plan(cfg, [tmp_path / "src" / "long.txt"])[0],
                                      cfg, sources.ReadStats()))
    assert len(pieces) > 30 and all(len(t) <= 1000 for t, _ in pieces)
    assert [last for _, last in pieces] == [False] * (len(pieces) - 1) + [True]


# -------------------------------------------------------------------------------- line ends


def lf_text(n_paragraphs: int = 400) -> str:
    rng = random.Random(5)
    words = [*WORDS, "naïve", "café", "日本語", "🎉", "x" * 40]
    paragraphs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(1, 9)))
                            for _ in range(rng.randint(1, 4))) for _ in range(n_paragraphs)]
    return "\n\n".join(paragraphs) + "\n"


LF_DOCUMENTS = {
    "file": lambda t: [t],
    "line": lambda t: [s for s in t.split("\n") if s],
    "paragraph": lambda t: t.split("\n\n"),
}


@pytest.mark.parametrize("small", [False, True], ids=["whole", "cut-everywhere"])
@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
@pytest.mark.parametrize("mode", ["file", "line", "paragraph"])
def test_crlf_and_lone_cr_line_ends_give_the_documents_of_lf(tmp_path, monkeypatch, mode, end,
                                                             small) -> None:
    """Each data.documents mode reads a CRLF or CR file as the same documents (and counts) as
    its LF twin — also when work items, read blocks and pieces cut the file everywhere (a
    block end between CR and LF, or inside a UTF-8 sequence)."""
    import blocklab.data.plaintext as plaintext
    import blocklab.data.sources as sources
    from blocklab.data.sources import ReadStats, plan, read_documents, resolve_files

    if small:
        monkeypatch.setattr(sources, "ITEM_BYTES", 4096)
        for name, value in (("BLOCK_BYTES", 333), ("PIECE_CHARS", 50), ("CUT_WINDOW", 20)):
            monkeypatch.setattr(plaintext, name, value)
    text = lf_text()
    f = tmp_path / "t.txt"
    f.write_bytes(text.replace("\n", end).encode())
    cfg = DataConfig(name=DataName.text, files=[str(f)], documents=mode)
    stats = ReadStats()
    items = plan(cfg, resolve_files(cfg))
    assert len(items) > 10 if small and mode != "file" else len(items) == 1
    docs = [d for item in items for d in read_documents(item, cfg, stats)]
    assert docs == LF_DOCUMENTS[mode](text)
    blank_lines = text.count("\n\n") if mode == "line" else 0  # empty documents, dropped
    assert (stats.documents, stats.empty_dropped) == (len(docs), blank_lines)
    assert stats.bytes == f.stat().st_size
    if mode == "paragraph" and not small:  # the case, through a preparation
        p = prep.prepare(dataclasses.replace(cfg, cache_dir=str(tmp_path / "cache")), BYTE,
                         log=lambda s: None)
        assert p.meta["documents"] == 400


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
def test_json_lines_with_crlf_or_lone_cr_line_ends(tmp_path, end) -> None:
    import json

    from blocklab.data.sources import ReadStats, plan, read_documents

    rows = [{"text": f"record {i}\nwith a newline inside"} for i in range(30)]
    f = tmp_path / "r.jsonl"
    f.write_bytes("".join(json.dumps(r) + end for r in rows).encode())
    cfg = DataConfig(name=DataName.text, files=[str(f)], format="json")
    stats = ReadStats()
    docs = [d for item in plan(cfg, [f]) for d in read_documents(item, cfg, stats)]
    assert docs == [r["text"] for r in rows] and stats.bytes == f.stat().st_size


# ---------------------------------------------------------------------------------- parquet


def test_a_dictionary_encoded_text_column_is_text(tmp_path) -> None:
    """pandas' category dtype is stored as a dictionary-encoded column: still text. A
    dictionary of numbers is still refused."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from blocklab.data.sources import ReadStats, plan, read_documents
    from blocklab.errors import DataError

    texts = [["red shoes", "blue hat", None, "green coat"][i % 4] for i in range(40)]
    table = pa.table({"text": pa.array(texts).dictionary_encode(),
                      "large": pa.array(texts, pa.large_string()).dictionary_encode(),
                      "n": pa.array([i % 3 for i in range(40)]).dictionary_encode()})
    f = tmp_path / "t.parquet"
    pq.write_table(table, f, row_group_size=16)
    assert pa.types.is_dictionary(pq.ParquetFile(f).schema_arrow.field("text").type)

    def docs(key: str, path: Path = f) -> list[str]:
        cfg = DataConfig(name=DataName.text, files=[str(path)], format="parquet", text_key=key)
        return [d for i in plan(cfg, [path]) for d in read_documents(i, cfg, ReadStats())]

    assert docs("text") == docs("large") == [t for t in texts if t]
    with pytest.raises(DataError, match=r"data.text_key='n': the column holds .* not text"):
        docs("n")
    pd = pytest.importorskip("pandas")
    pd.DataFrame({"text": pd.Categorical(texts)}).to_parquet(tmp_path / "pd.parquet")
    assert docs("text", tmp_path / "pd.parquet") == [t for t in texts if t]


# ------------------------------------------------------------------------------ BPE training


@pytest.mark.slow
def test_bpe_training_on_one_enormous_word_finishes_and_says_so(tmp_path) -> None:
    """A corpus that is one 3 MB "word" (no space): BPE training took time quadratic in the
    word's length (0.4 MB: 59 s; 3 MB: about an hour) and said nothing. Now the long run is cut
    into pieces for training, which a line says, and it takes seconds. (The 600 s timeout is
    only a safety net.) Without a terminal, the lines still come."""
    rng = random.Random(0)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "word.txt").write_text("".join(rng.choice("abcdefghij")
                                                       for _ in range(3_000_000)))
    r = prepare_cli("data=text_files", f"data.files=[{tmp_path / 'src'}]", "tokenizer=bpe",
                    "tokenizer.vocab_size=300", f"data.cache_dir={tmp_path / 'cache'}",
                    "data.num_proc=1", env={})
    assert r.returncode == 0, r.stderr[-2000:]
    said = r.stderr.splitlines()
    assert any("3.0 MB of it in runs of over 512 characters without a space, cut into pieces"
               in s for s in said), said
    assert any(s.startswith("tokenizer: trained a BPE of 300 tokens in ") for s in said), said
    assert "1 documents" in r.stdout


def test_bpe_training_without_a_terminal_is_never_silent_for_long(monkeypatch) -> None:
    """Every HEARTBEAT_S seconds a line says what the trainer is doing. (Deterministic: the
    sample's reader waits until the heartbeat has spoken; the 300 s wait is a safety net.)"""
    import threading

    import blocklab.data.tokenizer as tokenizer

    monkeypatch.setattr(tokenizer, "HEARTBEAT_S", 0.01)
    said: list[str] = []
    spoke = threading.Event()

    def log(line: str) -> None:
        said.append(line)
        if "reading the sample" in line:
            spoke.set()

    def documents():
        yield "the king and the queen " * 50
        assert spoke.wait(300), said
        yield "the sword and the crown " * 50

    tok = tokenizer.train_bpe(TokenizerConfig(name=TokenizerName.bpe, vocab_size=300),
                              documents(), log=log)
    assert tok.get_vocab_size() <= 300
    assert any(s.startswith("tokenizer: reading the sample (0.0 MB so far) ... ") for s in said)
    assert said[-1].startswith("tokenizer: trained a BPE of ")
    assert any(s.startswith("tokenizer: sample read (0.0 MB); computing merges") for s in said)


# ------------------------------------------------------------- what the last audit passed


def test_invalid_utf8_across_read_blocks_is_counted_and_located_as_in_one(tmp_path,
                                                                          monkeypatch) -> None:
    """Read in blocks of 7 bytes, a file with multi-byte characters and invalid sequences on
    every side of a block end decodes, counts and (strict) names the byte offset as one read."""
    import blocklab.data.plaintext as plaintext
    from blocklab.data.sources import ReadStats, plan, read_documents
    from blocklab.errors import DataError

    raw = "é日🎉a".encode() * 40 + b"\xe6\x97" + "ok é".encode() + b"\xff\xc3(" + b"\xf0\x9f"
    f = tmp_path / "bad.txt"
    f.write_bytes(raw)
    cfg = DataConfig(name=DataName.text, files=[str(f)])
    whole = raw.decode("utf-8", errors="replace")
    first_bad = len("é日🎉a".encode()) * 40
    for block in (1 << 20, 7, 1):
        monkeypatch.setattr(plaintext, "BLOCK_BYTES", block)
        stats = ReadStats()
        assert [d for i in plan(cfg, [f]) for d in read_documents(i, cfg, stats)] == [whole]
        assert stats.invalid_utf8 == whole.count("\ufffd") == 4 and stats.bytes == len(raw)
        strict = dataclasses.replace(cfg, utf8_errors="strict")
        with pytest.raises(DataError, match=rf"bad.txt: invalid UTF-8 at byte offset "
                                            rf"{first_bad} "):
            list(read_documents(plan(strict, [f])[0], strict, ReadStats()))


def test_an_empty_json_array_is_named_in_one_line(tmp_path) -> None:
    from blocklab.errors import DataError

    f = tmp_path / "empty.json"
    f.write_text("[]\n")
    cfg = DataConfig(name=DataName.text, files=[str(f)], format="json",
                     cache_dir=str(tmp_path / "cache"), num_proc=1)
    with pytest.raises(DataError) as e:
        prep.prepare(cfg, BYTE, log=lambda s: None)
    msg = str(e.value)
    assert "no documents at all" in msg and str(f) in msg and "\n" not in msg
    assert e.value.exit_code == 3 and leftovers(tmp_path / "cache") == []


def test_ten_thousand_tiny_files_are_ten_thousand_documents(tmp_path) -> None:
    from blocklab.data.shards import TokenCorpus

    d = tmp_path / "tiny"
    d.mkdir()
    for i in range(10_000):
        (d / f"{i:05d}.txt").write_text(f"doc {i}\r\n")
    cfg = DataConfig(name=DataName.text, files=[str(d)], cache_dir=str(tmp_path / "cache"),
                     num_proc=1)
    p = prep.prepare(cfg, BYTE, log=lambda s: None)
    assert p.meta["documents"] == 10_000 and p.meta["shards"] == 1
    corpus = TokenCorpus(p.path)
    assert len(corpus) == 10_000 and corpus.lengths[123] == len("doc 123\n") + 2

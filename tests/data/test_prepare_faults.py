"""Corpus preparation at its edges (issue 20): a preparation killed half-way or just before
its rename leaves temporaries the next one removes (and a live preparer's it leaves alone);
memory does not grow with the size of one document; CRLF and lone-CR line ends cut documents
like LF; dictionary-encoded Parquet text columns are text; BPE training on one enormous
"word" finishes and says so."""

from __future__ import annotations

import fcntl
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import blocklab.data.prepare as prep
from blocklab.config import DataConfig, DataName, TokenizerConfig, TokenizerName
from inprocess import run_cli

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
                          text=True, timeout=600, env={**os.environ, **env})


# ------------------------------------------------------------------------- killed preparations


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "tokenizer", "left"), [
    ("SIGKILL@shard:1", "byte", "tokens-00000.bin"),  # half-way: one shard of three written
    ("SIGKILL@publish:1", "byte", "manifest.json"),  # complete, just before the rename
    ("SIGKILL@publish:1", "bpe", None),  # the trained tokenizer, just before its rename
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
        assert tmp.parent.name == "tokenizers" and tmp.name.startswith(".bpe-")
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

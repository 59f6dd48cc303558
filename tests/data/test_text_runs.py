"""Text corpora end to end, as users run them: exact resume on memory-mapped shards, DDP ranks
sharing one prepared corpus (prepared once, not per rank), a tokenizer the user already has —
with its own special ids — through training, checkpoint, evaluation and text-space probes, and
memory that does not grow with the corpus."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from inprocess import SAFETY_S, run_cli
from train.test_train_cli import BIN, losses

pytestmark = pytest.mark.slow


def corpus(tmp_path: Path, n_files: int = 40, words: int = 300, seed: int = 0) -> Path:
    rng = random.Random(seed)
    vocab = ["the", "king", "queen", "crown", "sword", "river", "castle", "night", "day", "storm", "love", "war", "peace", "fool", "wise", "old", "young", "green", "gold", "bright", "dark", "sea", "moon", "sun", "star"]
    d = tmp_path / "corpus"
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        lines = [" ".join(rng.choice(vocab) for _ in range(rng.randint(4, 12))) + "."
                 for _ in range(words // 8)]
        (d / f"doc{i:03d}.txt").write_text("\n".join(lines) + "\n")
    return d


def cli(*args: str, env: dict | None = None, tool: str = "blocklab-train"
        ) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True,
                          timeout=SAFETY_S, env={**os.environ, **(env or {})})


def text_args(tmp_path: Path, data_dir: Path, *extra: str) -> list[str]:
    return ["data=text_files", f"data.files=[{data_dir}]", "tokenizer=byte",
            f"data.cache_dir={tmp_path / 'cache'}", "data.seq_len=64", "data.batch_size=4",
            "model=llama_tiny", "model.vocab_size=null", "model.n_layers=1", "model.d_model=64", "model.n_heads=2",
            "model/attention=mqa", "model.d_ff=128", "model.dropout=0.1",
            "trainer.max_steps=12", "trainer.ckpt_every_steps=6", "trainer.val_every_steps=6",
            "trainer.log_every_steps=1", "trainer.progress_bar=false", "probes=none",
            "checkpoint_probes.enabled=false", *extra]


@pytest.mark.parametrize("packing", ["false", "true"])
def test_resume_on_prepared_shards_is_exact(tmp_path, packing):
    data = corpus(tmp_path)
    args = text_args(tmp_path, data, f"data.packing={packing}")
    straight = cli(*args, f"run_dir={tmp_path / 'straight'}")
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "data: prepared" in straight.stderr  # the first run prepares ...
    run = tmp_path / "run"
    first = cli(*args, f"run_dir={run}", env={"BLOCKLAB_FAULT": "SIGKILL@step:9"})
    assert first.returncode == -9
    assert "data: prepared" not in first.stderr  # ... the others reuse it
    again = cli(*args, f"resume={run}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert losses(run) == losses(tmp_path / "straight") and len(losses(run)) == 12


def test_ddp_ranks_share_one_prepared_corpus(tmp_path):
    data = corpus(tmp_path, n_files=60)
    r = cli(*text_args(tmp_path, data, "trainer=ddp", "trainer.devices=2",
                       f"run_dir={tmp_path / 'ddp'}"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("data: prepared") == 1  # rank 0 prepared; rank 1 reused it
    assert len(losses(tmp_path / "ddp")) == 12


def _foreign(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    texts = [p.read_text() for p in sorted((tmp_path / "corpus").iterdir())]
    t.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    t.add_special_tokens(["<|endoftext|>"])
    d = tmp_path / "gpt2_like"
    d.mkdir()
    t.save(str(d / "tokenizer.json"))
    (d / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}))
    return d


def test_a_foreign_tokenizer_trains_checkpoints_evaluates_and_probes(tmp_path, capfd):
    """(The commands run in process: tests/inprocess.py.)"""
    data = corpus(tmp_path)
    tok_dir = _foreign(tmp_path)
    run = tmp_path / "run"
    args = [a for a in text_args(tmp_path, data, f"run_dir={run}") if a != "tokenizer=byte"]
    r = run_cli(capfd, "blocklab-train", *args, "tokenizer=file", f"tokenizer.path={tok_dir}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "<pad> added as id" in r.stderr and "<mask> added as id" in r.stderr
    meta = json.loads((run / "checkpoints" / "step-000012" / "meta.json").read_text())
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    assert meta["specials"]["bos"] == meta["specials"]["eos"] == eot != 1
    assert meta["specials"]["pad"] > eot and meta["config"]["model"]["vocab_size"] == \
        tok.get_vocab_size() + 2
    ev = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=text", "run_data=true",
                 "probes.needle.lengths=[1.0]", "probes.needle.n=2",
                 "probes.needle.depths=[0.5]", "probes.litm.enabled=false",
                 "probes.perplexity.lengths=[1.0]", "probes.perplexity.tokens=64",
                 "probes.train_length=600", "probes.text.max_new_tokens=4",
                 f"out={tmp_path / 'eval'}")
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "val/loss" in ev.stdout
    # the run's corpus was prepared with the checkpoint's tokenizer under out=, nowhere else
    assert (tmp_path / "eval" / "data-cache").is_dir()
    (probe_dir,) = [p for p in (tmp_path / "eval").iterdir()
                    if p.is_dir() and p.name != "data-cache"]
    examples = (probe_dir / "examples.csv").read_text()
    assert "needle" in examples  # text-space probes ran through the foreign tokenizer


RSS = """
import json, resource, sys
from blocklab.config import DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.data.prepare import prepare
from blocklab.data.shards import Pieces, TokenCorpus
cfg = DataConfig(name=DataName.text, files=[sys.argv[1]], cache_dir=sys.argv[2], num_proc=1,
                 seq_len=128, batch_size=8)
p = prepare(cfg, TokenizerConfig(name=TokenizerName.byte), log=lambda s: None)
after_prepare = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
s = Pieces(TokenCorpus(p.path), cfg)
n = len(s.train[0])
for i in range(0, 20 * n, n // 50 + 1):  # read examples from across the whole corpus
    s.train_example(i % (20 * n))
print(json.dumps({"prepare": after_prepare, "read": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss, "tokens": p.meta["tokens"]}))
"""


def test_memory_does_not_grow_with_the_corpus(tmp_path):
    """Preparation streams (bounded work items) and reading maps the shards: peak RSS at a
    corpus 10x larger stays within 1.5x (a corpus held in memory would grow ~10x)."""
    out = {}
    for mb in (2, 20):
        d = tmp_path / f"c{mb}"
        d.mkdir()
        line = ("the quick brown fox jumps over the lazy dog " * 20 + "\n") * 120  # ~108 kB
        for i in range(int(mb * 1e6 / len(line))):
            (d / f"f{i:04d}.txt").write_text(line)
        r = subprocess.run([sys.executable, "-c", RSS, str(d), str(tmp_path / f"cache{mb}")],
                           capture_output=True, text=True, timeout=SAFETY_S)
        assert r.returncode == 0, r.stderr[-3000:]
        out[mb] = json.loads(r.stdout.strip().splitlines()[-1])
    assert out[20]["tokens"] > 9 * out[2]["tokens"]
    assert out[20]["prepare"] < 1.5 * out[2]["prepare"], out
    assert out[20]["read"] < 1.5 * out[2]["read"], out


def test_blocklab_prepare_prepares_once(tmp_path, capfd):
    """The first preparation is the real command; the second (which finds the first's shards
    on disk: it shares nothing in memory with it) and the refusal run in process."""
    data = corpus(tmp_path, n_files=10)
    args = ["data=text_files", f"data.files=[{data}]", "tokenizer=byte",
            f"data.cache_dir={tmp_path / 'cache'}"]
    first = cli(*args, tool="blocklab-prepare")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "data: prepared" in first.stderr and first.stdout.startswith("prepared corpus ")
    second = run_cli(capfd, "blocklab-prepare", *args)
    assert second.returncode == 0 and "data: prepared" not in second.stderr
    assert second.stdout == first.stdout  # the same corpus, reused
    bad = run_cli(capfd, "blocklab-prepare", "data=retrieval_mix")
    assert bad.returncode == 2 and "only text data is prepared" in bad.stderr

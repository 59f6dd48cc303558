"""data.name=babilong (blocklab.data.babilong_train): each example is BOS + the BABILong prompt +
the answer, targets on the answer's tokens only, within the length drawn; the independent solver
(babi_solver.py) answers from the decoded prompt alone; seeded and deterministic; training and
validation disjoint (other stories, other haystack text: validation reads the end of it); the
curriculum caps lengths; the fingerprint follows what makes the examples; the config rules are
one-line errors; and a tiny run trains and evaluates end to end through blocklab-train and
blocklab-eval. Negative controls: a haystack too short for the validation part, a min_len too
short for the stories, and a sentence naming a label never reaching an example."""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

import pytest
from babi_solver import is_fact, solve

from blocklab.config import ConfigError, DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.config.choices import BABILONG_MIN_FACTS, BABILONG_TASKS
from blocklab.data.babi import MIN_FACTS, TASKS
from blocklab.data.babilong_train import VAL_SHARE
from blocklab.data.streams import build_streams
from blocklab.data.tokenizer import tokenizer_from_json
from inprocess import run_cli

WORDS = ("amber", "anchor", "badger", "banjo", "beetle", "cello", "comet", "donkey", "falcon",
         "ginger", "harp", "igloo", "jelly", "kettle", "lemon", "magnet", "nectar", "otter",
         "pepper", "quartz", "raven", "saddle", "tulip", "velvet", "walnut", "zebra")


def haystack(tmp_path, n: int = 3000) -> str:
    """A text file of n distinct sentences (numbered by their words), some naming labels."""
    rng = random.Random(0)
    lines = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12)))
        lines.append(f"Sentence {'abcdefghij'[i % 10]}{'abcdefghij'[i // 10 % 10]}"
                     f"{'abcdefghij'[i // 100 % 10]}{'abcdefghij'[i // 1000]} tells of {words}.")
        if i % 7 == 0:
            lines.append("The kitchen of the Office was bright.")  # must never be used
    path = tmp_path / "hay.txt"
    path.write_text(" ".join(lines))
    return str(path)


def config(hay: str, **kw) -> DataConfig:
    return DataConfig(**{"name": DataName.babilong, "haystack": hay, "seq_len": 1024,
                         "min_len": 512, "batch_size": 4, "babilong_facts": 6,
                         "babilong_tasks": list(TASKS), **kw})


BYTE = TokenizerConfig(name=TokenizerName.byte)


def test_examples(tmp_path) -> None:
    hay = haystack(tmp_path)
    s = build_streams(config(hay), BYTE)
    tok = tokenizer_from_json(s.tokenizer)
    text = Path(hay).read_text()
    sentences = re.split(r"(?<=\.) ", text)
    val_start = sentences[int(len(sentences) * (1 - VAL_SHARE)) - 10]
    seen_tasks = set()
    for part, stream in (("train", s.train), ("val", s.val)):
        for i in range(40):
            x = stream(i, None)
            assert x == stream(i, None)  # seeded
            assert x.tokens[0] == s.specials.bos and len(x.tokens) <= 1024
            assert len(x.tokens) >= 512 - 8  # within a few tokens of a length >= min_len
            k = x.answer_start
            assert all(x.targets[k:]) and not any(x.targets[:k])
            prompt, answer = tok.decode(x.tokens[1:k]), tok.decode(x.tokens[k:])
            assert answer == " " + x.meta["answer"]
            context, question = prompt.removesuffix(" Answer:").rsplit("\n\n", 1)
            units = [u for u in re.split(r"(?<=[.!?]) ", context) if u]
            facts = [u for u in units if is_fact(u)]
            assert solve(facts, question) == x.meta["answer"]
            assert "kitchen of the Office" not in context
            seen_tasks.add(x.meta["task"])
            # validation reads the end of the haystack, training never does
            first = next(u for u in units if u.startswith("Sentence"))
            at = text.index(first)
            assert (at >= text.index(val_start)) == (part == "val")
    assert seen_tasks == set(TASKS)
    train = {tuple(s.train(i, None).tokens) for i in range(40)}
    assert not train & {tuple(s.val(i, None).tokens) for i in range(40)}


def test_curriculum_and_fingerprint(tmp_path) -> None:
    hay = haystack(tmp_path)
    cfg = config(hay, min_len=256, curriculum=[[0, 320], [100, 600]], seq_len=800,
                 babilong_tasks=["qa1"])
    s = build_streams(cfg, BYTE)
    assert all(len(s.train(i, 5).tokens) <= 320 for i in range(16))
    assert max(len(s.train(i, 150).tokens) for i in range(32)) > 400
    base = s.fingerprint
    assert build_streams(cfg, BYTE).fingerprint == base
    for change in ({"babilong_depth": [0.0, 0.5]}, {"babilong_tasks": ["qa1", "qa2"]},
                   {"seed": 1}, {"babilong_facts": 3}, {"haystack": haystack(tmp_path, 2999)}):
        assert build_streams(dataclasses.replace(cfg, **change), BYTE).fingerprint != base
    # 2 facts of ~30 tokens and sentences of up to ~100 in >= 256: within ~0.3 of the span
    for span, ok in (([0.0, 0.1], lambda d: max(d) < 0.4), ([0.9, 1.0], lambda d: min(d) > 0.6)):
        s = build_streams(dataclasses.replace(cfg, babilong_depth=span, babilong_facts=2), BYTE)
        assert all(ok(s.train(i, None).meta["depths"]) for i in range(8))


@pytest.mark.parametrize("key,value,match", [
    ("babilong_tasks", ["qa9"], "data.babilong_tasks=\\['qa9'\\]: one or more of"),
    ("babilong_tasks", [], "data.babilong_tasks=\\[\\]"),
    ("babilong_tasks", ["qa1", "qa1"], "names a task twice"),
    ("babilong_depth", [0.6, 0.2], "data.babilong_depth=\\[0.6, 0.2\\]"),
    ("babilong_depth", [0.0, 1.5], "0 <= lo <= hi <= 1"),
    ("babilong_facts", 2, "data.babilong_facts=2: must be null .* or >= 4"),
    ("packing", True, "data.packing=True"),
    ("segment_mode", "stream", "data.segment_mode='stream'"),
    ("min_len", 2000, "data.min_len=2000"),
    ("val_tasks", ["qa6"], "data.val_tasks=\\['qa6'\\]: every validation task"),
])
def test_config_rules(tmp_path, key, value, match) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        build_streams(config("essay", **{key: value}), BYTE)
    assert "\n" not in str(e.value)


def test_refusals(tmp_path) -> None:
    with pytest.raises(ConfigError, match="synthetic"):
        build_streams(config("essay"), TokenizerConfig(name=TokenizerName.synthetic))
    with pytest.raises(ConfigError, match=r"data.haystack='essay': its validation part"):
        build_streams(config("essay", babilong_tasks=["qa1"]), BYTE)  # 4 sentences
    with pytest.raises(ConfigError, match=r"data.min_len=64: a qa3 story of 20 facts"):
        build_streams(config("essay", min_len=64, babilong_tasks=["qa3"], babilong_facts=None),
                      BYTE)
    with pytest.raises(ConfigError, match=r"data.haystack='.*missing.txt': not essay"):
        build_streams(config(str(tmp_path / "missing.txt")), BYTE)
    assert BABILONG_TASKS == TASKS and BABILONG_MIN_FACTS == MIN_FACTS


def test_a_tiny_run_trains_and_evaluates(tmp_path, capfd) -> None:
    """(The commands run in process: tests/inprocess.py.)"""
    run = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", "data=babilong", "tokenizer=byte",
                f"data.haystack={haystack(tmp_path)}", "data.seq_len=256", "data.min_len=192",
                "data.babilong_facts=3", "data.batch_size=4", "data.val_batches=2",
                "model=llama_tiny", "model.vocab_size=null", "model.n_layers=1",
                "model.d_model=32", "model.n_heads=2", "model/attention=mqa", "model.d_ff=64",
                "trainer.max_steps=4", "trainer.ckpt_every_steps=4", "trainer.val_every_steps=4",
                "trainer.log_every_steps=1", "trainer.progress_bar=false", "probes=none",
                "checkpoint_probes.enabled=false", "schedule.warmup_steps=1", f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "data: babilong qa1" in r.stderr and "val/loss" in r.stdout
    loss = float(re.search(r"val/loss\s+([\d.]+)", r.stdout)[1])
    ev = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none", f"out={tmp_path / 'ev'}")
    assert ev.returncode == 0, ev.stderr[-3000:]
    # the checkpoint's own validation stream, rebuilt from its config and tokenizer
    assert abs(float(re.search(r"val/loss ([\d.]+)", ev.stdout)[1]) - loss) < 2e-3
    bad = run_cli(capfd, "blocklab-train", "data=babilong", "tokenizer=byte",
                  "data.babilong_depth=[0.9,0.1]", f"run_dir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and "data.babilong_depth=[0.9, 0.1]" in bad.stderr


def test_split_mode_reads_whole_items_in_whole_segments(tmp_path, capfd) -> None:
    """data.segment_mode=split: items up to data.doc_len drawn in whole segments of seq_len
    (the curriculum grows the number of segments), each answered from its own text; min_len is
    checked against doc_len; a tiny XL-memory run trains through the segment objective."""
    hay = haystack(tmp_path)
    cfg = config(hay, seq_len=64, doc_len=512, min_len=192, segment_mode="split",
                 babilong_tasks=["qa1"], babilong_facts=3, curriculum=[[0, 256], [5, 512]])
    s = build_streams(cfg, BYTE)
    early = {len(s.train(i, 0).tokens) for i in range(24)}
    late = [len(s.train(i, 10).tokens) for i in range(48)]
    assert max(early) <= 256 and max(late) > 256 and max(late) <= 512
    # each item fills its whole-segment length within a few tokens (the collate pads the rest)
    assert all(n > 64 * (n // 64) - 8 or n % 64 == 0 for n in late)
    assert {-(-n // 64) for n in late} >= {4, 8}
    with pytest.raises(ConfigError, match=r"data.min_len=600: need 8 <= min_len <= doc_len=512"):
        build_streams(dataclasses.replace(cfg, min_len=600), BYTE)
    r = run_cli(capfd, "blocklab-train", "data=babilong", "tokenizer=byte",
                f"data.haystack={hay}", "data.segment_mode=split", "data.seq_len=64",
                "data.doc_len=256", "data.min_len=192", "data.babilong_facts=3",
                "data.batch_size=4", "data.val_batches=2", "model=llama_tiny",
                "model.vocab_size=null", "model.n_layers=1", "model.d_model=32",
                "model.n_heads=2", "model/attention=mqa", "model.d_ff=64", "model.max_seq_len=64",
                "model.mixer.mem_len=64", "trainer.max_steps=2", "trainer.ckpt_every_steps=2",
                "trainer.val_every_steps=2", "trainer.progress_bar=false", "probes=none",
                "checkpoint_probes.enabled=false", "schedule.warmup_steps=1",
                f"run_dir={tmp_path / 'xl'}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "val/loss" in r.stdout

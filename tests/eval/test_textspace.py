"""The text-space builder with a real (byte-level BPE) tokenizer: needles inserted at sentence
boundaries, the prompt tokenized once, the answer tokenized jointly, the needle located by
offsets with its actual token depth, answer and needle exactly once, BOS once at the start,
nothing over the length, N/A when the needle and question cannot fit — and a blocklab model of
each family runs the same probes end to end."""

from __future__ import annotations

import pytest

from blocklab.config import (
    LitmProbeConfig,
    ModelConfig,
    NeedleProbeConfig,
    PerplexityProbeConfig,
    ProbeSpec,
    TokenizerConfig,
    TokenizerName,
)
from blocklab.data.synthetic import BOS
from blocklab.data.tokenizer import train_bpe
from blocklab.eval.backends import BlocklabBackend
from blocklab.eval.kinds.litm import Litm
from blocklab.eval.kinds.needle import Needle
from blocklab.eval.probes import run_spec
from blocklab.eval.textspace import ESSAY, TextBuilder, TextTokenizer
from blocklab.model import build_model


@pytest.fixture(scope="module")
def tok():
    docs = [ESSAY] * 4 + ["The special magic number for Alice is 12345. What is the value?"] * 4
    raw = train_bpe(TokenizerConfig(name=TokenizerName.bpe, vocab_size=600), docs)
    return TextTokenizer.from_tokenizers(raw, bos=BOS, name="bpe")


def spec(**kw) -> ProbeSpec:
    return ProbeSpec(space="text",
                     needle=NeedleProbeConfig(lengths=[2.0, 3.0], depths=[0.0, 0.5, 1.0], n=6,
                                              fillers=["essay"]),
                     litm=LitmProbeConfig(n_records=[4, 8], gold=[0.0, 1.0], n=4), **kw)


def test_needle_items_are_built_in_text_and_tokenized_once(tok):
    s = spec()
    cells = Needle.text_cells(s, TextBuilder(tok, s), 128, None)
    assert all(c.na is None and len(c.items) == 6 for c in cells)
    for c in cells:
        for it in c.items:
            ids = it.prompt + it.answer
            assert ids[0] == BOS and BOS not in ids[1:]  # BOS once, at the start
            assert len(ids) <= c.key["length"]
            text = tok.decode(it.prompt)
            assert text.count(it.answer_text) == 1  # in its needle only, not in the question
            # joint tokenization: prompt + answer is the tokenization of the whole string
            assert tok.encode(tok.decode(it.prompt[1:]) + " " + it.answer_text)[0] == ids[1:]
            assert tok.decode(it.answer).strip() == it.answer_text
            needle_at = it.meta["needle_token"]
            assert tok.decode(it.prompt[needle_at:needle_at + 6]).startswith("The special")
            assert len(it.candidates) == 3 and it.candidates[it.gold] == it.answer
    # actual token depth follows the requested depth
    for length in (256, 384):
        depth = {c.key["depth"]: sum(i.meta["actual_depth"] for i in c.items) / len(c.items)
                 for c in cells if c.key["length"] == length}
        assert depth[0.0] < 0.1 and 0.25 < depth[0.5] < 0.75 and depth[1.0] > 0.9


def test_a_length_too_short_for_needles_and_question_is_not_applicable(tok):
    s = spec()
    s.needle.lengths = [0.1]
    cells = Needle.text_cells(s, TextBuilder(tok, s), 128, None)
    assert all(c.na is not None and c.na.startswith("n/a") and not c.items for c in cells)


def test_litm_records_hold_the_answer_once_and_closed_book_never(tok):
    s = spec()
    cells = Litm.text_cells(s, TextBuilder(tok, s), 0, None)
    variants = {c.key["variant"] for c in cells}
    assert variants == {"kv_records", "query_aware", "closed_book", "oracle"}
    for c in cells:
        for it in c.items:
            text = tok.decode(it.prompt)
            assert text.count(it.answer_text) == (0 if c.key["variant"] == "closed_book" else 1)
            assert len(it.candidates) == min(max(c.key["n_records"], 1), 1 + s.text.margin_candidates)


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_every_family_runs_text_probes_end_to_end(tok, family, tmp_path):
    m = ModelConfig(vocab_size=600, max_seq_len=512)
    m.family.name = family
    model = build_model(m)
    s = spec(perplexity=PerplexityProbeConfig(lengths=[1.0], tokens=256))
    s.text.max_new_tokens = 4
    r = run_spec(BlocklabBackend(model), s, builder=TextBuilder(tok, s), train_length=128,
                 keys={"step": 1}, out_dir=tmp_path / "p", decode=tok.decode)
    assert r.summary["space"] == "text"
    assert all(c["n"] > 0 for c in r.cells if c["probe"] != "perplexity")
    assert all(0 <= c["accuracy"] <= 1 for c in r.cells if c["probe"] != "perplexity")
    assert any(c["probe"] == "perplexity" for c in r.cells) == (family == "decoder")
    assert "generated" in r.examples[0]
    assert (tmp_path / "p" / "niah.png").exists()


@pytest.mark.parametrize("position", ["rope", "learned", "alibi"])
def test_scoring_from_a_shared_prefix_equals_one_pass_per_candidate(tok, position):
    """Each prompt run once into a KV cache, gold and every other answer scored from copies of
    it and the greedy continuation decoded from it, gives every per-example score of the
    reference path (one teacher-forced pass for the gold answers, one per other candidate, a
    separate generation) — on multi-token text answers."""
    from blocklab.eval.scoring import score_items

    m = ModelConfig(vocab_size=600, max_seq_len=512, n_layers=2)
    m.position.name = position
    model = build_model(m).eval()
    s = spec()
    s.text.max_new_tokens = 5
    b = TextBuilder(tok, s)
    items = [it for c in Needle.text_cells(s, b, 128, None) + Litm.text_cells(s, b, 0, None)
             for it in c.items][:24]
    assert any(len(it.answer) > 1 for it in items) and any(len(it.candidates) > 1 for it in items)
    shared = BlocklabBackend(model)
    assert shared.shares_prefix
    reference = BlocklabBackend(model)
    fast = score_items(shared, items, batch_size=8, decode=tok.decode, max_new_tokens=5)
    slow = score_items(_Unshared(reference), items, batch_size=8, decode=tok.decode,
                       max_new_tokens=5)
    assert len(fast) == len(slow) == len(items)
    for f, r in zip(fast, slow):
        assert abs(f["logprob"] - r["logprob"]) < 1e-4 and abs(f["margin"] - r["margin"]) < 1e-4
        assert (f["argmax"], f["exact"], f["rank"], f["any_value"], f["generated"]) == \
            (r["argmax"], r["exact"], r["rank"], r["any_value"], r["generated"])


class _Unshared:
    """A backend without the shared-prefix path (the reference)."""

    shares_prefix = False

    def __init__(self, backend):
        self.b = backend

    def __getattr__(self, name):
        return getattr(self.b, name)

"""The BABILong probe kind, checked against independent readings: every item's facts occur in
the prompt in story order, inside the cell's depth band, with the whole prompt and every label
within the length; the gold label is the answer an independent solver (tests/data/babi_solver)
reads off the prompt text alone; every label is tokenized jointly with the prompt. Forced
choice picks the label of highest total log-prob on a toy backend with known log-probs (a tie
is wrong), on both scoring paths (one pass per candidate, and the shared-prefix path a Hugging
Face model takes — checked equal to it on a tiny Llama); the generation is judged by BABILong's
single-label rule. Negative controls: an oracle answering a different item's story falls to
about chance while the oracle on the item itself scores 1.0; a backend preferring the wrong
label scores 0. End to end: a tiny byte-tokenizer model writes the report and the plots, and a
spec that does not ask for the kind reports and hashes as before."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from tests.data.babi_solver import is_fact, solve

from blocklab.config import (
    BabilongProbeConfig,
    ConfigError,
    LitmProbeConfig,
    ModelConfig,
    NeedleProbeConfig,
    PerplexityProbeConfig,
    ProbeSpec,
    validate_probe_spec,
)
from blocklab.config.probe_schema import BABILONG_TASKS
from blocklab.config.schema import TextProbeConfig
from blocklab.data import babi
from blocklab.data.synthetic import BOS
from blocklab.data.tokenizer import byte_tokenizer
from blocklab.eval.items import ProbeItem, spec_hash
from blocklab.eval.kinds.babilong import BAND_SLACK, Babilong
from blocklab.eval.scoring import score_items
from blocklab.eval.textspace import TextBuilder, TextTokenizer

TRAIN = 512


@pytest.fixture(scope="module")
def tok():
    return TextTokenizer.from_tokenizers(byte_tokenizer(), bos=BOS, name="byte")


def spec(n: int = 3, **kw) -> ProbeSpec:
    p = BabilongProbeConfig(enabled=True, n=n, lengths=[4.0], tasks=["qa1", "qa2", "qa3"],
                            depths=[[0.0, 1.0], [0.0, 0.33], [0.67, 1.0]])
    return ProbeSpec(space="text", needle=NeedleProbeConfig(enabled=False),
                     litm=LitmProbeConfig(enabled=False),
                     perplexity=PerplexityProbeConfig(enabled=False),
                     babilong=replace(p, **kw),
                     text=TextProbeConfig(haystack="shakespeare", max_new_tokens=8))


@pytest.fixture(scope="module")
def built(tok):
    s = spec()
    b = TextBuilder(tok, s)
    return b, Babilong.text_cells(s, b, TRAIN, None)


def story_of(text: str) -> tuple[list[str], str]:
    """(the fact sentences, the question) read off a plain prompt's text alone."""
    context, tail = text.rsplit("\n\n", 1)
    question = tail.removesuffix(" Answer:")
    facts = []
    for chunk in re.split(r"(?<=[.!?]) ", context):  # a fact ends each chunk it is in
        words = chunk.split(" ")
        tails = [" ".join(words[k:]) for k in range(max(0, len(words) - 10), len(words))]
        facts += [t for t in tails if is_fact(t)][:1]
    return facts, question


def test_items_hold_their_story_in_order_within_the_length_and_band(tok, built):
    _, cells = built
    assert {c.key["task"] for c in cells} == {"qa1", "qa2", "qa3"}
    assert all(c.na is None and len(c.items) == 3 for c in cells)
    for c in cells:
        lo, hi = c.key["depth_lo"], c.key["depth_hi"]
        for it in c.items:
            assert it.prompt[0] == BOS and BOS not in it.prompt[1:]
            assert len(it.prompt) + max(map(len, it.candidates)) <= c.key["length"]
            assert len(it.prompt) + max(map(len, it.candidates)) >= c.key["length"] - 40
            text = tok.decode(it.prompt[1:])
            facts, question = story_of(text)
            assert question == it.question and text.endswith(" Answer:")
            # the gold label is what an independent solver reads off the text alone
            assert solve(facts, question) == it.answer_text == it.labels[it.gold]
            assert it.labels == list(babi.TASK_LABELS[c.key["task"]])
            # every label tokenized jointly with the prompt (gold = the answer tokens)
            for label, cand in zip(it.labels, it.candidates):
                ids = tok.encode(text + " " + label)[0]
                assert ids == it.prompt[1:] + cand
            assert it.candidates[it.gold] == it.answer
            assert all(lo - BAND_SLACK <= d <= hi + BAND_SLACK for d in it.meta["fact_depths"])
            assert it.meta["fact_depths"] == sorted(it.meta["fact_depths"])


def test_facts_appear_in_story_order(built):
    """The story's facts (re-drawn from the item's seed) occur in the prompt in their order."""
    from blocklab.data.synthetic import example_rng

    b, cells = built
    c = next(c for c in cells if c.key["task"] == "qa3")
    for i, it in enumerate(c.items):
        story = babi.story("qa3", example_rng(9999, i, f"probe:text-babilong:qa3:{TRAIN * 4}"))
        text = b.tok.decode(it.prompt[1:])
        at = -1
        for f in story.facts:
            at = text.index(f, at + 1)
        assert story.question == it.question


def test_same_stories_at_every_band(built):
    _, cells = built
    qa2 = [c for c in cells if c.key["task"] == "qa2"]
    assert len({tuple(it.question for it in c.items) for c in qa2}) == 1


def test_a_band_the_story_cannot_fit_is_not_applicable(tok):
    s = spec(lengths=[0.5], tasks=["qa3"], depths=[[0.0, 0.1]])
    cells = Babilong.text_cells(s, TextBuilder(tok, s), TRAIN, None)
    assert cells[0].na is not None and cells[0].na.startswith("n/a: ") and not cells[0].items


# ------------------------------------------------------------------------------- scoring


class Toy:
    """A backend with known log-probs: a candidate's tokens get ``table[tuple(tokens)]`` in
    total (spread over its tokens); greedy returns ``reply`` (token ids)."""

    name, family, supports_perplexity = "toy", "decoder", False

    def __init__(self, table: dict[tuple, float], reply: list[int], vocab: int = 300):
        self.table, self.reply, self.vocab = table, reply, vocab

    def max_length(self):
        return None

    def _dist(self, prefix_last: int | None, pos: int, ans: list[int]) -> torch.Tensor:
        out = torch.full((self.vocab,), -50.0)
        if pos < len(ans):
            out[ans[pos]] = self.table.get(tuple(ans), -20.0) / len(ans)
        return out

    def answer_logprobs(self, prompts, answers):
        a = max(map(len, answers))
        logp = torch.zeros(len(answers), a, self.vocab)
        mask = torch.zeros(len(answers), a, dtype=torch.bool)
        for i, ans in enumerate(answers):
            for j in range(len(ans)):
                logp[i, j], mask[i, j] = self._dist(None, j, ans), True
        return logp, mask

    def greedy(self, prompts, n):
        return [list(self.reply) for _ in prompts]


class ToyPrefix(Toy):
    """The same model through ``score_from_prefix`` (and no ``shares_prefix``: the path a
    Hugging Face model takes for label items)."""

    def score_from_prefix(self, prompts, answer_sets, n):
        return [([torch.stack([self._dist(None, j, a) for j in range(len(a))]) for a in answers],
                 list(self.reply)) for answers in answer_sets]


def label_item(tok, labels, gold, question="Where is Mary?") -> ProbeItem:
    prompt = tok.encode("Mary went to the garden.\n\n" + question + " Answer:")[0]
    cands = [tok.encode(" " + x)[0] for x in labels]
    return ProbeItem(cell={"probe": "t"}, prompt=prompt, answer=cands[gold], candidates=cands,
                     gold=gold, answer_text=labels[gold], labels=list(labels),
                     question=question)


LABELS = ["bathroom", "garden", "kitchen"]


@pytest.mark.parametrize("backend", [Toy, ToyPrefix])
def test_forced_choice_picks_the_highest_total_logprob_and_a_tie_is_wrong(tok, backend):
    it = label_item(tok, LABELS, gold=1)
    first = [tuple(c) for c in it.candidates]
    cases = [({first[0]: -3.0, first[1]: -1.0, first[2]: -2.0}, True),
             ({first[0]: -0.5, first[1]: -1.0, first[2]: -2.0}, False),  # negative control
             ({first[0]: -1.0, first[1]: -1.0, first[2]: -2.0}, False)]  # a tie
    for table, want in cases:
        (row,) = score_items(backend(table, []), [it], batch_size=4, decode=tok.decode,
                             max_new_tokens=4)
        assert row["choice"] is want
        best_other = max(v for k, v in table.items() if k != first[1])
        assert math.isclose(row["margin"], table[first[1]] - best_other, abs_tol=1e-5)


@pytest.mark.parametrize("reply,want", [
    (" garden.", True), (" The most recent location of Mary is garden. Then kitchen", True),
    (" kitchen.", False), (" garden or kitchen.", False), (" nowhere", False),
    (" Mary is in the garden", True)])
def test_the_generation_is_judged_by_the_single_label_rule(tok, reply, want):
    it = label_item(tok, LABELS, gold=1)
    (row,) = score_items(ToyPrefix({}, tok.encode(reply)[0]), [it], batch_size=4,
                         decode=tok.decode, max_new_tokens=16)
    assert row["exact"] is want and row["partial"] == float(want)


def test_a_label_named_in_the_question_is_dropped(tok):
    it = label_item(tok, LABELS, gold=0, question="Where was the milk before the kitchen?")
    (row,) = score_items(ToyPrefix({}, tok.encode(" kitchen, then bathroom.")[0]), [it],
                         batch_size=4, decode=tok.decode, max_new_tokens=16)
    assert row["exact"] is True


class Oracle(Toy):
    """Reads each prompt's text with the independent solver and gives that label the best
    log-prob; ``shift`` answers the story of another item instead (the negative control)."""

    def __init__(self, tok, items, shift: int = 0):
        super().__init__({}, [])
        self.tok, self.items, self.shift = tok, items, shift

    def answer_logprobs(self, prompts, answers):
        a = max(map(len, answers))
        logp = torch.full((len(answers), a, self.vocab), -50.0)
        mask = torch.zeros(len(answers), a, dtype=torch.bool)
        for i, (p, ans) in enumerate(zip(prompts, answers)):
            k = next(j for j, it in enumerate(self.items) if it.prompt == p)
            other = self.items[(k + self.shift) % len(self.items)]
            facts, q = story_of(self.tok.decode(other.prompt[1:]))
            good = self.tok.encode(" " + solve(facts, q))[0]
            for j, t in enumerate(ans):
                logp[i, j, t] = -0.1 if ans == good else -5.0
                mask[i, j] = True
        return logp, mask


def test_an_oracle_reading_the_text_scores_one_and_one_reading_another_story_does_not(tok):
    s = spec(n=12, tasks=["qa1"], depths=[[0.0, 1.0]])
    (cell,) = Babilong.text_cells(s, TextBuilder(tok, s), TRAIN, None)
    items = cell.items
    right = score_items(Oracle(tok, items), items, batch_size=4, decode=None)
    wrong = score_items(Oracle(tok, items, shift=1), items, batch_size=4, decode=None)
    assert all(r["choice"] for r in right)
    assert sum(r["choice"] for r in wrong) <= 6  # chance 1/6: the story is what decides


def test_the_shared_prefix_path_of_a_hugging_face_model_equals_its_one_pass_path(tok):
    """HFCausalLM.score_from_prefix (one cached prompt run) gives the same forced choice,
    log-probs and greedy tokens as answer_logprobs per candidate + generate (tiny Llama)."""
    transformers = pytest.importorskip("transformers")
    from blocklab.eval.hf import HFCausalLM

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    lm = HFCausalLM(model, SimpleNamespace(pad_token_id=0, eos_token_id=2, name_or_path="t"),
                    batch_size=4)
    items = [label_item(tok, LABELS, g) for g in range(3)]
    fast = score_items(lm, items, batch_size=4, decode=tok.decode, max_new_tokens=5)

    class Plain:  # the same model without score_from_prefix: the teacher-forced path
        def __getattr__(self, name):
            if name == "score_from_prefix":
                raise AttributeError(name)
            return getattr(lm, name)

    slow = score_items(Plain(), items, batch_size=4, decode=tok.decode, max_new_tokens=5)
    for f, r in zip(fast, slow):
        assert abs(f["logprob"] - r["logprob"]) < 1e-4 and abs(f["margin"] - r["margin"]) < 1e-4
        assert (f["choice"], f["generated"], f["argmax"]) == (r["choice"], r["generated"],
                                                              r["argmax"])


# --------------------------------------------------------------------- run, config, report


def test_a_tiny_byte_model_writes_the_report_and_the_plots(tok, tmp_path):
    from blocklab.eval.backends import BlocklabBackend
    from blocklab.eval.probes import run_spec
    from blocklab.model import build_model

    s = spec(n=2, tasks=["qa1"], lengths=[1.0, 2.0])
    model = build_model(ModelConfig(vocab_size=300, max_seq_len=1024, n_layers=1, d_model=32,
                                    n_heads=2, d_ff=64)).eval()
    lines = []
    r = run_spec(BlocklabBackend(model), s, builder=TextBuilder(tok, s), train_length=TRAIN,
                 keys={"step": 1}, out_dir=tmp_path, decode=tok.decode, log=lines.append)
    summary = r.summary["babilong"]["qa1"]
    assert summary["choice"]["pooled"]["n"] == 2 * 2 * 3 and summary["chance"] == 1 / 6
    assert set(summary["exact"]["by_length_depth"]) == {"512", "1024"}
    assert all(0 <= c["choice"] <= 1 and c["choice_low"] <= c["choice"] <= c["choice_high"]
               for c in r.cells)
    assert {"choice", "exact", "generated"} <= set(r.examples[0])
    assert "BABILong (forced choice" in lines[0] and "pooled forced choice" in lines[0]
    for f in ("babilong_qa1.png", "babilong_curves.png", "summary.json", "cells.csv"):
        assert (tmp_path / f).exists(), f
    from blocklab.eval.callback import headline

    assert set(headline(r.summary)) == {"probe/babilong_qa1/choice", "probe/babilong_qa1/exact"}


def test_off_by_default_reporting_and_hashing_as_before():
    assert not Babilong.configured(ProbeSpec())
    assert spec_hash(ProbeSpec()) == "9dda9943bd8c"
    on = ProbeSpec(babilong=BabilongProbeConfig(enabled=True))
    assert Babilong.configured(on) and spec_hash(on) != "9dda9943bd8c"


def test_the_token_space_form_is_one_not_applicable_cell():
    from blocklab.data.synthetic import Vocab
    from blocklab.eval.items import TokenBuilder

    (cell,) = Babilong.cells(TokenBuilder(Vocab(), 1), spec(), 64, None)
    assert cell.na is not None and "no token-space form" in cell.na


def test_task_lists_agree():
    assert BABILONG_TASKS == babi.TASKS


@pytest.mark.parametrize("kw,needle", [
    ({"tasks": ["qa7"]}, "probes.babilong.tasks=['qa7']: each task must be one of"),
    ({"depths": [[0.5, 0.2]]}, "probes.babilong.depths=[[0.5, 0.2]]: each depth band"),
    ({"prompt": "chatty"}, "probes.babilong.prompt='chatty': one of plain, babilong"),
    ({"n": 0}, "probes.babilong.n=0: must be >= 1"),
    ({"export_only": True}, "probes.babilong.export_only=True: needs probes.babilong.export"),
])
def test_bad_settings_are_one_line(kw, needle):
    with pytest.raises(ConfigError) as e:
        validate_probe_spec(spec(**kw))
    assert "\n" not in str(e.value) and needle in str(e.value), str(e.value)


def test_stories_as_the_checkpoint_trained_and_bands_redrawn(tok) -> None:
    """``facts: null`` takes a data=babilong run's data.babilong_facts (a set value, another
    data source and a disabled kind are left alone); every item then holds that many facts
    (qa4: always 2), and a band that a first haystack draw cannot hold is redrawn rather than
    making the whole cell N/A (one short length, a narrow middle band: every cell built)."""
    from types import SimpleNamespace

    from blocklab.config import DataName

    run = SimpleNamespace(data=SimpleNamespace(name=DataName.babilong, babilong_facts=2))
    s = spec(n=6, tasks=["qa1", "qa4"], lengths=[0.5], depths=[[0.33, 0.67]])
    adapted = Babilong.adapt(s, run)
    assert adapted.babilong.facts == 2 and s.babilong.facts is None
    assert spec_hash(adapted) != spec_hash(s)
    assert Babilong.adapt(spec(facts=4), run).babilong.facts == 4
    text_run = SimpleNamespace(data=SimpleNamespace(name=DataName.text, babilong_facts=2))
    assert Babilong.adapt(s, text_run) is s
    assert Babilong.adapt(spec(enabled=False), run).babilong.facts is None
    cells = Babilong.text_cells(adapted, TextBuilder(tok, adapted), TRAIN, None)
    assert all(c.na is None for c in cells), [c.na for c in cells]
    assert {it.meta["n_facts"] for c in cells for it in c.items} == {2}
    for c in cells:
        assert all(0.33 - BAND_SLACK <= d <= 0.67 + BAND_SLACK
                   for it in c.items for d in it.meta["fact_depths"])

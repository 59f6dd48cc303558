"""The text-space builder's multi-needle (multi-key / multi-value / multi-query), variable
tracking (hops) and aggregation probes with a real (byte-level BPE) tokenizer, checked against an
independent reading of the prompt text: prompt + answer within the length, BOS once, every
answer and value exactly once (aggregation words exactly as often as counted), names, keys and
values unique, hop statements in chain order, recorded depths equal to offset-mapped token
positions recomputed by brute force, depths uniform per item (and a fixed-position draw caught
by the same test), items a pure function of (seed, cell, index), N/A never clamped — and an
oracle answering from the prompt text scores 1.0 while a backend copying a random in-context
answer lands on each cell's copy line."""

from __future__ import annotations

import random
import re
import zlib
from collections import Counter

import pytest
import torch

from blocklab.config import ProbeSpec, TokenizerConfig, TokenizerName
from blocklab.config.schema import (
    AggregationProbeConfig,
    HopsProbeConfig,
    MultiNeedleProbeConfig,
)
from blocklab.data.synthetic import BOS
from blocklab.data.tokenizer import train_bpe
from blocklab.eval import textspace
from blocklab.eval.aggregate import wilson_interval
from blocklab.eval.kinds.aggregation import Aggregation
from blocklab.eval.kinds.hops import Hops
from blocklab.eval.kinds.multi_needle import MultiNeedle
from blocklab.eval.scoring import score_items
from blocklab.eval.textspace import ESSAY, WORDS, TextBuilder, TextTokenizer

TRAIN = 128
NEEDLE = re.compile(r"The special magic number for (\w+) is (\d+)\.")
HOP = re.compile(r"VAR ([A-Z]{5}) = (?:(\d+)|VAR ([A-Z]{5}))\.")
WORD = re.compile(r"The word of the day is (\w+)\.")
KINDS = ["multikey", "multivalue", "multiquery", "hops", "aggregation"]
CHI2_4DF_P001 = 18.467  # chi-square critical value, 4 degrees of freedom, p = 0.001
Z999 = 3.2905  # two-sided 99.9% normal quantile: several deterministic interval checks at once


@pytest.fixture(scope="module")
def tok():
    docs = [ESSAY] * 4 + ["The special magic number for Alice is 12345. What is the value?",
                          "VAR QWERT = 12345. VAR ASDFG = VAR QWERT.",
                          "The word of the day is zebra."] * 4
    raw = train_bpe(TokenizerConfig(name=TokenizerName.bpe, vocab_size=600), docs)
    return TextTokenizer.from_tokenizers(raw, bos=BOS, name="bpe")


def spec(n: int = 6, lengths=(3.0,), seed: int = 9999, **kw) -> ProbeSpec:
    return ProbeSpec(space="text", seed=seed,
                     multi_needle=MultiNeedleProbeConfig(enabled=True, lengths=list(lengths),
                                                         keys=4, values=2, queries=2, n=n),
                     hops=HopsProbeConfig(enabled=True, hops=[3], lengths=list(lengths),
                                          distractor_chains=1, n=n),
                     aggregation=AggregationProbeConfig(enabled=True, candidates=4, margins=[2],
                                                        lengths=list(lengths), n=n), **kw)


def cells_of(builder: TextBuilder, s: ProbeSpec, kind: str, max_length=None):
    if kind == "hops":
        return Hops.text_cells(s, builder, TRAIN, max_length)
    if kind == "aggregation":
        return Aggregation.text_cells(s, builder, TRAIN, max_length)
    s.multi_needle.variants = [kind]
    return MultiNeedle.text_cells(s, builder, TRAIN, max_length)


def build(tok, kind: str, **kw):
    s = spec(**kw)
    return cells_of(TextBuilder(tok, s), s, kind)


def split(tok, item) -> tuple[str, str]:
    """(context, question line) of an item's prompt, read back from its tokens."""
    text = tok.decode(item.prompt)
    context, question = text.rsplit("\n\n", 1)
    return context, question


# ------------------------------------------------------------------ reference reading of text


def solve(text: str) -> list[str]:
    """The required answers, in the stated order, read from the prompt text alone: the asked
    keys' values in context order; the root of the asked variable's chain; the word named most
    often."""
    context, question = text.rsplit("\n\n", 1)
    if m := re.match(r"What is the value of VAR ([A-Z]{5})\?", question):
        defs = {name: value or parent for name, value, parent in HOP.findall(context)}
        v = m.group(1)
        while not v.isdigit():
            v = defs[v]
        return [v]
    if question.startswith("Which word"):
        return [Counter(WORD.findall(context)).most_common(1)[0][0]]
    needles = NEEDLE.findall(context)
    keys = {k for k, _ in needles}
    asked = [k for k in re.findall(r"[A-Z][a-z]+", question.split("?")[0]) if k in keys]
    return [v for k in asked for kk, v in needles if kk == k]


def copy_answer(text: str, rng: random.Random) -> list[str]:
    """A random in-context answer of the asked shape, read from the text: a random chain root;
    a random candidate word; a random key's value(s) in order of appearance, the question's
    key ignored; for several asked keys, their values shifted by a random number of places in
    the order of appearance."""
    context, question = text.rsplit("\n\n", 1)
    if question.startswith("What is the value of VAR"):
        return [rng.choice([v for _, v, _ in HOP.findall(context) if v])]
    if question.startswith("Which word"):
        return [rng.choice(sorted(set(WORD.findall(context))))]
    needles = NEEDLE.findall(context)
    order = list(dict.fromkeys(k for k, _ in needles))  # keys in order of appearance
    asked = [k for k in re.findall(r"[A-Z][a-z]+", question.split("?")[0]) if k in order]
    shift = rng.randrange(len(order))
    return [v for a in asked for k, v in needles
            if k == order[(order.index(a) + shift) % len(order)]]


class TextBackend:
    """A backend that answers from the prompt's text: ``answer(text, rng) -> answers``, joined
    by ", " and tokenized jointly with the prompt, is its greedy continuation and the peak of
    every teacher-forced step that follows it (uniform elsewhere). Its randomness is seeded by
    the prompt, so teacher forcing and generation agree and reruns are identical."""

    shares_prefix = False
    supports_perplexity = False

    def __init__(self, tok: TextTokenizer, answer, vocab: int = 600) -> None:
        self.tok, self.answer, self.vocab = tok, answer, vocab

    def max_length(self):
        return None

    def _continuation(self, prompt: list[int]) -> list[int]:
        text = self.tok.decode(prompt)
        rng = random.Random(zlib.crc32(repr(prompt).encode()))
        ids = self.tok.encode(text + " " + ", ".join(self.answer(text, rng)))[0]
        assert ids[: len(prompt) - 1] == prompt[1:]  # joint tokenization extends the prompt
        return ids[len(prompt) - 1:]

    def answer_logprobs(self, prompts, answers):
        width = max(len(a) for a in answers)
        logits = torch.zeros(len(prompts), width, self.vocab)
        mask = torch.zeros(len(prompts), width, dtype=torch.bool)
        for i, (p, a) in enumerate(zip(prompts, answers)):
            mine = self._continuation(p)
            mask[i, : len(a)] = True
            for j in range(min(len(a), len(mine))):
                if a[:j] != mine[:j]:
                    break
                logits[i, j, mine[j]] = 20.0
        return logits.log_softmax(-1), mask

    def greedy(self, prompts, max_new_tokens):
        return [self._continuation(p)[:max_new_tokens] for p in prompts]


def score(tok, backend, items):
    return score_items(backend, items, batch_size=16, decode=tok.decode, max_new_tokens=48)


# ---------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("kind", KINDS)
def test_items_fit_hold_bos_once_and_every_answer_as_often_as_placed(tok, kind):
    cells = build(tok, kind)
    assert len(cells) == 1 and cells[0].na is None and len(cells[0].items) == 6
    c = cells[0]
    for it in c.items:
        ids = it.prompt + it.answer
        assert len(ids) <= c.key["length"] == 3 * TRAIN
        assert ids[0] == BOS and BOS not in ids[1:]  # BOS once, at the start
        text = tok.decode(it.prompt)
        context, question = split(tok, it)
        # joint tokenization: prompt + answer is the tokenization of the whole string
        assert tok.encode(text + " " + it.answer_text)[0] == ids[1:]
        assert tok.decode(it.answer).strip() == it.answer_text
        golds = solve(text)
        assert it.answer_text == ", ".join(golds)
        assert (it.answer_texts or [it.answer_text]) == golds
        assert (it.answer_texts is None) == (kind not in ("multivalue", "multiquery"))
        assert it.candidates[it.gold] == it.answer
        assert len({tuple(x) for x in it.candidates}) == len(it.candidates)
        if kind in ("multikey", "multivalue", "multiquery"):
            needles = NEEDLE.findall(context)
            keys, values = [k for k, _ in needles], [v for _, v in needles]
            per_key = 2 if kind == "multivalue" else 1
            assert len(set(values)) == len(values) == 4 * per_key
            assert len(set(keys)) == 4 and all(keys.count(k) == per_key for k in keys)
            for v in values:  # every value exactly once in the prompt: never in the question
                assert text.count(v) == 1
            asked = [k for k in re.findall(r"[A-Z][a-z]+", question.split("?")[0]) if k in keys]
            assert len(asked) == (2 if kind == "multiquery" else 1)
            assert not re.search(r"\d", question)  # the number of answers is never stated
            # candidates: one per key (each key's run; multi-query: each shift), gold first
            assert len(it.candidates) == 4
            runs = {tok.decode(x).strip() for x in it.candidates}
            if kind != "multiquery":
                assert runs == {", ".join(v for k, v in needles if k == key) for key in keys}
        elif kind == "hops":
            stmts = HOP.findall(context)
            names = [n for n, _, _ in stmts]
            assert len(stmts) == 6 and len(set(names)) == 6  # 2 chains x 3 assignments
            roots = [v for _, v, _ in stmts if v]
            assert len(roots) == 2 and len(set(roots)) == 2
            assert all(text.count(r) == 1 for r in roots)
            order = {n: i for i, n in enumerate(names)}
            for n, _, parent in stmts:  # chain order: a variable is set after its parent
                assert not parent or order[parent] < order[n]
            assert sorted(tok.decode(x).strip() for x in it.candidates) == sorted(roots)
            m = it.meta
            assert len(m["hop_depths"]) == 3 and m["farthest_depth"] == m["hop_depths"][0]
            assert m["hop_depths"] == sorted(m["hop_depths"])
        else:
            words = Counter(WORD.findall(context))
            counts = sorted(words.values(), reverse=True)
            assert len(words) == 4 and counts[0] - counts[1] == 2  # margin exactly
            for w, k in words.items():
                assert w in WORDS and w not in ESSAY.lower()
                assert len(re.findall(w, text)) == k
            assert sorted(tok.decode(x).strip() for x in it.candidates) == sorted(words)
            assert sorted(it.meta["counts"], reverse=True) == counts
            assert it.meta["counts"][0] == words[it.answer_text]
            assert it.meta["winner_share"] == counts[0] / sum(counts)


def first_token_past(tok, ids: list[int], chars: int) -> int:
    """The smallest k whose first k + 1 tokens decode to more than ``chars`` characters (the
    token holding character ``chars``), by bisection over decoded prefixes: no offsets used."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tok.decode(ids[: mid + 1])) > chars:
            hi = mid
        else:
            lo = mid + 1
    return lo


@pytest.mark.parametrize("kind", KINDS)
def test_recorded_token_positions_and_depths_match_a_brute_force_reading(tok, kind):
    """Each statement's recorded token index is the token holding its first character, found
    by decoding prefixes of the prompt; its depth is that index over the context's tokens less
    the statement's own."""
    pattern = {"hops": HOP, "aggregation": WORD}.get(kind, NEEDLE)
    for it in build(tok, kind, n=4)[0].items:
        context, _ = split(tok, it)
        ids = it.prompt[1:]  # BOS off
        n_ctx = first_token_past(tok, ids, len(context) - 1) + 1
        bf = {}
        for m in pattern.finditer(context):
            at = first_token_past(tok, ids, m.start())
            span = first_token_past(tok, ids, m.end() - 1) + 1 - at
            bf[at + 1] = at / max(1, n_ctx - span)  # + 1: BOS
        m = it.meta
        if kind == "aggregation":  # the winner's statements only, sorted
            assert len(m["gold_depths"]) == m["counts"][0]
            assert m["gold_depths"] == sorted(m["gold_depths"])
            assert all(any(abs(d - x) < 1e-12 for x in bf.values()) for d in m["gold_depths"])
            continue
        if kind == "hops":  # the queried chain's statements, in chain order, among all chains'
            pairs = list(zip(m["hop_tokens"], m["hop_depths"]))
            assert set(m["hop_tokens"]) <= set(bf) and len(bf) == 6
            assert m["hop_tokens"] == sorted(m["hop_tokens"])
        else:  # every needle in order of appearance, then the answer's in answer order
            assert m["needle_tokens"] == sorted(bf) and m["depths"] == [bf[k] for k in sorted(bf)]
            pairs = list(zip(m["gold_tokens"], m["gold_depths"]))
            golds = it.answer_texts or [it.answer_text]
            assert [tok.decode(it.prompt[a:]).split(" is ", 1)[1][:5] for a, _ in pairs] == golds
        for at, d in pairs:
            assert abs(d - bf[at]) < 1e-12 and 0 <= d <= 1
            assert tok.decode(it.prompt[at:at + 12]).lstrip().startswith(
                "VAR" if kind == "hops" else "The special")


def chi_square_uniform(xs: list[float], bins: int = 5) -> float:
    counts = Counter(min(int(x * bins), bins - 1) for x in xs)
    expected = len(xs) / bins
    return sum((counts[b] - expected) ** 2 / expected for b in range(bins))


def test_gold_and_farthest_hop_depths_are_uniform_and_a_fixed_draw_is_caught(tok, monkeypatch):
    n = 200

    def depths():
        s = spec(n=n, lengths=(4.0,))
        b = TextBuilder(tok, s)
        gold = [it.meta["actual_depth"] for it in cells_of(b, s, "multikey")[0].items]
        far = [it.meta["farthest_depth"] for it in Hops.text_cells(s, b, TRAIN, None)[0].items]
        return gold, far

    gold, far = depths()
    assert chi_square_uniform(gold) < CHI2_4DF_P001
    assert chi_square_uniform(far) < CHI2_4DF_P001
    monkeypatch.setattr(textspace, "draw_depth", lambda rng: 0.5)  # one fixed position
    gold, far = depths()
    assert chi_square_uniform(gold) > CHI2_4DF_P001 and chi_square_uniform(far) > CHI2_4DF_P001


@pytest.mark.parametrize("kind", KINDS)
def test_items_are_a_pure_function_of_seed_cell_and_index(tok, kind):
    def key(it):
        return (it.prompt, it.answer, it.candidates, it.answer_texts, repr(it.meta))

    a = [key(it) for it in build(tok, kind, n=4)[0].items]
    assert a == [key(it) for it in build(tok, kind, n=4)[0].items]
    assert len({repr(k[0]) for k in a}) == len(a)  # another index, another item
    other = [key(it) for it in build(tok, kind, n=4, seed=1)[0].items]
    assert all(x[0] != y[0] for x, y in zip(a, other))


@pytest.mark.parametrize("kind", KINDS)
def test_a_length_too_short_is_not_applicable_never_clamped(tok, kind):
    (short,) = build(tok, kind, lengths=(0.5,))
    assert short.na is not None and short.na.startswith("n/a: length 64") and not short.items
    (unindexable,) = cells_of(TextBuilder(tok, spec()), spec(), kind, max_length=256)
    assert unindexable.na.startswith("n/a: length 384 > 256") and not unindexable.items


def test_an_oracle_reading_the_prompt_scores_one_on_every_kind(tok):
    items = [it for kind in KINDS for it in build(tok, kind, n=4)[0].items]
    rows = score(tok, TextBackend(tok, lambda text, rng: solve(text)), items)
    assert len(rows) == len(items) == 20
    assert all(r["argmax"] and r["exact"] and r["margin"] > 0 for r in rows)


@pytest.mark.parametrize("kind", KINDS)
def test_copying_a_random_in_context_answer_scores_the_copy_line(tok, kind):
    (c,) = build(tok, kind, n=96)
    rows = score(tok, TextBackend(tok, copy_answer), c.items)
    assert c.copy_any_value == {"hops": 1 / 2}.get(kind, 1 / 4)
    # multi-query: a shifted answer may hold the gold values in another order, which counts
    # as exact (any order) but not under teacher forcing
    for metric in ("argmax",) if kind == "multiquery" else ("argmax", "exact"):
        lo, hi = wilson_interval(sum(r[metric] for r in rows), len(rows), Z999)
        assert lo <= c.copy_any_value <= hi, (metric, lo, hi)
    assert all(r["any_value"] for r in rows)  # always *an* in-context answer: the shortcut


def test_several_answers_are_exact_only_when_all_are_generated_in_any_order(tok):
    """The scorer's ``answer_texts``: the gold values generated in a random order are exact
    (the teacher-forced argmax, bound to the stated order, is right half the time: 2 answers);
    only the first of them is not exact and finds half of them (``partial``)."""
    for kind in ("multivalue", "multiquery"):
        (c,) = build(tok, kind, n=64)
        shuffled = score(tok, TextBackend(tok, lambda text, rng: rng.sample(solve(text), 2)),
                         c.items)
        assert all(r["exact"] and r["partial"] == 1.0 for r in shuffled)
        lo, hi = wilson_interval(sum(r["argmax"] for r in shuffled), len(shuffled), Z999)
        assert lo <= 1 / 2 <= hi
        first = score(tok, TextBackend(tok, lambda text, rng: solve(text)[:1]), c.items)
        assert not any(r["exact"] or r["argmax"] for r in first)
        assert all(r["partial"] == 0.5 for r in first)

"""BABILong's construction and scoring (Kuratov et al. 2024, "BABILong: Testing the Limits of
LLMs with Long Context Reasoning-in-a-Haystack", arXiv 2406.10149; booydar/babilong).

A bAbI story (:mod:`blocklab.data.babi`) is hidden in real text: its facts are inserted, in
their order, at sentence boundaries of a run of consecutive haystack sentences (a random start,
never wrapping round), at token depths drawn uniformly within ``depth`` and sorted, and the run
is as long as makes the context reach the target length in the model's own tokens (the last
sentence cut short, as BABILong cuts its last sentence's tokens). The question follows the
context (:data:`PROMPT`). A haystack sentence that names any word of the bAbI vocabulary (every
label, actor, room and object, case-insensitive, whole word) is skipped, so the haystack never
holds a label by accident.

Scoring (:func:`answer_correct`) is BABILong's ``compare_answers``: the output lower-cased,
cut to its first sentence (at the first ".") and before any ``<context>`` / ``<example>``;
the task's labels found in it (as substrings, as BABILong matches them) less those the question
names; correct iff the target is the only label left.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blocklab.data.babi import VOCABULARY, Story
from blocklab.data.haystack import place, words_pattern

#: The prompt a BABILong item is read with (training examples and the probe's plain format);
#: the answer follows as " " + answer.
PROMPT = "{context}\n\n{question} Answer:"
ANSWER = " {answer}"

#: Haystack sentences naming any of these are never used.
AVOID = words_pattern(VOCABULARY, ignore_case=True)


class TooShort(ValueError):
    """The target length cannot hold the story's facts and the reserved tokens (or the
    haystack holds too few sentences for it)."""


def preprocess_output(output: str) -> str:
    """BABILong's ``preprocess_output``: lower-cased, the first sentence (up to the first
    "."), cut before ``<context>`` and ``<example>``. (BABILong also cuts at "Question",
    after lower-casing — which never matches; kept as it behaves.)"""
    output = output.lower().split(".")[0]
    output = output.split("<context>")[0]
    return output.split("<example>")[0]


def answer_correct(output: str, target: str, question: str, labels: Sequence[str]) -> bool:
    """BABILong's ``compare_answers`` (single-target tasks qa1–qa5): correct iff, of the
    ``labels`` found in the preprocessed ``output`` (substring match, lower case) and not in
    the ``question``, the ``target`` is the only one."""
    output = preprocess_output(output)
    target = target.lower()
    low = {label.lower() for label in labels}
    in_question = {label for label in low if label in question.lower()}
    found = {label for label in low if label in output} - in_question
    return target in found and len(found) == 1


@dataclass(frozen=True)
class Sample:
    """One BABILong item as text: ``context`` (the haystack with the facts inserted) ends before
    the question; ``fact_chars`` is each fact's character offset in it, ``depths`` each fact's
    token depth (tokens before it over the context's tokens less its own, 0..1),
    ``supporting_depths`` those of the supporting facts, ``n_tokens`` the context's tokens."""

    task: str
    context: str
    question: str
    answer: str
    labels: tuple[str, ...]
    fact_chars: tuple[int, ...]
    depths: tuple[float, ...]
    supporting_depths: tuple[float, ...]
    n_tokens: int
    facts: tuple[str, ...] = ()

    def prompt(self) -> str:
        return PROMPT.format(context=self.context, question=self.question)


def _run(sentences: Sequence[str], start: int, budget: int, count: Callable[[str], int]
         ) -> tuple[list[str], int, bool]:
    """Whole sentences from ``start`` (skipping any naming the vocabulary) while they fit
    ``budget`` tokens; the used tokens and whether the haystack went on past them."""
    out, used = [], 0
    for i in range(start, len(sentences)):
        s = sentences[i]
        if AVOID.search(s):
            continue
        n = count(s)
        if used + n > budget:
            return out, used, True
        out.append(s)
        used += n
    return out, used, False


def _lead(sentences: Sequence[str], start: int, room: int, count: Callable[[str], int]
          ) -> list[str]:
    """The usable sentences before ``start`` that fill ``room`` tokens, walking back: whole ones
    while they fit, then the longest end of the next (binary search on characters) — the
    context then starts mid-sentence, as an excerpt does, and every fact still sits at a
    sentence's end."""
    out: list[str] = []
    for prev in reversed(sentences[max(0, start - 200):start]):
        if room <= 1:
            break
        if AVOID.search(prev):
            continue
        if count(prev) <= room:
            out.insert(0, prev)
            room -= count(prev)
            continue
        lo, hi = 0, len(prev)  # the smallest cut whose remainder fits
        while lo < hi:
            mid = (lo + hi) // 2
            if count(prev[mid:].lstrip()) <= room:
                hi = mid
            else:
                lo = mid + 1
        piece = prev[lo:].lstrip()
        if AVOID.search(piece):  # a cut word reads as a vocabulary word: from the next word
            piece = piece.split(" ", 1)[1] if " " in piece else ""
        if piece:
            out.insert(0, piece)
        break
    return out


def build_sample(story: Story, sentences: Sequence[str], length: int, ntok: Callable[[str], int],
                 rng: random.Random, *, depth: tuple[float, float] = (0.0, 1.0),
                 reserve: int = 0) -> Sample:
    """``story`` hidden in ``sentences`` (a haystack, in text order) so that the context's
    tokens (``ntok``) plus ``reserve`` (the caller's question, answer, BOS...) come to at most
    ``length``, within a few tokens of it; each fact at a token depth drawn uniformly in
    ``depth`` (sorted, so the facts keep their order) and put at the nearest sentence boundary.
    :class:`TooShort` when the facts and ``reserve`` do not fit ``length``, or the haystack is
    too short for it (it is never repeated)."""
    cache: dict[str, int] = {}

    def count(s: str) -> int:  # tokens of a haystack part after its separating space
        n = cache.get(s)
        if n is None:
            n = cache[s] = ntok(" " + s)
        return n

    lo, hi = depth
    facts = list(story.facts)
    fixed = sum(count(f) for f in facts) + reserve
    if fixed > length:
        raise TooShort(f"length {length} cannot hold the {len(facts)} facts of a {story.task} "
                       f"story and {reserve} reserved tokens ({fixed} tokens)")
    budget = length - fixed
    hay: list[str] = []
    if budget > 0:
        if len(sentences) < 2:
            raise TooShort(f"a haystack of {len(sentences)} sentence(s) holds no context")
        for attempt in range(8):
            start = 1 + rng.randrange(len(sentences) - 1) if attempt < 7 else 1
            hay, used, more = _run(sentences, start, budget, count)
            if more:
                break
        else:
            raise TooShort(f"the haystack ({len(sentences):,} sentences) is shorter than the "
                           f"{budget:,} tokens length {length} needs (it is never repeated)")
        hay = _lead(sentences, start, budget - used - 1, count) + hay
    # depths are of the context (facts included): the haystack position of fact k is the one
    # that puts depths[k] of the context's tokens before it
    sizes = [count(f) for f in facts]
    total_hay = sum(count(h) for h in hay)
    total = total_hay + sum(sizes)
    where, before, last = [], 0, 0.0
    for d, n in zip(sorted(lo + (hi - lo) * rng.random() for _ in facts), sizes):
        last = max(last, min(1.0, (d * (total - n) - before) / max(1, total_hay)))
        where.append(last)  # never before the fact ahead of it: the story keeps its order
        before += n
    while True:
        context, chars = place(hay, facts, where, count)
        n_tokens = ntok(context)
        if n_tokens + reserve <= length or not hay:
            break
        # joint tokenization came out longer than the parts: shorten the first piece
        first = hay.pop(0).split(" ")
        over = n_tokens + reserve - length
        if len(first) > 1:
            hay.insert(0, " ".join(first[min(len(first) - 1, max(1, over // 2)):]))
    if n_tokens + reserve > length:
        raise TooShort(f"length {length}: the facts alone come to {n_tokens} tokens")
    # each fact's token depth: the tokens of the parts before it (haystack sentences and facts,
    # each counted after its separating space) over the context's tokens less its own
    fact_depths, pos, tokens, h = [], 0, 0, 0
    for c, f in zip(chars, facts):
        while pos < c:
            tokens += count(hay[h])
            pos += len(hay[h]) + 1
            h += 1
        fact_depths.append(min(1.0, tokens / max(1, n_tokens - count(f))))
        tokens += count(f)
        pos += len(f) + 1
    return Sample(story.task, context, story.question, story.answer, story.labels, tuple(chars),
                  tuple(fact_depths), tuple(fact_depths[i] for i in story.supporting), n_tokens,
                  tuple(facts))

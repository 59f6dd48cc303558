"""BABILong's construction and scoring (blocklab.data.babilong): the facts are found again in
the context, in story order, at the offsets given, and the independent solver (babi_solver.py)
answers from the context's text alone; every other sentence of the context is haystack, a run
of consecutive haystack sentences with no bAbI word in it; the context's tokens come within a
few of the target; fact depths lie within the bounds asked; BABILong's scoring rule case by
case. Negative controls: a haystack sentence naming a label is never used; a length that cannot
hold the facts is refused."""

from __future__ import annotations

import random
import re

import pytest
from babi_solver import is_fact, solve

from blocklab.data.babi import TASK_LABELS, TASKS, VOCABULARY, story
from blocklab.data.babilong import PROMPT, TooShort, answer_correct, build_sample
from blocklab.data.haystack import ESSAY, sentences_of

HAY = sentences_of(ESSAY * 6)
VOCAB = re.compile(r"\b(" + "|".join(VOCABULARY) + r")\b", re.I)
CLEAN = [h for h in HAY if not VOCAB.search(h)]  # the sentences a haystack may use
BYTES = lambda s: len(s.encode())  # noqa: E731
WORDS = lambda s: len(re.findall(r"\w+|[^\w\s]", s))  # noqa: E731  (a word-level tokenizer)
SLACK = {BYTES: 4, WORDS: 3}


def split(context: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?]) ", context) if s]


@pytest.mark.parametrize("ntok", [BYTES, WORDS], ids=["bytes", "words"])
@pytest.mark.parametrize("task", TASKS)
def test_sample_built_as_babilong(task: str, ntok) -> None:
    for i in range(25):
        s = story(task, random.Random(i))
        length = [600, 1500, 3000][i % 3] if ntok is BYTES else [150, 400, 800][i % 3]
        reserve = 20 + i
        x = build_sample(s, HAY, length, ntok, random.Random(100 + i), reserve=reserve)
        assert x.question == s.question and x.answer == s.answer and x.labels == s.labels
        # the facts at their offsets, in story order
        assert list(x.fact_chars) == sorted(x.fact_chars)
        for c, f in zip(x.fact_chars, s.facts):
            assert x.context[c:c + len(f)] == f
        # the solver reads the context alone: the facts are exactly its bAbI sentences
        units = split(x.context)
        facts = [u for u in units if is_fact(u)]
        assert facts == list(s.facts)
        assert solve(facts, s.question) == s.answer
        # the rest is a run of consecutive usable haystack sentences, the first maybe the end
        # of the one before
        hay = [u for u in units if not is_fact(u)]
        if len(hay) > 1:
            k = next(j for j in range(1, len(CLEAN)) if CLEAN[j:j + len(hay) - 1] == hay[1:])
            assert CLEAN[k - 1].endswith(hay[0])
        assert not VOCAB.search(" ".join(hay))
        # the length: within a few tokens of the target, never over
        assert x.n_tokens == ntok(x.context)
        assert length - SLACK[ntok] <= x.n_tokens + reserve <= length
        assert all(0.0 <= d <= 1.0 for d in x.depths)
        assert x.supporting_depths == tuple(x.depths[j] for j in s.supporting)
        assert x.prompt() == PROMPT.format(context=x.context, question=s.question)


def test_depth_bounds() -> None:
    longest = max(BYTES(" " + h) for h in HAY) + 80  # a sentence and a few facts either side
    for i in range(30):
        s = story("qa2", random.Random(i))
        x = build_sample(s, HAY, 4000, BYTES, random.Random(i), depth=(0.4, 0.6))
        for d in x.depths:
            assert 0.4 - longest / 4000 <= d <= 0.6 + longest / 4000
    ends = build_sample(story("qa1", random.Random(0)), HAY, 4000, BYTES, random.Random(0),
                        depth=(0.0, 0.05))
    assert max(ends.depths) < 0.15


def test_never_a_label_in_the_haystack() -> None:
    """Negative control: haystack sentences naming labels (any case) are never used."""
    bad = ["Mary loved the Kitchen of her aunt.", "The garden was green.",
           "A football flew over.", "Nobody saw the BEDROOM door."]
    hay = [x for pair in zip(HAY, bad * (len(HAY) // 4 + 1)) for x in pair]
    for i in range(20):
        x = build_sample(story("qa1", random.Random(i)), hay, 2000, BYTES, random.Random(i))
        assert not any(b in x.context for b in bad)


def test_too_short() -> None:
    s = story("qa3", random.Random(0), n_facts=10)
    need = sum(BYTES(" " + f) for f in s.facts)
    with pytest.raises(TooShort):
        build_sample(s, HAY, need - 1, BYTES, random.Random(0))
    with pytest.raises(TooShort):
        build_sample(s, HAY, need + 10, BYTES, random.Random(0), reserve=20)
    x = build_sample(s, HAY, need, BYTES, random.Random(0))  # the facts alone (BABILong "0k")
    assert split(x.context) == list(s.facts)
    with pytest.raises(TooShort, match="never repeated"):
        build_sample(s, HAY[:5], 5000, BYTES, random.Random(0))
    assert issubclass(TooShort, ValueError)


QA1 = TASK_LABELS["qa1"]
QA5 = TASK_LABELS["qa5"]


@pytest.mark.parametrize("output,target,question,labels,want", [
    ("kitchen", "kitchen", "Where is Mary?", QA1, True),
    ("The Kitchen.", "kitchen", "Where is Mary?", QA1, True),
    ("Mary is in the kitchen. Before that the bathroom.", "kitchen", "Where is Mary?", QA1,
     True),                                              # only the first sentence counts
    ("kitchen or bathroom", "kitchen", "Where is Mary?", QA1, False),  # two labels
    ("bathroom", "kitchen", "Where is Mary?", QA1, False),
    ("", "kitchen", "Where is Mary?", QA1, False),
    ("<context>kitchen", "kitchen", "Where is Mary?", QA1, False),      # cut at <context>
    ("kitchen<example>bathroom", "kitchen", "Where is Mary?", QA1, True),  # cut at <example>
    ("the kitchens", "kitchen", "Where is Mary?", QA1, True),          # substring, as BABILong
    # labels named in the question are dropped
    ("The apple was in the kitchen", "office", "Where was the apple before the kitchen?", QA1,
     False),
    ("office, not the kitchen", "office", "Where was the apple before the kitchen?", QA1, True),
    ("Fred gave the football to Jeff", "Fred", "Who gave the football to Jeff?", QA5, True),
    ("Jeff", "Fred", "Who gave the football to Jeff?", QA5, False),
    ("Bill and Fred", "Fred", "Who gave the football to Jeff?", QA5, False),
    ("milk", "milk", "What did Fred give to Bill?", QA5, True),
    ("The milk. Fred gave Bill the apple.", "milk", "What did Fred give to Bill?", QA5, True),
])
def test_babilong_scoring_rule(output, target, question, labels, want) -> None:
    assert answer_correct(output, target, question, labels) is want

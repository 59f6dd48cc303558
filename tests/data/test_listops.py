"""The ``listops`` task (LRA's ListOps grammar) and its experiment's measurement: every answer
equals an independent evaluator's (a recursive-descent parser of the token string, MED as LRA's
``int(np.median(...))``), lengths stay in the requested range, generation is a pure function of
the seed, LRA's draw probabilities hold, and the masked answer slot is what the encoder is
asked and scored on."""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter

import numpy as np
import pytest
import torch

from blocklab.config import ConfigError, DataConfig, TaskWeights, validate_mixture
from blocklab.data.mixture import Mixture
from blocklab.data.synthetic import MASK, Vocab, example_rng
from blocklab.data.tasks import TASKS
from blocklab.data.tasks import listops as lo
from blocklab.objectives import IGNORE, MaskedLM

VOCAB = Vocab(n_filler=4, n_keys=5, n_values=10)


def parse(words: list[str]) -> int:
    """Reference evaluator, written apart from the generator: recursive descent over the
    words, every operator applied with the standard library."""
    ops = {"[MIN": min, "[MAX": max, "[SM": lambda xs: math.fsum(xs) % 10,
           "[MED": lambda xs: math.floor(statistics.median(xs))}
    at = 0

    def node() -> int:
        nonlocal at
        word = words[at]
        at += 1
        if word.isdigit():
            return int(word)
        args = []
        while words[at] != "]":
            args.append(node())
        at += 1
        assert 2 <= len(args) <= lo.LISTOPS_MAX_ARGS, words
        return int(ops[word](args))

    value = node()
    assert at == len(words), "trailing words"
    return value


def depth_of(words: list[str]) -> int:
    level = deepest = 0
    for w in words:
        level += w.startswith("[")
        deepest = max(deepest, level + (not w.startswith("[") and w != "]"))
        level -= w == "]"
    return deepest


def disagreements(examples) -> list[int]:
    """Indices whose stored answer, answer token or id sequence disagree with the reference."""
    words_of = {i: w for w, i in lo.token_ids(VOCAB).items()}
    bad = []
    for k, ex in enumerate(examples):
        gap = ex.tokens[1:].index(next(t for t in ex.tokens[1:] if t != VOCAB.filler[0]))
        words = [words_of[t] for t in ex.tokens[1 + gap:]]
        answer = parse(words)
        if (words != ex.meta["words"] or answer != ex.meta["answer"]
                or ex.tokens[0] != VOCAB.values[answer]):
            bad.append(k)
    return bad


def sample(n: int, length: int, salt: str = "t", **kw):
    return [lo.listops(example_rng(0, i, salt), VOCAB, length, **kw) for i in range(n)]


def test_answers_equal_an_independent_evaluator() -> None:
    examples = sample(300, 96) + sample(100, 200, max_depth=6)
    assert disagreements(examples) == []
    assert {ex.meta["root"] for ex in examples} == {"MIN", "MAX", "MED", "SM"}
    # even-count medians occur, and the evaluators agree there too
    meds = sum(ex.meta["words"].count("[MED") for ex in examples)
    assert meds > 100


def test_a_wrong_median_is_caught(monkeypatch) -> None:
    """Negative control: MED of an even count rounded up (not LRA's truncation) disagrees."""
    right = lo.evaluate

    def upper(tree):
        if isinstance(tree, tuple) and tree[0] == "MED":
            values = sorted(right(a) for a in tree[1])
            return values[len(values) // 2]
        return right(tree) if isinstance(tree, int) else right((tree[0], [upper(a) for a in
                                                                           tree[1]]))

    monkeypatch.setattr(lo, "evaluate", upper)
    assert len(disagreements(sample(200, 96))) > 5


@pytest.mark.parametrize(("values", "expected"), [
    ([1, 2], 1), ([3, 4, 5, 8], 4), ([0, 9], 4), ([9, 9, 0, 1], 5), ([7, 2, 5], 5)])
def test_med_is_lras_int_of_numpy_median(values: list[int], expected: int) -> None:
    assert lo.evaluate(("MED", values)) == int(np.median(values)) == expected


def test_lengths_depths_and_the_rejection_range() -> None:
    for length in (16, 64, 128, 257):
        for ex in sample(60, length, salt=f"len{length}"):
            assert (length + 1) // 2 <= len(ex.tokens) <= length
            assert ex.targets == [True] + [False] * (len(ex.tokens) - 1)
            assert ex.meta["depth"] == depth_of(ex.meta["words"]) <= lo.LISTOPS_MAX_DEPTH
    for ex in sample(30, 100, min_length=90):
        assert 90 <= len(ex.tokens) <= 100
    with pytest.raises(ValueError, match="min_tokens"):
        lo.draw_tree(random.Random(0), 10, 9)
    with pytest.raises(ValueError, match=r"no tree of 3\.\.3 tokens"):  # an operator needs >= 4
        lo.draw_tree(random.Random(0), 3, 3)


def test_a_gap_of_blanks_between_the_slot_and_the_expression() -> None:
    for ex in sample(40, 64, gap=8):
        assert ex.tokens[1:9] == [VOCAB.filler[0]] * 8 and ex.tokens[9] != VOCAB.filler[0]
        assert 32 <= len(ex.tokens) <= 64 and ex.targets == [True] + [False] * (len(ex.tokens)
                                                                                 - 1)
    assert disagreements(sample(100, 64, gap=8)) == []
    cfg = DataConfig(tasks=TaskWeights(needle=0, listops=1), n_keys=5, n_values=10, n_filler=4,
                     seq_len=64, min_len=40, listops_gap=12)
    assert all(Mixture(cfg)(i).tokens[1:13] == [VOCAB.filler[0]] * 12 for i in range(10))
    assert Mixture(cfg).fingerprint() != Mixture(DataConfig(**{**cfg.__dict__,
                                                               "listops_gap": 0})).fingerprint()
    with pytest.raises(ConfigError, match=r"data.listops_gap=13: .*min_len >= 2 x gap \+ 16"):
        validate_mixture(DataConfig(**{**cfg.__dict__, "listops_gap": 13}))


def test_generation_is_deterministic_from_the_seed() -> None:
    a, b = sample(20, 128), sample(20, 128)
    assert [e.tokens for e in a] == [e.tokens for e in b]
    assert len({tuple(e.tokens) for e in a}) == 20
    other = [lo.listops(example_rng(1, i, "t"), VOCAB, 128) for i in range(20)]
    assert [e.tokens for e in other] != [e.tokens for e in a]


def test_lras_draw_probabilities() -> None:
    """Unconditioned trees (no length range): a node below the maximum depth is an operator
    with probability 0.25, with 2..10 arguments uniformly and the 4 operators uniformly."""
    rng = random.Random(7)
    roots, args, ops = Counter(), Counter(), Counter()
    for _ in range(8000):
        tree = lo.draw_tree(rng, 1, 10**6)
        roots[isinstance(tree, tuple)] += 1
        if isinstance(tree, tuple):
            ops[tree[0]] += 1
            args[len(tree[1])] += 1
    assert abs(roots[True] / 8000 - lo.VALUE_P) < 0.02
    assert set(args) == set(range(2, 11)) and max(args.values()) / min(args.values()) < 1.4
    assert set(ops) == set(lo.OPERATORS) and max(ops.values()) / min(ops.values()) < 1.25


def test_a_task_of_the_mixture_with_its_rules() -> None:
    assert TASKS["listops"] is lo.ListOpsTask and TaskWeights().listops == 0
    cfg = DataConfig(tasks=TaskWeights(needle=0, listops=1), n_keys=5, n_values=10, n_filler=4,
                     seq_len=64, min_len=64)
    mix = Mixture(cfg)
    examples = [mix(i) for i in range(40)]
    assert {e.meta["task"] for e in examples} == {"listops"}
    assert disagreements(examples) == []
    for bad, key in ((dict(n_values=9), "data.n_values"), (dict(n_keys=4), "data.n_keys")):
        with pytest.raises(ConfigError, match=key) as e:
            validate_mixture(DataConfig(**{**cfg.__dict__, **bad}))
        assert "\n" not in str(e.value) and "listops" in str(e.value)


class Oracle(torch.nn.Module):
    """An 'encoder' that parses its input (answer slot masked) and puts all its mass on the
    right digit; ``constant``: always that digit instead."""

    def __init__(self, constant: int | None = None) -> None:
        super().__init__()
        self.constant = constant
        self.words_of = {i: w for w, i in lo.token_ids(VOCAB).items()}

    def forward(self, ids, *, valid, select):
        assert bool((ids[:, 0] == MASK).all()), "the answer slot is masked"
        assert bool(select[:, 0].all()) and int(select.sum()) == len(ids)
        out = torch.zeros(len(ids), VOCAB.size)
        for r in range(len(ids)):
            words = [self.words_of[int(t)] for t, v in zip(ids[r, 1:], valid[r, 1:]) if v]
            digit = parse(words) if self.constant is None else self.constant
            out[r, VOCAB.values[digit]] = 1.0
        return out


def test_the_measurement_scores_the_masked_answer_slot() -> None:
    from blocklab.repro.experiments.listops import examples, slot_hits

    exs = examples(VOCAB, n=70, length=64)
    objective = MaskedLM()
    batch = objective.collate(exs[:4])
    assert bool((batch["input_ids"][:, 0] == MASK).all())
    assert [int(r[0]) for r in batch["labels"]] == [e.tokens[0] for e in exs[:4]]
    assert bool((batch["labels"][:, 1:] == IGNORE).all())
    assert slot_hits(Oracle(), objective, exs, batch_size=32) == [True] * 70
    hits = slot_hits(Oracle(constant=9), objective, exs, batch_size=32)  # negative control
    assert sum(hits) == sum(e.meta["answer"] == 9 for e in exs) < 70


# ------------------------------------------------------------------------ the experiment


def tallies(**rates: float) -> dict:
    from blocklab.repro.measure import Tally

    return {arm.rstrip("_"): {"accuracy": [Tally(round(r * 1000), 1000)]}
            for arm, r in rates.items()}


def test_the_checks_decide_the_gap_and_the_recovery() -> None:
    from blocklab.repro.experiments.listops import Below, Recovers

    gap = Below("window", "accuracy", other="full", margin=0.10)
    rec = Recovers("global", "accuracy", other="full", base="window", fraction=0.5)
    assert gap.evaluate(tallies(full=0.40, window=0.29))[1]
    assert not gap.evaluate(tallies(full=0.40, window=0.31))[1]  # only 0.09 below
    assert rec.evaluate(tallies(full=0.40, window=0.20, global_=0.31))[1]
    assert not rec.evaluate(tallies(full=0.40, window=0.20, global_=0.29))[1]  # < half back
    assert not rec.evaluate(tallies(full=0.20, window=0.20, global_=0.20))[1]  # no lead at all
    assert rec.evaluate(tallies(full=0.40, global_=0.31)) == ("window: not measured (--only)",
                                                              False)


@pytest.mark.parametrize("size", ["quick", "full"])
def test_every_arm_is_the_same_encoder_but_its_mixer(size: str) -> None:
    from blocklab.repro.experiments.listops import SETTINGS, make

    exp = make(size)
    arms = exp.sizes[size].arms
    w = SETTINGS[size]["window"]
    mixer = {a.name: {o for o in a.overrides if o.startswith(("model/mixer=", "model.mixer."))}
             for a in arms}
    expected = {
        "full attention": {"model/mixer=softmax"},
        f"window {w} only": {"model/mixer=softmax", f"model.mixer.window={w}"},
        f"window {w} + global token": {"model/mixer=softmax", f"model.mixer.window={w}",
                                       "model.mixer.global_tokens=1"},
        "favor+ 64": {"model/mixer=linear", "model.mixer.feature_map=favor",
                      "model.mixer.n_features=64"},
        "linformer 32": {"model/mixer=linformer", "model.mixer.proj_dim=32"},
        "nystrom 16": {"model/mixer=nystrom", "model.mixer.landmarks=16"}}
    # quick (CI) trains the three checked arms, full all six, in the table's order
    assert list(mixer) == list(expected)[:SETTINGS[size]["arms"]] == list(expected)[:len(arms)]
    assert mixer == {name: expected[name] for name in mixer}
    assert len(arms) == (3 if size == "quick" else 6)
    rest = {tuple(o for o in a.overrides if o not in mixer[a.name]) for a in arms}
    assert len(rest) == 1 and "model.family.name=encoder" not in rest.pop()  # bert_tiny's
    for what, (_, breaker) in exp.breaks.items():  # each break copies one arm onto another
        changed = [b for a, b in zip(arms, breaker(arms)) if a != b]
        assert len(changed) == 1 and changed[0].overrides in {a.overrides for a in arms}, what


def test_every_arm_composes_as_an_encoder() -> None:
    from omegaconf import OmegaConf

    from blocklab.config import compose
    from blocklab.repro.experiments.listops import arms
    from blocklab.repro.runner import RUN_DEFAULTS

    for arm in arms("quick"):  # the checked arms (every arm: test_repro.py composes them all)
        cfg = compose("train", [*RUN_DEFAULTS, *arm.overrides])
        assert cfg.model.family.name == "encoder" and cfg.data.tasks.listops == 1
        validate_mixture(OmegaConf.to_object(cfg.data))

"""Synthetic tasks and the training mixture (docs/probes.md, "Retrieval is taught, then probed"):
exact lengths, determinism from (seed, index, salt), the needle / record / query formats, random
key–value pairings (closed-book = chance), mixture weights, the length curriculum, the stream
fingerprint and config validation."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import Counter

import pytest

from blocklab.config import (
    ConfigError,
    DataConfig,
    TaskWeights,
    needle_min_length,
    validate_mixture,
)
from blocklab.data.mixture import Mixture
from blocklab.data.synthetic import BOS, MARK, REC, SEP, Vocab, example_rng, markov_chain
from blocklab.data.tasks import TASKS
from blocklab.data.tasks.copy import copy
from blocklab.data.tasks.flip_flop import flip_flop
from blocklab.data.tasks.kv_records import kv_records
from blocklab.data.tasks.markov_lm import markov_lm
from blocklab.data.tasks.mqar import mqar

VOCAB = Vocab()
EXACT = ("needle", "kv_records", "kv_records_query_aware", "markov_lm")  # len == length
SHORTER = {"mqar": 5, "copy": 1, "flip_flop": 1}  # len <= length, by at most this much (whole records/halves)
ALL_TASKS = TaskWeights(needle=1, kv_records=1, kv_records_query_aware=1, mqar=1, copy=1,
                        markov_lm=1)


def make(name: str, index: int, length: int, *, seed: int = 0, salt: str = "", **kw):
    return TASKS[name].generate(example_rng(seed, index, salt), VOCAB, length, seed=seed, **kw)


def runs_of_mark(tokens: list[int]) -> list[int]:
    return [i for i, t in enumerate(tokens) if t == MARK]


# ------------------------------------------------------------------------------------ lengths


def test_task_table_is_the_documented_one() -> None:
    assert set(TASKS) == {"needle", "kv_records", "kv_records_query_aware", "mqar", "copy",
                          "markov_lm", "multihop", "counting", "flip_flop", "listops"}
    assert set(TASKS) == {f.name for f in dataclasses.fields(TaskWeights)}


@pytest.mark.parametrize("n_distractors", [0, 1, 3, 6])
def test_needle_length_is_exact(n_distractors: int) -> None:
    lo = needle_min_length(n_distractors)
    for i, length in enumerate([*range(lo, lo + 25), 64, 127, 128, 257, 512]):
        for filler in ("iid", "phrase", "markov"):
            ex = make("needle", i, length, n_distractors=n_distractors, filler=filler)
            assert len(ex.tokens) == length == len(ex.targets), (length, filler)
            assert len(runs_of_mark(ex.tokens)) == n_distractors + 1


@pytest.mark.parametrize("n_distractors", [0, 1, 2, 3, 5, 8])
def test_needle_min_length_is_the_boundary(n_distractors: int) -> None:
    lo = needle_min_length(n_distractors)
    for length in (0, 1, lo - 3, lo - 1):
        if length < 0:
            continue
        with pytest.raises(ValueError, match="too short"):
            make("needle", 0, length, n_distractors=n_distractors)
    for i in range(50):  # at the boundary every example builds, at its exact length
        assert len(make("needle", i, lo, n_distractors=n_distractors).tokens) == lo


@pytest.mark.parametrize("name", ["kv_records", "kv_records_query_aware"])
def test_kv_records_uses_as_many_records_as_fit(name: str) -> None:
    qa = 2 if name == "kv_records_query_aware" else 0
    for length in range(4 + qa + 3, 4 + qa + 3 + 90):
        ex = make(name, length, length)
        m = ex.meta["n_records"]
        assert len(ex.tokens) == 4 + qa + 3 * m == len(ex.targets)
        assert length - 3 < len(ex.tokens) <= length  # one more record would not fit
    with pytest.raises(ValueError):
        make(name, 0, 3 + qa + 3)


@pytest.mark.parametrize("name", ["mqar", "copy", "markov_lm", "flip_flop"])
def test_other_task_lengths(name: str) -> None:
    """markov_lm: exactly ``length``; mqar / copy / flip_flop: whole records / halves /
    instruction pairs, so ``<= length``."""
    for length in range(8, 140):
        ex = make(name, length, length)
        assert len(ex.tokens) == len(ex.targets)
        if name == "markov_lm":
            assert len(ex.tokens) == length
        else:
            assert length - SHORTER[name] <= len(ex.tokens) <= length, length


# -------------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("name", sorted(TASKS))
def test_examples_are_pure_functions_of_seed_index_salt(name: str) -> None:
    state = random.getstate()
    for i in range(20):
        a, b = make(name, i, 64, seed=7, salt="train"), make(name, i, 64, seed=7, salt="train")
        assert (a.tokens, a.targets, a.meta) == (b.tokens, b.targets, b.meta)
    assert random.getstate() == state, "drew from the global RNG"
    seqs = {tuple(make(name, i, 64, seed=7, salt="train").tokens) for i in range(20)}
    assert len(seqs) == 20  # different indices, different examples
    assert make(name, 3, 64, seed=7).tokens != make(name, 3, 64, seed=8).tokens


def test_train_and_val_streams_do_not_overlap() -> None:
    cfg = DataConfig(tasks=ALL_TASKS, n_distractors=[0, 3])
    train, val = Mixture(cfg, salt="train"), Mixture(cfg, salt="val")
    t = [tuple(train(i).tokens) for i in range(2000)]
    v = [tuple(val(i).tokens) for i in range(2000)]
    assert not set(t) & set(v)
    assert t == [tuple(Mixture(cfg, salt="train")(i).tokens) for i in range(2000)]
    assert train.fingerprint() != val.fingerprint()


# ------------------------------------------------------------------------------------- needle


def check_needle(ex, n_distractors: int) -> None:
    toks = ex.tokens
    assert toks[0] == BOS and toks[-3] == SEP
    key, value = toks[-2], toks[-1]
    assert key in VOCAB.keys and value in VOCAB.values
    assert toks.count(key) == 2, "gold key must occur in its needle and the query only"
    assert toks.count(value) == 2, "gold value must occur in its needle and the answer only"
    assert ex.targets == [False] * (len(toks) - 1) + [True]
    marks = runs_of_mark(toks)
    assert len(marks) == n_distractors + 1
    needles = [(toks[i + 1], toks[i + 2]) for i in marks]
    for k, v in needles:
        assert k in VOCAB.keys and v in VOCAB.values
    assert len({k for k, _ in needles}) == len({v for _, v in needles}) == len(needles)
    gi = ex.meta["gold_index"]
    assert toks[gi] == MARK and toks[gi + 1] == key and toks[gi + 2] == value
    assert sorted(ex.meta["candidates"]) == sorted(v for _, v in needles)
    assert ex.meta["query_index"] == len(toks) - 2
    # everything else in the haystack is filler; needles are separated by filler
    needle_pos = {p for i in marks for p in (i, i + 1, i + 2)}
    assert all(toks[p] in VOCAB.filler for p in range(1, len(toks) - 3) if p not in needle_pos)
    assert all(b - a > 3 for a, b in itertools.pairwise(marks))


def test_needle_format_gold_and_distractors() -> None:
    rng = random.Random(0)
    for i in range(400):
        n = rng.randint(0, 6)
        length = rng.randint(needle_min_length(n), 160)
        ex = make("needle", i, length, n_distractors=n, filler=rng.choice(["iid", "phrase",
                                                                          "markov"]))
        check_needle(ex, n)


@pytest.mark.parametrize("n_distractors", [0, 1, 3])
@pytest.mark.parametrize("length", [needle_min_length(3), 40, 128, 301])
def test_needle_depth_places_the_gold_needle(n_distractors: int, length: int) -> None:
    for i in range(11):
        d = i / 10
        ex = make("needle", i, length, n_distractors=n_distractors, depth=d)
        check_needle(ex, n_distractors)
        toks, gi = ex.tokens, ex.meta["gold_index"]
        hay_len = sum(t in VOCAB.filler for t in toks)
        hay_before = sum(t in VOCAB.filler for t in toks[:gi])
        assert abs(hay_before - round(d * hay_len)) <= 1, (d, hay_before, hay_len)
        if d == 0:
            assert gi == 1  # right after BOS
        if d == 1:
            assert gi == len(toks) - 6  # last thing before SEP k v
        if n_distractors == 0:
            assert gi - 1 == hay_before


@pytest.mark.parametrize("name", ["needle", "kv_records"])
def test_keys_and_values_are_repaired_every_example(name: str) -> None:
    """Closed-book can't beat chance: a key's value in one stream says nothing in another."""
    def pairs(salt: str, n: int) -> list[tuple[int, int]]:
        out = []
        for i in range(n):
            ex = make(name, i, 48, salt=salt)
            out.append((ex.tokens[-2], ex.tokens[-1]))  # (queried key, gold value)
        return out

    train = pairs("train", 3000)
    by_key: dict[int, Counter] = {}
    for k, v in train:
        by_key.setdefault(k, Counter())[v] += 1
    k0 = max(by_key, key=lambda k: sum(by_key[k].values()))
    assert len(by_key[k0]) >= 25, "a key is tied to few values"
    guess = {k: c.most_common(1)[0][0] for k, c in by_key.items()}
    test = pairs("val", 3000)
    acc = sum(guess.get(k) == v for k, v in test) / len(test)
    assert acc < 3 / VOCAB.n_values, f"closed-book accuracy {acc:.3f} beats chance"


# --------------------------------------------------------------------------------- kv_records


@pytest.mark.parametrize("query_aware", [False, True])
@pytest.mark.parametrize("length", [7 + 2 * 3, 52, 100, 196])
def test_kv_records_gold_index_control(query_aware: bool, length: int) -> None:
    qa = 2 if query_aware else 0
    m = (length - 4 - qa) // 3
    for j in sorted({0, m // 4, m // 2, 3 * m // 4, m - 1}):
        ex = kv_records(example_rng(1, j, "kv"), VOCAB, length, gold=j, query_aware=query_aware)
        toks = ex.tokens
        assert ex.meta["gold"] == j and ex.meta["n_records"] == m
        start = 1 + qa
        recs = [toks[start + 3 * r: start + 3 * r + 3] for r in range(m)]
        assert all(r[0] == REC for r in recs)
        keys, values = [r[1] for r in recs], [r[2] for r in recs]
        assert len(set(keys)) == len(set(values)) == m
        assert all(k in VOCAB.keys for k in keys) and all(v in VOCAB.values for v in values)
        assert toks[0] == BOS and toks[-3:] == [SEP, keys[j], values[j]]
        if query_aware:
            assert toks[1:3] == [SEP, keys[j]]
        assert ex.targets == [False] * (len(toks) - 1) + [True]
        assert sorted(ex.meta["candidates"]) == sorted(values)


def test_kv_records_query_aware_task_puts_the_query_first() -> None:
    for i in range(50):
        ex = make("kv_records_query_aware", i, 60)
        assert ex.tokens[:3] == [BOS, SEP, ex.tokens[-2]] and ex.tokens[3] == REC
        assert ex.meta["task"] == "kv_records_query_aware"
        assert make("kv_records", i, 60).tokens[1] == REC


def test_kv_records_gold_is_uniform_when_not_given() -> None:
    golds = Counter(make("kv_records", i, 28).meta["gold"] for i in range(2000))  # m = 8
    assert set(golds) == set(range(8))
    assert max(golds.values()) < 2 * min(golds.values())


# -------------------------------------------------------------------------------- mqar / copy


def test_mqar_queries_every_key_once_with_targets_on_values() -> None:
    orders = set()
    for i, length in enumerate(range(7, 200, 3)):
        ex = mqar(example_rng(0, i, "mqar"), VOCAB, length)
        toks, m = ex.tokens, ex.meta["n_records"]
        assert m == (length - 1) // 6 and len(toks) == 1 + 6 * m
        recs = {toks[1 + 3 * r + 1]: toks[1 + 3 * r + 2] for r in range(m)}
        assert all(toks[1 + 3 * r] == REC for r in range(m)) and len(recs) == m
        q0 = 1 + 3 * m
        queries = [toks[q0 + 3 * q: q0 + 3 * q + 3] for q in range(m)]
        assert all(q[0] == SEP for q in queries)
        assert sorted(q[1] for q in queries) == sorted(recs)  # every key exactly once
        assert all(recs[k] == v for _, k, v in queries)
        assert [p for p, t in enumerate(ex.targets) if t] == [q0 + 3 * q + 2 for q in range(m)]
        orders.add(tuple(q[1] for q in queries) == tuple(recs))
    assert False in orders, "queries always in record order"


def test_copy_second_half_equals_first() -> None:
    for i, length in enumerate(range(4, 130)):
        ex = copy(example_rng(0, i, "copy"), VOCAB, length)
        toks, n = ex.tokens, (len(ex.tokens) - 2) // 2
        assert n >= 1 and toks[0] == BOS and toks[n + 1] == SEP
        assert toks[1:n + 1] == toks[n + 2:]
        assert ex.targets == [False] * (n + 2) + [True] * n


def test_markov_lm_follows_the_chain() -> None:
    chain, other = markov_chain(0, VOCAB), markov_chain(1, VOCAB)
    firsts, total, foreign = 0, 0, 0
    for i in range(200):
        ex = markov_lm(example_rng(0, i, "lm"), VOCAB, 100, seed=0)
        assert ex.tokens[0] == BOS and ex.targets == [False] + [True] * 99
        for a, b in zip(ex.tokens[1:], ex.tokens[2:]):
            assert b in chain.successors[a]
            firsts += b == chain.successors[a][0]
            foreign += b not in other.successors[a]
            total += 1
    assert abs(firsts / total - 8 / 15) < 0.03  # skewed weights 8:4:2:1
    assert foreign / total > 0.5  # the chain depends on the seed


# ------------------------------------------------------------------------------------ mixture


def test_mixture_task_frequencies_match_weights() -> None:
    w = TaskWeights(needle=3, kv_records=1, kv_records_query_aware=0, mqar=2, copy=0.5,
                    markov_lm=2.5)
    mix = Mixture(DataConfig(tasks=w))
    n = 3000
    counts = Counter(mix(i).meta["task"] for i in range(n))
    weights = {k: v for k, v in dataclasses.asdict(w).items() if v}
    assert set(counts) == set(weights)  # zero weight: never drawn
    total = sum(weights.values())
    chi2 = sum((counts[k] - n * v / total) ** 2 / (n * v / total) for k, v in weights.items())
    assert chi2 < 25, (chi2, counts)  # 4 dof: p ~ 1e-4


def test_mixture_lengths_follow_the_curriculum() -> None:
    cfg = DataConfig(tasks=ALL_TASKS, min_len=32, seq_len=128,
                     curriculum=[[0, 32], [50, 80], [100, 128]])
    mix = Mixture(cfg)
    assert mix.max_len(0) == mix.max_len(49) == 32
    assert mix.max_len(50) == mix.max_len(99) == 80
    assert mix.max_len(100) == mix.max_len(10**6) == 128
    ramp = [mix.max_len(s) for s in range(0, 120)]
    assert ramp == sorted(ramp) and set(ramp) == {32, 80, 128}
    assert Mixture(dataclasses.replace(cfg, curriculum=[])).max_len(0) == 128
    capped = dataclasses.replace(cfg, curriculum=[[0, 32], [10, 500]])
    assert Mixture(capped).max_len(20) == 128  # never beyond seq_len
    with pytest.raises(ConfigError, match="curriculum"):
        Mixture(dataclasses.replace(cfg, curriculum=[[50, 64], [0, 32]]))
    bs = cfg.batch_size
    for step in (0, 10, 50, 99, 100, 5000, None):
        hi = 128 if step is None else mix.max_len(step)
        exact, lens = [], []
        for b in range(400):  # one example from each of 400 batches (one length per batch)
            ex = mix(b * bs + b % bs, step)
            lens.append(len(ex.tokens))
            if ex.meta["task"] in ("needle", "markov_lm"):
                exact.append(len(ex.tokens))
        assert max(lens) <= hi, (step, max(lens), hi)
        assert min(exact) >= 32 and max(exact) <= hi
        assert max(exact) >= hi - (hi - 32) // 5  # the range is used, not just its bottom
        assert min(lens) >= 32 - max(SHORTER.values())


def test_mixture_draws_one_length_per_batch() -> None:
    cfg = DataConfig(tasks=TaskWeights(needle=1, markov_lm=1), batch_size=8, curriculum=[[0, 40]])
    mix = Mixture(cfg)
    for step in (0, 25, None):
        per_batch = [{len(mix(b * 8 + j, step).tokens) for j in range(8)} for b in range(40)]
        assert all(len(s) == 1 for s in per_batch), per_batch
        assert len(set().union(*per_batch)) > 5 or step == 0


def test_mixture_needles_honour_distractor_range_and_fillers() -> None:
    cfg = DataConfig(n_distractors=[2, 4], fillers=["phrase"])
    mix = Mixture(cfg)
    seen = Counter()
    for i in range(300):
        ex = mix(i)
        seen[ex.meta["n_distractors"]] += 1
        assert ex.meta["filler"] == "phrase"
        check_needle(ex, ex.meta["n_distractors"])
    assert set(seen) == {2, 3, 4}


def stream(cfg: DataConfig, n: int = 30) -> list[list[int]]:
    mix = Mixture(cfg)
    return [mix(37 * i, 3 * i).tokens for i in range(n)]  # many batches, every curriculum stage


BASE = DataConfig(tasks=TaskWeights(needle=1, mqar=1), curriculum=[[0, 48], [20, 128]])


@pytest.mark.parametrize("change", [
    {"seed": 1}, {"seq_len": 96}, {"tasks": TaskWeights(needle=1, mqar=2)},
    {"tasks": TaskWeights(needle=1, copy=1)}, {"min_len": 40}, {"curriculum": [[0, 48], [10, 128]]},
    {"n_distractors": [1, 2]}, {"fillers": ["iid"]}, {"n_keys": 70},
    {"batch_size": 7},  # one length per batch: the batch size shapes the stream
], ids=lambda c: next(iter(c)))
def test_fingerprint_changes_with_the_stream(change: dict) -> None:
    other = dataclasses.replace(BASE, **change)
    assert Mixture(other).fingerprint() != Mixture(BASE).fingerprint()
    assert stream(other) != stream(BASE)


@pytest.mark.parametrize("change", [
    {"val_batches": 3}, {"num_workers": 2}, {"packing": True},
    {"val_fraction": 0.5}, {"mlm_probability": 0.3},
    {"tasks": TaskWeights(needle=1, mqar=1, copy=0)},
], ids=lambda c: next(iter(c)))
def test_fingerprint_ignores_what_does_not_change_the_stream(change: dict) -> None:
    other = dataclasses.replace(BASE, **change)
    assert Mixture(other).fingerprint() == Mixture(BASE).fingerprint()
    assert stream(other) == stream(BASE)
    assert Mixture(dataclasses.replace(BASE)).fingerprint() == Mixture(BASE).fingerprint()


# ------------------------------------------------------------------------------- check_mixture


@pytest.mark.parametrize(("change", "key"), [
    ({"tasks": TaskWeights(needle=1, kv_records=-1)}, "data.tasks"),
    ({"tasks": TaskWeights(needle=0)}, "data.tasks"),
    ({"tasks": {"needle": 1, "needel": 1}}, "data.tasks.needel"),
    ({"n_distractors": [3, 1]}, "data.n_distractors"),
    ({"n_distractors": [-1, 1]}, "data.n_distractors"),
    ({"min_len": 4}, "data.min_len"),
    ({"min_len": 200}, "data.min_len"),
    ({"n_distractors": [1, 5], "min_len": needle_min_length(5) - 1}, "data.min_len"),
    ({"tasks": TaskWeights(needle=0, kv_records=1), "n_keys": 40}, "data.n_keys"),
    ({"tasks": TaskWeights(needle=0, kv_records_query_aware=1), "n_values": 39}, "data.n_"),
    ({"tasks": TaskWeights(mqar=1), "n_keys": 20}, "data.n_keys"),
    ({"n_distractors": [0, 7], "n_keys": 7, "min_len": 40}, "data.n_keys"),
], ids=["negative", "zero-sum", "unknown-task", "distractors-min>max", "distractors-negative",
        "min_len<8", "min_len>seq_len", "min_len-needles", "keys-kv", "values-kv-qa", "keys-mqar",
        "keys-needle"])
def test_check_mixture_rejects(change: dict, key: str) -> None:
    cfg = dataclasses.replace(DataConfig(seq_len=128), **change)
    with pytest.raises(ConfigError) as e:
        validate_mixture(cfg)
    msg = str(e.value)
    assert "\n" not in msg and key in msg, msg
    with pytest.raises(ConfigError):
        Mixture(cfg)


@pytest.mark.parametrize("task", ["kv_records", "kv_records_query_aware", "mqar"])
@pytest.mark.parametrize("seq_len", [64, 100, 128])
def test_check_mixture_key_count_is_the_exact_boundary(task: str, seq_len: int) -> None:
    """Enough keys per validate_mixture means every sequence up to seq_len builds; one fewer fails."""
    weights = TaskWeights(needle=0, **{task: 1})
    need = make(task, 0, seq_len).meta["n_records"]  # records in the longest sequence
    ok = DataConfig(tasks=weights, seq_len=seq_len, min_len=seq_len, n_keys=need, n_values=need)
    mix = Mixture(ok)
    for i in range(50):
        mix(i)
    with pytest.raises(ConfigError, match=r"data\.n_keys"):
        validate_mixture(dataclasses.replace(ok, n_keys=need - 1, n_values=need - 1))


def test_check_mixture_needle_min_len_boundary_builds() -> None:
    for hi in (0, 3, 6):
        lo = needle_min_length(hi)
        cfg = DataConfig(n_distractors=[hi, hi], min_len=max(lo, 8), seq_len=max(lo, 8) + 1)
        mix = Mixture(cfg)
        for i in range(100):
            assert len(mix(i, 0).tokens) >= lo


@pytest.mark.parametrize("fillers", [["iid", "typo"], []], ids=["unknown", "empty"])
def test_check_mixture_rejects_bad_fillers(fillers: list[str]) -> None:
    """RELIABILITY E: an unknown choice fails at config time, not mid-run when first drawn."""
    cfg = DataConfig(fillers=fillers)
    with pytest.raises(ConfigError, match=r"data\.fillers"):
        validate_mixture(cfg)


# ------------------------------------------------------- variable tracking and aggregation


def test_multihop_and_counting_are_exact_length_and_draw_their_ranges() -> None:
    """Training draws: every (hops, chains) / (candidates, margin) pair that fits is drawn, and
    nothing else; sequences are exactly ``length`` tokens from the shortest length up."""
    from blocklab.config import (
        counting_choices,
        counting_min_length,
        multihop_choices,
        multihop_min_length,
    )

    for name, shortest, choices, fields in (
            ("multihop", multihop_min_length(1, 1), multihop_choices, ("hops", "distractor_chains")),
            ("counting", counting_min_length(2, 1), counting_choices, ("n_candidates", "margin"))):
        with pytest.raises(ValueError, match="too short"):
            make(name, 0, shortest - 1)
        for length in (shortest, 32, 64, 128):
            seen = set()
            for i in range(150):
                ex = make(name, i, length)
                assert len(ex.tokens) == length == len(ex.targets)
                assert ex.tokens.count(BOS) == 1 == ex.tokens.count(SEP) and ex.tokens[0] == BOS
                assert SEP in ex.tokens[-3:-1]  # SEP x_h v (multihop) / SEP c (counting)
                assert ex.targets == [False] * (length - 1) + [True]
                seen.add(tuple(ex.meta[f] for f in fields))
            assert seen == set(choices(length)), (name, length)


def test_multihop_chains_resolve_to_the_answer_in_chain_order() -> None:
    for i in range(300):
        ex = make("multihop", i, 96, filler=["iid", "phrase", "markov"][i % 3])
        toks = ex.tokens
        assert toks[-3] == SEP and toks[-2] in VOCAB.keys and toks[-1] in VOCAB.values
        where = {}
        for j, t in enumerate(toks[:-3]):
            if t == MARK:
                assert toks[j + 1] not in where, "a variable is assigned twice"
                where[toks[j + 1]] = j
        assert all(t not in VOCAB.keys or toks[j - 1] == MARK or toks[j - 2] == MARK
                   for j, t in enumerate(toks[:-3]))
        chain, x = [], toks[-2]
        while True:  # brute force: follow the question's variable back to a value
            chain.append(where[x])
            rhs = toks[where[x] + 2]
            if rhs in VOCAB.values:
                break
            x = rhs
        assert rhs == toks[-1] and toks.count(rhs) == 2  # stated once, answered once
        assert chain[::-1] == ex.meta["hop_indices"] == sorted(chain)
        assert len(chain) == ex.meta["hops"]
        roots = [t for t in toks[:-1] if t in VOCAB.values]
        assert len(roots) == len(set(roots)) == ex.meta["distractor_chains"] + 1


def test_counting_margin_is_exact_and_the_answer_most_frequent() -> None:
    for i in range(300):
        k, m = 2 + i % 3, 1 + i % 4
        ex = make("counting", i, 64, candidates=k, margin=m)
        toks = ex.tokens
        counts = Counter(t for t in toks[:-2] if t in VOCAB.values)
        assert len(counts) == k and not any(t in VOCAB.keys or t == MARK for t in toks)
        (top, n1), (_, n2) = counts.most_common(2)
        assert top == toks[-1] and n1 - n2 == m and n2 <= 4  # COUNTING_MAX_COUNT
        assert ex.meta["winner_share"] == n1 / sum(counts.values())
        assert [toks[j] for j in ex.meta["gold_indices"]] == [top] * n1


def test_mixture_draws_multihop_and_counting() -> None:
    cfg = DataConfig(tasks=TaskWeights(needle=0, multihop=1, counting=1), fillers=["phrase"])
    mix = Mixture(cfg)
    tasks = Counter()
    for i in range(200):
        ex = mix(i)
        tasks[ex.meta["task"]] += 1
        assert ex.meta["filler"] == "phrase"
    assert set(tasks) == {"multihop", "counting"} and min(tasks.values()) > 60


def test_multihop_hops_limits_the_hop_counts_training_draws() -> None:
    """``data.multihop_hops=[lo, hi]``: every training chain has lo..hi hops (each drawn, as
    far as they fit the length); the vocabulary rule and the shortest length follow the range;
    the stream's fingerprint changes only when the range does."""
    base = DataConfig(tasks=TaskWeights(needle=0, multihop=1), seq_len=64, min_len=64)
    for lo, hi in ((1, 2), (2, 3), (4, 4)):
        cfg = dataclasses.replace(base, multihop_hops=[lo, hi])
        mix = Mixture(cfg)
        hops = Counter(mix(i).meta["hops"] for i in range(300))
        assert set(hops) == set(range(lo, hi + 1)), (lo, hi, hops)
        assert mix.fingerprint() != Mixture(base).fingerprint()
    assert set(Counter(Mixture(base)(i).meta["hops"] for i in range(300))) == {1, 2, 3, 4}
    assert Mixture(dataclasses.replace(base, multihop_hops=[1, 4])).fingerprint() == \
        Mixture(base).fingerprint()
    # 1..2 hops at 64 tokens need 6 keys (2 hops x 3 chains), 1..4 need 12
    validate_mixture(dataclasses.replace(base, multihop_hops=[1, 2], n_keys=6))
    with pytest.raises(ConfigError, match=r"data\.n_keys"):
        validate_mixture(dataclasses.replace(base, multihop_hops=[1, 2], n_keys=5))
    with pytest.raises(ConfigError, match=r"data\.n_keys"):
        validate_mixture(dataclasses.replace(base, n_keys=6))
    # 3 hops and 1 distractor chain need 23 tokens
    with pytest.raises(ConfigError, match=r"data\.min_len=22: multihop needs"):
        validate_mixture(dataclasses.replace(base, multihop_hops=[3, 4], min_len=22))
    validate_mixture(dataclasses.replace(base, multihop_hops=[3, 4], min_len=23))
    for bad in ([0, 2], [3, 2], [2]):
        with pytest.raises(ConfigError, match=r"data\.multihop_hops=.*1 <= min <= max"):
            validate_mixture(dataclasses.replace(base, multihop_hops=bad))


@pytest.mark.parametrize(("change", "key"), [
    ({"tasks": TaskWeights(needle=0, multihop=1), "n_keys": 11}, "data.n_keys"),
    ({"tasks": TaskWeights(needle=0, multihop=1), "n_values": 2}, "data.n_values"),
    ({"tasks": TaskWeights(needle=0, counting=1), "n_values": 3}, "data.n_values"),
    ({"tasks": TaskWeights(needle=0, counting=1), "min_len": 12}, "data.min_len"),
    ({"tasks": TaskWeights(needle=0, multihop=1), "min_len": 10}, "data.min_len"),
], ids=["multihop-keys", "multihop-values", "counting-values", "counting-min_len",
        "multihop-min_len"])
def test_check_mixture_rejects_new_tasks(change: dict, key: str) -> None:
    cfg = dataclasses.replace(DataConfig(seq_len=128), **change)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_mixture(cfg)
    ok = dataclasses.replace(cfg, n_keys=12, n_values=4, min_len=13)  # the exact boundary
    mix = Mixture(ok)
    for i in range(100):
        mix(i)


# ---------------------------------------------------------------------------------- flip-flop


def _replay(tokens: list[int]) -> tuple[list[int], int, int]:
    """Run a flip-flop program: the answer each read must give, the writes, and the distance
    from the last written value to the end."""
    answers, last, writes, at = [], None, 0, 0
    for i in range(1, len(tokens), 2):
        op, v = tokens[i], tokens[i + 1]
        assert op in (MARK, REC, SEP), op
        if op == SEP:
            answers.append(last)
            assert v == last  # a read carries the last written value
        elif op == MARK:
            last, writes, at = v, writes + 1, i + 1
    return answers, writes, len(tokens) - 1 - at


@pytest.mark.parametrize("p_read", [0.0, 0.1, 0.5])
def test_flip_flop_reads_give_the_last_write(p_read: float) -> None:
    vocab = VOCAB
    for i, length in enumerate([5, 6, 7, 64, 129, 513]):
        for j in range(20):
            ex = flip_flop(example_rng(3, 100 * i + j), vocab, length, p_read=p_read)
            assert ex.tokens[0] == BOS and ex.tokens[1] == MARK and ex.tokens[-2] == SEP
            answers, writes, distance = _replay(ex.tokens)
            supervised = [t for t, on in zip(ex.tokens, ex.targets) if on]
            assert supervised == answers  # exactly the read values are supervised
            assert [k for k, on in enumerate(ex.targets) if on] == [
                k + 1 for k in range(1, len(ex.tokens), 2) if ex.tokens[k] == SEP]
            assert ex.meta == {"task": "flip_flop", "writes": writes, "distance": distance}
            if p_read == 0:
                assert len(answers) == 1  # one read, at the end
            assert set(ex.tokens[2::2]) <= set(vocab.values[:2])  # the first 2 value ids


def test_flip_flop_rates_and_the_ignored_values_look_like_written_ones() -> None:
    ops, values = Counter(), {MARK: Counter(), REC: Counter()}
    for i in range(300):
        toks = flip_flop(example_rng(0, i), VOCAB, 129, p_write=0.2, p_read=0.1,
                         symbols=3).tokens
        for k in range(3, len(toks) - 2, 2):  # the pairs drawn by rate: not the first or last
            ops[toks[k]] += 1
            if toks[k] in values:
                values[toks[k]][toks[k + 1]] += 1
    total = sum(ops.values())
    for op, p in ((MARK, 0.2), (SEP, 0.1), (REC, 0.7)):
        assert abs(ops[op] / total - p) < 0.01, (op, ops[op] / total)
    for counts in values.values():  # ignored and written values: uniform over the 3 symbols
        assert set(counts) == set(VOCAB.values[:3])
        assert max(counts.values()) / min(counts.values()) < 1.1


def test_flip_flop_sparser_writes_mean_longer_holds() -> None:
    def mean_distance(p: float) -> float:
        return sum(flip_flop(example_rng(1, i), VOCAB, 513, p_write=p).meta["distance"]
                   for i in range(200)) / 200

    dense, sparse = mean_distance(0.1), mean_distance(0.01)
    assert 15 < dense < 25 and sparse > 4 * dense  # about 2 / p tokens back, capped by the length


@pytest.mark.parametrize("kw", [{"p_write": 0}, {"p_write": 1.1}, {"p_read": -0.1},
                                {"p_write": 0.6, "p_read": 0.5}, {"symbols": 0}])
def test_flip_flop_refuses_impossible_rates(kw: dict) -> None:
    with pytest.raises(ValueError, match="flip_flop"):
        flip_flop(example_rng(0, 0), VOCAB, 64, **kw)
    with pytest.raises(ValueError, match="too short"):
        flip_flop(example_rng(0, 0), VOCAB, 4)


def test_flip_flop_needs_its_symbols_in_the_value_range() -> None:
    cfg = DataConfig(tasks=TaskWeights(needle=0, flip_flop=1), n_values=1)
    with pytest.raises(ConfigError, match=r"data\.n_values=1: flip_flop .*needs 0 distinct keys "
                                          r"and 2 distinct values"):
        validate_mixture(cfg)
    mix = Mixture(dataclasses.replace(cfg, n_values=2))
    assert all(mix(i).meta["task"] == "flip_flop" for i in range(50))

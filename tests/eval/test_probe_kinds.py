"""The multi-needle, variable-tracking and aggregation probes (docs/probes.md, "Multi-needle,
variable tracking, aggregation") against models whose answers are known, in every family:
an oracle that solves each prompt by brute force scores 1.0 (multi-token answers included,
through the encoder's masked slots, the encoder–decoder's target and the decoder's KV-cached
scoring and generation); a model answering random values scores chance; one answering a
random in-context candidate scores the copy line. Plus: no leakage from the training stream,
uniform gold / farthest-hop depths (and a fixed-position generator fails the same test),
unique keys / values / variables, BOS once, hop statements in chain order."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from torch import nn

from blocklab.config import (
    AggregationProbeConfig,
    DataConfig,
    HopsProbeConfig,
    LitmProbeConfig,
    ModelConfig,
    MultiNeedleProbeConfig,
    NeedleProbeConfig,
    PerplexityProbeConfig,
    ProbeSpec,
    TaskWeights,
)
from blocklab.data import synthetic as syn
from blocklab.data.tasks.needle import needle
from blocklab.eval.aggregate import wilson_interval
from blocklab.eval.backends import BlocklabBackend
from blocklab.eval.items import TokenBuilder
from blocklab.eval.kinds import PROBE_KINDS
from blocklab.eval.probes import run_spec
from blocklab.eval.scoring import partial_credit, text_match

VOCAB = syn.Vocab()
KEYS, VALUES = set(VOCAB.keys), set(VOCAB.values)
KINDS = ("multi_needle", "hops", "aggregation")


# ------------------------------------------------------------------ brute-force reference


def solve(prompt: list[int]) -> tuple[list[int], list[list[int]]]:
    """(gold answer, every in-context alternative answer) read off a prompt by brute force,
    knowing only the formats: ``MARK a b`` statements (``a = b``), bare value ids, the
    question ``SEP q…`` at the end."""
    s = len(prompt) - 1 - prompt[::-1].index(syn.SEP)
    ctx, query = prompt[:s], prompt[s + 1:]
    marks = [i for i, t in enumerate(ctx) if t == syn.MARK]
    stmts = [(ctx[i + 1], ctx[i + 2]) for i in marks]
    if not query:  # aggregation: the most frequent bare value
        counts = Counter(t for t in ctx if t in VALUES)
        (top, n1), (_, n2) = counts.most_common(2)
        assert n1 > n2
        return [top], [[c] for c in counts]

    def resolve(x: int) -> list[int]:
        rhs = [b for a, b in stmts if a == x]
        return resolve(rhs[0]) if len(rhs) == 1 and rhs[0] in KEYS else rhs

    answer = [v for q in query for v in resolve(q)]
    keys = list(dict.fromkeys(a for a, b in stmts if b in VALUES))
    if len(query) > 1:  # multi-query: the asked keys' values shifted over the keys
        idx = [keys.index(q) for q in query]
        cands = [[resolve(keys[(i + sh) % len(keys)])[0] for i in idx] for sh in range(len(keys))]
    elif len(answer) > 1:  # multi-value: each key's run of values
        cands = [resolve(k) for k in keys]
    else:  # every value in context (hops: every chain's root)
        cands = [[b] for _, b in stmts if b in VALUES]
    return answer, cands


class Solver(nn.Module):
    """A fake model of any family that answers the probe items: ``oracle`` (the brute-force
    answer), ``copy`` (a random in-context candidate answer, fixed per prompt) or ``random``
    (a random value per answer token). It implements each family's forward signature and the
    generation interface (``new_cache`` / ``prepare`` / ``decode``), so items go through the
    real objectives: the decoder's shared-prefix scoring and cached greedy, the encoder's
    masked answer slots, the encoder–decoder's target."""

    max_positions = None
    can_generate = True

    def __init__(self, family: str, mode: str = "oracle", seed: int = 0) -> None:
        super().__init__()
        self.config = ModelConfig(vocab_size=VOCAB.size)
        self.config.family.name = family
        self.mode, self.seed = mode, seed
        self._answers: dict[tuple[int, ...], list[int]] = {}

    def answer(self, prompt: list[int]) -> list[int]:
        key = tuple(prompt)
        if key not in self._answers:
            gold, cands = solve(prompt)
            rng = random.Random(f"{self.mode}:{self.seed}:{key}")
            if self.mode == "copy":
                gold = rng.choice(cands)
            elif self.mode == "random":
                gold = [rng.choice(VOCAB.values) for _ in gold]
            self._answers[key] = gold
        return self._answers[key]

    def _token(self, prompt: list[int], slot: int) -> int | None:
        ans = self.answer(prompt)
        return ans[slot] if slot < len(ans) else None

    def _causal_next(self, ctx: list[int]) -> int | None:
        if syn.SEP not in ctx:
            return None
        s = len(ctx) - 1 - ctx[::-1].index(syn.SEP)
        after = ctx[s + 1:]
        n_q = next((j for j, t in enumerate(after) if t not in KEYS), len(after))
        if any(t not in VALUES for t in after[n_q:]):
            return None
        return self._token(ctx[: s + 1 + n_q], len(after) - n_q)

    def new_cache(self, batch: int, capacity: int) -> _Cache:
        return _Cache([[] for _ in range(batch)])

    def prepare(self, *, source_ids=None, source_valid=None) -> dict:
        if source_ids is None:
            return {}
        valid = source_valid if source_valid is not None else torch.ones_like(source_ids).bool()
        return {"memory": [source_ids[i, valid[i]].tolist() for i in range(len(source_ids))],
                "source_valid": source_valid}

    def decode(self, ids, *, positions, valid, cache, **prepared):
        if self.config.family.name == "decoder":
            return self(ids, positions=positions, valid=valid, cache=cache)
        return self(None, ids, valid=valid, positions=positions, cache=cache, **prepared)

    def forward(self, *args, select=None, **kw):
        fam = self.config.family.name
        ids = args[0] if fam != "encoder_decoder" else args[1]
        b, t = ids.shape
        logits = torch.zeros(b, t, VOCAB.size)
        want = select if select is not None else torch.ones(b, t, dtype=torch.bool)
        for i in range(b):
            row = ids[i].tolist()
            if fam == "decoder":
                cache, valid = kw.get("cache"), kw.get("valid")
                real = valid[i].tolist() if valid is not None else [True] * t
                ctx = list(cache.rows[i]) if cache is not None else []
                for j in range(t):
                    if real[j]:
                        ctx.append(row[j])
                        tok = self._causal_next(ctx) if want[i, j] else None
                        if tok is not None:
                            logits[i, j, tok] = 20.0
                if cache is not None:
                    cache.rows[i] = ctx
            elif fam == "encoder":
                first = row.index(syn.MASK)
                prompt = [x for x, ok in zip(row[:first], kw["valid"][i].tolist()) if ok]
                for j in range(first, t):
                    if row[j] == syn.MASK and want[i, j]:
                        logits[i, j, self._token(prompt, j - first)] = 20.0
            else:
                if args[0] is not None:  # teacher forcing: target position j -> slot j
                    prompt, done = args[0][i, kw["source_valid"][i]].tolist(), 0
                else:  # cached generation: slots continue after what the cache holds
                    prompt, done = kw["memory"][i], len(kw["cache"].rows[i])
                    kw["cache"].rows[i] = kw["cache"].rows[i] + row
                for j in range(t):
                    tok = self._token(prompt, done + j) if want[i, j] else None
                    if tok is not None:
                        logits[i, j, tok] = 20.0
        return logits if select is None else logits[select]


class _Cache:
    def __init__(self, rows: list[list[int]]) -> None:
        self.rows = rows

    def select(self, index) -> _Cache:
        return _Cache([list(self.rows[int(r)]) for r in index])


def spec(n: int = 48, **kw) -> ProbeSpec:
    return ProbeSpec(
        needle=NeedleProbeConfig(enabled=False), litm=LitmProbeConfig(enabled=False),
        perplexity=PerplexityProbeConfig(enabled=False),
        multi_needle=MultiNeedleProbeConfig(enabled=True, lengths=[1.0], keys=3, values=2,
                                            queries=2, n=n),
        hops=HopsProbeConfig(enabled=True, hops=[1, 3], lengths=[1.0], distractor_chains=1, n=n),
        aggregation=AggregationProbeConfig(enabled=True, candidates=3, margins=[1, 3],
                                           lengths=[1.0], n=n), **kw)


def run(model, sp: ProbeSpec | None = None, out=None):
    return run_spec(BlocklabBackend(model), sp or spec(), builder=TokenBuilder(VOCAB, 1234),
                    train_length=64, keys={"step": 0}, out_dir=out, plots=out is not None)


def cells_of(kind: str, sp: ProbeSpec | None = None):
    return PROBE_KINDS[kind].token_cells(sp or spec(), TokenBuilder(VOCAB, 1234), 64, None)


def items_of(kind: str, sp: ProbeSpec | None = None):
    return [it for c in cells_of(kind, sp) for it in c.items]


# ---------------------------------------------------------------------------- baselines


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_oracle_scores_one_in_every_family_multi_token_answers_included(family):
    r = run(Solver(family))
    assert {c["probe"] for c in r.cells} == set(KINDS)
    widths = Counter(c["variant"] for c in r.cells)
    assert len(widths) == 3 + 2 + 2
    for c in r.cells:
        assert c["n"] == 48 and c["status"] == "ok", c
        assert c["accuracy"] == c["exact"] == c["partial"] == 1.0, c
        assert c["margin"] > 0, c  # every other in-context answer is scored below the gold
    assert all(e["any_value"] for e in r.examples)
    s = r.summary
    assert s["multi_needle"]["multivalue"]["pooled"]["accuracy"] == 1.0
    assert s["hops"]["accuracy_by_hops"] == {"1": 1.0, "3": 1.0}
    assert sum(b["n"] for b in s["hops"]["by_farthest_depth"]) == 2 * 48
    assert s["aggregation"]["margin 3"]["pooled"]["accuracy"] == 1.0


def _pooled(r, probe: str, key: str = "argmax"):
    ex = [e for e in r.examples if e["probe"] == probe]
    return sum(e[key] for e in ex), len(ex)


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_copying_a_candidate_scores_the_copy_line_and_random_values_chance(family):
    """The copy line of every cell is 1 / (in-context candidate answers); chance is
    (1 / n_values) ** answer tokens. 99.9% Wilson intervals, pooled per kind over cells with
    the same line."""
    sp = spec(n=160)
    copy, rand = run(Solver(family, "copy", seed=1), sp), run(Solver(family, "random", seed=2), sp)
    for probe in KINDS:
        lines = {c["copy_any_value"] for c in copy.cells if c["probe"] == probe}
        assert len(lines) == 1  # keys=3 / 2 chains / 3 candidates: one line per kind here
        k, n = _pooled(copy, probe)
        lo, hi = wilson_interval(k, n, z=3.29)
        assert lo <= lines.pop() <= hi, (probe, k, n)
        k, n = _pooled(rand, probe)
        chance = max(c["chance"] for c in rand.cells if c["probe"] == probe)
        lo, hi = wilson_interval(k, n, z=3.29)
        assert lo <= chance <= hi, (probe, k, n)
    # partial credit of random values on the two-token answers: 1 - (1 - 1/V)^2 per item
    ex = [e for e in rand.examples if e["variant"] in ("multivalue", "multiquery")]
    mean = sum(e["partial"] for e in ex) / len(ex)
    expected = 1 - (1 - 1 / VOCAB.n_values) ** 2
    assert abs(mean - expected) < 4 * (expected / len(ex)) ** 0.5 + 1e-9, mean
    # copying whole candidates: partial of a multi-value run is all or nothing
    assert {e["partial"] for e in copy.examples if e["variant"] == "multivalue"} <= {0.0, 1.0}


def test_chance_and_copy_lines_per_cell():
    for c in cells_of("multi_needle"):
        width = {"multikey": 1, "multivalue": 2, "multiquery": 2}[c.key["variant"]]
        assert c.chance == pytest.approx(VOCAB.n_values ** -width)
        assert c.copy_any_value == pytest.approx(1 / 3)
        assert all(len(it.candidates) == 3 and len(it.answer) == width for it in c.items)
    assert all(c.copy_any_value == 0.5 and c.chance == 1 / 64 for c in cells_of("hops"))
    assert all(c.copy_any_value == pytest.approx(1 / 3) for c in cells_of("aggregation"))


def test_partial_credit_and_text_matching_reference():
    assert partial_credit([5, 6], [6, 5]) == 1.0  # order-free
    assert partial_credit([5, 5], [5, 6]) == 0.5  # each generated token matches once
    assert partial_credit([5, 6, 7], [7]) == 0.0  # only the first len(answer) tokens count
    assert text_match(None, ["12345", "67890"], "It is 12345, and 67890.") == (True, 1.0)
    assert text_match(None, ["12345", "67890"], "It is 12345.") == (False, 0.5)
    assert text_match("Blue sky", None, "the BLUE-sky!") == (True, 1.0)


def test_text_items_with_several_answers_need_all_of_them():
    """Scorer side of the text-space kinds: an item with ``answer_texts`` is exact only when
    every string is in the generation; partial is the share found."""
    from blocklab.eval.items import ProbeItem
    from blocklab.eval.scoring import score_items

    class Fixed:
        family, name = "decoder", "fixed"

        def answer_logprobs(self, prompts, answers):
            w = max(len(a) for a in answers)
            return (torch.full((len(prompts), w, 8), -2.0794),
                    torch.arange(w)[None] < torch.tensor([len(a) for a in answers])[:, None])

        def greedy(self, prompts, n):
            return [[1, 2, 3] for _ in prompts]

    items = [ProbeItem({"probe": "multi_needle"}, [0], [1, 2], [[1, 2]], 0, answer_text="a b",
                       answer_texts=texts) for texts in (["a", "b"], ["a", "zz"], ["zz"])]
    rows = score_items(Fixed(), items, batch_size=8, decode=lambda g: "x a y b",
                       max_new_tokens=3)
    assert [(r["exact"], r["partial"]) for r in rows] == [(True, 1.0), (False, 0.5), (False, 0.0)]


# ------------------------------------------------------------------------------ leakage


def test_probe_answers_cannot_be_guessed_from_the_training_stream():
    """A closed-book table fitted on the training stream (data seed 1234: needles, variable
    tracking, counting), keyed by the last prompt token, scores chance on the probe items
    (probe seed 9999); no probe sequence is a training sequence."""
    from blocklab.data.mixture import Mixture

    mix = Mixture(DataConfig(seed=1234, seq_len=64, min_len=32,
                             tasks=TaskWeights(needle=1, multihop=1, counting=1)), salt="train")
    table: dict[int, Counter] = {}
    train = set()
    for i in range(6000):
        ex = mix(i)
        start = ex.answer_start
        table.setdefault(ex.tokens[start - 1], Counter())[ex.tokens[start]] += 1
        train.add(tuple(ex.tokens))
    assert {"multihop", "counting"} <= {mix(i).meta["task"] for i in range(50)}
    items = [it for kind in KINDS for it in items_of(kind, spec(n=96))]
    hits = sum(table.get(it.prompt[-1], Counter({-1: 1})).most_common(1)[0][0] == it.answer[0]
               for it in items)
    lo, hi = wilson_interval(hits, len(items), z=3.29)
    assert lo <= 1 / VOCAB.n_values <= hi, (hits, len(items))
    assert not any(tuple(it.prompt + it.answer) in train for it in items)


# ------------------------------------------------------------------------ depth uniformity


def chi2_uniform(us: list[float], bins: int = 10) -> float:
    counts = Counter(min(int(u * bins), bins - 1) for u in us)
    e = len(us) / bins
    return sum((counts[b] - e) ** 2 / e for b in range(bins))


CHI2_CRIT = 27.88  # chi-square, 9 degrees of freedom, p = 0.001


def jittered(depths_and_hay: list[tuple[float, int]], seed: int = 0) -> list[float]:
    """Exact uniforms under H0: a slot uniform on {0..hay} maps to (slot + U) / (hay + 1)."""
    rng = random.Random(seed)
    return [(round(d * hay) + rng.random()) / (hay + 1) for d, hay in depths_and_hay]


def _hay(prompt: list[int]) -> int:
    return sum(t in VOCAB.filler for t in prompt)


def test_gold_and_farthest_hop_depths_are_uniform_and_a_fixed_position_fails():
    sp = spec(n=400)
    sp.multi_needle.variants = ["multikey"]
    sp.hops.hops = [3]
    sp.aggregation.margins = [2]
    mk = [(it.meta["gold_depths"][0], _hay(it.prompt)) for it in items_of("multi_needle", sp)]
    hops = [(it.meta["farthest_depth"], _hay(it.prompt)) for it in items_of("hops", sp)]
    agg = [(d, _hay(it.prompt)) for it in items_of("aggregation", sp)[:150]
           for d in it.meta["gold_depths"]]
    for name, sample in (("multikey", mk), ("hops", hops), ("aggregation", agg)):
        assert chi2_uniform(jittered(sample)) < CHI2_CRIT, name
    # negative controls: a needle at a fixed depth, and the naive chain draw (h sorted uniform
    # slots: the root is their minimum, Beta(1, h)-distributed, not uniform)
    fixed = [needle(syn.example_rng(0, i, "fixed"), VOCAB, 64, n_distractors=2, depth=0.5)
             for i in range(400)]
    fixed_d = [((ex.meta["gold_index"] - 1) / 46, 46) for ex in fixed]
    assert chi2_uniform(jittered(fixed_d)) > CHI2_CRIT
    rng = random.Random(1)
    naive = [(min(rng.randint(0, 40) for _ in range(3)) / 40, 40) for _ in range(400)]
    assert chi2_uniform(jittered(naive)) > CHI2_CRIT


# --------------------------------------------------------------------- item invariants


@pytest.mark.parametrize("kind", KINDS)
def test_items_unique_ids_bos_once_answer_once_and_exact_length(kind):
    sp = spec(n=40)
    sp.multi_needle.lengths = sp.hops.lengths = sp.aggregation.lengths = [0.5, 1.0, 2.0]
    for c in cells_of(kind, sp):
        assert c.na is None or c.key["length"] < 64, c.na
        for it in c.items:
            p = it.prompt
            assert len(p) + len(it.answer) == c.key["length"]
            assert p[0] == syn.BOS and p.count(syn.BOS) == 1 and p.count(syn.SEP) == 1
            query = p[p.index(syn.SEP) + 1:]
            assert all(t in KEYS for t in query)  # the question names keys only
            gold, cands = solve(p)  # the brute-force reference agrees with the builder
            assert gold == it.answer == it.candidates[it.gold]
            assert sorted(cands) == sorted(it.candidates)
            stmts = [(p[i + 1], p[i + 2]) for i, t in enumerate(p) if t == syn.MARK]
            values = [t for t in p if t in VALUES]
            if kind == "aggregation":
                assert not stmts and not query
                counts = sorted(Counter(values).values(), reverse=True)
                assert counts[0] - counts[1] == c.key["count_margin"]
                assert len(counts) == sp.aggregation.candidates
                continue
            assert len(values) == len(set(values))  # every value once: no answer stated twice
            assert all(p.count(v) == 1 for v in it.answer)
            lhs = Counter(a for a, _ in stmts)
            per_key = sp.multi_needle.values if c.key.get("variant") == "multivalue" else 1
            assert set(lhs.values()) == {per_key}  # unique keys / variable names
            if kind == "hops":
                assert len(stmts) == c.key["hops"] * (sp.hops.distractor_chains + 1)


def test_hop_statements_are_in_chain_order():
    for it in items_of("hops", spec(n=60)):
        p = it.prompt
        where = {p[i + 1]: i for i, t in enumerate(p) if t == syn.MARK}
        chain, x = [], p[-1]
        while True:  # follow the chain back from the queried variable, by brute force
            i = where[x]
            chain.append(i)
            if p[i + 2] in VALUES:
                break
            x = p[i + 2]
        assert chain[::-1] == sorted(chain)  # root first: statements appear in chain order
        assert len(chain) == it.cell["hops"]
        hd = it.meta["hop_depths"]
        assert hd == sorted(hd) and hd[0] == it.meta["farthest_depth"]


def test_report_files_and_table(tmp_path):
    r = run(Solver("decoder"), out=tmp_path / "r")
    for name in ("multi_needle.png", "hops.png", "aggregation.png", "cells.csv"):
        assert (tmp_path / "r" / name).stat().st_size > 0
    from blocklab.eval.report import format_report

    text = format_report(r.summary, r.cells)
    for line in ("multi-needle", "variable tracking", "aggregation", "multivalue", "3 hops",
                 "margin 3", "by farthest-hop depth"):
        assert line in text, line
    header = (tmp_path / "r" / "cells.csv").read_text().splitlines()[0].split(",")
    for col in ("probe", "variant", "length", "hops", "count_margin", "margin", "partial",
                "copy_any_value", "chance", "winner_share"):
        assert col in header
    # the aggregation rows keep their count margin apart from the log-prob margin statistic
    # (one name for both once drew the heatmap's rows from the log-prob margins)
    agg = [c for c in r.cells if c["probe"] == "aggregation"]
    assert agg and all(c["variant"] == f"margin {c['count_margin']}" for c in agg)


# ----------------------------------------------------------------------------- config rules


def test_breadth_spec_composes_and_validates_against_the_default_run():
    from blocklab.config import compose, validate_train
    from blocklab.train.run import to_train_config

    tc = to_train_config(compose("train", ["probes=breadth"]))
    assert validate_train(tc) is tc
    p = tc.probes
    assert p.name == "breadth" and p.multi_needle.enabled and p.hops.enabled
    assert p.aggregation.enabled and not (p.needle.enabled or p.litm.enabled)
    assert not ProbeSpec().hops.enabled  # off by default: the other specs keep their cost


@pytest.mark.parametrize(("change", "key"), [
    ({"multi_needle.variants": ["multikey", "multi"]}, "probes.multi_needle.variants"),
    ({"multi_needle.variants": []}, "probes.multi_needle.variants"),
    ({"multi_needle.queries": 5}, "probes.multi_needle.queries"),
    ({"multi_needle.keys": 9, "multi_needle.values": 8}, "probes.multi_needle.keys"),
    ({"multi_needle.lengths": [0.1]}, "probes.multi_needle.lengths"),
    ({"hops.hops": [0, 2]}, "probes.hops.hops"),
    ({"hops.hops": [40]}, "probes.hops.hops"),
    ({"hops.distractor_chains": -1}, "probes.hops.distractor_chains"),
    ({"aggregation.candidates": 1}, "probes.aggregation.candidates"),
    ({"aggregation.margins": [0]}, "probes.aggregation.margins"),
    ({"aggregation.candidates": 65}, "probes.aggregation.candidates"),
    ({"aggregation.lengths": [0.05]}, "probes.aggregation.lengths"),
    ({"hops.n": 0}, "probes.hops.n"),
], ids=lambda c: str(c))
def test_probe_kind_rules(change: dict, key: str):
    from omegaconf import OmegaConf

    from blocklab.config import ConfigError, validate_probe_spec

    cfg = OmegaConf.structured(spec())
    for k, v in change.items():
        OmegaConf.update(cfg, k, v)
    sp = OmegaConf.to_object(cfg)
    with pytest.raises(ConfigError) as e:
        validate_probe_spec(sp, "probes", synthetic=True, data=DataConfig(seq_len=128))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"config error: {key}="), msg
    validate_probe_spec(spec(), "probes", synthetic=True, data=DataConfig(seq_len=128))

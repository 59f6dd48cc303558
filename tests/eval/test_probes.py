"""Probe scoring against models whose answers are known: an oracle that reads the answer from
the context scores 1.0 in every family; a model guessing values at random scores chance (within
the Wilson interval); one guessing among in-context values scores the copy-any-value line; a
lookup table fitted on the training stream cannot guess probe answers closed-book (no leakage).
Plus: perplexity windows score every stream token exactly once, probes leave the global RNGs
alone, N/A cells for learned tables, and the reports land on disk."""

from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from blocklab.config import (
    LitmProbeConfig,
    ModelConfig,
    NeedleProbeConfig,
    PerplexityProbeConfig,
    PositionConfig,
    ProbeSpec,
)
from blocklab.data import synthetic as syn
from blocklab.eval.aggregate import wilson_interval
from blocklab.eval.backends import BlocklabBackend
from blocklab.eval.items import TokenBuilder
from blocklab.eval.kinds.needle import Needle
from blocklab.eval.perplexity import perplexity_rows, window_plan
from blocklab.eval.probes import run_spec
from blocklab.model import build_model

VOCAB = syn.Vocab()


def lookup(seq: list[int], key: int) -> int | None:
    """The value recorded for ``key`` in a needle / record sequence (brute force)."""
    for i in range(len(seq) - 2):
        if seq[i] in (syn.MARK, syn.REC) and seq[i + 1] == key:
            return seq[i + 2]
    return None


class Oracle(nn.Module):
    """Reads the answer from the context, through each family's own forward signature:
    decoder (answer after ``SEP k``), encoder (answer slot masked), encoder–decoder (query at
    the end of the source, answer at the first target position)."""

    max_positions = None  # indexes any length

    def __init__(self, family: str, guess: str = "oracle", seed: int = 0) -> None:
        super().__init__()
        self.config = ModelConfig(vocab_size=VOCAB.size)
        self.config.family.name = family
        self.guess, self.gen = guess, torch.Generator().manual_seed(seed)

    def _answer(self, context: list[int], key: int) -> int:
        if self.guess == "oracle":
            v = lookup(context, key)
            return v if v is not None else VOCAB.values[0]
        if self.guess == "random_value":
            return VOCAB.values[int(torch.randint(VOCAB.n_values, (1,), generator=self.gen))]
        values = [context[i + 2] for i in range(len(context) - 2)
                  if context[i] in (syn.MARK, syn.REC) and context[i + 2] in VOCAB.values]
        return values[int(torch.randint(len(values), (1,), generator=self.gen))]

    def _logits(self, rows: list[tuple[list[int], int] | None], b: int, t: int) -> torch.Tensor:
        out = torch.zeros(b * t, VOCAB.size)
        for r, q in enumerate(rows):
            if q is not None:
                out[r, self._answer(*q)] = 20.0
        return out.view(b, t, -1)

    def forward(self, *args, select=None, **kw):
        fam = self.config.family.name
        if fam == "decoder":
            ids = args[0]
            b, t = ids.shape
            rows = [(ids[i, :j + 1].tolist(), int(ids[i, j])) if j and ids[i, j - 1] == syn.SEP
                    else None for i in range(b) for j in range(t)]
        elif fam == "encoder":
            ids = args[0]
            b, t = ids.shape
            rows = [(ids[i, :j].tolist(), int(ids[i, j - 1])) if ids[i, j] == syn.MASK else None
                    for i in range(b) for j in range(t)]
        else:
            src, tgt = args[0], args[1]
            valid = kw["source_valid"]
            b, t = tgt.shape
            rows = []
            for i in range(b):
                s = src[i, valid[i]].tolist()
                rows += [(s, s[-1]) if j == 0 else None for j in range(t)]
        logits = self._logits(rows, b, t)
        return logits if select is None else logits[select]


def small_spec(**kw) -> ProbeSpec:
    return ProbeSpec(needle=NeedleProbeConfig(lengths=[0.5, 1.0, 2.0], depths=[0.0, 0.5, 1.0],
                                              n=16),
                     litm=LitmProbeConfig(n_records=[8], gold=[0.0, 0.5, 1.0], n=16), **kw)


def run(backend, spec, tmp_path=None):
    return run_spec(backend, spec, builder=TokenBuilder(VOCAB, 1234), train_length=64,
                    keys={"step": 0}, out_dir=tmp_path, plots=tmp_path is not None)


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_an_oracle_scores_one_in_every_family(family):
    r = run(BlocklabBackend(Oracle(family)), small_spec(perplexity=PerplexityProbeConfig(enabled=False)))
    scored = [c for c in r.cells if c["n"]]
    assert scored and all(c["accuracy"] == 1.0 and c["exact"] == 1.0 for c in scored
                          if c["variant"] != "closed_book")
    closed = next(c for c in r.cells if c["variant"] == "closed_book")
    assert closed["accuracy"] < 0.2  # nothing to read: the oracle falls back to one fixed value
    assert all(c["margin"] > 0 for c in scored if c["variant"] not in ("closed_book", "oracle"))
    for s in r.summary["needle"].values():
        assert s["effective_length"] == 128 and s["within_train_length"]["accuracy"] == 1.0


def test_random_guessing_scores_chance_and_copying_scores_the_copy_line():
    spec = ProbeSpec(needle=NeedleProbeConfig(lengths=[1.0], depths=[i / 10 for i in range(11)],
                                              n=64, n_distractors=[2]),
                     litm=LitmProbeConfig(enabled=False), perplexity=PerplexityProbeConfig(enabled=False))
    rand = run(BlocklabBackend(Oracle("decoder", "random_value")), spec)
    acc = rand.summary["needle"]["2 distractors"]["within_train_length"]
    assert acc["n"] == 11 * 64
    assert acc["ci_low"] <= 1 / VOCAB.n_values <= acc["ci_high"]
    copy = run(BlocklabBackend(Oracle("decoder", "in_context")), spec)
    acc = copy.summary["needle"]["2 distractors"]["within_train_length"]
    assert acc["ci_low"] <= 1 / 3 <= acc["ci_high"]
    assert all(c["any_value"] == 1.0 for c in copy.cells)  # always *a* value: the shortcut


def test_answers_cannot_be_guessed_closed_book_from_the_training_stream():
    """Leakage: the best closed-book predictor fitted on 20k training needles (the most frequent
    value per query key) scores chance on the probe items, because pairings are re-drawn per
    sequence and the probe seed differs from the data seed."""
    from blocklab.config import DataConfig
    from blocklab.data.mixture import Mixture

    mix = Mixture(DataConfig(seed=1234, seq_len=64, min_len=32), salt="train")
    table: dict[int, Counter] = {}
    for i in range(20_000):
        ex = mix(i)
        table.setdefault(ex.tokens[-2], Counter())[ex.tokens[-1]] += 1
    spec = ProbeSpec(needle=NeedleProbeConfig(lengths=[1.0], n=256, depths=[0.5]))
    cells = Needle.token_cells(spec, TokenBuilder(VOCAB, 0), 64, None)
    items = [it for c in cells for it in c.items]
    hits = sum(table.get(it.prompt[-1], Counter({-1: 1})).most_common(1)[0][0] == it.answer[0]
               for it in items)
    lo, hi = wilson_interval(hits, len(items))
    assert lo <= 1 / VOCAB.n_values <= hi, (hits, len(items))
    # and no probe sequence is a training sequence
    train = {tuple(mix(i).tokens) for i in range(5_000)}
    assert not any(tuple(it.prompt + it.answer) in train for it in items)


def test_probes_leave_global_random_state_alone():
    torch.manual_seed(5)
    model = build_model(ModelConfig(vocab_size=VOCAB.size,
                                    position=PositionConfig(name="rope")))
    states = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    run(BlocklabBackend(model), small_spec(perplexity=PerplexityProbeConfig(lengths=[1.0], tokens=256)))
    assert torch.equal(states[0], torch.get_rng_state())
    assert states[1] == random.getstate()
    assert np.array_equal(states[2], np.random.get_state()[1])


def test_greedy_through_the_kv_cache_agrees_with_the_argmax_used_for_one_token_answers():
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=VOCAB.size, position=PositionConfig(name="rope"),
                                    init_std=0.2)).eval()
    backend = BlocklabBackend(model)
    cells = Needle.token_cells(small_spec(), TokenBuilder(VOCAB, 0), 64, None)
    items = [it for c in cells for it in c.items][:48]
    logp, _ = backend.answer_logprobs([it.prompt for it in items], [it.answer for it in items])
    greedy = backend.greedy([it.prompt for it in items], 1)
    assert [g[0] for g in greedy] == logp[:, 0].argmax(-1).tolist()


def test_learned_positions_mark_longer_cells_not_applicable():
    model = build_model(ModelConfig(vocab_size=VOCAB.size, position=PositionConfig(name="learned"),
                                    max_seq_len=64))
    r = run(BlocklabBackend(model), small_spec())
    na = [c for c in r.cells if c["length"] > 64]
    assert na and all(c.get("accuracy") is None and c["status"].startswith("n/a") for c in na)
    assert all(c["n"] > 0 for c in r.cells if c["length"] <= 64 and c["probe"] != "perplexity")
    ppl = {(c["variant"], c["length"]): c for c in r.cells if c["probe"] == "perplexity"}
    assert ppl[("sliding", 128)]["ppl"] is None and ppl[("sliding", 64)]["ppl"] is not None


class Counting:
    """A causal backend whose 'NLL' of each target token is that token's value: with a stream
    0, 1, 2, ... the scored values say exactly which stream tokens were scored."""

    family, name = "decoder", "counting"

    def max_length(self):
        return None

    def token_nll(self, windows):
        return windows[:, 1:].float()


@pytest.mark.parametrize("mode", ["nonoverlapping", "sliding"])
@pytest.mark.parametrize("body", [63, 99, 128])
def test_window_plans_score_each_stream_token_once_with_enough_context(mode, body):
    plan = window_plan(5000, body, mode, 0.25, 1000)
    scored = [s + k for s, first in plan for k in range(first, body)]
    assert len(scored) == len(set(scored)) >= 1000  # each token once
    assert scored == list(range(len(scored)))  # contiguous from the stream's start
    if mode == "sliding":  # after the first window, every scored token has >= 3/4 of a window
        assert all(first >= body - round(0.25 * body) for _, first in plan[1:])


@pytest.mark.parametrize("bos", [syn.BOS, None])
def test_perplexity_scores_the_planned_tokens(bos):
    """With per-token 'NLL' = the target token's value, the mean NLL names the tokens scored:
    it must equal the plan's (minus each window's first token when there is no BOS to predict
    it from)."""
    stream = list(range(10, 3010))
    for length in (64, 100):
        body = length - (bos is not None)
        for row in perplexity_rows(Counting(), [stream], bos, [length], 1000, 0.25, 640):
            plan = window_plan(len(stream), body, row["variant"], 0.25, 1000)
            ref = [stream[s + k] for s, first in plan for k in range(first, body)
                   if bos is not None or k > 0]
            assert row["n"] == len(ref)
            assert row["nll"] == pytest.approx(sum(ref) / len(ref))


def test_reports_are_written_keyed_and_complete(tmp_path):
    model = build_model(ModelConfig(vocab_size=VOCAB.size,
                                    position=PositionConfig(name="rope")))
    out = tmp_path / "probes" / "step-000000" / "x"
    spec = small_spec(perplexity=PerplexityProbeConfig(lengths=[0.5, 1.0], tokens=256))
    r = run(BlocklabBackend(model), spec, out)
    for name in ("cells.csv", "examples.csv", "summary.json", "niah.png", "litm.png",
                 "perplexity.png"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 0 and summary["n_examples"] == len(r.examples)
    header = (out / "cells.csv").read_text().splitlines()[0].split(",")
    for col in ("probe", "variant", "length", "depth", "n", "accuracy", "ci_low", "ci_high",
                "exact", "margin", "logprob", "rank_median", "any_value", "copy_any_value",
                "chance", "status"):
        assert col in header
    assert not list(tmp_path.glob("**/*.tmp-*"))


def test_scoring_reports_progress_as_lines_in_a_log_with_the_same_results():
    """A probe grid is never silent: counted batches on stderr (here a log, not a terminal),
    a line whenever ``every`` seconds passed — the clock is injected, so no timing — and the
    results equal those of a run without progress lines."""
    import io

    from blocklab.progress import Progress

    spec = small_spec(perplexity=PerplexityProbeConfig(enabled=False), batch_size=8)
    ticks = iter(range(0, 10**6, 100))  # 100 "seconds" per clock read: every batch is reported
    log = io.StringIO()
    backend = BlocklabBackend(Oracle("decoder"))
    r = run_spec(backend, spec, builder=TokenBuilder(VOCAB, 1234), train_length=64,
                 keys={"step": 0}, plots=False,
                 progress=Progress("probes", stream=log, every=10, clock=lambda: next(ticks)))
    lines = log.getvalue().splitlines()
    n_items = sum(c["n"] for c in r.cells)
    n_batches = -(-n_items // 8)
    # the plan, said before anything runs, then the counted batches
    assert lines[0].startswith(f"probes: {spec.name}: {n_items} items (needle ")
    assert lines[1] == f"probes: {spec.name}, {n_items} items: batches 0/{n_batches}"
    assert len(lines) == n_batches + 2 and lines[-1].endswith(f"{n_batches}/{n_batches} (100%)")
    quiet_log = io.StringIO()
    again = run_spec(backend, spec, builder=TokenBuilder(VOCAB, 1234), train_length=64,
                     keys={"step": 0}, plots=False,
                     progress=Progress("probes", stream=quiet_log, every=10, clock=lambda: 0.0))
    assert len(quiet_log.getvalue().splitlines()) == 3  # the plan, start and end only
    assert again.cells == r.cells

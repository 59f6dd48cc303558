"""The aggregation probe kind (after RULER's common-words extraction, arXiv 2404.06654):
candidates scattered through the haystack, the most frequent ``margin`` times more often than the
runner-up; answer the most frequent. Cells: margin × length. docs/probes.md, "More probe
kinds"."""

from __future__ import annotations

import random
from functools import partial
from typing import Any

from blocklab.config import (
    COUNTING_MAX_COUNT,
    AggregationProbeConfig,
    ProbeSpec,
    counting_min_length,
)
from blocklab.config.checks import require
from blocklab.data import synthetic as syn
from blocklab.data.tasks.counting import counting
from blocklab.eval import textspace
from blocklab.eval.aggregate import grid_summary
from blocklab.eval.items import (
    FILLER_CYCLE,
    Cell,
    NotApplicable,
    ProbeItem,
    answers_item,
    fits,
    lengths_of,
)
from blocklab.eval.kinds.base import ProbeKind
from blocklab.eval.textspace import TextBuilder

WORD_STATEMENT = "The word of the day is {word}."
WORD_QUESTION = "Which word of the day was named most often?"
WORD_PREFIX = "The word of the day named most often is"


class Aggregation(ProbeKind):
    """Aggregation (token and text space); rows of its heatmap are count margins."""

    name = "aggregation"
    config = AggregationProbeConfig
    title = "aggregation"
    what = "the most frequent candidate"
    row_key = "count_margin"
    row_label = "margin (winner - runner-up count)"
    heading = "Aggregation: accuracy by margin and length"

    @classmethod
    def token_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                    max_length: int | None) -> list[Cell]:
        """Aggregation: margins × lengths, ``candidates`` ids; ``winner_share`` (the winner's share
        of all candidate occurrences: what copying a random occurrence scores) per item."""
        p, vocab = cls.settings(spec), builder.vocab
        k = p.candidates
        cells = []
        for margin in p.margins:
            need = counting_min_length(k, margin)
            for length in lengths_of(p.lengths, train_length):
                key = {"probe": cls.name, "variant": f"margin {margin}", "count_margin": margin,
                       "length": length}
                na = fits(length, max_length)
                if na is None and length < need:
                    na = NotApplicable(f"length {length} < {need} for {k} candidates, margin "
                                       f"{margin}").status
                cell = Cell(key, [], na, copy_any_value=1 / k, chance=1 / vocab.n_values)
                if na is None:
                    salt = f"probe:aggregation:{k}:{margin}:{length}"
                    for i in range(p.n):
                        ex = counting(syn.example_rng(spec.seed, i, salt), vocab, length,
                                      candidates=k, margin=margin,
                                      filler=FILLER_CYCLE[i % len(FILLER_CYCLE)], seed=spec.seed)
                        m = ex.meta
                        cell.items.append(answers_item(
                            key, ex, gold_depths=m["gold_depths"],
                            winner_share=m["winner_share"],
                            distance=m["query_index"] - m["gold_indices"][0]))
                cells.append(cell)
        return cells

    @classmethod
    def text_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                   max_length: int | None) -> list[Cell]:
        """Aggregation (after RULER's common-words extraction, arXiv 2404.06654): ``candidates``
        distinct words from :data:`WORDS` (never one occurring in the haystack) named in
        ``WORD_STATEMENT`` sentences, each occurrence at its own uniform depth. Counts as in
        the token-space builder: the runner-up ``r`` times (``r`` uniform in
        1..``COUNTING_MAX_COUNT``), the winner exactly ``r + margin`` times, every other word
        1..``r`` times. The question asks which word was named most often; answer: that word;
        candidates: every candidate word, gold first (copy line 1/candidates; chance 1 over
        the word list). Meta: ``counts`` (winner, runner-up, others), ``winner_share`` (the
        winner's share of all occurrences: what copying a random occurrence scores) and
        ``gold_depths`` (the winner's statements, sorted)."""
        p, b = cls.settings(spec), builder
        require(2 <= p.candidates <= len(b.words), "probes.aggregation.candidates",
                p.candidates, f"must be in 2..{len(b.words)} (the candidate words that never "
                f"occur in the haystack {b.t.haystack!r})")
        require(all(m >= 1 for m in p.margins), "probes.aggregation.margins", list(p.margins),
                "each margin must be >= 1")
        cells = []
        for m in p.margins:
            for length in lengths_of(p.lengths, train_length):
                key = {"probe": cls.name, "variant": f"margin {m}", "count_margin": m,
                       "length": length}
                make = partial(cls.text_item, b, key=key, margin=m, n_words=p.candidates,
                               length=length)
                cells.append(b.cell(key, length, max_length, p.n, spec.seed,
                                    f"probe:text-aggregation:{m}:{p.candidates}:{length}", make,
                                    copy_any_value=1 / p.candidates, chance=1 / len(b.words)))
        return cells

    @classmethod
    def text_item(cls, b: TextBuilder, rng: random.Random, *, key: dict[str, Any], margin: int,
                  n_words: int, length: int) -> ProbeItem:
        """One text item: ``n_words`` candidate words, the winner ``margin`` times more often
        than the runner-up; see :meth:`text_cells`."""
        words = rng.sample(b.words, n_words)  # words[0] wins: a random word
        runner_up = rng.randint(1, COUNTING_MAX_COUNT)
        counts = [runner_up + margin, runner_up] + [rng.randint(1, runner_up)
                                                    for _ in range(n_words - 2)]
        owner = [w for w, k in enumerate(counts) for _ in range(k)]
        stmts = [WORD_STATEMENT.format(word=words[w]) for w in owner]
        depths = [textspace.draw_depth(rng) for _ in owner]
        lay = b.scatter(rng, length, stmts, depths, WORD_QUESTION, WORD_PREFIX, words[0])
        for w, k in zip(words, counts):
            b.count(lay.text, w, k)
        first = {w: min(lay.tokens[i] for i in range(len(owner)) if owner[i] == w)
                 for w in range(n_words)}
        alts = [words[w] for w in sorted(range(1, n_words), key=first.__getitem__)]
        return b.probe_item(key, lay, [words[0]], alts, {
            "counts": counts, "winner_share": counts[0] / len(owner),
            "gold_depths": sorted(d for d, w in zip(lay.depths, owner) if w == 0)},
            multi=False)

    @classmethod
    def summary(cls, rows: list[dict[str, Any]], examples: list[dict[str, Any]], *,
                train_length: int, threshold: float) -> dict[str, Any]:
        """Aggregation: per margin, accuracy by length and pooled, beside the copy line (1 /
        candidates) and the occurrence line (mean share of the winner among all occurrences)."""
        per = grid_summary(rows, cls.name)
        ac = [c for c in rows if c["probe"] == cls.name]
        for variant, s in per.items():
            vc = [c for c in ac if c["variant"] == variant and c["n"]]
            s["count_margin"] = next(c["count_margin"] for c in ac if c["variant"] == variant)
            s["winner_share"] = (sum(c["winner_share"] * c["n"] for c in vc)
                                 / sum(c["n"] for c in vc)) if vc else None
        return per

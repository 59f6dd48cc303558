"""Probe items and the token-space builder.

A probe spec (``blocklab.config.ProbeSpec``) is rendered into :class:`ProbeItem` lists — a
prompt, the gold answer tokens, the in-context alternatives, and the cell it belongs to — by
the token-space builder here (synthetic vocabularies) or the text-space builder
(:mod:`blocklab.eval.textspace`, real tokenizers). Scoring and reports never look at which
builder made an item.

Every item is a pure function of (spec seed, cell, sample index): the same cells hold the same
sequences at every checkpoint, so checkpoints compare pairwise; the probe seed differs from
every training seed, and keys and values are re-paired per sequence, so nothing is guessable
without the context (the closed-book baseline measures exactly that).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from blocklab.config import ProbeSpec
from blocklab.data import synthetic as syn


@dataclass
class ProbeItem:
    """One probe example. ``prompt`` is everything the model conditions on (context, query,
    answer prefix); ``answer`` the gold continuation, tokenized jointly with the prompt;
    ``candidates`` every in-context alternative answer (gold at ``gold``), for margins and the
    copy-any-value diagnostic. ``cell`` names the grid cell (probe, variant, length, depth,
    ...), ``meta`` what was actually built (token depth of the needle, distance to the query)."""

    cell: dict[str, Any]
    prompt: list[int]
    answer: list[int]
    candidates: list[list[int]] = field(default_factory=list)
    gold: int = 0
    answer_text: str | None = None  # text space: the gold string for the substring match
    # text space, several required answers (multi-value / multi-query): every one of these
    # strings must appear in the generation (``answer_text`` is then their joined form)
    answer_texts: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Cell:
    """A grid cell: its key, its items, or the reason it is N/A (never clamped)."""

    key: dict[str, Any]
    items: list[ProbeItem]
    na: str | None = None
    copy_any_value: float | None = None
    chance: float | None = None


def spec_hash(spec: ProbeSpec | dict[str, Any]) -> str:
    """A short stable hash of everything that decides which items are built and how they are
    scored (the display name and the batch size do not change results)."""
    from omegaconf import OmegaConf

    plain = spec if isinstance(spec, dict) else OmegaConf.to_container(
        OmegaConf.structured(spec), enum_to_str=True)
    plain = {k: v for k, v in plain.items() if k not in ("name", "batch_size", "enabled")
             and not (k == "kinds" and not v)}  # no user kinds: the hash of every older spec
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:12]


def lengths_of(multiples: list[float], train_length: int) -> list[int]:
    """Absolute lengths for multiples of the training length, sorted, deduplicated."""
    return sorted({max(1, round(x * train_length)) for x in multiples})


def fits(length: int, max_length: int | None) -> str | None:
    """The N/A reason when a length is beyond what the position scheme can index."""
    if max_length is not None and length > max_length:
        return f"n/a: length {length} > {max_length} positions the model can index"
    return None


def needle_grid(spec: ProbeSpec, train_length: int):
    """(distractors, length, depth, cell key) for every NIAH cell, in report order."""
    for nd in spec.needle.n_distractors:
        for length in lengths_of(spec.needle.lengths, train_length):
            for depth in spec.needle.depths:
                yield nd, length, depth, {"probe": "needle", "variant": f"{nd} distractors",
                                          "length": length, "depth": depth, "n_distractors": nd}


def needle_cells(spec: ProbeSpec, vocab: syn.Vocab, train_length: int,
                 max_length: int | None) -> list[Cell]:
    """NIAH grid: for each distractor count, lengths × depths, ``n`` items per cell. Fillers
    rotate over the samples (repeated phrase, i.i.d., Markov text)."""
    p = spec.needle
    cells = []
    for nd, length, depth, key in needle_grid(spec, train_length):
        na = fits(length, max_length)
        if na is None and length < syn.needle_min_length(nd):
            na = f"n/a: length {length} < {syn.needle_min_length(nd)} for {nd + 1} needles"
        cell = Cell(key, [], na, copy_any_value=1 / (nd + 1), chance=1 / vocab.n_values)
        if na is None:
            salt = f"probe:needle:{nd}:{length}:{depth}"
            for i in range(p.n):
                ex = syn.needle(syn.example_rng(spec.seed, i, salt), vocab, length,
                                n_distractors=nd, depth=depth,
                                filler=p.fillers[i % len(p.fillers)], seed=spec.seed)
                cell.items.append(_item(key, ex, distance=ex.meta["query_index"]
                                        - ex.meta["gold_index"], actual_depth=ex.meta["depth"]))
        cells.append(cell)
    return cells


def litm_cells(spec: ProbeSpec, vocab: syn.Vocab, max_length: int | None) -> list[Cell]:
    """Lost in the middle over key–value records: gold position swept over m records, the
    query-aware layout, closed-book (the records removed: only ``BOS SEP k``) and oracle (only
    the gold record) baselines."""
    p = spec.litm
    chance = 1 / vocab.n_values
    cells = []
    for m in p.n_records:
        if m > min(vocab.n_keys, vocab.n_values):
            raise ValueError(f"probes.litm.n_records={m}: more records than the vocabulary has "
                             f"keys/values ({vocab.n_keys}/{vocab.n_values})")
        golds = sorted({round(g * (m - 1)) for g in p.gold})
        for variant in ("kv_records", "query_aware") if p.query_aware else ("kv_records",):
            qa = variant == "query_aware"
            length = 3 * m + 4 + (2 if qa else 0)
            for j in golds:
                key = {"probe": "litm", "variant": variant, "length": length, "n_records": m,
                       "gold_position": j}
                cell = Cell(key, [], fits(length, max_length), copy_any_value=1 / m, chance=chance)
                if cell.na is None:
                    salt = f"probe:litm:{variant}:{m}:{j}"
                    for i in range(p.n):
                        ex = syn.kv_records(syn.example_rng(spec.seed, i, salt), vocab, length,
                                            gold=j, query_aware=qa, seed=spec.seed)
                        cell.items.append(_item(key, ex, distance=3 * (m - j)))
                cells.append(cell)
    if p.baselines:
        m = max(p.n_records)
        for variant in ("closed_book", "oracle"):
            length = 4 if variant == "closed_book" else 7
            key = {"probe": "litm", "variant": variant, "length": length,
                   "n_records": 0 if variant == "closed_book" else 1, "gold_position": None}
            cell = Cell(key, [], None, copy_any_value=None if variant == "closed_book" else 1.0,
                        chance=chance)
            salt = f"probe:litm:{variant}"
            for i in range(p.n):
                rng = syn.example_rng(spec.seed, i, salt)
                if variant == "closed_book":  # the same draw as a full example, records removed
                    ex = syn.kv_records(rng, vocab, 3 * m + 4, seed=spec.seed)
                    k, v = ex.tokens[-2], ex.tokens[-1]
                    ex = syn.Example([syn.BOS, syn.SEP, k, v], [False] * 3 + [True],
                                     {"candidates": [v]})
                else:
                    ex = syn.kv_records(rng, vocab, 7, gold=0, seed=spec.seed)
                cell.items.append(_item(key, ex))
            cells.append(cell)
    return cells


def _item(cell: dict[str, Any], ex: syn.Example, **meta: Any) -> ProbeItem:
    start = ex.answer_start
    answer = ex.tokens[start:]
    cands = [[v] for v in ex.meta["candidates"]]
    return ProbeItem(cell=cell, prompt=ex.tokens[:start], answer=answer, candidates=cands,
                     gold=cands.index(answer), meta={"n_tokens": len(ex.tokens), **meta})


# ------------------------------------------------- multi-needle, variable tracking, aggregation
# Answers may be several tokens (multi-value: the key's values in order of appearance;
# multi-query: the asked keys' values in the order asked); ``argmax`` / ``exact`` need all of
# them, ``partial`` is the share found (RULER's "all" score). ``candidates`` are every
# in-context alternative answer, so the copy line — answering with a random one of them — is
# 1 / len(candidates); chance is a random value per answer token, (1 / n_values) ** tokens.

FILLER_CYCLE = ("iid", "phrase", "markov")  # fillers rotate over the samples of a cell


def _multi_item(cell: dict[str, Any], ex: syn.Example, **meta: Any) -> ProbeItem:
    start = ex.answer_start
    return ProbeItem(cell=cell, prompt=ex.tokens[:start], answer=ex.tokens[start:],
                     candidates=[list(a) for a in ex.meta["answers"]], gold=ex.meta["gold"],
                     meta={"n_tokens": len(ex.tokens), **meta})


def multi_needle_cells(spec: ProbeSpec, vocab: syn.Vocab, train_length: int,
                       max_length: int | None) -> list[Cell]:
    """Multi-key / multi-value / multi-query needles: variants × lengths, ``n`` items per cell,
    every needle at its own uniform depth (``depths``: all needles, ``gold_depths``: the
    answer's, in answer order)."""
    p = spec.multi_needle
    cells = []
    for variant in p.variants:
        n_answer = syn.multi_needle_answer_length(variant, p.values, p.queries)
        need = syn.multi_needle_min_length(variant, p.keys, p.values, p.queries)
        n_cands = p.keys  # one alternative answer per key (multikey/-value), per shift (-query)
        for length in lengths_of(p.lengths, train_length):
            key = {"probe": "multi_needle", "variant": variant, "length": length}
            na = fits(length, max_length)
            if na is None and length < need:
                na = f"n/a: length {length} < {need} for {variant} (keys={p.keys}, " \
                     f"values={p.values}, queries={p.queries})"
            cell = Cell(key, [], na, copy_any_value=1 / n_cands,
                        chance=(1 / vocab.n_values) ** n_answer)
            if na is None:
                salt = f"probe:multi_needle:{variant}:{length}"
                for i in range(p.n):
                    ex = syn.multi_needle(syn.example_rng(spec.seed, i, salt), vocab, length,
                                          variant=variant, keys=p.keys, values=p.values,
                                          queries=p.queries,
                                          filler=FILLER_CYCLE[i % len(FILLER_CYCLE)],
                                          seed=spec.seed)
                    m = ex.meta
                    cell.items.append(_multi_item(
                        key, ex, depths=m["depths"], gold_depths=m["gold_depths"],
                        actual_depth=m["gold_depths"][0],
                        distance=m["query_index"] - min(m["gold_indices"])))
            cells.append(cell)
    return cells


def hops_cells(spec: ProbeSpec, vocab: syn.Vocab, train_length: int,
               max_length: int | None) -> list[Cell]:
    """Variable tracking: hops × lengths, ``distractor_chains`` other chains of the same
    length; ``farthest_depth`` is the depth of the queried chain's root statement (uniform),
    ``hop_depths`` every statement's, in chain order."""
    p = spec.hops
    c = p.distractor_chains
    cells = []
    for h in p.hops:
        need = syn.multihop_min_length(h, c)
        for length in lengths_of(p.lengths, train_length):
            key = {"probe": "hops", "variant": f"{h} hops", "hops": h, "length": length}
            na = fits(length, max_length)
            if na is None and length < need:
                na = f"n/a: length {length} < {need} for {c + 1} chains of {h} hops"
            cell = Cell(key, [], na, copy_any_value=1 / (c + 1), chance=1 / vocab.n_values)
            if na is None:
                salt = f"probe:hops:{h}:{c}:{length}"
                for i in range(p.n):
                    ex = syn.multihop(syn.example_rng(spec.seed, i, salt), vocab, length,
                                      hops=h, distractor_chains=c,
                                      filler=FILLER_CYCLE[i % len(FILLER_CYCLE)], seed=spec.seed)
                    m = ex.meta
                    cell.items.append(_multi_item(
                        key, ex, farthest_depth=m["farthest_depth"], hop_depths=m["hop_depths"],
                        actual_depth=m["farthest_depth"],
                        distance=m["query_index"] - m["hop_indices"][0]))
            cells.append(cell)
    return cells


def aggregation_cells(spec: ProbeSpec, vocab: syn.Vocab, train_length: int,
                      max_length: int | None) -> list[Cell]:
    """Aggregation: margins × lengths, ``candidates`` ids; ``winner_share`` (the winner's share
    of all candidate occurrences: what copying a random occurrence scores) per item."""
    p = spec.aggregation
    k = p.candidates
    cells = []
    for margin in p.margins:
        need = syn.counting_min_length(k, margin)
        for length in lengths_of(p.lengths, train_length):
            key = {"probe": "aggregation", "variant": f"margin {margin}", "count_margin": margin,
                   "length": length}
            na = fits(length, max_length)
            if na is None and length < need:
                na = f"n/a: length {length} < {need} for {k} candidates, margin {margin}"
            cell = Cell(key, [], na, copy_any_value=1 / k, chance=1 / vocab.n_values)
            if na is None:
                salt = f"probe:aggregation:{k}:{margin}:{length}"
                for i in range(p.n):
                    ex = syn.counting(syn.example_rng(spec.seed, i, salt), vocab, length,
                                      candidates=k, margin=margin,
                                      filler=FILLER_CYCLE[i % len(FILLER_CYCLE)], seed=spec.seed)
                    m = ex.meta
                    cell.items.append(_multi_item(
                        key, ex, gold_depths=m["gold_depths"], winner_share=m["winner_share"],
                        distance=m["query_index"] - m["gold_indices"][0]))
            cells.append(cell)
    return cells


def markov_stream(data_seed: int, probe_seed: int, vocab: syn.Vocab, n_tokens: int) -> list[int]:
    """A held-out token stream from the training data's Markov chain (the perplexity probe's
    text in token space): the chain is the data seed's, the sample the probe seed's."""
    rng = syn.example_rng(probe_seed, 0, "probe:perplexity")
    return syn.markov_chain(data_seed, vocab).sample(rng, n_tokens)


class TokenBuilder:
    """The token-space builder over a synthetic vocabulary (the data's own)."""

    space = "token"

    def __init__(self, vocab: syn.Vocab, data_seed: int, *, language_model: bool = True) -> None:
        self.vocab, self.data_seed = vocab, data_seed
        self.language_model = language_model  # the training mixture has a markov_lm slice

    def needle_cells(self, spec: ProbeSpec, train_length: int, max_length: int | None) -> list[Cell]:
        return needle_cells(spec, self.vocab, train_length, max_length)

    def litm_cells(self, spec: ProbeSpec, max_length: int | None) -> list[Cell]:
        return litm_cells(spec, self.vocab, max_length)

    def multi_needle_cells(self, spec: ProbeSpec, train_length: int,
                           max_length: int | None) -> list[Cell]:
        return multi_needle_cells(spec, self.vocab, train_length, max_length)

    def hops_cells(self, spec: ProbeSpec, train_length: int,
                   max_length: int | None) -> list[Cell]:
        return hops_cells(spec, self.vocab, train_length, max_length)

    def aggregation_cells(self, spec: ProbeSpec, train_length: int,
                          max_length: int | None) -> list[Cell]:
        return aggregation_cells(spec, self.vocab, train_length, max_length)

    def stream(self, spec: ProbeSpec, n_tokens: int) -> tuple[list[int], int | None]:
        """The held-out Markov stream; ``ValueError`` (-> N/A rows) when the model was never
        trained to predict it: its perplexity would measure nothing."""
        if not self.language_model:
            raise ValueError("n/a: the training mixture has no language-modelling slice "
                             "(data.tasks.markov_lm=0)")
        return markov_stream(self.data_seed, spec.seed, self.vocab, n_tokens), syn.BOS

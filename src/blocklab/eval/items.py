"""Probe items and the token-space builder.

A probe spec (``blocklab.config.ProbeSpec``) is rendered into :class:`ProbeItem` lists — a
prompt, the gold answer tokens, the in-context alternatives, and the cell it belongs to — by
each probe kind (``blocklab.eval.kinds``) on the token-space builder here (synthetic
vocabularies) or the text-space builder (:mod:`blocklab.eval.textspace`, real tokenizers).
Scoring and reports never look at which builder made an item.

Every item is a pure function of (spec seed, cell, sample index): the same cells hold the same
sequences at every checkpoint, so checkpoints compare pairwise; the probe seed differs from
every training seed, and keys and values are re-paired per sequence, so nothing is guessable
without the context (the closed-book baseline measures exactly that).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
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
    # text space, a closed label set (``candidates`` are then every label, gold at ``gold``):
    # scored by forced choice (the gold label's log-prob above every other's) and the
    # generation judged by the single-label rule (data/babilong.py ``answer_correct``: of the
    # labels in its first sentence, less those the ``question`` names, the gold one alone)
    labels: list[str] | None = None
    question: str | None = None


@dataclass
class Cell:
    """A grid cell: its key, its items, or the reason it is N/A (never clamped)."""

    key: dict[str, Any]
    items: list[ProbeItem]
    na: str | None = None
    copy_any_value: float | None = None
    chance: float | None = None


@dataclass
class ProbeResult:
    """Scored cells (one row each), per-example rows, the summary, and where files went (the
    driver makes it, the report writes it: defined here, below both)."""

    cells: list[dict[str, Any]]
    examples: list[dict[str, Any]]
    summary: dict[str, Any]
    out_dir: Path | None = None
    files: dict[str, str] = field(default_factory=dict)


def spec_hash(spec: ProbeSpec | dict[str, Any]) -> str:
    """A short stable hash of everything that decides which items are built and how they are
    scored (the display name and the batch size do not change results)."""
    from omegaconf import OmegaConf

    plain = spec if isinstance(spec, dict) else OmegaConf.to_container(
        OmegaConf.structured(spec), enum_to_str=True)
    plain = {k: v for k, v in plain.items() if k not in ("name", "batch_size", "enabled",
                                                         "text_grid")
             and not (k == "kinds" and not v)}  # no user kinds: the hash of every older spec
    # options added later (``ADDED`` of a settings class) hash only when set away from their
    # defaults, so every older spec keeps its hash
    for name, section in list(plain.items()):
        added = getattr(getattr(spec, name, None), "ADDED", None) if not isinstance(
            spec, dict) else None
        if added and isinstance(section, dict):
            plain[name] = {k: v for k, v in section.items() if added.get(k, _NONE) != v}
            if not plain[name]:  # a whole section added later, at its defaults
                del plain[name]
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:12]


_NONE = object()


def lengths_of(multiples: list[float], train_length: int) -> list[int]:
    """Absolute lengths for multiples of the training length, sorted, deduplicated."""
    return sorted({max(1, round(x * train_length)) for x in multiples})


def fits(length: int, max_length: int | None) -> str | None:
    """The N/A status when a length is beyond what the position scheme can index."""
    if max_length is not None and length > max_length:
        return NotApplicable(f"length {length} > {max_length} positions the model can "
                             "index").status
    return None


class NotApplicable(Exception):
    """A cell or measurement that cannot be made for this model and spec (a length too short
    for the statements, a model never trained to predict the stream): not an error, a result.
    ``status`` is what the report says instead of a number (``n/a: <reason>``); nothing is
    clamped and the run goes on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    @property
    def status(self) -> str:
        return f"n/a: {self.reason}"


@dataclass
class PerplexityText:
    """What the perplexity probe reads: ``documents`` (token ids, no BOS), ``name`` (what the
    report and the plot say) and ``note`` (a caveat the report states, e.g. text the run
    trained on)."""

    name: str
    documents: list[list[int]]
    note: str | None = None


def answer_item(cell: dict[str, Any], ex: syn.Example, **meta: Any) -> ProbeItem:
    """A token-space item with a one-token answer among ``meta["candidates"]``."""
    start = ex.answer_start
    answer = ex.tokens[start:]
    cands = [[v] for v in ex.meta["candidates"]]
    return ProbeItem(cell=cell, prompt=ex.tokens[:start], answer=answer, candidates=cands,
                     gold=cands.index(answer), meta={"n_tokens": len(ex.tokens), **meta})


# ------------------------------------------------------------------ several-token answers
# Answers may be several tokens (multi-value: the key's values in order of appearance;
# multi-query: the asked keys' values in the order asked); ``argmax`` / ``exact`` need all of
# them, ``partial`` is the share found (RULER's "all" score). ``candidates`` are every
# in-context alternative answer, so the copy line — answering with a random one of them — is
# 1 / len(candidates); chance is a random value per answer token, (1 / n_values) ** tokens.

FILLER_CYCLE = ("iid", "phrase", "markov")  # fillers rotate over the samples of a cell


def answers_item(cell: dict[str, Any], ex: syn.Example, **meta: Any) -> ProbeItem:
    """A token-space item whose candidates are ``meta["answers"]`` (gold at ``meta["gold"]``)."""
    start = ex.answer_start
    return ProbeItem(cell=cell, prompt=ex.tokens[:start], answer=ex.tokens[start:],
                     candidates=[list(a) for a in ex.meta["answers"]], gold=ex.meta["gold"],
                     meta={"n_tokens": len(ex.tokens), **meta})


def markov_stream(data_seed: int, probe_seed: int, vocab: syn.Vocab, n_tokens: int) -> list[int]:
    """A held-out token stream from the training data's Markov chain (the perplexity probe's
    text in token space): the chain is the data seed's, the sample the probe seed's."""
    rng = syn.example_rng(probe_seed, 0, "probe:perplexity")
    return syn.markov_chain(data_seed, vocab).sample(rng, n_tokens)


class TokenBuilder:
    """The token-space builder over a synthetic vocabulary (the data's own): what every
    kind's token-space cells draw from (``vocab``) and the perplexity stream; the cells
    themselves are each kind's (``blocklab.eval.kinds``)."""

    space = "token"

    def __init__(self, vocab: syn.Vocab, data_seed: int, *, language_model: bool = True) -> None:
        self.vocab, self.data_seed = vocab, data_seed
        self.language_model = language_model  # the training mixture has a markov_lm slice

    def perplexity_text(self, spec: ProbeSpec, need: int):
        """The held-out Markov stream (one document of ``need`` tokens);
        :class:`NotApplicable` (-> N/A rows) when the model was never trained to predict it:
        its perplexity would measure nothing."""
        if not self.language_model:
            raise NotApplicable("the training mixture has no language-modelling slice "
                                "(data.tasks.markov_lm=0)")
        stream = markov_stream(self.data_seed, spec.seed, self.vocab, need)
        return PerplexityText(f"held-out text of the training data's Markov chain "
                              f"({len(stream):,} tokens)", [stream])

    bos = syn.BOS  # every perplexity window starts with it, as every training sequence

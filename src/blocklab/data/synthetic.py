"""The synthetic vocabulary and what every synthetic task builds with: the specials, the
filler / key / value ranges (:class:`Vocab`), the :class:`Example` (also what text corpora
yield), the per-example generator (:func:`example_rng`), the filler kinds, the Markov chain and
the placement of statements in a haystack. The tasks themselves are components, one module each
in :mod:`blocklab.data.tasks`.

Examples are generated deterministically from (seed, index) so any example can be rebuilt on
its own (exact resume, disjoint train / probe seeds, pairwise-comparable probe cells). Every
example has random key–value pairings, so the closed-book baseline is chance and the only way
to answer is in-context retrieval.

The multi-key / multi-value / multi-query needles are probes only (not a mixture task): their
generator is their probe kind's (``MultiNeedle.token_example`` in
``blocklab.eval.kinds.multi_needle``).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from typing import Any

# The filler kinds are defined beside the config schema, whose validator checks configs
# against them.
from blocklab.config import FILLERS

SPECIALS = ("<pad>", "<bos>", "<eos>", "<sep>", "<mark>", "<rec>", "<mask>")
PAD, BOS, EOS, SEP, MARK, REC, MASK = range(len(SPECIALS))


@dataclass(frozen=True)
class Vocab:
    """Specials, then filler, key and value ranges (disjoint)."""

    n_filler: int = 64
    n_keys: int = 64
    n_values: int = 64

    @property
    def filler(self) -> range:
        return range(len(SPECIALS), len(SPECIALS) + self.n_filler)

    @property
    def keys(self) -> range:
        return range(self.filler.stop, self.filler.stop + self.n_keys)

    @property
    def values(self) -> range:
        return range(self.keys.stop, self.keys.stop + self.n_values)

    @property
    def size(self) -> int:
        return self.values.stop

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "synthetic", "specials": list(SPECIALS), "n_filler": self.n_filler,
                "n_keys": self.n_keys, "n_values": self.n_values, "size": self.size}


@dataclass
class Example:
    """One sequence. ``targets[i]`` is True where token ``i`` is a supervised answer token (to be
    predicted from tokens ``< i``). ``meta`` records what probes report (task, gold index,
    actual token depth of the gold needle, distractors, ...). ``segments`` (optional) marks the
    documents inside one sequence (a packed window of a text corpus)."""

    tokens: list[int]
    targets: list[bool]
    meta: dict[str, Any] = field(default_factory=dict)
    segments: list[int] | None = None

    @property
    def answer_start(self) -> int:
        return self.targets.index(True)


def example_rng(seed: int, index: int, salt: str = "") -> random.Random:
    """A generator that depends only on (seed, index, salt): no global state is touched."""
    return random.Random(f"blocklab:{seed}:{salt}:{index}")


def filler_tokens(rng: random.Random, vocab: Vocab, n: int, kind: str, seed: int) -> list[int]:
    if kind == "iid":
        return rng.choices(vocab.filler, k=n)
    if kind == "phrase":  # one fixed phrase per task seed, repeated, random phase
        phrase = random.Random(f"phrase:{seed}").choices(vocab.filler, k=11)
        start = rng.randrange(len(phrase))
        return [phrase[(start + i) % len(phrase)] for i in range(n)]
    if kind == "markov":
        return markov_chain(seed, vocab).sample(rng, n)
    raise ValueError(f"unknown filler kind {kind!r}; known: {', '.join(FILLERS)}")


class MarkovChain:
    """A fixed sparse random Markov chain over the filler tokens (4 successors per token, skewed
    weights): learnable and language-like, the perplexity slice of the mixture."""

    def __init__(self, seed: int, vocab: Vocab) -> None:
        r = random.Random(f"markov:{seed}")
        self.successors = {t: r.sample(vocab.filler, 4) for t in vocab.filler}
        self.vocab = vocab

    def sample(self, rng: random.Random, n: int) -> list[int]:
        out = [rng.choice(self.vocab.filler)]
        for _ in range(n - 1):
            out.append(rng.choices(self.successors[out[-1]], weights=(8, 4, 2, 1))[0])
        return out[:n]


@functools.lru_cache(maxsize=16)
def markov_chain(seed: int, vocab: Vocab) -> MarkovChain:
    return MarkovChain(seed, vocab)


# ------------------------------------------------------------- multi-needle, hops, counting
# Shared conventions: every statement (``MARK a b``) and every bare candidate id goes *before*
# the filler token at an insertion slot drawn uniformly in [0, hay_len] (ties allowed: tied
# inserts sit side by side, in chain order within a chain, in random order across chains), so
# the depth of a statement — filler tokens before it / all filler tokens — is uniform on the
# grid {0, 1/hay_len, ..., 1}. The question never states where or how many answers there are.


def place_inserts(rng: random.Random, hay: list[int], inserts: list[tuple[int, int, list[int]]]
           ) -> tuple[list[int], list[int]]:
    """``BOS`` + ``hay`` with each ``(slot, order, tokens)`` insert placed before
    ``hay[slot]``; tied slots keep ``order`` (then the given order). Returns the tokens and
    each insert's first token index, in the order given."""
    ranked = sorted(range(len(inserts)), key=lambda j: (inserts[j][0], inserts[j][1], j))
    tokens, at, prev = [BOS], [0] * len(inserts), 0
    for j in ranked:
        slot, _, payload = inserts[j]
        tokens += hay[prev:slot]
        prev = slot
        at[j] = len(tokens)
        tokens += payload
    return tokens + hay[prev:], at


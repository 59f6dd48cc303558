"""Token-space synthetic tasks: retrieval-shaped sequences over a synthetic vocabulary, generated
deterministically from (seed, index) so any example can be rebuilt on its own (exact resume,
disjoint train / probe seeds, pairwise-comparable probe cells).

Every example has random key–value pairings, so the closed-book baseline is chance and the only
way to answer is in-context retrieval. Needles come with distractor needles of the same format
by default: a single needle can be solved by copying *any* value (docs/probes.md, "A single needle is a shortcut task").

Sequence formats (decoder form; ``→`` marks the supervised answer tokens):

- ``needle``:        ``BOS f f … MARK k v f … MARK k' v' … SEP k → v``
- ``kv_records``:    ``BOS REC k1 v1 … REC km vm SEP kj → vj``
- ``kv_records_query_aware``: ``BOS SEP kj REC k1 v1 … SEP kj → vj``
- ``mqar``:          ``BOS REC k1 v1 … SEP ki → vi SEP kj → vj …`` (every key queried once)
- ``copy``:          ``BOS x1 … xn SEP → x1 … xn``
- ``markov_lm``:     text from a fixed random Markov chain, every token supervised.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from typing import Any

# The filler kinds and the shortest needle are defined beside the config schema, whose
# validator checks configs against them (config.py); the tasks and probe builders use them here.
from blocklab.config import FILLERS, needle_min_length

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


def _filler(rng: random.Random, vocab: Vocab, n: int, kind: str, seed: int) -> list[int]:
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


def needle(rng: random.Random, vocab: Vocab, length: int, *, n_distractors: int = 3,
           depth: float | None = None, filler: str = "iid", seed: int = 0) -> Example:
    """``BOS hay(with MARK k v needles) SEP k_gold → v_gold``. ``depth`` in [0, 1] places the
    gold needle at that fraction of the haystack (else uniform); distractors go to random
    distinct slots. The real token index of the gold needle is recorded in ``meta``."""
    n = n_distractors + 1
    hay_len = length - 3 * n - 4  # BOS, needles, SEP k v
    if hay_len < n_distractors:
        raise ValueError(f"needle: length {length} too short for {n} needles "
                         f"(needs >= {needle_min_length(n_distractors)})")
    keys = rng.sample(vocab.keys, n)
    values = rng.sample(vocab.values, n)
    hay = _filler(rng, vocab, hay_len, filler, seed)
    slots = list(range(hay_len + 1))  # needle inserted before hay[slot]
    gold_slot = round(depth * hay_len) if depth is not None else rng.choice(slots)
    others = rng.sample([s for s in slots if s != gold_slot] or slots, n_distractors) if n_distractors else []
    inserts = sorted([(gold_slot, 0)] + [(s, i + 1) for i, s in enumerate(others)])
    tokens, gold_index = [BOS], -1
    prev = 0
    for slot, which in inserts:
        tokens += hay[prev:slot]
        prev = slot
        if which == 0:
            gold_index = len(tokens)
        tokens += [MARK, keys[which], values[which]]
    tokens += [*hay[prev:], SEP, keys[0], values[0]]
    targets = [False] * (len(tokens) - 1) + [True]
    return Example(tokens, targets, {
        "task": "needle", "n_distractors": n_distractors, "gold_index": gold_index,
        "depth": (gold_index - 1) / max(len(tokens) - 4, 1), "query_index": len(tokens) - 2,
        "candidates": values, "filler": filler})


def kv_records(rng: random.Random, vocab: Vocab, length: int, *, gold: int | None = None,
               query_aware: bool = False, seed: int = 0) -> Example:
    """``BOS [SEP kj] REC k1 v1 … REC km vm SEP kj → vj`` with as many records m as fit in
    ``length`` (so up to 2 tokens shorter)."""
    m = (length - 4 - (2 if query_aware else 0)) // 3
    if m < 1:
        raise ValueError(f"kv_records: length {length} too short")
    keys, values = rng.sample(vocab.keys, m), rng.sample(vocab.values, m)
    j = rng.randrange(m) if gold is None else gold
    tokens = [BOS] + ([SEP, keys[j]] if query_aware else [])
    for k, v in zip(keys, values):
        tokens += [REC, k, v]
    tokens += [SEP, keys[j], values[j]]
    return Example(tokens, [False] * (len(tokens) - 1) + [True], {
        "task": "kv_records_query_aware" if query_aware else "kv_records", "n_records": m,
        "gold": j, "candidates": values, "query_index": len(tokens) - 2})


def mqar(rng: random.Random, vocab: Vocab, length: int, *, seed: int = 0) -> Example:
    """Multi-query associative recall ("Zoology", arXiv 2312.04927): records, then every key
    queried once in random order — dense supervision that speeds up learning to match keys."""
    m = (length - 1) // 6
    if m < 1:
        raise ValueError(f"mqar: length {length} too short")
    keys, values = rng.sample(vocab.keys, m), rng.sample(vocab.values, m)
    tokens = [BOS]
    for k, v in zip(keys, values):
        tokens += [REC, k, v]
    targets = [False] * len(tokens)
    for j in rng.sample(range(m), m):
        tokens += [SEP, keys[j], values[j]]
        targets += [False, False, True]
    return Example(tokens, targets, {"task": "mqar", "n_records": m})


def copy(rng: random.Random, vocab: Vocab, length: int, *, seed: int = 0) -> Example:
    """``BOS x1 … xn SEP → x1 … xn``: induction / copying."""
    n = (length - 2) // 2
    xs = rng.choices(vocab.filler, k=n)
    return Example([BOS, *xs, SEP, *xs], [False] * (n + 2) + [True] * n, {"task": "copy"})


def markov_lm(rng: random.Random, vocab: Vocab, length: int, *, seed: int = 0) -> Example:
    """Language-like filler from a fixed Markov chain; every token after BOS is supervised."""
    tokens = [BOS, *markov_chain(seed, vocab).sample(rng, length - 1)]
    return Example(tokens, [False] + [True] * (length - 1), {"task": "markov_lm"})


TASKS = {
    "needle": needle,
    "kv_records": kv_records,
    "kv_records_query_aware": lambda rng, vocab, length, **kw: kv_records(
        rng, vocab, length, query_aware=True, **kw),
    "mqar": mqar,
    "copy": copy,
    "markov_lm": markov_lm,
}

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
- ``multihop``:      ``BOS hay(MARK x1 v … MARK x2 x1 … ) SEP xh → v`` (variable tracking:
  chains of assignments, distractor chains interleaved; answer the root value)
- ``counting``:      ``BOS hay(c_i scattered, the winner margin times more often than the
  runner-up) SEP → c_winner`` (aggregation)
- ``flip_flop``:     ``BOS MARK v REC u … MARK w REC x … SEP → w`` (state written and held:
  ``MARK v`` writes v, ``REC u`` says to ignore u, ``SEP`` reads the last value written)

The multi-key / multi-value / multi-query needles are probes only (not a mixture task): their
generator lives with their probe kind (``blocklab.eval.kinds.multi_needle``).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from typing import Any

# The filler kinds and the shortest needle are defined beside the config schema, whose
# validator checks configs against them (config.py); the tasks and probe builders use them here.
from blocklab.config import (
    COUNTING_MAX_COUNT,
    FILLERS,
    MULTIHOP_HOPS,
    counting_choices,
    counting_min_length,
    mqar_min_length,
    multihop_choices,
    multihop_min_length,
    needle_min_length,
)

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
    hay = filler_tokens(rng, vocab, hay_len, filler, seed)
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


def mqar(rng: random.Random, vocab: Vocab, length: int, *, pairs: int | None = None,
         layout: str = "spread", seed: int = 0) -> Example:
    """Multi-query associative recall ("Zoology", arXiv 2312.04927): records, then every key
    queried once in random order — dense supervision that speeds up learning to match keys.
    With ``pairs``, exactly ``length`` tokens (``meta["distances"]``: tokens from each queried
    value's record to its answer) laid out as ``layout``: ``spread``, ``BOS k1 v1 … kn vn``
    then the n queries ``SEP ki → vi`` in random order at random places among i.i.d. filler;
    ``zoology``, the paper's own (:func:`blocklab.data.zoology.mqar_zoology`)."""
    if pairs is not None:
        if layout == "zoology":
            from blocklab.data.zoology import mqar_zoology

            return mqar_zoology(rng, vocab, length, pairs)
        return _mqar_spread(rng, vocab, length, pairs)
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


def _mqar_spread(rng: random.Random, vocab: Vocab, length: int, n: int) -> Example:
    if length < mqar_min_length(n):
        raise ValueError(f"mqar: {n} pairs need length >= {mqar_min_length(n)}, got {length}")
    keys, values = rng.sample(vocab.keys, n), rng.sample(vocab.values, n)
    tokens = [BOS]
    for k, v in zip(keys, values):
        tokens += [k, v]
    n_fill = length - len(tokens) - 3 * n
    # filler before each query (and after the last): a uniform composition of n_fill into n+1
    cuts = sorted(rng.randint(0, n_fill) for _ in range(n))
    gaps = [b - a for a, b in zip([0, *cuts], [*cuts, n_fill])]
    targets = [False] * len(tokens)
    distances = []
    for gap, j in zip(gaps, rng.sample(range(n), n)):
        tokens += rng.choices(vocab.filler, k=gap)
        tokens += [SEP, keys[j], values[j]]
        targets += [False] * gap + [False, False, True]
        distances.append(len(tokens) - 1 - (2 + 2 * j))  # answer index - stored value index
    tokens += rng.choices(vocab.filler, k=gaps[-1])
    targets += [False] * gaps[-1]
    return Example(tokens, targets, {"task": "mqar", "n_records": n, "distances": distances})


def copy(rng: random.Random, vocab: Vocab, length: int, *, seed: int = 0) -> Example:
    """``BOS x1 … xn SEP → x1 … xn``: induction / copying."""
    n = (length - 2) // 2
    xs = rng.choices(vocab.filler, k=n)
    return Example([BOS, *xs, SEP, *xs], [False] * (n + 2) + [True] * n, {"task": "copy"})


def markov_lm(rng: random.Random, vocab: Vocab, length: int, *, seed: int = 0) -> Example:
    """Language-like filler from a fixed Markov chain; every token after BOS is supervised."""
    tokens = [BOS, *markov_chain(seed, vocab).sample(rng, length - 1)]
    return Example(tokens, [False] + [True] * (length - 1), {"task": "markov_lm"})


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


def multihop(rng: random.Random, vocab: Vocab, length: int, *, hops: int | None = None,
             distractor_chains: int | None = None, filler: str = "iid",
             seed: int = 0, hop_range: tuple[int, int] = MULTIHOP_HOPS) -> Example:
    """Variable tracking (RULER's ``vt``, arXiv 2404.06654): ``distractor_chains + 1`` chains
    of ``hops`` assignments each, exactly ``length`` tokens:

        ``BOS hay(MARK x1 v … MARK x2 x1 … MARK xh x(h-1) …) SEP xh → v``

    Variables are key-range ids, root values value-range ids, all distinct in a sequence; only
    the context says which is which (``MARK a b`` reads ``a = b``). Each chain's statements
    are at slots drawn in chain order: the root (the statement farthest from the question)
    uniform over the haystack, every later one uniform after it, so ``farthest_depth`` is
    uniform. Chains interleave. Unset ``hops`` / ``distractor_chains`` (training) draw a pair
    uniformly from :func:`multihop_choices` (what fits ``length``, hops in ``hop_range``). ``meta``: ``hop_indices``
    and ``hop_depths`` of the queried chain in chain order, ``farthest_depth``, ``answers``
    (every chain's root value, gold first)."""
    if hops is None or distractor_chains is None:
        fit = [(h, c) for h, c in multihop_choices(length, hop_range)
               if (hops is None or h == hops)
               and (distractor_chains is None or c == distractor_chains)]
        if not fit:
            raise ValueError(f"multihop: length {length} too short (needs >= "
                             f"{multihop_min_length(hops or 1, distractor_chains or 1)})")
        hops, distractor_chains = rng.choice(fit)
    if hops < 1 or distractor_chains < 0:
        raise ValueError(f"multihop: hops={hops} must be >= 1 and distractor_chains="
                         f"{distractor_chains} >= 0")
    need = multihop_min_length(hops, distractor_chains)
    if length < need:
        raise ValueError(f"multihop: length {length} too short for {hops} hops and "
                         f"{distractor_chains} distractor chains (needs >= {need})")
    chains = distractor_chains + 1
    names = rng.sample(vocab.keys, hops * chains)
    roots = rng.sample(vocab.values, chains)
    hay_len = length - 1 - 3 * hops * chains - 3
    hay = filler_tokens(rng, vocab, hay_len, filler, seed)
    rank = rng.sample(range(chains), chains)  # tie order across chains
    inserts, slots = [], []
    for c in range(chains):
        xs = names[c * hops:(c + 1) * hops]
        root = rng.randint(0, hay_len)
        chain_slots = [root, *sorted(rng.randint(root, hay_len) for _ in range(hops - 1))]
        for h, s in enumerate(chain_slots):
            inserts.append((s, rank[c] * hops + h, [MARK, xs[h], roots[c] if h == 0 else xs[h - 1]]))
            slots.append(s)
    tokens, at = place_inserts(rng, hay, inserts)
    tokens += [SEP, names[hops - 1], roots[0]]
    hop_depths = [slots[h] / hay_len for h in range(hops)]
    return Example(tokens, [False] * (len(tokens) - 1) + [True], {
        "task": "multihop", "hops": hops, "distractor_chains": distractor_chains,
        "hop_indices": at[:hops], "hop_depths": hop_depths, "farthest_depth": hop_depths[0],
        "depth": hop_depths[0], "query_index": len(tokens) - 2,
        "answers": [[v] for v in roots], "gold": 0, "candidates": roots, "filler": filler})


def counting(rng: random.Random, vocab: Vocab, length: int, *, candidates: int | None = None,
             margin: int | None = None, max_count: int = COUNTING_MAX_COUNT,
             filler: str = "iid", seed: int = 0) -> Example:
    """Aggregation (RULER's frequent-words task, arXiv 2404.06654, in token space):
    ``candidates`` distinct value-range ids scattered as bare tokens through the filler,
    ``BOS hay(c …) SEP → c*``, exactly ``length`` tokens. Counts: the runner-up occurs r times
    (r uniform in 1..``max_count``), the winner r + ``margin`` times, every other candidate
    uniform in 1..r times; each occurrence at its own uniform slot, so neither the first nor
    the last occurrence names the winner more often than its share of occurrences (recorded as
    ``winner_share``: what copying a random *occurrence* scores). Unset ``candidates`` /
    ``margin`` (training) draw a pair uniformly from :func:`counting_choices`."""
    if candidates is None or margin is None:
        fit = [(k, m) for k, m in counting_choices(length)
               if (candidates is None or k == candidates) and (margin is None or m == margin)]
        if not fit:
            raise ValueError(f"counting: length {length} too short (needs >= "
                             f"{counting_min_length(candidates or 2, margin or 1)})")
        candidates, margin = rng.choice(fit)
    if candidates < 2 or margin < 1 or max_count < 1:
        raise ValueError(f"counting: candidates={candidates} must be >= 2, margin={margin} "
                         f">= 1, max_count={max_count} >= 1")
    need = counting_min_length(candidates, margin, max_count)
    if length < need:
        raise ValueError(f"counting: length {length} too short for {candidates} candidates "
                         f"and margin {margin} (needs >= {need})")
    ids = rng.sample(vocab.values, candidates)  # ids[0] wins: a random id
    r = rng.randint(1, max_count)
    counts = [r + margin, r] + [rng.randint(1, r) for _ in range(candidates - 2)]
    total = sum(counts)
    hay_len = length - 1 - total - 2
    hay = filler_tokens(rng, vocab, hay_len, filler, seed)
    occ = [c for c, n in enumerate(counts) for _ in range(n)]
    slots = [rng.randint(0, hay_len) for _ in occ]
    tokens, at = place_inserts(rng, hay, [(s, rng.random(), [ids[c]]) for s, c in zip(slots, occ)])
    tokens += [SEP, ids[0]]
    gold = [j for j, c in enumerate(occ) if c == 0]
    return Example(tokens, [False] * (len(tokens) - 1) + [True], {
        "task": "counting", "n_candidates": candidates, "margin": margin,
        "counts": dict(zip(ids, counts)), "winner_share": counts[0] / total,
        "gold_indices": sorted(at[j] for j in gold),
        "gold_depths": sorted(slots[j] / hay_len for j in gold),
        "query_index": len(tokens) - 2, "answers": [[c] for c in ids], "gold": 0,
        "candidates": ids, "filler": filler})


def flip_flop(rng: random.Random, vocab: Vocab, length: int, **kw: Any) -> Example:
    """Liu et al.'s flip-flop language: :func:`blocklab.data.flip_flop.flip_flop`."""
    from blocklab.data.flip_flop import flip_flop as build

    return build(rng, vocab, length, **kw)


TASKS = {
    "needle": needle,
    "kv_records": kv_records,
    "kv_records_query_aware": lambda rng, vocab, length, **kw: kv_records(
        rng, vocab, length, query_aware=True, **kw),
    "mqar": mqar,
    "copy": copy,
    "markov_lm": markov_lm,
    "multihop": multihop,
    "counting": counting,
    "flip_flop": flip_flop,
}

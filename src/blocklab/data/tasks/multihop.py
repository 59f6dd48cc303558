"""The ``multihop`` task, variable tracking: ``BOS hay(MARK x1 v … MARK x2 x1 … ) SEP xh → v``
(chains of assignments, distractor chains interleaved; answer the root value)."""

from __future__ import annotations

import random
from typing import Any

from blocklab.config import MULTIHOP_HOPS, DataConfig, multihop_choices, multihop_min_length
from blocklab.data.synthetic import MARK, SEP, Example, Vocab, filler_tokens, place_inserts
from blocklab.data.tasks.base import Task


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


class MultihopTask(Task):
    name = "multihop"
    generate = staticmethod(multihop)

    @classmethod
    def draw(cls, cfg: DataConfig, rng: random.Random) -> dict[str, Any]:
        # hops and distractor chains are drawn by the task itself (what fits the length)
        return {"filler": rng.choice(cfg.fillers), "hop_range": tuple(cfg.multihop_hops)}

"""The ``counting`` task, aggregation: ``BOS hay(c_i scattered, the winner margin times more
often than the runner-up) SEP → c_winner``."""

from __future__ import annotations

import random
from typing import Any

from blocklab.config import (
    COUNTING_MAX_COUNT,
    DataConfig,
    counting_choices,
    counting_min_length,
)
from blocklab.data.synthetic import SEP, Example, Vocab, filler_tokens, place_inserts
from blocklab.data.tasks.base import Task


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


class CountingTask(Task):
    name = "counting"
    generate = staticmethod(counting)

    @classmethod
    def draw(cls, cfg: DataConfig, rng: random.Random) -> dict[str, Any]:
        # candidates and margins are drawn by the task itself (what fits the length)
        return {"filler": rng.choice(cfg.fillers)}

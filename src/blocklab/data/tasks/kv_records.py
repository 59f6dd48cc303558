"""The ``kv_records`` tasks: ``BOS REC k1 v1 … REC km vm SEP kj → vj``, and
``kv_records_query_aware``: ``BOS SEP kj REC k1 v1 … SEP kj → vj`` (the question also asked
first)."""

from __future__ import annotations

import random
from typing import Any

from blocklab.data.synthetic import BOS, REC, SEP, Example, Vocab
from blocklab.data.tasks.base import Task


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


class KvRecordsTask(Task):
    name = "kv_records"
    generate = staticmethod(kv_records)


class KvRecordsQueryAwareTask(Task):
    name = "kv_records_query_aware"

    @staticmethod
    def generate(rng: random.Random, vocab: Vocab, length: int, **kw: Any) -> Example:
        return kv_records(rng, vocab, length, query_aware=True, **kw)

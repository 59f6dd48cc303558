"""MQAR in Zoology's own layout (Arora et al. 2023, arXiv 2312.04927; ``zoology/data/
associative_recall.py``, the Figure-2 configs): the ``data.mqar_layout=zoology`` sequences."""

from __future__ import annotations

import random

from blocklab.config import mqar_min_length
from blocklab.config.facts import ZOOLOGY_POWER_A
from blocklab.data.synthetic import Example, Vocab


def mqar_zoology(rng: random.Random, vocab: Vocab, length: int, n: int) -> Example:
    """Zoology's MQAR (``zoology/data/associative_recall.py``, the Figure-2 configs): ``k1 v1 …
    kn vn`` (keys and values from disjoint id ranges), then a query region of ``length - 2n``
    tokens cut into 2-token slots; each key is put, once, at the start of a slot drawn without
    replacement with probability ∝ g^(a - 1) (g = 1 the slot right after the records,
    a = 0.01), its value after it as the target; every other token is one constant filler id
    (``random_non_queries=False``). No BOS, no SEP: a key's second occurrence is the query."""
    if length < mqar_min_length(n, "zoology"):
        raise ValueError(f"mqar: {n} pairs need length >= {mqar_min_length(n, 'zoology')} in "
                         f"the zoology layout, got {length}")
    keys, values = rng.sample(vocab.keys, n), rng.sample(vocab.values, n)
    tokens = [t for kv in zip(keys, values) for t in kv]
    slots = (length - 2 * n) // 2
    # weighted sampling without replacement (Efraimidis & Spirakis: the n largest u^(1/w) are
    # distributed as n successive weighted draws, as numpy's choice(replace=False, p=...))
    ranked = sorted(range(slots), key=lambda g: rng.random() ** (1 / (g + 1) ** (ZOOLOGY_POWER_A
                                                                                - 1)),
                    reverse=True)
    region = [vocab.filler[0]] * (length - 2 * n)
    targets = [False] * length
    distances = []
    for j, g in enumerate(ranked[:n]):
        region[2 * g], region[2 * g + 1] = keys[j], values[j]
        answer = 2 * n + 2 * g + 1
        targets[answer] = True
        distances.append(answer - (2 * j + 1))
    return Example(tokens + region, targets, {"task": "mqar", "n_records": n,
                                              "distances": distances})

"""The ``mqar`` task, multi-query associative recall ("Zoology", Arora et al. 2023, arXiv
2312.04927): ``BOS REC k1 v1 … SEP ki → vi SEP kj → vj …`` (every key queried once); with
``data.mqar_pairs``, a fixed number of pairs in the ``spread`` layout or in Zoology's own
(``zoology/data/associative_recall.py``, the Figure-2 configs: ``data.mqar_layout=zoology``)."""

from __future__ import annotations

import random
from typing import Any

from blocklab.config import DataConfig, mqar_min_length
from blocklab.config.facts import ZOOLOGY_POWER_A
from blocklab.data.synthetic import BOS, REC, SEP, Example, Vocab
from blocklab.data.tasks.base import Task


def mqar(rng: random.Random, vocab: Vocab, length: int, *, pairs: int | None = None,
         layout: str = "spread", seed: int = 0, seg_len: int | None = None) -> Example:
    """Multi-query associative recall ("Zoology", arXiv 2312.04927): records, then every key
    queried once in random order — dense supervision that speeds up learning to match keys.
    With ``pairs``, exactly ``length`` tokens (``meta["distances"]``: tokens from each queried
    value's record to its answer) laid out as ``layout``: ``spread``, ``BOS k1 v1 … kn vn``
    then the n queries ``SEP ki → vi`` in random order at random places among i.i.d. filler;
    ``zoology``, the paper's own (:func:`mqar_zoology`); ``segments``, across segments of
    ``seg_len`` (:func:`mqar_segments`)."""
    if pairs is not None:
        if layout == "segments":
            return mqar_segments(rng, vocab, length, pairs, seg_len or length)
        if layout == "zoology":
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


def _scatter(rng: random.Random, vocab: Vocab, items: list[list[int]], room: int
             ) -> tuple[list[int], list[int]]:
    """``items`` in order at uniform places among i.i.d. filler, ``room`` tokens in all: the
    tokens and the index of each item's last token."""
    n_fill = room - sum(len(it) for it in items)
    cuts = sorted(rng.randint(0, n_fill) for _ in items)
    gaps = [b - a for a, b in zip([0, *cuts], [*cuts, n_fill])]
    tokens: list[int] = []
    last = []
    for gap, item in zip(gaps, items):
        tokens += rng.choices(vocab.filler, k=gap) + item
        last.append(len(tokens) - 1)
    return tokens + rng.choices(vocab.filler, k=gaps[-1]), last


def mqar_segments(rng: random.Random, vocab: Vocab, length: int, n: int, seg_len: int
                  ) -> Example:
    """MQAR across segments (``data.mqar_layout=segments``, for memory across segments, RMT /
    BABILong's setting: arXiv 2207.06881, 2406.10149): ``length // seg_len`` segments; BOS and
    the ``n`` records ``k v`` at uniform places in the first, the ``n`` queries ``SEP k v``
    (random order) at uniform places in the last, i.i.d. filler everywhere else. Only a memory
    that reaches ``meta["segments_back"]`` segments back answers. A document of one segment
    (a curriculum over the number of segments starts there, as RMT's does) holds its records in
    the segment's first half and its queries in the second: the recall a single segment's
    attention learns, the same circuit a memory then carries across segments."""
    if 3 * n > seg_len:
        raise ValueError(f"mqar: {n} pairs need segments of >= {3 * n} tokens, got {seg_len}")
    segs = max(length // seg_len, 1)
    keys, values = rng.sample(vocab.keys, n), rng.sample(vocab.values, n)
    order = rng.sample(range(n), n)
    queries = [[SEP, keys[j], values[j]] for j in order]
    records = [[k, v] for k, v in zip(keys, values)]
    if segs == 1:
        half = seg_len // 2
        if 2 * n > half - 1 or 3 * n > seg_len - half:
            raise ValueError(f"mqar: {n} pairs do not fit one segment of {seg_len} tokens")
        first, _ = _scatter(rng, vocab, records, half - 1)
        last, answers = _scatter(rng, vocab, queries, seg_len - half)
        tokens, start = [BOS, *first, *last], half
    else:
        first, _ = _scatter(rng, vocab, records, seg_len - 1)
        last, answers = _scatter(rng, vocab, queries, seg_len)
        middle = rng.choices(vocab.filler, k=(segs - 2) * seg_len)
        tokens, start = [BOS, *first, *middle, *last], (segs - 1) * seg_len
    targets = [False] * len(tokens)
    for a in answers:
        targets[start + a] = True
    return Example(tokens, targets, {"task": "mqar", "n_records": n,
                                     "segments_back": segs - 1})


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


class MqarTask(Task):
    name = "mqar"
    generate = staticmethod(mqar)

    @classmethod
    def draw(cls, cfg: DataConfig, rng: random.Random) -> dict[str, Any]:
        if cfg.mqar_pairs is None:
            return {}
        return {"pairs": (cfg.mqar_pairs if cfg.mqar_min_pairs is None
                          else rng.randint(cfg.mqar_min_pairs, cfg.mqar_pairs)),
                "layout": cfg.mqar_layout,
                **({"seg_len": cfg.seq_len} if cfg.mqar_layout == "segments" else {})}

"""The facts of the synthetic vocabulary that the config rules need: what the synthetic tasks
(data/tasks/) and the token-space probes require of a config (shortest sequences, distinct
ids drawn, the ranges the training tasks draw from). Defined on the config floor (and imported by
the data package) so that a config is checked without importing the data package."""

from __future__ import annotations

FILLERS = ("iid", "phrase", "markov")  # haystack kinds of the needle task
MARKOV_MIN_FILLER = 4  # the Markov filler chain gives each filler token 4 distinct successors


def needle_min_length(n_distractors: int) -> int:
    """Shortest needle sequence: BOS, 3 tokens per needle, SEP k v, one filler per distractor."""
    return 3 * (n_distractors + 1) + 4 + n_distractors


MQAR_LAYOUTS = ("spread", "zoology", "segments")  # data.mqar_layout (with data.mqar_pairs)
ZOOLOGY_POWER_A = 0.01  # Zoology's query slots: p(slot g) ∝ g^(a - 1), g = 1, 2, ...


def mqar_min_length(pairs: int, layout: str = "spread") -> int:
    """Shortest MQAR sequence with ``data.mqar_pairs`` pairs: ``spread``: BOS, the records, one
    ``SEP k v`` per key; ``zoology``: the records and a query slot of 2 tokens per key (the
    paper's ``4 n <= L``)."""
    return 4 * pairs if layout == "zoology" else 1 + 5 * pairs


def distinct_pairs(task: str, seq_len: int, max_distractors: int) -> int:
    """Distinct keys (and as many values) that one ``task`` sequence of up to ``seq_len`` tokens
    draws from the synthetic vocabulary (0: the task draws no keys)."""
    if task in ("multihop", "counting", "flip_flop"):  # unequal key / value needs: distinct_ids
        return max(distinct_ids(task, seq_len, max_distractors))
    return {"needle": max_distractors + 1, "kv_records": (seq_len - 4) // 3,
            "kv_records_query_aware": (seq_len - 6) // 3,
            "mqar": (seq_len - 1) // 6}.get(task, 0)


# Variable tracking (``multihop``) and aggregation (``counting``) as training tasks: the ranges
# each example draws from (inclusive), restricted per example to what fits its length.
MULTIHOP_HOPS = (1, 4)  # assignments in the queried chain (lookups needed)
MULTIHOP_DISTRACTOR_CHAINS = (1, 2)  # other chains of the same length
COUNTING_CANDIDATES = (2, 4)  # distinct candidate ids
COUNTING_MARGINS = (1, 3)  # winner count - runner-up count
COUNTING_MAX_COUNT = 4  # the runner-up occurs 1..4 times (probes and training alike)
MULTI_NEEDLE_VARIANTS = ("multikey", "multivalue", "multiquery")
# State that is written and held (``flip_flop``, Liu et al. 2023's flip-flop language): the
# probability of a write per instruction pair (the rest are ignores; one read, at the end,
# unless a read probability is given) and the symbols written, the first value-range ids
FLIP_FLOP_WRITE = 0.1
FLIP_FLOP_SYMBOLS = 2


def multi_needle_needles(variant: str, keys: int, values: int) -> int:
    """Needles of a multi-needle sequence: ``keys`` (multikey, multiquery) or ``keys × values``
    (multivalue: every key carries ``values`` values, so the queried key is not the only
    repeated one)."""
    return keys * values if variant == "multivalue" else keys


def multi_needle_answer_length(variant: str, values: int, queries: int) -> int:
    """Answer tokens: 1 (multikey), ``values`` (multivalue), ``queries`` (multiquery)."""
    return {"multikey": 1, "multivalue": values, "multiquery": queries}[variant]


def multi_needle_min_length(variant: str, keys: int, values: int, queries: int) -> int:
    """Shortest multi-needle sequence: BOS, 3 tokens per needle, at least one filler token,
    SEP, the queried keys and the answer."""
    n_query = queries if variant == "multiquery" else 1
    return (1 + 3 * multi_needle_needles(variant, keys, values) + 1 + 1 + n_query
            + multi_needle_answer_length(variant, values, queries))


def multihop_min_length(hops: int, distractor_chains: int) -> int:
    """Shortest variable-tracking sequence: BOS, 3 tokens per statement of every chain, at
    least one filler token, ``SEP x_h v``."""
    return 1 + 3 * hops * (distractor_chains + 1) + 1 + 3


def counting_min_length(candidates: int, margin: int,
                        max_count: int = COUNTING_MAX_COUNT) -> int:
    """Shortest aggregation sequence for the largest counts: BOS, ``candidates × max_count +
    margin`` candidate tokens, at least one filler token, ``SEP c``."""
    return 1 + candidates * max_count + margin + 1 + 2


def multihop_choices(length: int, hops: tuple[int, int] | list[int] = MULTIHOP_HOPS
                     ) -> list[tuple[int, int]]:
    """(hops, distractor chains) pairs the ``multihop`` training task draws from (uniformly) at
    ``length``: ``hops`` (inclusive; ``data.multihop_hops``) and the distractor range above,
    restricted to what fits."""
    return [(h, c) for h in range(hops[0], hops[1] + 1)
            for c in range(MULTIHOP_DISTRACTOR_CHAINS[0], MULTIHOP_DISTRACTOR_CHAINS[1] + 1)
            if multihop_min_length(h, c) <= length]


def counting_choices(length: int) -> list[tuple[int, int]]:
    """(candidates, margin) pairs the ``counting`` training task draws from at ``length``."""
    return [(k, m) for k in range(COUNTING_CANDIDATES[0], COUNTING_CANDIDATES[1] + 1)
            for m in range(COUNTING_MARGINS[0], COUNTING_MARGINS[1] + 1)
            if counting_min_length(k, m) <= length]


def distinct_ids(task: str, seq_len: int, max_distractors: int = 0,
                 hops: tuple[int, int] | list[int] = MULTIHOP_HOPS) -> tuple[int, int]:
    """(keys, values): distinct key-range and value-range ids that one ``task`` sequence of up
    to ``seq_len`` tokens draws (variables of ``multihop`` are key-range ids; ``hops``: the
    range it draws hop counts from)."""
    if task == "multihop":
        fit = multihop_choices(seq_len, hops)
        return (max((h * (c + 1) for h, c in fit), default=0),
                max((c + 1 for _, c in fit), default=0))
    if task == "counting":
        return 0, max((k for k, _ in counting_choices(seq_len)), default=0)
    if task == "flip_flop":
        return 0, FLIP_FLOP_SYMBOLS
    if task == "listops":  # 4 operators and the closing bracket; the 10 digits
        return 5, 10
    n = distinct_pairs(task, seq_len, max_distractors)
    return n, n

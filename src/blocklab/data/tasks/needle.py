"""The ``needle`` task: ``BOS f f … MARK k v f … MARK k' v' … SEP k → v`` — key–value needles
in a haystack of filler, distractor needles of the same format beside the gold one (a single
needle can be solved by copying *any* value: docs/probes.md, "A single needle is a shortcut
task")."""

from __future__ import annotations

import random
from typing import Any

from blocklab.config import DataConfig, needle_min_length
from blocklab.data.synthetic import BOS, MARK, SEP, Example, Vocab, filler_tokens
from blocklab.data.tasks.base import Task


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


class NeedleTask(Task):
    name = "needle"
    generate = staticmethod(needle)

    @classmethod
    def draw(cls, cfg: DataConfig, rng: random.Random) -> dict[str, Any]:
        return {"n_distractors": rng.randint(*cfg.n_distractors), "filler": rng.choice(cfg.fillers)}

"""The ``copy`` task: ``BOS x1 … xn SEP → x1 … xn`` (induction / copying)."""

from __future__ import annotations

import random

from blocklab.data.synthetic import BOS, SEP, Example, Vocab
from blocklab.data.tasks.base import Task


def copy(rng: random.Random, vocab: Vocab, length: int, *, seed: int = 0) -> Example:
    """``BOS x1 … xn SEP → x1 … xn``: induction / copying."""
    n = (length - 2) // 2
    xs = rng.choices(vocab.filler, k=n)
    return Example([BOS, *xs, SEP, *xs], [False] * (n + 2) + [True] * n, {"task": "copy"})


class CopyTask(Task):
    name = "copy"
    generate = staticmethod(copy)

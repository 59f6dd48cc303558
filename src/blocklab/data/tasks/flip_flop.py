"""The ``flip_flop`` task: state written, held and overwritten (Liu et al. 2023, "Exposing
Attention Glitches with Flip-Flop Language Modeling", arXiv 2306.00946), in token space."""

from __future__ import annotations

import random

from blocklab.config import FLIP_FLOP_SYMBOLS, FLIP_FLOP_WRITE
from blocklab.data.synthetic import BOS, MARK, REC, SEP, Example, Vocab
from blocklab.data.tasks.base import Task


def flip_flop(rng: random.Random, vocab: Vocab, length: int, *, p_write: float = FLIP_FLOP_WRITE,
              p_read: float = 0.0, symbols: int = FLIP_FLOP_SYMBOLS, seed: int = 0) -> Example:
    """``BOS`` then ``(length - 1) // 2`` instruction pairs: the first writes (``MARK v``);
    each later one reads with probability ``p_read`` (``SEP v``, v the last value written: the
    supervised answer), writes with ``p_write``, and otherwise is an instruction to ignore its
    value (``REC v``); the last pair is always a read. Values are the first ``symbols``
    value-range ids, and ignored values are drawn like written ones, so only the instruction
    tells them apart. ``p_read=0`` (the default): one read, at the end, so the answer is the
    last write however far back: holding a value across ignores and dropping it at the next
    write is the whole task. Liu et al.'s FFL(0.8) is ``p_write=p_read=0.1``, 2 symbols.
    ``meta``: the writes and the distance in tokens from the last written value to the answer."""
    if not (0 < p_write <= 1 and p_read >= 0 and p_write + p_read <= 1) or symbols < 1:
        raise ValueError(f"flip_flop: p_write={p_write} must be in (0, 1] and p_read={p_read} "
                         f">= 0 with p_write + p_read <= 1; symbols={symbols} must be >= 1")
    n = (length - 1) // 2
    if n < 2:
        raise ValueError(f"flip_flop: length {length} too short (needs >= 5: BOS, a write, a "
                         "read)")
    values = vocab.values[:symbols]
    tokens, targets = [BOS], [False]
    last, writes, written_at = 0, 0, 0
    for i in range(n):
        r = rng.random()
        op = ("write" if i == 0 else "read" if i == n - 1 or r < p_read
              else "write" if r < p_read + p_write else "ignore")
        if op == "read":
            tokens += [SEP, last]
            targets += [False, True]
            continue
        v = rng.choice(values)
        tokens += [MARK if op == "write" else REC, v]
        targets += [False, False]
        if op == "write":
            last, writes, written_at = v, writes + 1, len(tokens) - 1
    return Example(tokens, targets, {"task": "flip_flop", "writes": writes,
                                     "distance": len(tokens) - 1 - written_at})


class FlipFlopTask(Task):
    name = "flip_flop"
    generate = staticmethod(flip_flop)

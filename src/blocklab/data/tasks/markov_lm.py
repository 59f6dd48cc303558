"""The ``markov_lm`` task: text from a fixed random Markov chain over the filler tokens, every
token supervised (the perplexity slice of the mixture)."""

from __future__ import annotations

import random

from blocklab.data.synthetic import BOS, Example, Vocab, markov_chain
from blocklab.data.tasks.base import Task


def markov_lm(rng: random.Random, vocab: Vocab, length: int, *, seed: int = 0) -> Example:
    """Language-like filler from a fixed Markov chain; every token after BOS is supervised."""
    tokens = [BOS, *markov_chain(seed, vocab).sample(rng, length - 1)]
    return Example(tokens, [False] + [True] * (length - 1), {"task": "markov_lm"})


class MarkovLmTask(Task):
    name = "markov_lm"
    generate = staticmethod(markov_lm)

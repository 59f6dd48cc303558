"""Held-out needle accuracy with distractor needles, for any family (through its objective's
own batch format). The full probe suite builds on the same scoring."""

from __future__ import annotations

from typing import Any

import torch

from blocklab.data.synthetic import Vocab, example_rng, needle
from blocklab.train.objectives import IGNORE, Objective


@torch.no_grad()
def needle_accuracy(model: torch.nn.Module, objective: Objective, vocab: Vocab, *, length: int,
                    n_distractors: int, n: int = 256, seed: int = 9999,
                    fillers: tuple[str, ...] = ("iid", "phrase", "markov"),
                    batch_size: int = 128) -> dict[str, Any]:
    """Argmax accuracy at the answer, and how often the prediction is *any* in-context value
    (the copy-any-value shortcut scores 1/(n_distractors+1) on accuracy but 1.0 here)."""
    was_training = model.training
    model.eval()
    correct = any_value = 0
    try:
        for start in range(0, n, batch_size):
            exs = [needle(example_rng(seed, i, f"probe:needle:{n_distractors}:{length}"), vocab,
                          length, n_distractors=n_distractors, filler=fillers[i % len(fillers)],
                          seed=seed) for i in range(start, min(start + batch_size, n))]
            batch = objective.collate(exs)
            logits = objective.logits(model, batch)
            at = batch["labels"] != IGNORE
            pred = logits.argmax(-1)[at]  # one answer per example, in order
            gold = batch["labels"][at]
            correct += int((pred == gold).sum())
            any_value += sum(int(p) in e.meta["candidates"] for p, e in zip(pred.tolist(), exs))
    finally:
        model.train(was_training)
    return {"n_distractors": n_distractors, "length": length, "n": n, "accuracy": correct / n,
            "any_value": any_value / n, "copy_any_value": 1 / (n_distractors + 1),
            "chance": 1 / vocab.n_values}

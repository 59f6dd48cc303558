"""Held-out measurements on a trained decoder: teacher-forced argmax accuracy at the supervised
positions of sequences built for the purpose, from a seed no training run uses.

Every builder here is a pure function of ``(seed, index)`` through
:func:`blocklab.data.synthetic.example_rng` (salted per measurement), over the vocabulary the
checkpoint was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from blocklab.data import synthetic as syn
from blocklab.data.mixture import vocab_of

EVAL_SEED = 424242  # never a training seed of a reference experiment (those are 0, 1, 2, ...)


@dataclass
class Tally:
    """Hits over trials (one trial per supervised token)."""

    hits: int = 0
    trials: int = 0

    def add(self, hits: list[bool]) -> None:
        self.hits += sum(hits)
        self.trials += len(hits)

    @property
    def rate(self) -> float:
        return self.hits / self.trials if self.trials else float("nan")


def load(run_dir: str | Path) -> tuple[torch.nn.Module, syn.Vocab]:
    """The newest checkpoint's model (eval mode) and the synthetic vocabulary it trained on."""
    from blocklab.checkpoint import load_model
    from blocklab.eval.evaluate import stored_train_config

    model, _, meta = load_model(run_dir)
    if not getattr(model, "decoder", None) or getattr(model, "encoder", None):
        raise ValueError(f"{run_dir}: the reference experiments measure decoder-only models")
    return model, vocab_of(stored_train_config(meta).data)


@torch.no_grad()
def target_hits(model: torch.nn.Module, examples: list[syn.Example], *,
                batch_size: int = 64) -> list[list[bool]]:
    """Per example, whether the argmax after each prefix is the supervised token (right
    padding: causal queries never see it)."""
    out: list[list[bool]] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        width = max(len(e.tokens) for e in chunk)
        ids = torch.full((len(chunk), width), syn.PAD, dtype=torch.long)
        valid = torch.zeros((len(chunk), width), dtype=torch.bool)
        for i, e in enumerate(chunk):
            ids[i, : len(e.tokens)] = torch.tensor(e.tokens)
            valid[i, : len(e.tokens)] = True
        pred = model(ids, valid=valid).argmax(-1)  # (B, T): the token after each position
        for i, e in enumerate(chunk):
            out.append([int(pred[i, t - 1]) == e.tokens[t]
                        for t, on in enumerate(e.targets) if on])
    return out


def mqar_examples(vocab: syn.Vocab, *, n: int, length: int, pairs: int,
                  seed: int = EVAL_SEED) -> list[syn.Example]:
    """Zoology-layout MQAR sequences (every key queried once, queries spread over the length)."""
    return [syn.mqar(syn.example_rng(seed, i, f"repro:mqar:{length}:{pairs}"), vocab, length,
                     pairs=pairs) for i in range(n)]


def recall_at_gap(vocab: syn.Vocab, *, n: int, pairs: int, gap: int,
                  seed: int = EVAL_SEED) -> list[syn.Example]:
    """``BOS k1 v1 … kn vn f×gap SEP kj → vj`` with the gold record the last one, so the answer
    is ``gap + 3`` tokens after its value (``gap + 2`` from the query position that predicts it)
    and every record is at least that far: the receptive-field measurement."""
    out = []
    for i in range(n):
        rng = syn.example_rng(seed, i, f"repro:gap:{pairs}:{gap}")
        keys, values = rng.sample(vocab.keys, pairs), rng.sample(vocab.values, pairs)
        tokens = [syn.BOS]
        for k, v in zip(keys, values):
            tokens += [k, v]
        tokens += [*rng.choices(vocab.filler, k=gap), syn.SEP, keys[-1], values[-1]]
        out.append(syn.Example(tokens, [False] * (len(tokens) - 1) + [True],
                               {"distance": gap + 3}))
    return out


def needle_examples(vocab: syn.Vocab, *, n: int, length: int, n_distractors: int,
                    seed: int = EVAL_SEED) -> list[syn.Example]:
    """Needles with distractor needles, depth uniform per item, i.i.d. filler."""
    return [syn.needle(syn.example_rng(seed, i, f"repro:needle:{length}:{n_distractors}"),
                       vocab, length, n_distractors=n_distractors, filler="iid")
            for i in range(n)]


def accuracy(model: torch.nn.Module, examples: list[syn.Example]) -> Tally:
    tally = Tally()
    for hits in target_hits(model, examples):
        tally.add(hits)
    return tally

"""Held-out measurements on a trained decoder: teacher-forced argmax accuracy at the supervised
positions of sequences built for the purpose, from a seed no training run uses.

Every builder here is a pure function of ``(seed, index)`` through
:func:`blocklab.data.synthetic.example_rng` (salted per measurement), over the vocabulary the
checkpoint was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from blocklab.config import FLIP_FLOP_WRITE
from blocklab.data import synthetic as syn
from blocklab.data.mixture import vocab_of
from blocklab.data.tasks.flip_flop import flip_flop
from blocklab.data.tasks.mqar import mqar
from blocklab.data.tasks.needle import needle

EVAL_SEED = 424242  # never a training seed of a reference experiment (those are 0, 1, 2, ...)


@dataclass
class Tally:
    """Hits over trials (one trial per supervised token)."""

    hits: int = 0
    trials: int = 0

    def add(self, hits: list[bool]) -> None:
        self.hits += sum(hits)
        self.trials += len(hits)

    def add_tally(self, other: Tally) -> None:
        self.hits += other.hits
        self.trials += other.trials

    @property
    def rate(self) -> float:
        return self.hits / self.trials if self.trials else float("nan")


@dataclass
class Scalar:
    """A measured number that is not a rate of trials (e.g. a perplexity ratio): checks read
    ``rate``; no interval is drawn for it."""

    rate: float
    hits: int = 0
    trials: int = 0


@dataclass
class Trained:
    """A measured checkpoint: its model (eval mode), the synthetic vocabulary and the data
    seed it trained on (the seed picks the Markov chain of its language slice)."""

    model: torch.nn.Module
    vocab: syn.Vocab
    data_seed: int
    config: Any = None  # the run's training config (TrainConfig), as stored


def load(run_dir: str | Path, model_overrides: tuple[str, ...] = ()) -> Trained:
    """The newest checkpoint's model with its vocabulary and data seed.
    ``model_overrides`` (``key=value`` into the model config, e.g. ``mixer.window=16``)
    rebuild the model with the trained weights under a changed, parameter-free setting."""
    import yaml
    from omegaconf import OmegaConf

    from blocklab.checkpoint import load_model
    from blocklab.config.compose import model_to_dict
    from blocklab.eval.evaluate import stored_train_config
    from blocklab.model import build_model

    model, _, meta = load_model(run_dir)
    tc = stored_train_config(meta)  # read (and migrated) as the stored config it is
    if model_overrides:
        cfg = OmegaConf.create(model_to_dict(tc.model))
        for item in model_overrides:
            key, _, value = item.partition("=")
            OmegaConf.update(cfg, key, yaml.safe_load(value) if value else None)  # "16" -> 16
        changed = build_model(OmegaConf.to_container(cfg))
        changed.load_state_dict(model.state_dict())  # strict: the override adds no parameter
        model = changed.eval()
    if not getattr(model, "decoder", None) or getattr(model, "encoder", None):
        raise ValueError(f"{run_dir}: the reference experiments measure decoder-only models")
    return Trained(model, vocab_of(tc.data), tc.data.seed, tc)


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


def flip_flop_examples(vocab: syn.Vocab, *, n: int, length: int,
                       p_write: float = FLIP_FLOP_WRITE, seed: int = EVAL_SEED
                       ) -> list[syn.Example]:
    """Flip-flop sequences with one read, at the end (its answer: the last write)."""
    salt = f"repro:flip_flop:{length}:{p_write!r}"
    return [flip_flop(syn.example_rng(seed, i, salt), vocab, length, p_write=p_write)
            for i in range(n)]


def mqar_examples(vocab: syn.Vocab, *, n: int, length: int, pairs: int, layout: str = "spread",
                  seed: int = EVAL_SEED) -> list[syn.Example]:
    """MQAR sequences with ``pairs`` pairs, every key queried once (``layout``: ``spread``,
    queries spread over the length after SEP markers; ``zoology``, the paper's exactly)."""
    salt = f"repro:mqar:{length}:{pairs}" + ("" if layout == "spread" else f":{layout}")
    return [mqar(syn.example_rng(seed, i, salt), vocab, length, pairs=pairs, layout=layout)
            for i in range(n)]


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
    return [needle(syn.example_rng(seed, i, f"repro:needle:{length}:{n_distractors}"),
                       vocab, length, n_distractors=n_distractors, filler="iid")
            for i in range(n)]


def accuracy(model: torch.nn.Module, examples: list[syn.Example]) -> Tally:
    tally = Tally()
    for hits in target_hits(model, examples):
        tally.add(hits)
    return tally


@torch.no_grad()
def markov_perplexity(model: torch.nn.Module, vocab: syn.Vocab, data_seed: int, *, length: int,
                      tokens: int = 4096, seed: int = EVAL_SEED) -> float:
    """Perplexity on held-out text of the training data's Markov chain (the language slice),
    in non-overlapping windows of ``length`` tokens (``BOS`` + ``length - 1`` chain tokens,
    every chain token scored), about ``tokens`` scored tokens in all."""
    per = length - 1
    n_windows = max(1, -(-tokens // per))
    stream = syn.markov_chain(data_seed, vocab).sample(
        syn.example_rng(seed, length, "repro:markov"), per * n_windows)
    ids = torch.tensor([[syn.BOS, *stream[i * per:(i + 1) * per]] for i in range(n_windows)])
    total, count = 0.0, 0
    for chunk in ids.split(max(1, 8192 // length)):
        logp = model(chunk).log_softmax(-1)[:, :-1]  # predicts tokens 1..
        nll = -logp.gather(-1, chunk[:, 1:, None]).squeeze(-1)
        total, count = total + float(nll.sum()), count + nll.numel()
    return float(torch.tensor(total / count).exp())

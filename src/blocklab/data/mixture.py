"""The synthetic training mixture: example ``i`` of a run is a pure function of (seed, i) and
the step it is drawn for (length curriculum), so an exact resume only needs the number of
examples consumed."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from blocklab.config import MULTIHOP_HOPS, DataConfig, validate_mixture
from blocklab.config.validate_data import longest
from blocklab.data.synthetic import Example, Vocab, example_rng
from blocklab.registry import lookup


def vocab_of(cfg: DataConfig) -> Vocab:
    return Vocab(n_filler=cfg.n_filler, n_keys=cfg.n_keys, n_values=cfg.n_values)


def task_weights(cfg: DataConfig) -> dict[str, float]:
    """Non-zero mixture weights by task name (blocklab's ``data.tasks``, then a user's
    ``data.user_tasks``)."""
    weights = cfg.tasks if isinstance(cfg.tasks, dict) else dataclasses.asdict(cfg.tasks)
    weights = {**weights, **(cfg.user_tasks or {})}
    return {k: float(v) for k, v in weights.items() if v}


class Mixture:
    """``mixture(index, step)`` -> Example; tasks drawn by weight per example, one length per
    batch uniform in ``[min_len, max_len(step)]``, where max_len follows the short-to-long
    ``curriculum`` stages (docs/probes.md: key matching is learned on short sequences first);
    with ``data.segment_mode=split``, a number of whole segments uniform over that range (the
    curriculum then grows the number of segments)."""

    def __init__(self, cfg: DataConfig, *, salt: str = "train", only: list[str] | None = None,
                 length: int | None = None) -> None:
        """``only``: draw from these tasks alone, at their weights (validation's
        ``data.val_tasks``); ``length``: every sequence this long (``data.val_len``)."""
        validate_mixture(cfg)  # the mixture rules of config.validate_train, for direct use
        self.cfg, self.salt, self.vocab = cfg, salt, vocab_of(cfg)
        self.length = length
        weights = task_weights(cfg)
        if only:
            weights = {k: w for k, w in weights.items() if k in only}
        self.names = sorted(weights)
        self.weights = [weights[n] for n in self.names]
        self.tasks = {n: lookup("task", n, f"data.tasks.{n}") for n in self.names}

    def max_len(self, step: int) -> int:
        """Longest sequence at ``step``: the last curriculum stage started by then, capped at
        seq_len; seq_len without a curriculum. With ``data.segment_mode=split`` the cap is
        ``data.doc_len`` (one example is one document read segment by segment), so the
        curriculum grows the number of segments."""
        top = longest(self.cfg)
        started = [length for start, length in self.cfg.curriculum if start <= step]
        return min(started[-1], top) if started else top

    def __call__(self, index: int, step: int | None = None) -> Example:
        c = self.cfg
        rng = example_rng(c.seed, index, self.salt)
        name = rng.choices(self.names, self.weights)[0]
        # One length per batch (indices of a batch are consecutive): no padding waste.
        batch_rng = example_rng(c.seed, index // c.batch_size, self.salt + ":length")
        hi = longest(c) if step is None else self.max_len(step)
        lo = min(c.min_len, hi)
        if self.length:
            length = self.length
        elif c.segment_mode == "split" and hi >= c.seq_len:  # whole segments, not padding
            t = c.seq_len
            length = t * batch_rng.randint(max(-(-lo // t), 1), hi // t)
        else:
            length = batch_rng.randint(lo, hi)
        task = self.tasks[name]
        return task.generate(rng, self.vocab, length, seed=c.seed, **task.draw(c, rng))

    def fingerprint(self) -> str:
        """Identifies the data stream: same fingerprint, same examples."""
        spec = {"salt": self.salt, "vocab": self.vocab.to_dict(),
                **{k: getattr(self.cfg, k) for k in ("seed", "seq_len", "min_len", "batch_size")},
                "curriculum": [list(stage) for stage in self.cfg.curriculum],
                "tasks": task_weights(self.cfg), "n_distractors": list(self.cfg.n_distractors),
                "fillers": list(self.cfg.fillers),
                **({"mqar_pairs": self.cfg.mqar_pairs} if self.cfg.mqar_pairs is not None
                   else {}),
                **({"mqar_min_pairs": self.cfg.mqar_min_pairs}
                   if self.cfg.mqar_min_pairs is not None else {}),
                **({"val_tasks": sorted(self.cfg.val_tasks)} if self.cfg.val_tasks else {}),
                **({"val_len": self.cfg.val_len} if self.cfg.val_len is not None else {}),
                **({"mqar_layout": self.cfg.mqar_layout} if self.cfg.mqar_layout != "spread"
                   else {}),
                **({"listops_gap": self.cfg.listops_gap} if self.cfg.listops_gap else {}),
                **({"multihop_hops": list(self.cfg.multihop_hops)}
                   if tuple(self.cfg.multihop_hops) != MULTIHOP_HOPS else {}),
                **({"segment_mode": self.cfg.segment_mode}
                   if self.cfg.segment_mode != "none" else {}),
                **({"doc_len": self.cfg.doc_len} if self.cfg.doc_len is not None else {})}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

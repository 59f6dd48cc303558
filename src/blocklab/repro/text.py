"""Held-out measurements on a decoder trained on text: the loss per token of the run's own
validation part and of text it trained on, and whether the validation text is text it trained
on (the check that can see a wrong split).

The streams are rebuilt from the checkpoint's stored data config by the functions training
uses (``build_streams``; the prepared corpus is reused from the data cache) and must have the
fingerprint the run recorded, and the loss is the family's objective (``build_objective``), so
``val loss`` over every validation window is what the run's ``val/loss`` is over its first
``data.val_batches`` batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from blocklab.errors import DataError

GRAM = 32  # tokens of a validation window looked up in the training text


@dataclass
class TextRun:
    """A trained text decoder (eval mode) with its streams and objective."""

    model: torch.nn.Module
    streams: Any  # blocklab.data.streams.Streams
    objective: Any
    consumed: int  # training examples the run consumed (steps x batch x accumulation)


def load_text(run_dir: str | Path) -> TextRun:
    """The newest checkpoint of ``run_dir`` with the streams it trained and validated on."""
    from blocklab import checkpoint as ckpt
    from blocklab.data.streams import build_streams
    from blocklab.objectives import build_objective

    loaded = ckpt.read(run_dir)
    tc = loaded.config
    model, _ = ckpt.model_of(loaded)
    streams = build_streams(tc.data, tc.tokenizer, bptt=tc.trainer.bptt)
    recorded = loaded.meta.get("data_fingerprint")
    if streams.fingerprint != recorded:
        raise DataError(f"data error: {run_dir}: its data changed since it trained (data "
                        f"fingerprint {recorded}, now {streams.fingerprint}); restore the data "
                        "or remove the run to train it again")
    objective = build_objective(tc.model.family.name, tc.data, streams.specials)
    consumed = int(loaded.meta["step"]) * tc.data.batch_size * tc.trainer.accumulate
    return TextRun(model, streams, objective, consumed)


@torch.no_grad()
def mean_loss(run: TextRun, make, indices: range, batch_size: int = 64) -> float:
    """Mean loss per target token of ``run.model`` over the examples ``make(i)``."""
    from blocklab.eval.evaluate import summed_loss

    keys = [(i, None) for i in indices]
    return summed_loss(run.model, run.objective, make,
                       (keys[a:a + batch_size] for a in range(0, len(keys), batch_size))).loss


def _gram_hashes(rows: np.ndarray, gram: int) -> np.ndarray:
    """A 64-bit polynomial hash of every ``gram``-token run inside each row of ``rows``."""
    n = rows.shape[1] - gram + 1
    h = np.zeros((rows.shape[0], n), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(gram):
            h = h * np.uint64(1_000_003) + rows[:, j:j + n].astype(np.uint64)
    return h.ravel()


def seen_in_training(run: TextRun, samples: int, gram: int = GRAM) -> tuple[int, int]:
    """(hits, trials): of ``samples`` validation windows spread over the validation part,
    how many begin with ``gram`` tokens that occur inside some training window. Near 0 for
    a held-out tail (a line that recurs across plays at most); 1 for validation on training
    text, however the split is made (a validation source that is the training files too)."""
    s = run.streams
    if s.train_rows is not None:  # packed windows: all at once (1 s, not 11 s for 70k)
        rows = s.train_rows().astype(np.int64)
    else:
        train = [s.train(i).tokens for i in range(s.train_examples)]
        width = max(len(t) for t in train)
        rows = np.asarray([t for t in train if len(t) == width], dtype=np.int64)
    known = np.unique(_gram_hashes(rows, gram))
    picks = np.linspace(0, s.val_examples - 1, num=min(samples, s.val_examples)).astype(int)
    grams = np.asarray([s.val(int(i)).tokens[:gram] for i in picks
                        if len(s.val(int(i)).tokens) >= gram], dtype=np.int64)
    found = np.isin(_gram_hashes(grams, gram), known)
    return int(found.sum()), len(found)


@torch.no_grad()
def future_leaks(run: TextRun, samples: int) -> tuple[int, int]:
    """(hits, trials): of ``samples`` validation windows, in how many changing the last token
    changes a prediction made before it (a causal model: never). Sees a model that reads the
    future however early in training, before its loss shows it."""
    s = run.streams
    picks = np.linspace(0, s.val_examples - 1, num=min(samples, s.val_examples)).astype(int)
    hits = 0
    for i in picks:
        ids = torch.tensor([s.val(int(i)).tokens[:-1]])  # the inputs: seq_len tokens
        later = ids.clone()
        later[0, -1] = (later[0, -1] + 1) % s.vocab_size
        hits += bool((run.model(ids)[:, :-1] - run.model(later)[:, :-1]).abs().max() > 1e-5)
    return hits, len(picks)

"""Perplexity against evaluation length (docs/probes.md, "Grids and reports"), the probe that
needs no task at all: a position scheme that breaks beyond the training length shows it as
perplexity rising with the window length.

Two window layouts per length: non-overlapping windows (a scored token sees anything from 0 to
L-1 tokens of context), and a sliding window that scores only the last ``stride`` fraction of
each window, so every scored token has at least (1 - stride)·L tokens of context (the
nonoverlapping / sliding-window distinction discussed by Press et al. 2022, "Train Short, Test
Long", arXiv 2108.12409). Both score every stream token exactly once.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def window_plan(n_stream: int, body: int, mode: str, stride: float, n_tokens: int
                ) -> list[tuple[int, int]]:
    """(start, first scored offset) of each window of ``body`` stream tokens, until at least
    ``n_tokens`` are scored: non-overlapping windows score everything; sliding windows advance
    by ``stride·body`` and score only the tokens no earlier window scored."""
    step = body if mode == "nonoverlapping" else max(1, round(stride * body))
    plan: list[tuple[int, int]] = []
    pos = scored = 0
    while scored < n_tokens and pos + body <= n_stream:
        first = 0 if (mode == "nonoverlapping" or pos == 0) else body - step
        plan.append((pos, first))
        scored += body - first
        pos += step
    return plan


def _na(key: dict[str, Any], status: str) -> dict[str, Any]:
    return {**key, "n": 0, "nll": None, "ppl": None, "status": status}


def _windows_nll(backend, stream: list[int], head: list[int], length: int,
                 plan: list[tuple[int, int]], batch_tokens: int) -> tuple[float, int]:
    """Summed NLL and count of the scored tokens of every window in ``plan``, batched so that
    one forward pass holds about ``batch_tokens`` tokens."""
    body = length - len(head)
    total, count = 0.0, 0
    per_batch = max(1, batch_tokens // length)
    for i in range(0, len(plan), per_batch):
        chunk = plan[i:i + per_batch]
        windows = torch.tensor([head + stream[s:s + body] for s, _ in chunk])
        nll = backend.token_nll(windows)  # (B, length-1): predicts tokens 1..length-1
        for r, (_, s) in enumerate(chunk):
            part = nll[r, len(head) - 1 + s:] if head else nll[r, max(s - 1, 0):]
            total, count = total + float(part.sum()), count + part.numel()
    return total, count


@torch.no_grad()
def perplexity_rows(backend, stream: list[int], bos: int | None, lengths: list[int],
                    n_tokens: int, stride: float, batch_tokens: int) -> list[dict[str, Any]]:
    """Perplexity at each evaluation length: non-overlapping windows, and a sliding window that
    scores only its last ``stride`` fraction (every scored token then has at least
    (1 - stride)·L tokens of context). Each window starts with ``bos`` when given (as every
    training sequence does)."""
    rows = []
    head = [bos] if bos is not None else []
    limit = backend.max_length()
    for length in lengths:
        for mode in ("nonoverlapping", "sliding"):
            key = {"probe": "perplexity", "variant": mode, "length": length}
            if limit is not None and length > limit:
                rows.append(_na(key, f"n/a: length {length} > {limit} positions the model "
                                     "can index"))
                continue
            plan = window_plan(len(stream), length - len(head), mode, stride, n_tokens)
            if not plan:
                rows.append(_na(key, f"n/a: stream of {len(stream)} tokens < length {length}"))
                continue
            total, count = _windows_nll(backend, stream, head, length, plan, batch_tokens)
            rows.append({**key, "n": count, "nll": total / count, "ppl": math.exp(total / count),
                         "status": "ok"})
    return rows

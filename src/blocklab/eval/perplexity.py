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

from blocklab.progress import Progress, quiet


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


def document_plan(documents: list[list[int]], body: int, mode: str, stride: float,
                  n_tokens: int) -> tuple[list[tuple[int, int, int]], int]:
    """(document, start, first scored offset) of each window of ``body`` tokens, document by
    document (a window never spans two documents; a document shorter than one window gives
    none), until at least ``n_tokens`` are scored; and how many are."""
    plan: list[tuple[int, int, int]] = []
    scored = 0
    for d, doc in enumerate(documents):
        if scored >= n_tokens:
            break
        for start, first in window_plan(len(doc), body, mode, stride, n_tokens - scored):
            plan.append((d, start, first))
            scored += body - first
    return plan, scored


def _windows_nll(backend, documents: list[list[int]], head: list[int], length: int,
                 plan: list[tuple[int, int, int]], batch_tokens: int, tick) -> tuple[float, int]:
    """Summed NLL and count of the scored tokens of every window in ``plan``, batched so that
    one forward pass holds about ``batch_tokens`` tokens (``tick()`` after each)."""
    body = length - len(head)
    total, count = 0.0, 0
    per_batch = max(1, batch_tokens // length)
    for i in range(0, len(plan), per_batch):
        chunk = plan[i:i + per_batch]
        windows = torch.tensor([head + list(documents[d][s:s + body]) for d, s, _ in chunk])
        nll = backend.token_nll(windows)  # (B, length-1): predicts tokens 1..length-1
        for r, (_, _, s) in enumerate(chunk):
            part = nll[r, len(head) - 1 + s:] if head else nll[r, max(s - 1, 0):]
            total, count = total + float(part.sum()), count + part.numel()
        tick()
    return total, count


@torch.no_grad()
def perplexity_rows(backend, documents: list[list[int]], bos: int | None, lengths: list[int],
                    n_tokens: int, stride: float, batch_tokens: int, *,
                    progress: Progress | None = None, text: str = "the text"
                    ) -> list[dict[str, Any]]:
    """Perplexity at each evaluation length over ``documents`` (never cycled: a length whose
    windows cannot score ``n_tokens`` tokens of it is N/A, with the reason): non-overlapping
    windows, and a sliding window that scores only its last ``stride`` fraction (every scored
    token then has at least (1 - stride)·L tokens of context). Each window starts with ``bos``
    when given (as every training sequence does); ``text`` names the text in the reasons."""
    head = [bos] if bos is not None else []
    limit = backend.max_length()
    jobs: list[tuple[dict[str, Any], int, list | None, str | None]] = []
    for length in lengths:
        for mode in ("nonoverlapping", "sliding"):
            key = {"probe": "perplexity", "variant": mode, "length": length}
            if limit is not None and length > limit:
                jobs.append((key, length, None, f"n/a: length {length} > {limit} positions "
                                                "the model can index"))
                continue
            plan, scored = document_plan(documents, length - len(head), mode, stride, n_tokens)
            if scored < n_tokens:
                longest = max((len(d) for d in documents), default=0)
                jobs.append((key, length, None, (
                    f"n/a: {text} holds {sum(len(d) for d in documents):,} tokens (longest "
                    f"document {longest:,}): {scored:,} of probes.perplexity.tokens="
                    f"{n_tokens:,} scorable in windows of {length} (never cycled)")))
                continue
            jobs.append((key, length, plan, None))
    progress = progress or quiet()
    windows = sum(-(-len(plan) // max(1, batch_tokens // length))
                  for _, length, plan, _ in jobs if plan)
    rows = []
    with progress.count(f"perplexity at {len(lengths)} lengths: batches", windows) as tick:
        for key, length, plan, na in jobs:
            if plan is None:
                rows.append(_na(key, na))
                continue
            total, count = _windows_nll(backend, documents, head, length, plan, batch_tokens,
                                        tick)
            rows.append({**key, "n": count, "nll": total / count,
                         "ppl": math.exp(total / count), "status": "ok"})
    return rows


def repeated_share(tokens: list[int], n: int = 32) -> float:
    """The share of ``tokens``' n-grams that occurred earlier in them: about 0 for natural
    text, 1/2 for a text repeated twice. Perplexity on text that repeats measures copying
    (a model that has seen a span once predicts it again), not context use."""
    if len(tokens) <= n:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    again = 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i:i + n])
        if gram in seen:
            again += 1
        else:
            seen.add(gram)
    return again / (len(tokens) - n + 1)

"""Streaming evaluation of a causal decoder over a stream longer than it trained on: the loss
of every next token, either recomputed from a fresh forward over the last ``window`` tokens
(the sliding window *with recomputation*: the quality ceiling of a bounded context, ``window``
tokens of forward per token) or decoded token by token through the model's own decode cache
(whatever the model's softmax options make of it: the whole history, a window's ring, sinks
beside the ring), timing each step.

This is how StreamingLLM (Xiao et al., arXiv 2309.17453; mit-han-lab/streaming-llm,
``examples/eval_long_ppl.py``) measures its Figure 3: one token at a time through a KV cache
(``start_size`` sinks + ``recent_size`` recent tokens), the negative log-likelihood of the next
token per position. Which keys a cached decode keeps is the model's (``model.mixer.window``,
``model.mixer.sinks``), so the same trained weights give each arm by their config alone.

Shape legend: B streams, N tokens per stream, W window, V vocabulary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class Decoded:
    """Per-token losses of a cached decode and what it cost."""

    losses: Tensor  # (B, N - 1): the loss of predicting token t + 1 after tokens <= t
    seconds: Tensor  # (N - 1,) wall time of each decode step (the whole batch)
    state_bytes: int  # the bytes of the decode cache made for the stream


@torch.no_grad()
def recompute_losses(model: torch.nn.Module, ids: Tensor, window: int,
                     batch_size: int = 256) -> Tensor:
    """(B, N) ids -> (B, N - 1) losses: token ``t`` predicted from a fresh forward over tokens
    ``[max(0, t - window), t)`` alone (each query of a window sees ``window`` tokens, itself
    included, as a window of ``window`` does). The first ``window`` predictions come from one
    forward over the first ``window`` tokens (a causal prefix is its own fresh forward)."""
    if window < 1:
        raise ValueError(f"window={window}: at least 1 token of context")
    b, n = ids.shape
    out = torch.empty(b, n - 1)
    head = min(window, n)
    logits = model(ids[:, :head])[:, :-1].float()
    out[:, :head - 1] = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:head], reduction="none")
    if n > window:
        wins = ids.unfold(1, window, 1)[:, : n - window].reshape(-1, window)  # ids[j:j + W]
        targets = ids[:, window:].reshape(-1)  # ids[j + W]
        last = torch.zeros(1, window, dtype=torch.bool)
        last[0, -1] = True
        losses = []
        for a in range(0, len(wins), batch_size):
            rows = wins[a:a + batch_size]
            lg = model(rows, select=last.expand(len(rows), -1)).float()  # (rows, V)
            losses.append(F.cross_entropy(lg, targets[a:a + batch_size], reduction="none"))
        out[:, window - 1:] = torch.cat(losses).view(b, n - window)
    return out


@torch.no_grad()
def decode_losses(model: torch.nn.Module, ids: Tensor) -> Decoded:
    """(B, N) ids decoded one token per step through ``model.new_cache`` (what the cache keeps
    is the model's softmax options): the loss of each next token, each step's wall time and
    the cache's bytes."""
    b, n = ids.shape
    cache = model.new_cache(b, n)
    losses = torch.empty(b, n - 1)
    seconds = torch.empty(n - 1)
    for t in range(n - 1):
        start = time.perf_counter()
        logits = model(ids[:, t:t + 1], cache=cache)[:, -1]
        seconds[t] = time.perf_counter() - start
        losses[:, t] = F.cross_entropy(logits.float(), ids[:, t + 1], reduction="none")
    return Decoded(losses, seconds, int(cache.nbytes))


def state_bytes(model: torch.nn.Module, tokens: int) -> int:
    """Bytes of the decode state ``model`` makes for one stream of ``tokens`` tokens (a growing
    cache: what it holds once full; a ring or sinks + ring: the same for any length)."""
    return int(model.new_cache(1, tokens).nbytes)


def binned(values: Tensor, width: int) -> list[float]:
    """The mean of ``values`` ((B, M) per position, or (M,)) over consecutive bins of
    ``width`` positions (the last bin may be shorter)."""
    v = values if values.dim() == 2 else values[None]
    return [float(v[:, a:a + width].mean()) for a in range(0, v.shape[1], width)]

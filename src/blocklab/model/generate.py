"""Autoregressive generation with the KV cache: greedy, temperature, top-k and top-p sampling,
batched prompts of different lengths (left-padded, positions counted from each row's first real
token). The same loop runs without a cache (full recompute each step) as a reference."""

from __future__ import annotations

import torch
from torch import Tensor

from blocklab.model.position import positions_from_valid


def sample_next(logits: Tensor, *, temperature: float = 0.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """(B, V) logits -> (B,) token ids. ``temperature == 0`` is greedy (argmax)."""
    if temperature <= 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.where(logits >= kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        # Nucleus sampling ("The Curious Case of Neural Text Degeneration", arXiv 1904.09751):
        # keep the smallest set of tokens whose probability mass reaches top_p.
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        mass_before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)
        sorted_logits = sorted_logits.where(mass_before < top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def generate(model: torch.nn.Module, prompt_ids: Tensor, *, max_new_tokens: int,
             prompt_valid: Tensor | None = None, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None,
             generator: torch.Generator | None = None, eos_id: int | None = None,
             use_cache: bool = True, **source: Tensor | None) -> Tensor:
    """Continue ``prompt_ids`` (B, T), left-padded where ``prompt_valid`` is False, by up to
    ``max_new_tokens``; return only the new tokens (B, N). Rows that emitted ``eos_id`` keep
    emitting it. Encoder–decoder models take ``source_ids=``/``source_valid=`` too (encoded
    once) and ``prompt_ids`` is the decoder start. With the cache each step feeds one token
    into preallocated K/V buffers; ``use_cache=False`` recomputes the whole prefix (reference)."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            return _generate(model, prompt_ids, max_new_tokens, prompt_valid, use_cache, eos_id,
                             source, {"temperature": temperature, "top_k": top_k,
                                      "top_p": top_p, "generator": generator})
    finally:
        model.train(was_training)


def _generate(model: torch.nn.Module, prompt_ids: Tensor, max_new_tokens: int,
              prompt_valid: Tensor | None, use_cache: bool, eos_id: int | None,
              source: dict[str, Tensor | None], sampling: dict) -> Tensor:
    b, t = prompt_ids.shape
    pad_free = prompt_valid is None or bool(prompt_valid.all())
    valid = None if pad_free else prompt_valid
    if pad_free:
        positions = torch.arange(t, device=prompt_ids.device).expand(b, t)
        next_position = torch.full((b, 1), t, device=prompt_ids.device)
    else:
        positions = positions_from_valid(prompt_valid)
        next_position = prompt_valid.long().sum(-1, keepdim=True)  # (B, 1)
    prepared = model.prepare(**source)
    cache = model.new_cache(b, t + max_new_tokens) if use_cache else None
    ids, pos = prompt_ids, positions  # what the next forward sees
    done = torch.zeros(b, dtype=torch.bool, device=prompt_ids.device)
    out = []
    for i in range(max_new_tokens):
        logits = model.decode(ids, positions=pos, valid=valid, cache=cache, **prepared)
        token = sample_next(logits[:, -1], **sampling)
        if eos_id is not None:
            token = token.where(~done, eos_id)
            done |= token == eos_id
        out.append(token)
        if (eos_id is not None and bool(done.all())) or i == max_new_tokens - 1:
            break
        step_pos = next_position + i  # (B, 1)
        if use_cache:  # the cache holds the past: feed only the new token
            ids, pos = token[:, None], step_pos
            if valid is not None:
                valid = torch.ones_like(ids, dtype=torch.bool)
        else:
            ids, pos = torch.cat((ids, token[:, None]), 1), torch.cat((pos, step_pos), 1)
            if valid is not None:
                valid = torch.cat((valid, torch.ones_like(token[:, None], dtype=torch.bool)), 1)
    return torch.stack(out, 1)

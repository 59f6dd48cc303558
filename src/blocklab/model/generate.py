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


@torch.no_grad()
def generate(model: torch.nn.Module, prompt_ids: Tensor, *, max_new_tokens: int,
             prompt_valid: Tensor | None = None, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None,
             generator: torch.Generator | None = None, eos_id: int | None = None,
             use_cache: bool = True, **source: Tensor | None) -> Tensor:
    """Continue ``prompt_ids`` (B, T), left-padded where ``prompt_valid`` is False, by up to
    ``max_new_tokens``; return only the new tokens (B, N). Rows that emitted ``eos_id`` keep
    emitting it. Encoder–decoder models take ``source_ids=``/``source_valid=`` too (encoded
    once) and ``prompt_ids`` is the decoder start."""
    was_training = model.training
    model.eval()
    try:
        b, t = prompt_ids.shape
        valid = prompt_valid if prompt_valid is not None else torch.ones_like(prompt_ids, dtype=torch.bool)
        positions = positions_from_valid(valid)
        next_position = valid.long().sum(-1, keepdim=True)  # (B, 1)
        pad_free = prompt_valid is None or bool(valid.all())
        prepared = model.prepare(**source)
        cache = model.new_cache(b, t + max_new_tokens) if use_cache else None
        seq, seq_valid, seq_pos = prompt_ids, valid, positions
        step_ids, step_valid, step_pos = prompt_ids, valid, positions
        done = torch.zeros(b, dtype=torch.bool, device=prompt_ids.device)
        out = []
        for i in range(max_new_tokens):
            if use_cache:
                logits = model.decode(step_ids, positions=step_pos,
                                      valid=None if pad_free else step_valid, cache=cache,
                                      **prepared)
            else:
                logits = model.decode(seq, positions=seq_pos,
                                      valid=None if pad_free else seq_valid, cache=None,
                                      **prepared)
            token = sample_next(logits[:, -1], temperature=temperature, top_k=top_k,
                                top_p=top_p, generator=generator)
            if eos_id is not None:
                token = token.where(~done, eos_id)
                done |= token == eos_id
            out.append(token)
            if (eos_id is not None and bool(done.all())) or i == max_new_tokens - 1:
                break
            step_ids, step_pos = token[:, None], next_position + i  # (B, 1)
            step_valid = torch.ones_like(step_ids, dtype=torch.bool)
            seq = torch.cat((seq, step_ids), 1)
            seq_valid = torch.cat((seq_valid, step_valid), 1)
            seq_pos = torch.cat((seq_pos, step_pos), 1)
        return torch.stack(out, 1)
    finally:
        model.train(was_training)

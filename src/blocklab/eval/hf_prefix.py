"""Shared-prefix scoring for a Hugging Face causal LM (:class:`blocklab.eval.hf.HFCausalLM`):
every answer of a prompt (a gold answer and the alternatives, e.g. all the labels of a forced
choice) scored from one KV-cached run of the prompt, and the greedy continuation from the same
cache — one prompt pass per item instead of one per candidate and one more for the generation.
The same contract as ``BlocklabBackend.score_from_prefix`` (eval/backends.py).

Prompts are run one at a time (no padding: nothing to mask, every row exact); after each
answer the cache is cropped back to the prompt, so the next answer and the greedy run start from
the prompt alone."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def _step(model: Any, ids: list[int], cache: Any, device: torch.device, *, last: bool = False
          ) -> tuple[Tensor, Any]:
    """Log-softmax (len(ids), V) of the next token after each of ``ids`` (``last``: after the
    last only, (1, V) — a long prompt's every position would be gigabytes), extending
    ``cache``."""
    x = torch.tensor([ids], dtype=torch.long, device=device)
    params = _params(model)
    keep = {"logits_to_keep": 1} if last and "logits_to_keep" in params else {}
    # newer transformers name the cache argument ``cache`` (``past_key_values`` deprecated)
    name = "cache" if "cache" in params else "past_key_values"
    out = model(input_ids=x, use_cache=True, **{name: cache}, **keep)
    logits = out.logits[0, -1:] if last else out.logits[0]
    new = out.get("cache") if isinstance(out, dict) and out.get("cache") is not None else None
    return F.log_softmax(logits.float(), dim=-1).cpu(), (
        new if new is not None else out.past_key_values)


def _params(model: Any) -> set[str]:
    """The keyword arguments ``model.forward`` names."""
    import inspect

    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def score_from_prefix(lm: Any, prompts: list[list[int]], answer_sets: list[list[list[int]]],
                      max_new_tokens: int) -> list[tuple[list[Tensor], list[int]]]:
    """Per prompt: each of its answers' (len, V) log-probs (``lp[j] = log p(. | prompt +
    answer[:j])``) and a greedy continuation of up to ``max_new_tokens`` (cut after a stop
    token, as ``HFCausalLM.greedy``), from one run of the prompt."""
    model, device = lm.model.eval(), lm.device
    results: list[tuple[list[Tensor], list[int]]] = []
    with torch.inference_mode():
        for prompt, answers in zip(prompts, answer_sets):
            if not prompt:
                raise ValueError("an empty prompt: nothing to condition the answers on")
            first, cache = _step(model, list(prompt), None, device, last=True)
            last = first[-1]
            lps = []
            for ans in answers:
                if len(ans) > 1:
                    rest, cache = _step(model, list(ans[:-1]), cache, device)
                    cache.crop(-(len(ans) - 1))  # back to the prompt (negative: drop)
                    lps.append(torch.cat([last[None], rest]))
                else:
                    lps.append(last[None].clone())
            generated: list[int] = []
            dist = last
            for _ in range(max_new_tokens):
                tok = int(dist.argmax())
                generated.append(tok)
                if tok in lm.eos_ids or len(generated) == max_new_tokens:
                    break
                nxt, cache = _step(model, [tok], cache, device, last=True)
                dist = nxt[-1]
            results.append((lps, generated))
    return results

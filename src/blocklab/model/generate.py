"""Autoregressive generation with the KV cache: greedy, temperature, top-k and top-p sampling,
batched prompts of different lengths. The same loop runs without a cache (full recompute each
step) as a reference.

Everything a caller can get wrong is checked before the first step, in one line: unknown
keyword arguments (a ``TypeError``, never swallowed), a family that cannot generate, sampling
knobs out of range, a prompt row without any real token, and prompt + new tokens beyond what
the position scheme can index. Logits that are not finite (NaN weights) stop the loop with a
``FloatingPointError`` naming the step, before anything is sampled from them. Padding may
sit on either side (or in between): rows are left-aligned first, which changes nothing for
the model because positions count real tokens only and padding keys are never visible.

Fixed-shape decoding (``static_cache=True``, implied by ``compile``): the prompt is prefilled
eagerly into a fixed-shape :class:`~blocklab.model.cache.DecodeCache` (``static=True``), then every step feeds one
token per row into the same shapes (position as a tensor, write slot as a tensor), so the step
compiles once (``torch.compile(fullgraph=True, dynamic=False)``; ``mode="reduce-overhead"``
captures it in a CUDA graph on GPU) and is replayed for every later token and every later call
with the same batch size and capacity bucket. The cache is kept per model and reused.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from blocklab.model.cache import DecodeCache
from blocklab.model.position import positions_from_valid


def sample_next(logits: Tensor, *, temperature: float = 0.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """(B, V) logits -> (B,) token ids. ``temperature == 0`` is greedy (argmax); ``top_k`` of
    0 or None and ``top_p`` of 1 or None are off. Any temperature samples: the logits are
    shifted to a maximum of 0 before they are divided (a tiny temperature sends the others to
    -inf, never the maximum to inf), and one below float32's smallest normal number, which
    float32 cannot divide by, is greedy (what sampling tends to as the temperature goes to 0)."""
    if temperature < torch.finfo(torch.float32).tiny:
        return logits.argmax(-1)
    logits = logits.float()
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.where(logits >= kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        # Nucleus sampling ("The Curious Case of Neural Text Degeneration", arXiv 1904.09751):
        # keep the smallest set of tokens whose probability mass reaches top_p.
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        mass_before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)
        keep = mass_before < top_p
        keep[:, 0] = True  # the top token, whatever top_p rounds to in float32
        sorted_logits = sorted_logits.where(keep, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def generate(model: torch.nn.Module, input_ids: Tensor, *, max_new_tokens: int,
             valid: Tensor | None = None, source_ids: Tensor | None = None,
             source_valid: Tensor | None = None, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None,
             generator: torch.Generator | None = None, eos_id: int | None = None,
             use_cache: bool = True, static_cache: bool = False,
             compile: bool | str = False,
             on_token: Callable[[Tensor], None] | None = None) -> Tensor:
    """Continue ``input_ids`` (B, T) by up to ``max_new_tokens``; return only the new tokens
    (B, N) — (B, 0) for ``max_new_tokens=0``, so ``torch.cat((input_ids, out), 1)`` is the
    prompt. ``valid`` (B, T) marks real prompt tokens (padding on either side). Rows that
    emitted ``eos_id`` keep emitting it. An encoder–decoder model generates from
    ``source_ids``/``source_valid`` (encoded once) and ``input_ids`` is the decoder start. With
    the cache each step feeds one token into K/V buffers (grown as they fill, model/kv.py);
    ``use_cache=False`` recomputes the whole prefix (the reference). ``static_cache=True``
    decodes with fixed shapes (see the module docstring); ``compile=True`` (or a
    ``torch.compile`` mode name) compiles that step: ``"reduce-overhead"`` on CUDA, the
    default mode elsewhere. ``on_token`` is called with each step's (B,) tokens as soon as
    they are sampled, before the next forward (streaming: ``blocklab-generate`` prints each
    piece as it comes)."""
    input_ids, valid = _check(model, input_ids, valid, max_new_tokens, source_ids,
                              temperature, top_k, top_p)
    if (static_cache or compile) and not use_cache:
        raise ValueError("generate: static_cache / compile decode with a cache; drop "
                         "use_cache=False")
    if max_new_tokens == 0:
        return input_ids.new_zeros((input_ids.shape[0], 0))
    was_training = model.training
    model.eval()
    try:
        # no_grad rather than inference_mode for fixed-shape decoding: its buffers outlive
        # the call (reused), and compiled graphs take ordinary tensors
        with torch.no_grad() if static_cache or compile else torch.inference_mode():
            prepared = model.prepare(source_ids=source_ids, source_valid=source_valid)
            b, t = input_ids.shape
            step = model.decode
            if not use_cache:
                cache = None
            elif static_cache or compile:
                cache = static_cache_for(model, b, t + max_new_tokens)
                if compile:
                    step = _compiled_step(model, compile, input_ids.device)
            else:
                cache = model.new_cache(b, t + max_new_tokens)
            return _generate(model, input_ids, valid, max_new_tokens, cache, eos_id, prepared,
                             {"temperature": temperature, "top_k": top_k, "top_p": top_p,
                              "generator": generator}, step, on_token)
    finally:
        model.train(was_training)


#: Rounding of a static cache's capacity: calls whose prompt + new tokens fall in one bucket
#: share one cache and one compiled graph.
CAPACITY_BUCKET = 64
_STATIC_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_COMPILED: dict[str, Callable] = {}


def static_cache_for(model: torch.nn.Module, batch: int, tokens: int) -> DecodeCache:
    """The model's reusable fixed-shape cache for ``batch`` rows and at least ``tokens`` slots
    (rounded up to :data:`CAPACITY_BUCKET`), emptied; made on first use. Kept per model (a
    weak reference: the cache goes with the model)."""
    capacity = -(-tokens // CAPACITY_BUCKET) * CAPACITY_BUCKET
    ref = model.embed.weight
    key = (batch, capacity, ref.dtype, ref.device)
    caches = _STATIC_CACHES.setdefault(model, {})
    cache = caches.get(key)
    if cache is None:
        cache = caches[key] = model.new_cache(batch, capacity, static=True)
    else:
        cache.reset()
    return cache


def _decode_step(model: torch.nn.Module, input_ids: Tensor, **kw: Tensor | None) -> Tensor:
    return model.decode(input_ids, **kw)


def _compiled_step(model: torch.nn.Module, compile: bool | str,
                   device: torch.device) -> Callable:
    """The decode step compiled once per mode (dynamo keys its graphs on the model's structure
    and the fixed shapes), bound to ``model``."""
    mode = compile if isinstance(compile, str) else (
        "reduce-overhead" if device.type == "cuda" else "default")
    if mode not in _COMPILED:
        _COMPILED[mode] = torch.compile(_decode_step, mode=mode, fullgraph=True, dynamic=False)
    fn = _COMPILED[mode]
    return lambda ids, **kw: fn(model, ids, **kw)


def left_align(ids: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Move each row's real tokens to the right end, in order (right padding or holes become
    left padding)."""
    order = valid.long().argsort(dim=1, stable=True)  # padding first, real tokens in order
    return ids.gather(1, order), valid.gather(1, order)


def _check(model: torch.nn.Module, ids: Tensor, valid: Tensor | None, max_new_tokens: int,
           source_ids: Tensor | None, temperature: float, top_k: int | None,
           top_p: float | None) -> tuple[Tensor, Tensor | None]:
    if not getattr(model, "can_generate", False):
        model.new_cache(1, 1)  # raises the family's own explanation
        raise TypeError(f"generate: a {type(model).__name__} cannot generate")
    if ids.dim() != 2 or ids.dtype != torch.long:
        raise ValueError(f"generate: input_ids must be a (batch, tokens) long tensor, got "
                         f"{tuple(ids.shape)} {ids.dtype}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens={max_new_tokens!r}: must be an int >= 0")
    if not 0 <= temperature < float("inf"):
        raise ValueError(f"generate: temperature={temperature}: must be a finite number >= 0 "
                         "(0 = greedy)")
    if top_k is not None and top_k < 0:
        raise ValueError(f"generate: top_k={top_k}: must be >= 0 (0 or None = off)")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"generate: top_p={top_p}: must be in (0, 1] (1 or None = off)")
    if valid is not None:
        if valid.shape != ids.shape:
            raise ValueError(f"generate: valid has shape {tuple(valid.shape)}, input_ids "
                             f"{tuple(ids.shape)}")
        valid = valid.bool()
        empty = (~valid.any(1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"generate: prompt rows {empty} have no valid token")
        if bool(valid.all()):
            valid = None
        else:
            ids, valid = left_align(ids, valid)
    longest = ids.shape[1] if valid is None else int(valid.sum(1).max())
    limit = model.max_positions
    needed = longest + max_new_tokens - 1  # the last new token is returned, never fed back
    if limit is not None and needed > limit:
        raise ValueError(f"generate: a prompt of {longest} tokens + max_new_tokens="
                         f"{max_new_tokens} needs {needed} positions; the position table has "
                         f"model.max_seq_len={limit}")
    source_limit = getattr(model, "max_source_positions", None)
    if source_ids is not None and source_limit is not None and source_ids.shape[1] > source_limit:
        raise ValueError(f"generate: source_ids of {source_ids.shape[1]} tokens exceed "
                         f"model.max_seq_len={source_limit} positions")
    return ids, valid


def _generate(model: torch.nn.Module, prompt_ids: Tensor, valid: Tensor | None,
              max_new_tokens: int, cache: object, eos_id: int | None,
              prepared: dict[str, Tensor | None], sampling: dict, step: Callable,
              on_token: Callable[[Tensor], None] | None = None) -> Tensor:
    """The loop: a prefill of the prompt (``model.decode``), then one ``step`` per token."""
    b, t = prompt_ids.shape
    if valid is None:
        positions = torch.arange(t, device=prompt_ids.device).expand(b, t)
        next_position = torch.full((b, 1), t, device=prompt_ids.device)
    else:
        positions = positions_from_valid(valid)
        next_position = valid.long().sum(-1, keepdim=True)  # (B, 1)
    use_cache = cache is not None
    ids, pos = prompt_ids, positions  # what the next forward sees
    done = torch.zeros(b, dtype=torch.bool, device=prompt_ids.device)
    out = []
    for i in range(max_new_tokens):
        forward = step if i and use_cache else model.decode
        logits = forward(ids, positions=pos, valid=valid, cache=cache, **prepared)[:, -1]
        if not bool(torch.isfinite(logits).all()):  # NaN weights: never sampled from
            raise FloatingPointError(f"generate: the model's logits are not finite at new "
                                     f"token {i + 1}")
        token = sample_next(logits, **sampling)
        if eos_id is not None:
            token = token.where(~done, eos_id)
            done |= token == eos_id
        out.append(token)
        if on_token is not None:
            on_token(token)
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

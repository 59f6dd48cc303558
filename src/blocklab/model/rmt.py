"""Recurrent memory tokens: the Recurrent Memory Transformer (Bulatov et al. 2022,
arXiv:2207.06881), as BABILong runs it (Kuratov et al. 2024, arXiv:2406.10149).

``model.memory_tokens = n``: a learned (n, d) parameter is the first memory of every
document. Each segment's input embeddings become ``[memory (read); segment; memory (write)]``,
run through the decoder stack as one causal sequence of ``T + 2n`` tokens with positions
restarting per segment (0..T+2n-1, real tokens counted); the logits are the segment's, and the
next memory is the final hidden states (after the final norm) at the ``n`` write positions —
booydar/recurrent-memory-transformer ``MemoryCell`` (``inputs_embeds = cat([mem, emb, mem])``,
``logits[:, n:-n]``, memory = ``hidden_states[-1][:, -n:]``).

The memory is carried by a carry cache (model/carry.py: ``model.new_cache(b, None,
carry=True)``), in its ``memory`` slot: a row whose document changes (``cache.enter``) gets
the initial memory again, ``cache.detach()`` cuts its graph (``trainer.bptt``), and
``cache.state_dict()`` saves it. In RMT mode no mixer state is carried: memory tokens are the
only path between segments (the cache holds no layer state). A forward without a carry cache
(generation without a cache, probes, a single segment) reads the segment with the initial
memory, so training and evaluation run the same computation; so does a decode cache
(generation, probes), which holds the read memory ahead of the first tokens.

Padding: each row is compacted — its real tokens follow the read memory, the write memory
follows them, padding goes last (invisible) — so the write tokens see every real token and a
padded row computes exactly what the row alone does; the outputs are put back in place.

Shape legend: B batch, T segment tokens, n memory tokens, d model width, L = T + 2n.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from blocklab.model.cache import DecodeCache
from blocklab.model.position import positions_from_valid

if TYPE_CHECKING:
    from blocklab.model.transformer import DecoderModel


class MemoryTokens(nn.Module):
    """The initial memory, an (n, d) parameter (GPT-2 init, as every weight matrix)."""

    def __init__(self, n: int, d: int) -> None:
        super().__init__()
        self.n = n
        self.weight = nn.Parameter(torch.empty(n, d))

    def initial(self, batch: int) -> Tensor:
        """(B, n, d): the first memory of every row."""
        return self.weight.unsqueeze(0).expand(batch, -1, -1)

    def new_cache(self, stack: nn.Module, batch: int, *, device: torch.device | str,
                  mem: str = "train") -> DecodeCache:
        """A carry cache for RMT: the shared bookkeeping and the memory, no layer state."""
        cache = DecodeCache([None] * len(stack.blocks), batch=batch, capacity=None,
                            device=device, signature=stack.signature, carry=True, mem=mem)
        cache.memory_init = self.weight
        return cache

    @staticmethod
    def param_count(n: int, d: int) -> int:
        return n * d


def _layout(valid: Tensor | None, b: int, t: int, n: int,
            device: torch.device) -> tuple[Tensor | None, Tensor]:
    """Where each token of ``[read (n); segment (T); write (n)]`` goes in the compacted row
    ((B, L) destination indices; None: no padding, the identity) and each row's real count."""
    if valid is None:
        return None, torch.full((b,), t, dtype=torch.long, device=device)
    real = valid.bool()
    r = real.sum(-1)  # (B,)
    order = real.long().cumsum(-1) - 1
    pad_rank = (~real).long().cumsum(-1) - 1
    seg = torch.where(real, n + order, 2 * n + r[:, None] + pad_rank)
    ar = torch.arange(n, device=device).expand(b, n)
    return torch.cat((ar, seg, n + r[:, None] + ar), 1), r


def _gather(x: Tensor, idx: Tensor) -> Tensor:
    return x.gather(1, idx[..., None].expand(-1, -1, x.shape[-1]))


def _one_document(segments: Tensor | None, valid: Tensor | None) -> None:
    if segments is None:
        return
    real = torch.ones_like(segments, dtype=torch.bool) if valid is None else valid.bool()
    first = segments.gather(1, real.long().argmax(-1, keepdim=True))
    if bool(((segments != first) & real).any()):
        raise ValueError("model.memory_tokens: a row holds one document (memory tokens travel "
                         "with it, data.segment_mode=split); packed rows are not supported")


def rmt_forward(model: DecoderModel, input_ids: Tensor, *, valid: Tensor | None,
                positions: Tensor | None, segments: Tensor | None,
                cache: DecodeCache | None, token_types: Tensor | None) -> Tensor:
    """(B, T) ids -> (B, T, d) hidden states of the segment, read between memory tokens
    (module docstring); with a carry ``cache``, its memory is read and replaced."""
    _one_document(segments, valid)
    if cache is not None and not cache.carry:
        return _decode(model, input_ids, valid=valid, positions=positions, cache=cache,
                       token_types=token_types)
    mt: MemoryTokens = model.memory
    b, t = input_ids.shape
    n, dev = mt.n, input_ids.device
    if positions is None:
        positions = (positions_from_valid(valid) if valid is not None
                     else torch.arange(t, device=dev).expand(b, t))
    real = None if valid is None else valid.bool()
    end = (positions if real is None else torch.where(real, positions, -1)).amax(-1) + 1
    ar = torch.arange(n, device=dev).expand(b, n)
    pos = torch.cat((ar, positions + n, n + end[:, None] + ar), 1)
    if cache is not None:
        cache.memory_init = mt.weight
        cache.begin(positions, valid, segments)  # the bookkeeping only: no layer state
        cache.advance(t)
    old = mt.initial(b) if cache is None or cache.memory is None else cache.memory
    x = torch.cat((old, model.embed_tokens(input_ids, token_types), old), 1)
    marked = model.marks(input_ids)
    if marked is not None:
        marked = torch.cat((marked.new_zeros(b, n), marked, marked.new_zeros(b, n)), 1)
    dest, r = _layout(valid, b, t, n, dev)
    new_valid = None
    if dest is not None:
        src = dest.argsort(-1)  # the token at each place of the compacted row
        x, pos = _gather(x, src), pos.gather(1, src)
        marked = None if marked is None else marked.gather(1, src)
        new_valid = torch.arange(t + 2 * n, device=dev)[None, :] < (2 * n + r)[:, None]
    h = model.decoder(x, positions=pos, valid=new_valid, marked=marked)
    if dest is not None:
        h = _gather(h, dest)  # back to [read; segment; write]
    if cache is not None:
        new = h[:, n + t:]
        cache.memory = new if real is None else torch.where((r > 0)[:, None, None], new, old)
    return h[:, n:n + t]


def _decode(model: DecoderModel, input_ids: Tensor, *, valid: Tensor | None,
            positions: Tensor | None, cache: DecodeCache, token_types: Tensor | None) -> Tensor:
    """A decode cache (generation, probes): the write tokens never change a segment's logits
    (causality), so the cache holds the read memory, prefilled before the first tokens; a
    caller's positions count from the segment's first token (shifted by n here)."""
    n, (b, t) = model.memory.n, input_ids.shape
    first = not torch.compiler.is_compiling() and cache.length == 0
    if positions is not None:
        positions = positions + n
    else:  # counting real tokens, after what the cache holds (its memory included)
        positions = (positions_from_valid(valid) if valid is not None
                     else torch.arange(t, device=input_ids.device).expand(b, t))
        positions = positions + (n if first else cache.next_positions()[:, None])
    x = model.embed_tokens(input_ids, token_types)
    marked = model.marks(input_ids)
    if first:
        ar = torch.arange(n, device=x.device).expand(b, n)
        x, positions = torch.cat((model.memory.initial(b).to(x.dtype), x), 1), \
            torch.cat((ar, positions), 1)
        if valid is not None:
            valid = torch.cat((valid.new_ones(b, n), valid), 1)
        if marked is not None:
            marked = torch.cat((marked.new_zeros(b, n), marked), 1)
    h = model.decoder(x, positions=positions, valid=valid, cache=cache, marked=marked)
    return h[:, n:] if first else h

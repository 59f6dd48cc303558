"""What the probe scorer needs from a model, for blocklab models of every family (a Hugging Face
causal LM gets the same interface in :mod:`blocklab.eval.hf`):

- ``answer_logprobs(prompts, answers)`` → ``(logp (B, A, V), mask (B, A))``: teacher-forced
  log-distributions at every answer token (decoder: after the query; encoder–decoder: haystack
  and query in the source, the answer as the target; encoder: the answer slots masked);
- ``greedy(prompts, max_new_tokens)``: greedy continuation through the KV cache;
- ``token_nll(windows)``: per-token negative log-likelihood (causal models only);
- ``max_length()``: the longest input the position scheme can index (``None`` = any).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from blocklab.data.synthetic import BOS, MASK, PAD, Example
from blocklab.train.objectives import OBJECTIVES


def left_pad(rows: list[list[int]], pad: int = PAD) -> tuple[Tensor, Tensor]:
    """(ids, valid) with every row right-aligned (prompts for generation)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        valid[i, width - len(r):] = True
    return ids, valid


def right_pad(rows: list[list[int]], pad: int = PAD) -> tuple[Tensor, Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        valid[i, : len(r)] = True
    return ids, valid


def scatter_rows(flat: Tensor, counts: list[int]) -> tuple[Tensor, Tensor]:
    """(N, V) rows in row-major order, ``counts[i]`` of them for item i -> (B, A, V), mask."""
    b, a = len(counts), max(counts)
    mask = torch.arange(a)[None, :] < torch.tensor(counts)[:, None]
    out = flat.new_zeros((b, a, flat.shape[-1]))
    out[mask] = flat
    return out, mask


class BlocklabBackend:
    """A blocklab model of any family, scored through its own objective's batch format (the
    same shift and masking as in training)."""

    def __init__(self, model: torch.nn.Module, *, name: str = "blocklab") -> None:
        self.model = model
        self.family = model.config.family.name.value
        self.objective = OBJECTIVES[self.family]()
        self.name = name

    def max_length(self) -> int | None:
        m = self.model.config
        return m.max_seq_len if m.position.name.value == "learned" else None

    def answer_logprobs(self, prompts: list[list[int]], answers: list[list[int]]
                        ) -> tuple[Tensor, Tensor]:
        examples = [Example(p + a, [False] * len(p) + [True] * len(a))
                    for p, a in zip(prompts, answers)]
        batch = self.objective.collate(examples)
        flat = self.objective.target_logits(self.model, batch).float().log_softmax(-1)
        return scatter_rows(flat, [len(a) for a in answers])

    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        from blocklab.model.generate import generate

        if self.family == "encoder":  # parallel mask prediction at max_new_tokens slots
            logp, _ = self.answer_logprobs(prompts, [[MASK] * max_new_tokens for _ in prompts])
            return logp.argmax(-1).tolist()
        if self.family == "encoder_decoder":
            src, valid = right_pad(prompts)
            start = torch.full((len(prompts), 1), BOS, dtype=torch.long)
            out = generate(self.model, start, max_new_tokens=max_new_tokens, source_ids=src,
                           source_valid=valid)
        else:
            ids, valid = left_pad(prompts)
            out = generate(self.model, ids, prompt_valid=valid, max_new_tokens=max_new_tokens)
        return out.tolist()

    def token_nll(self, windows: Tensor) -> Tensor:
        if self.family != "decoder":
            raise ValueError(f"perplexity needs a causal LM, not a {self.family} model")
        logits = self.model(windows[:, :-1]).float()
        return F.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none")

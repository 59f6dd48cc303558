"""What the probe scorer needs from a model, for blocklab models of every family (a Hugging Face
causal LM gets the same interface in :mod:`blocklab.eval.hf`):

- ``answer_logprobs(prompts, answers)`` → ``(logp (B, A, V), mask (B, A))``: teacher-forced
  log-distributions at every answer token (decoder: after the query; encoder–decoder: haystack
  and query in the source, the answer as the target; encoder: the answer slots masked);
- ``greedy(prompts, max_new_tokens)``: greedy continuation (through the KV cache where the
  family has one);
- ``token_nll(windows)``: per-token negative log-likelihood (causal LMs only,
  ``supports_perplexity``);
- ``max_length()``: the longest input the position scheme can index (``None`` = any);
- optionally ``shares_prefix`` and ``score_from_prefix(prompts, answer_sets, n)``: every answer
  of a prompt (gold and the in-context alternatives) scored from one KV-cached run of the
  prompt, plus the greedy continuation from the same cache — one prompt pass per item instead
  of one per candidate.

A blocklab model is scored through its run's own objective (objectives/): the batch format,
shift and masking are the ones it was trained with, and nothing here names a family.
"""

from __future__ import annotations

import torch
from torch import Tensor

from blocklab.config import DataConfig
from blocklab.data.synthetic import Example
from blocklab.objectives import Objective, build_objective


def scatter_rows(flat: Tensor, counts: list[int]) -> tuple[Tensor, Tensor]:
    """(N, V) rows in row-major order, ``counts[i]`` of them for item i -> (B, A, V), mask."""
    b, a = len(counts), max(counts)
    mask = torch.arange(a)[None, :] < torch.tensor(counts)[:, None]
    out = flat.new_zeros((b, a, flat.shape[-1]))
    out[mask] = flat
    return out, mask


class BlocklabBackend:
    """A blocklab model of any family, scored through its objective's batch format (the same
    shift and masking as in training). Without an objective, the family's default one for
    the default data config (unpacked)."""

    def __init__(self, model: torch.nn.Module, objective: Objective | None = None, *,
                 name: str = "blocklab") -> None:
        self.model = model
        self.family = model.config.family.name
        self.objective = objective or build_objective(self.family, DataConfig())
        self.supports_perplexity = self.objective.causal_lm
        self.name = name

    def max_length(self) -> int | None:
        return self.model.max_positions

    def answer_logprobs(self, prompts: list[list[int]], answers: list[list[int]]
                        ) -> tuple[Tensor, Tensor]:
        examples = [Example(p + a, [False] * len(p) + [True] * len(a))
                    for p, a in zip(prompts, answers)]
        batch = self.objective.collate(examples)
        flat = self.objective.target_logits(self.model, batch).float().log_softmax(-1)
        return scatter_rows(flat, [len(a) for a in answers])

    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        return self.objective.greedy(self.model, prompts, max_new_tokens)

    @property
    def shares_prefix(self) -> bool:
        """Whether :meth:`score_from_prefix` is available (causal LMs: one KV-cached prompt)."""
        return (getattr(self.objective, "shares_prefix", False)
                and callable(getattr(self.model, "new_cache", None)))

    def score_from_prefix(self, prompts: list[list[int]], answer_sets: list[list[list[int]]],
                          max_new_tokens: int) -> list[tuple[list[Tensor], list[int]]]:
        """Per prompt: each of its answers' (len, V) log-probs and a greedy continuation of
        ``max_new_tokens``, from one run of the prompt (objective.score_prefix)."""
        return self.objective.score_prefix(self.model, prompts, answer_sets, max_new_tokens)

    def token_nll(self, windows: Tensor) -> Tensor:
        return self.objective.token_nll(self.model, windows)

"""Output heads: next-token LM head and BERT-style masked-LM head, tied to the input embedding
or not ("Using the Output Embedding to Improve Language Models", arXiv 1608.05859). Every head
softcaps its logits when ``model.logit_softcap`` is set: ``c · tanh(logits / c)`` after the
head scale and the projection (Gemma 2's ``final_logit_softcapping``)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.config import ModelConfig
from blocklab.model.estimate import params_of
from blocklab.model.scores import softcap
from blocklab.registry import lookup


class LMHead(nn.Module):
    """Project the final hidden state to vocabulary logits."""

    def __init__(self, m: ModelConfig, embedding: nn.Embedding) -> None:
        super().__init__()
        self.proj = nn.Linear(m.d_model, m.vocab_size, bias=False)
        if m.tie_embeddings:
            self.proj.weight = embedding.weight  # one Parameter, two names
        self.scale = m.head_scale  # T5 with a tied head: d_model^-0.5
        self.softcap = m.logit_softcap  # None: the logits as they are

    def forward(self, h: Tensor) -> Tensor:
        if self.scale != 1.0:
            h = h * self.scale
        # (B, T, V); no bias (a module call per token)
        return softcap(F.linear(h, self.proj.weight), self.softcap)

    @staticmethod
    def param_count(m: ModelConfig) -> int:
        """Parameters beyond the embedding: none when tied."""
        return 0 if m.tie_embeddings else m.vocab_size * m.d_model


class MLMHead(LMHead):
    """BERT's masked-LM head: dense + GELU + norm, then the (tied) vocabulary projection with a
    bias. "BERT", arXiv 1810.04805."""

    def __init__(self, m: ModelConfig, embedding: nn.Embedding) -> None:
        super().__init__(m, embedding)
        self.dense = nn.Linear(m.d_model, m.d_model)
        self.norm = lookup("norm", m.norm.name)(m.norm, m.d_model)
        self.bias = nn.Parameter(embedding.weight.new_zeros(m.vocab_size))
        self.approximate = m.ffn.approximate  # the model's GELU form

    def forward(self, h: Tensor) -> Tensor:
        h = self.norm(F.gelu(self.dense(h), approximate=self.approximate))
        if self.scale != 1.0:
            h = h * self.scale
        return softcap(F.linear(h, self.proj.weight, self.bias), self.softcap)  # (B, T, V)

    @staticmethod
    def param_count(m: ModelConfig) -> int:
        d = m.d_model
        norm = params_of(lookup("norm", m.norm.name), m.norm, d)
        return d * d + d + norm + m.vocab_size + LMHead.param_count(m)

"""The objective of each family (:data:`OBJECTIVES`): examples into a batch (the shift, once),
a batch into a loss, a prompt into the family's answer. The package's :func:`build_objective`
chooses one (its docstring, ``blocklab/objectives/__init__.py``, says how)."""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from blocklab.config import DataConfig
from blocklab.data.synthetic import PAD, Example
from blocklab.data.tokenizer import BLOCKLAB_SPECIALS, Specials
from blocklab.errors import ConfigError

IGNORE = -100


@dataclass
class LossOut:
    loss: Tensor  # mean over valid targets (0 when none)
    total: Tensor  # summed token loss
    count: Tensor  # number of valid targets
    # valid targets whose argmax is the label (top-1 accuracy's numerator); None where not
    # counted (training steps: the argmax would cost a pass over every logit for nothing)
    correct: Tensor | None = None
    # with ``z``: log²Z (Z the softmax's normaliser of the logits) summed over the valid
    # targets, with its graph (the z-loss: training adds ``optim.z_loss`` times its mean)
    z: Tensor | None = None


def token_loss(logits: Tensor, labels: Tensor, *, accuracy: bool = False,
               z: bool = False) -> LossOut:
    """Cross-entropy summed over non-ignored labels, divided by max(count, 1); with
    ``accuracy``, also the valid targets the logits' argmax predicts (ties: the lowest id);
    with ``z``, also the summed log²Z of the valid targets (PaLM's z-loss, arXiv 2204.02311),
    from the one logsumexp the cross-entropy needs (``CE = log Z - logit[label]``)."""
    valid = labels != IGNORE
    count = valid.sum()
    correct = ((logits.detach().argmax(-1) == labels) & valid).sum() if accuracy else None
    if not z:
        total = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                ignore_index=IGNORE, reduction="sum")
        return LossOut(total / count.clamp(min=1), total, count, correct)
    flat, target = logits.flatten(0, 1).float(), labels.flatten()
    keep = target != IGNORE
    log_z = torch.logsumexp(flat, dim=-1)
    picked = flat.gather(1, torch.where(keep, target, 0)[:, None])[:, 0]
    total = torch.where(keep, log_z - picked, 0.0).sum()
    return LossOut(total / count.clamp(min=1), total, count, correct,
                   torch.where(keep, log_z.square(), 0.0).sum())


def _pad(rows: list[list[int]] | list[list[bool]], value: int | bool, width: int | None = None,
         dtype: torch.dtype = torch.long) -> Tensor:
    """(len(rows), width) of ``rows`` left-aligned, ``value`` after each; one tensor built from
    one nested list (a tensor per row costs about 1 ms per batch of 12 rows of 65)."""
    width = width or max(len(r) for r in rows)
    return torch.tensor([[*r, *([value] * (width - len(r)))] for r in rows], dtype=dtype)


def pad_rows(rows: list[list[int]], *, left: bool, pad: int = PAD) -> tuple[Tensor, Tensor]:
    """(ids, valid) of ragged rows, right-aligned (``left`` padding, prompts for generation) or
    left-aligned."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, span] = torch.tensor(r, dtype=torch.long)
        valid[i, span] = True
    return ids, valid


def _pack(examples: list[Example], row_len: int) -> list[tuple[list[int], list[bool], list[int]]]:
    """Greedy first-fit packing in order: (tokens, targets, segment ids) rows of <= row_len.
    An example that carries its own ``segments`` (a window of several documents) keeps them."""
    rows: list[tuple[list[int], list[bool], list[int]]] = []
    for ex in examples:
        if not rows or len(rows[-1][0]) + len(ex.tokens) > row_len:
            rows.append(([], [], []))
        tokens, targets, segments = rows[-1]
        seg = (segments[-1] + 1) if segments else 1
        tokens += ex.tokens
        targets += ex.targets
        segments += ([seg + s - ex.segments[0] for s in ex.segments] if ex.segments
                     else [seg] * len(ex.tokens))
    return rows


class Objective:
    """``collate`` examples into a batch; ``logits`` aligned with ``batch["labels"]``;
    ``greedy`` answers prompts the way this family is asked."""

    #: Whether the family is a causal LM whose per-token likelihood is a perplexity.
    causal_lm: bool = False
    #: Whether ``data.packing`` applies: several documents per row, kept apart by segment ids.
    packs: bool = False
    #: The tokenizer's pad / bos / eos / mask ids (blocklab's own by default).
    specials: Specials = BLOCKLAB_SPECIALS

    @classmethod
    def from_config(cls, data: DataConfig) -> Objective:
        """The objective for a run's data config (packing, masking rate, seed)."""
        return cls()

    def collate(self, examples: list[Example]) -> dict[str, Tensor]:
        raise NotImplementedError

    def logits(self, model: torch.nn.Module, batch: dict[str, Tensor], **kw: Tensor) -> Tensor:
        raise NotImplementedError

    def reading(self) -> contextlib.AbstractContextManager[None]:
        """One evaluation pass over consecutive batches (validation, ``blocklab-eval``): an
        objective whose batches continue each other keeps its state across them."""
        return contextlib.nullcontext()

    def loss(self, model: torch.nn.Module, batch: dict[str, Tensor], *,
             z: bool = False) -> LossOut:
        """The batch's token loss; scored without gradients (validation, evaluation), also its
        top-1 accuracy (``correct``); with ``z`` (training under ``optim.z_loss``), also the
        summed log²Z (``LossOut.z``)."""
        return token_loss(self.logits(model, batch), batch["labels"],
                          accuracy=not torch.is_grad_enabled(), z=z)

    def target_logits(self, model: torch.nn.Module, batch: dict[str, Tensor]) -> Tensor:
        """(N, V) logits of the supervised positions only (``labels != IGNORE``, row-major
        order), without the vocabulary projection of every other position."""
        return self.logits(model, batch, select=batch["labels"] != IGNORE)

    def greedy(self, model: torch.nn.Module, prompts: list[list[int]],
               max_new_tokens: int) -> list[list[int]]:
        """Greedy continuation of each prompt (ragged token lists) by ``max_new_tokens``."""
        raise NotImplementedError

    #: Whether :meth:`score_prefix` scores several answers from one run of the prompt.
    shares_prefix = False

    def token_nll(self, model: torch.nn.Module, windows: Tensor) -> Tensor:
        """(B, T) windows -> (B, T-1) next-token negative log-likelihoods (causal LMs)."""
        raise ValueError(f"perplexity needs a causal LM objective, not {type(self).__name__}")


def _continuations(answers: list[list[int]], pad: int) -> Tensor:
    """Each answer but its last token, right-padded to a (K, L) batch (pads come after every
    real token: causal queries never see them)."""
    width = max(len(a) for a in answers) - 1
    ids = torch.full((len(answers), width), pad, dtype=torch.long)
    for k, a in enumerate(answers):
        ids[k, : len(a) - 1] = torch.tensor(a[:-1], dtype=torch.long)
    return ids


class CausalLM(Objective):
    """Decoder: predict token ``t+1`` from tokens ``<= t``."""

    causal_lm = True
    packs = True

    def __init__(self, *, pack_to: int | None = None) -> None:
        self.pack_to = pack_to

    @classmethod
    def from_config(cls, data: DataConfig) -> CausalLM:
        return cls(pack_to=data.seq_len if data.packing else None)

    def collate(self, examples: list[Example]) -> dict[str, Tensor]:
        pad = self.specials.pad
        if self.pack_to:
            rows = _pack(examples, self.pack_to + 1)
            tokens = _pad([r[0] for r in rows], pad, self.pack_to + 1)
            targets = _pad([r[1] for r in rows], False, self.pack_to + 1, torch.bool)
            segments = _pad([r[2] for r in rows], 0, self.pack_to + 1)
        else:
            tokens = _pad([e.tokens for e in examples], pad)
            targets = _pad([e.targets for e in examples], False, dtype=torch.bool)
            segments = None
        # The shift, once: input t predicts token t+1, supervised where token t+1 is a target
        # and (packed rows) belongs to the same document as input t.
        inputs, labels = tokens[:, :-1], tokens[:, 1:].clone()
        keep = targets[:, 1:]
        if segments is not None:
            keep &= segments[:, 1:] == segments[:, :-1]
        labels[~keep] = IGNORE
        batch = {"input_ids": inputs, "labels": labels}
        if segments is not None:
            segments = segments[:, :-1]
            # rows that are each one document (no boundary, no padding) need no segments: the
            # masks are then plain causal, SDPA's fast path (an explicit mask costs about 3 % of
            # a small model's CPU step), and positions count from each row's start either way
            if not bool((segments == segments[:, :1]).all()):
                batch["segments"] = segments
        return batch

    def logits(self, model: torch.nn.Module, batch: dict[str, Tensor], **kw: Tensor) -> Tensor:
        """(B, T, V), aligned with ``batch["labels"]``. Right padding needs no key mask in a
        causal model: pads sit after every real token, so no real query sees them."""
        return model(batch["input_ids"], segments=batch.get("segments"), **kw)

    def greedy(self, model: torch.nn.Module, prompts: list[list[int]],
               max_new_tokens: int) -> list[list[int]]:
        from blocklab.model.generate import generate

        ids, valid = pad_rows(prompts, left=True, pad=self.specials.pad)
        return generate(model, ids, valid=valid, max_new_tokens=max_new_tokens,
                        eos_id=self.specials.eos).tolist()

    shares_prefix = True

    def score_prefix(self, model: torch.nn.Module, prompts: list[list[int]],
                     answer_sets: list[list[list[int]]], max_new_tokens: int
                     ) -> list[tuple[list[Tensor], list[int]]]:
        """Prompts with several answers each: the prompts run once, left-padded into one KV
        cache; every answer is scored from a copy of its prompt's rows in one batched forward,
        and the greedy continuation (as :meth:`greedy`) decodes from the same cache. Returns,
        per prompt, each answer's (len, V) log-probs and the ``max_new_tokens`` greedy tokens."""
        from blocklab.model.position import positions_from_valid

        b, eos = len(prompts), self.specials.eos
        ids, valid = pad_rows(prompts, left=True, pad=self.specials.pad)
        t = ids.shape[1]
        longest = max(len(a) for answers in answer_sets for a in answers)
        cache = model.new_cache(b, t + max(longest, max_new_tokens))
        last = torch.zeros_like(ids, dtype=torch.bool)
        last[:, -1] = True  # left padding: every row ends in the last column
        padded = not bool(valid.all())
        first = model(ids, valid=valid if padded else None, positions=positions_from_valid(valid),
                      cache=cache, select=last).float()  # (B, V)
        first_lp = first.log_softmax(-1)
        after = valid.long().sum(-1)  # (B,) each row's next position
        out = [[first_lp[i: i + 1]] * len(answers) for i, answers in enumerate(answer_sets)]
        if longest > 1:
            rows = torch.tensor([i for i, answers in enumerate(answer_sets) for _ in answers])
            flat = [a for answers in answer_sets for a in answers]
            cont = _continuations(flat, self.specials.pad)  # (N, L)
            # a shorter answer's padding repeats its last position: never a position past the
            # longest answer's own (a learned table ends there)
            ends = torch.tensor([max(len(a) - 2, 0) for a in flat])
            positions = after[rows][:, None] + torch.minimum(torch.arange(cont.shape[1]),
                                                             ends[:, None])
            rest = model(cont, positions=positions, cache=cache.select(rows))
            rest = rest.float().log_softmax(-1)  # (N, L, V)
            k = 0
            for i, answers in enumerate(answer_sets):
                out[i] = [torch.cat((first_lp[i: i + 1], rest[k + j, : len(a) - 1]))
                          for j, a in enumerate(answers)]
                k += len(answers)
        tokens = torch.full((b, max_new_tokens), eos, dtype=torch.long)
        token, done = first.argmax(-1), torch.zeros(b, dtype=torch.bool)
        for i in range(max_new_tokens):
            token = token.where(~done, eos)
            done |= token == eos
            tokens[:, i] = token
            if i == max_new_tokens - 1 or bool(done.all()):
                break
            step = model(token[:, None], positions=(after + i)[:, None], cache=cache)
            token = step[:, -1].argmax(-1)
        return [(out[i], tokens[i].tolist()) for i in range(b)]

    def token_nll(self, model: torch.nn.Module, windows: Tensor) -> Tensor:
        logits = model(windows[:, :-1]).float()
        return F.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none")


class MaskedLM(Objective):
    """Encoder: answer tokens (or, for tasks supervised everywhere, a random ``p`` of tokens)
    are replaced by ``MASK`` and predicted at their own position ("BERT", arXiv 1810.04805)."""

    def __init__(self, *, mlm_probability: float = 0.15, seed: int = 0) -> None:
        self.p, self.seed = mlm_probability, seed

    @classmethod
    def from_config(cls, data: DataConfig) -> MaskedLM:
        return cls(mlm_probability=data.mlm_probability, seed=data.seed)

    def collate(self, examples: list[Example]) -> dict[str, Tensor]:
        mask = self._mask()
        inputs, labels = [], []
        for ex in examples:
            rng = random.Random(f"mlm:{self.seed}:{ex.tokens}")
            dense = sum(ex.targets) > len(ex.tokens) // 2  # LM-style task: mask a fraction
            chosen = [t and (not dense or rng.random() < self.p) for t in ex.targets]
            if dense and not any(chosen):
                chosen[ex.targets.index(True)] = True
            inputs.append([mask if c else tok for tok, c in zip(ex.tokens, chosen)])
            labels.append([tok if c else IGNORE for tok, c in zip(ex.tokens, chosen)])
        ids = _pad(inputs, self.specials.pad)
        return {"input_ids": ids, "labels": _pad(labels, IGNORE, ids.shape[1]),
                "valid": _pad([[1] * len(r) for r in inputs], 0, ids.shape[1]).bool()}

    def logits(self, model: torch.nn.Module, batch: dict[str, Tensor], **kw: Tensor) -> Tensor:
        return model(batch["input_ids"], valid=batch["valid"], **kw)

    def _mask(self) -> int:
        if self.specials.mask is None:
            raise ConfigError("config error: model.family.name='encoder': the masked-LM "
                              "objective needs a mask token, and this tokenizer has none")
        return self.specials.mask

    def greedy(self, model: torch.nn.Module, prompts: list[list[int]],
               max_new_tokens: int) -> list[list[int]]:
        """Parallel prediction of ``max_new_tokens`` masked slots after each prompt (an
        encoder answers in place, not left to right)."""
        n = max_new_tokens
        ids, valid = pad_rows([p + [self._mask()] * n for p in prompts], left=False,
                              pad=self.specials.pad)
        select = torch.zeros_like(valid)
        for i, p in enumerate(prompts):
            select[i, len(p):len(p) + n] = True
        logits = model(ids, valid=valid, select=select)  # (B·n, V), row-major
        return logits.argmax(-1).view(len(prompts), n).tolist()


class Seq2Seq(Objective):
    """Encoder–decoder with teacher forcing: the source is everything before the first answer
    token, the target is ``BOS + answers``; the decoder input is the target shifted right."""

    def collate(self, examples: list[Example]) -> dict[str, Tensor]:
        sp = self.specials
        sources, targets = [], []
        for ex in examples:
            start = ex.answer_start
            sources.append(ex.tokens[:start])
            targets.append([sp.bos] + [t for t, is_t in zip(ex.tokens[start:], ex.targets[start:])
                                       if is_t])
        src = _pad(sources, sp.pad)
        tgt = _pad(targets, sp.pad)
        labels = _pad([t[1:] for t in targets], IGNORE, tgt.shape[1] - 1)  # padding: no target
        return {"source_ids": src,
                "source_valid": _pad([[1] * len(s) for s in sources], 0, src.shape[1]).bool(),
                "target_ids": tgt[:, :-1], "labels": labels}

    def logits(self, model: torch.nn.Module, batch: dict[str, Tensor], **kw: Tensor) -> Tensor:
        return model(batch["source_ids"], batch["target_ids"], source_valid=batch["source_valid"],
                     **kw)

    def greedy(self, model: torch.nn.Module, prompts: list[list[int]],
               max_new_tokens: int) -> list[list[int]]:
        from blocklab.model.generate import generate

        src, valid = pad_rows(prompts, left=False, pad=self.specials.pad)
        start = torch.full((len(prompts), 1), self.specials.bos, dtype=torch.long)
        return generate(model, start, source_ids=src, source_valid=valid,
                        max_new_tokens=max_new_tokens).tolist()


OBJECTIVES: dict[str, type[Objective]] = {
    "decoder": CausalLM,
    "encoder": MaskedLM,
    "encoder_decoder": Seq2Seq,
}

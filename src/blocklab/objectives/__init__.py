"""Objectives, chosen from the model family in one place: :func:`build_objective`.

Training, ``blocklab-eval`` and the probe backends all build their objective here, from the
family and the data config, so a validation loss recomputed from a checkpoint is the loss the
run logged, and a probe sees exactly the batch format the model was trained on.

Each objective turns a list of :class:`~blocklab.data.synthetic.Example` (token sequences with a
per-token ``targets`` flag) into a batch, a batch into a loss, and a prompt into the family's
answer (:meth:`Objective.greedy`). The next-token shift happens
exactly once, in :meth:`CausalLM.collate`; labels are ``IGNORE`` for padding, for positions whose
next token is in another packed document, and for non-answer positions of retrieval tasks.
Losses are per-token means over valid targets that are 0 (not NaN) when there are none.
"""

from __future__ import annotations

import torch
from torch import Tensor

from blocklab.config import DataConfig
from blocklab.data.synthetic import Example
from blocklab.data.tokenizer import BLOCKLAB_SPECIALS, Specials
from blocklab.objectives.core import (
    IGNORE,
    OBJECTIVES,
    CausalLM,
    LossOut,
    MaskedLM,
    Objective,
    Seq2Seq,
    pad_rows,
    token_loss,
)
from blocklab.objectives.segmented import SegmentedLM, segment_loss
from blocklab.registry import lookup

__all__ = ["IGNORE", "OBJECTIVES", "CausalLM", "LossOut", "MaskedLM", "Objective", "SegmentedLM",
           "Seq2Seq", "build_objective", "pad_batch", "pad_rows", "round_up",
           "segment_loss", "token_loss"]


def round_up(length: int, multiple: int, *, cap: int) -> int:
    """``length`` rounded up to a multiple of ``multiple``, but never beyond ``cap`` (nor below
    ``length``)."""
    return max(length, min(-(-length // multiple) * multiple, cap))


#: Fill value of each batch key when a batch is padded to a fixed width: padding is never a
#: target, never a valid key, and in packed rows a document of its own.
_FILL = {"labels": IGNORE, "valid": False, "source_valid": False, "segments": -1}


def pad_batch(batch: dict[str, Tensor], multiple: int, *, cap: int, pad: int) -> dict[str, Tensor]:
    """Right-pad every (B, T) tensor of ``batch`` to ``round_up(T, multiple, cap=cap)`` tokens
    (``data.pad_to_multiple``): a compiled model with static shapes then sees a few widths
    instead of one per batch length. Right padding changes no real output: causal queries never
    see later keys, and bidirectional ones see ``valid`` / ``source_valid`` only."""
    out = {}
    for key, t in batch.items():
        width = round_up(t.shape[1], multiple, cap=cap)
        fill = _FILL.get(key, pad)
        out[key] = t if width == t.shape[1] else torch.cat(
            (t, t.new_full((t.shape[0], width - t.shape[1]), fill)), 1)
    return out


def build_objective(family: str, data: DataConfig,
                    specials: Specials | None = None) -> Objective:
    """The objective of model ``family`` for a run's ``data`` config and its tokenizer's
    ``specials``: the one constructor that training, evaluation and probes share. A
    ``data.segment_mode`` reads the decoder's rows segment by segment (:class:`SegmentedLM`). With
    ``data.pad_to_multiple``, its batches are padded to a multiple of that many tokens
    (:func:`pad_batch`)."""
    if getattr(data, "segment_mode", "none") != "none":  # the decoder, read segment by segment
        objective: Objective = SegmentedLM.from_config(data)
    else:
        objective = lookup("objective", family, "model.family.name").from_config(data)
    objective.specials = specials or BLOCKLAB_SPECIALS
    multiple = getattr(data, "pad_to_multiple", None)
    if multiple:
        collate = objective.collate

        def padded(examples: list[Example]) -> dict[str, Tensor]:
            return pad_batch(collate(examples), multiple, cap=data.seq_len,
                             pad=objective.specials.pad)

        objective.collate = padded  # type: ignore[method-assign]
    return objective

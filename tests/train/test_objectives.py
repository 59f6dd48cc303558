"""Objectives: the shift happens once and right, losses count only valid targets and are 0
(not NaN) without any, packing never supervises across documents, and every family learns."""

from __future__ import annotations

import math

import pytest
import torch

from blocklab.config import DataConfig, PositionConfig, TaskWeights
from blocklab.data.mixture import Mixture
from blocklab.data.synthetic import BOS, MASK, Example, Vocab, example_rng
from blocklab.data.tasks.needle import needle
from blocklab.model import build_model
from blocklab.objectives import IGNORE, CausalLM, MaskedLM, Seq2Seq, token_loss
from blocklab.registry import names
from model.variants import tiny


def _lm_example(n: int, offset: int = 10) -> Example:
    return Example(list(range(offset, offset + n)), [False] + [True] * (n - 1))


def test_causal_shift_pairs_each_input_with_the_next_token():
    batch = CausalLM().collate([_lm_example(6), _lm_example(4, offset=30)])
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids.shape == labels.shape == (2, 5)
    valid = labels != IGNORE
    assert torch.equal(labels[valid], (ids + 1)[valid])  # consecutive tokens: label = input + 1
    assert not (labels[valid] == ids[valid]).any()  # never the same-position input
    assert valid.sum(1).tolist() == [5, 3]  # padding (row 2's last slot) is ignored


class Echo(torch.nn.Module):
    """A model that predicts its own input token: perfect if the shift were missing."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, ids, **_):
        return torch.nn.functional.one_hot(ids, self.vocab).float() * 50


def test_an_echo_model_cannot_reach_low_loss():
    vocab = Vocab()
    exs = [Mixture(DataConfig(tasks=TaskWeights(needle=0, markov_lm=1.0, copy=1.0)))(i) for i in range(16)]
    obj = CausalLM()
    loss = obj.loss(Echo(vocab.size), obj.collate(exs)).loss
    assert loss > 10  # echoing is confidently wrong everywhere


def test_only_answer_tokens_are_supervised_for_retrieval():
    ex = needle(example_rng(0, 1), Vocab(), 40, n_distractors=2)
    batch = CausalLM().collate([ex])
    labels = batch["labels"][0]
    supervised = (labels != IGNORE).nonzero().flatten().tolist()
    assert supervised == [len(ex.tokens) - 2]  # the input position of the query key
    assert labels[supervised[0]] == ex.tokens[-1]  # ... predicts the gold value


def test_packing_never_supervises_across_documents():
    exs = [_lm_example(5), _lm_example(7, 40), _lm_example(3, 80)]
    batch = CausalLM(pack_to=16).collate(exs)
    ids, labels, seg = batch["input_ids"], batch["labels"], batch["segments"]
    assert ids.shape == (1, 16)
    valid = labels != IGNORE
    assert valid.sum() == 4 + 6 + 2  # each document's own next-token targets, no boundary ones
    assert torch.equal(labels[valid], (ids + 1)[valid])
    assert seg[0, :5].eq(1).all() and seg[0, 5:12].eq(2).all() and seg[0, 12:15].eq(3).all()


def test_rows_of_one_document_drop_their_segments_and_score_the_same():
    """A packed batch whose every row is one document (and no padding) carries no segments,
    so attention takes the plain causal path; its logits equal those computed with the
    segments, and a batch with a boundary or padding in any row keeps them."""
    one = CausalLM(pack_to=8).collate([_lm_example(9), _lm_example(9, 40)])
    assert "segments" not in one
    model = build_model(tiny()).eval()
    with torch.no_grad():
        plain = model(one["input_ids"])
        same = model(one["input_ids"], segments=torch.ones_like(one["input_ids"]))
    torch.testing.assert_close(plain, same, rtol=1e-5, atol=1e-6)
    for exs in ([_lm_example(4), _lm_example(5, 40)], [_lm_example(9), _lm_example(6, 40)]):
        assert "segments" in CausalLM(pack_to=8).collate(exs)


def test_loss_is_a_mean_over_valid_targets_and_zero_without_any():
    logits = torch.randn(2, 5, 11, requires_grad=True)
    labels = torch.full((2, 5), IGNORE)
    out = token_loss(logits, labels)
    assert out.loss.item() == 0.0 and out.count.item() == 0
    out.loss.backward()
    assert torch.isfinite(logits.grad).all()
    labels[0, 1], labels[1, 3] = 4, 7
    out = token_loss(logits, labels)
    ref = torch.nn.functional.cross_entropy(logits[[0, 1], [1, 3]], torch.tensor([4, 7]))
    torch.testing.assert_close(out.loss, ref)


def test_masked_lm_masks_answers_and_predicts_them_in_place():
    ex = needle(example_rng(0, 2), Vocab(), 40, n_distractors=1)
    batch = MaskedLM().collate([ex])
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    assert ids[-1] == MASK and labels[-1] == ex.tokens[-1]
    assert (labels[:-1] == IGNORE).all() and batch["valid"].all()


def test_seq2seq_splits_source_and_shifts_the_target_once():
    ex = needle(example_rng(0, 3), Vocab(), 40, n_distractors=1)
    batch = Seq2Seq().collate([ex])
    assert batch["source_ids"][0].tolist() == ex.tokens[:-1]
    assert batch["target_ids"][0].tolist() == [BOS]
    assert batch["labels"][0].tolist() == [ex.tokens[-1]]


@pytest.mark.parametrize("family", names("family"))
def test_each_family_learns_a_tiny_task(family):
    """Copying (decoder, encoder–decoder) / masked Markov text (encoder) over 16 filler tokens:
    within 200 steps the loss falls below ln 16, the best any predictor that ignores the context
    can do — so the model uses its context through the family's masks and shift."""
    torch.manual_seed(0)
    vocab = Vocab(n_filler=16, n_keys=16, n_values=16)
    cfg = tiny(family, PositionConfig(name="learned"), vocab_size=vocab.size, d_model=64,
               d_ff=128)
    model = build_model(cfg)
    obj = {"decoder": CausalLM, "encoder": MaskedLM,
           "encoder_decoder": Seq2Seq}[family]()
    task = "markov_lm" if family == "encoder" else "copy"
    mix = Mixture(DataConfig(tasks=TaskWeights(needle=0, **{task: 1.0}), n_filler=16, n_keys=16, n_values=16,
                             min_len=10, seq_len=14))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(200):
        batch = obj.collate([mix(step * 16 + i) for i in range(16)])
        loss = obj.loss(model, batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    start, end = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert end < math.log(16) - 0.1 < start, (start, end)


def test_task_weights_schema_lists_exactly_the_registered_tasks():
    import dataclasses

    from blocklab.data.tasks import TASKS

    assert {f.name for f in dataclasses.fields(TaskWeights)} == set(TASKS)

"""The sequence-mixer seam, over every variant of the grid that decodes (every mixer, hybrid
pattern and the example plugin's mixer included): what a mixer's state promises beyond the
invariants of test_invariants.py and test_cache.py.

- chunked prefill of a left-padded batch, then decoding, equals each row's full forward;
- ``select(rows)`` (shared-prefix scoring: one prefill, several continuations per row) equals
  recomputing each continuation, for the growing and the fixed-shape (static) cache, after a
  prefill and after a decode step;
- every accepted short-convolution tap count of every mixer that has one decodes;
- ``reset()`` empties a static cache in place: decoding again gives the same logits;
- the decode state's bytes are what the estimator says (``state_bytes``), at two capacities;
- negative controls: deliberately broken mixers fail these checks and the grid invariants.
"""

from __future__ import annotations

import dataclasses

import pytest
import test_cache
import test_invariants
import torch
from variants import VOCAB, params, tiny

from blocklab import registry
from blocklab.config import MixerConfig, PositionConfig
from blocklab.model import build_model
from blocklab.model.estimate import estimate, state_bytes
from blocklab.model.mixer import Sequence, State

DEC, ED = "decoder", "encoder_decoder"
ATOL = 1e-5


def _batch(cfg, rows: int = 3, t: int = 11):
    """Left-padded prompts (rows pad 3, 0, 1), and a source for an encoder–decoder."""
    ids = torch.randint(0, VOCAB, (rows, t))
    valid = torch.ones(rows, t, dtype=torch.bool)
    for r, pad in enumerate((3, 0, 1)[:rows]):
        valid[r, :pad] = False
    src = {"source_ids": torch.randint(0, VOCAB, (rows, 7))} if cfg.family.name == ED else {}
    return ids, valid, src


def _full(model, ids, src, **kw):
    source = src.get("source_ids")
    return model(source, ids, **kw) if source is not None else model(ids, **kw)


def _alone(model, ids, valid, src, r):
    """Row ``r``'s real tokens run alone (the reference every padded path must equal)."""
    one = {k: v[r: r + 1] for k, v in src.items()}
    return _full(model, ids[r: r + 1, valid[r]], one)


@params(DEC, ED)
def test_chunked_prefill_of_left_padded_rows_then_decoding_equals_each_row_alone(cfg):
    assert _prefill_in_chunks_then_decode(cfg) == 6  # 3 rows, growing and static caches


def _prefill_in_chunks_then_decode(cfg) -> int:
    """Assert every row's chunked prefill and decode steps equal the row run alone; returns
    the number of (row, cache kind) pairs compared."""
    compared = 0
    model = build_model(cfg).eval()
    ids, valid, src = _batch(cfg, t=14)
    positions = torch.where(valid, valid.long().cumsum(-1) - 1, 0)
    prepared = model.prepare(**src)
    for static in (False, True):
        cache = model.new_cache(3, 20, static=static)
        outs, start = [], 0
        with torch.no_grad():
            for size in (5, 4, 1, 1, 3):  # prefill in chunks, then single decode steps
                sl = slice(start, start + size)
                outs.append(model.decode(ids[:, sl], positions=positions[:, sl],
                                         valid=valid[:, sl], cache=cache, **prepared))
                start += size
        got = torch.cat(outs, 1)
        for r in range(3):
            torch.testing.assert_close(got[r, valid[r]], _alone(model, ids, valid, src, r)[0],
                                       atol=ATOL, rtol=0, msg=f"row {r}, static={static}")
            compared += 1
    return compared


@params(DEC, ED)
def test_selected_rows_continue_like_recompute(cfg):
    """One prefill of 3 left-padded prompts; rows [2, 0, 0, 1] selected; each continued by its
    own 3 tokens in one forward, then one more step: equal to running prompt + continuation
    alone. The fixed-shape cache too (``select`` of a static cache)."""
    model = build_model(cfg).eval()
    ids, valid, src = _batch(cfg)
    positions = torch.where(valid, valid.long().cumsum(-1) - 1, 0)
    rows = torch.tensor([2, 0, 0, 1])
    cont = torch.randint(0, VOCAB, (4, 4))
    for static in (False, True):
        prepared = model.prepare(**src)
        cache = model.new_cache(3, 24, static=static)
        with torch.no_grad():
            model.decode(ids, positions=positions, valid=valid, cache=cache, **prepared)
            chosen = cache.select(rows)
            picked = {k: None if v is None else v.index_select(0, rows)
                      for k, v in prepared.items()}
            start = valid.long().sum(-1).index_select(0, rows)[:, None]
            a = model.decode(cont[:, :3], positions=start + torch.arange(3), valid=None,
                             cache=chosen, **picked)
            b = model.decode(cont[:, 3:], positions=start + 3, valid=None, cache=chosen,
                             **picked)
        got = torch.cat((a, b), 1)
        for j, r in enumerate(rows.tolist()):
            one = {k: v[r: r + 1] for k, v in src.items()}
            want = _full(model, torch.cat((ids[r: r + 1, valid[r]], cont[j: j + 1]), 1), one)
            torch.testing.assert_close(got[j], want[0, -4:], atol=ATOL, rtol=0,
                                       msg=f"selected row {j} (prompt {r}), static={static}")


@params(DEC, ED)
def test_select_works_after_any_decode_step(cfg):
    """Regression (issue 42): ``select`` of a static cache after a forward shorter than
    ``max(rows) + 1`` (a decode step) raised IndexError — the write slots, one for all rows,
    were sliced by row. Prefill, one step, select rows [2, 0, 0, 1], continue: equal to
    recomputing each row, growing and static."""
    assert _select_after_a_step(cfg) == 8  # 4 selected rows, growing and static caches


def _select_after_a_step(cfg) -> int:
    """Assert each selected row continues like recompute; returns the (row, cache kind) pairs
    compared."""
    compared = 0
    model = build_model(cfg).eval()
    ids, valid, src = _batch(cfg)
    positions = torch.where(valid, valid.long().cumsum(-1) - 1, 0)
    rows, step = torch.tensor([2, 0, 0, 1]), torch.randint(0, VOCAB, (3, 1))
    cont = torch.randint(0, VOCAB, (4, 2))
    for static in (False, True):
        prepared = model.prepare(**src)
        cache = model.new_cache(3, 24, static=static)
        with torch.no_grad():
            model.decode(ids, positions=positions, valid=valid, cache=cache, **prepared)
            model.decode(step, positions=positions[:, -1:] + 1, valid=None, cache=cache,
                         **prepared)
            chosen = cache.select(rows)
            picked = {k: None if v is None else v.index_select(0, rows)
                      for k, v in prepared.items()}
            start = valid.long().sum(-1).index_select(0, rows)[:, None] + 1
            got = model.decode(cont, positions=start + torch.arange(2), valid=None,
                               cache=chosen, **picked)
        for j, r in enumerate(rows.tolist()):
            one = {k: v[r: r + 1] for k, v in src.items()}
            seq = torch.cat((ids[r: r + 1, valid[r]], step[r: r + 1], cont[j: j + 1]), 1)
            torch.testing.assert_close(got[j], _full(model, seq, one)[0, -2:], atol=ATOL,
                                       rtol=0, msg=f"row {j} (prompt {r}), static={static}")
            compared += 1
    return compared


#: every mixer with a short convolution, its option, and the tap counts it accepts
SHORT_CONVS = [("linear", "short_conv", (0, 1, 2, 3)), ("gated_conv", "short_conv", (1, 2, 3)),
               ("ssm", "d_conv", (1, 2, 3))]


@pytest.mark.parametrize(("mixer", "option", "taps"),
                         [(m, o, k) for m, o, ks in SHORT_CONVS for k in ks],
                         ids=[f"{m}-{k}" for m, _, ks in SHORT_CONVS for k in ks])
def test_every_accepted_short_convolution_decodes(mixer, option, taps):
    """Regression (issue 42): linear attention with ``short_conv=1`` could not decode (its
    state had no tail). Every accepted tap count of every mixer with a short convolution:
    chunked prefill then steps, and select, equal recompute (growing and static caches)."""
    from blocklab.config.validate import validate_model

    cfg = tiny(DEC, PositionConfig(name="none"),
               mixer=MixerConfig(name=mixer, **{option: taps}))
    validate_model(cfg)  # an accepted value
    assert _prefill_in_chunks_then_decode(cfg) == 6
    assert _select_after_a_step(cfg) == 8


@params(DEC, ED)
def test_reset_empties_a_static_cache_in_place(cfg):
    model = build_model(cfg).eval()
    ids, valid, src = _batch(cfg)
    positions = torch.where(valid, valid.long().cumsum(-1) - 1, 0)
    prepared = model.prepare(**src)
    cache = model.new_cache(3, 16, static=True)
    with torch.no_grad():
        first = model.decode(ids, positions=positions, valid=valid, cache=cache, **prepared)
        model.decode(ids[:, :2], positions=positions[:, -1:] + torch.arange(1, 3), valid=None,
                     cache=cache, **prepared)
        pointers = [t.data_ptr() for s in cache.states if s is not None
                    for t in s.tensors().values()]
        cache.reset()
        assert cache.length == 0
        again = model.decode(ids, positions=positions, valid=valid, cache=cache, **prepared)
    assert [t.data_ptr() for s in cache.states if s is not None
            for t in s.tensors().values()] == pointers  # the same buffers (compiled replays)
    torch.testing.assert_close(again[valid], first[valid], atol=0, rtol=0)


@params(DEC, ED)
def test_decode_state_bytes_are_the_estimate(cfg):
    """The estimator asks each mixer for its state; the real cache holds exactly that, at a
    short and a long capacity (recurrent states do not grow with it)."""
    model = build_model(cfg)
    for capacity in (6, 48):
        cache = model.new_cache(2, capacity, dtype=torch.float32)
        assert cache.nbytes == state_bytes(cfg, 2, capacity, 4)
        assert cache.nbytes == estimate(cfg, batch=2, seq_len=capacity,
                                        bytes_per_value=4).state_bytes


# ---------------------------------------------------------------------- negative controls
# A mixer that breaks one promise must fail the check that guards it; each is registered for
# the one test and removed after.

def _broken(name: str, forward):
    base = registry.lookup("mixer", "token_shift")
    return type(name, (base,), {"forward": forward})


def _ignores_padding(self, x, seq, state):  # sees padding as real tokens
    return type(self).__mro__[1].forward(self, x, dataclasses.replace(seq, valid=None, _memo={}),
                                         state)


def _ignores_documents(self, x, seq, state):  # lets packed documents see each other
    return type(self).__mro__[1].forward(self, x, dataclasses.replace(
        seq, segments=None, _memo={}), state)


def _forgets_its_state(self, x, seq, state):  # decodes as if every step started anew
    return type(self).__mro__[1].forward(self, x, seq, None)


def _peeks_ahead(self, x, seq, state):  # mixes in the next token (not causal)
    out = type(self).__mro__[1].forward(self, x, seq, state)
    return out + 0.5 * torch.roll(out, -1, dims=1)


@pytest.fixture()
def broken():
    added = []

    def register(name, forward):
        registry.register("mixer", name)(_broken(name.title(), forward))
        added.append(name)
        return tiny(DEC, PositionConfig(name="none"), mixer=MixerConfig(name=name))

    yield register
    table = registry.table("mixer")
    for name in added:
        table.pop(name, None)
        registry._registered.pop(("mixer", name), None)


@pytest.mark.parametrize(("name", "forward", "check"), [
    ("pad_blind", _ignores_padding,
     test_invariants.test_padding_never_changes_real_outputs_right_and_left),
    ("doc_blind", _ignores_documents,
     test_invariants.test_packed_documents_equal_each_document_alone),
    ("stateless", _forgets_its_state, test_cache.test_incremental_decoding_equals_full_prefix),
    ("stateless2", _forgets_its_state,
     test_selected_rows_continue_like_recompute),
    ("peeking", _peeks_ahead, test_invariants.test_future_tokens_never_change_earlier_logits),
    ("pad_blind2", _ignores_padding,
     test_chunked_prefill_of_left_padded_rows_then_decoding_equals_each_row_alone),
])
def test_a_broken_mixer_fails_the_check_that_guards_its_promise(broken, name, forward, check):
    cfg = broken(name, forward)
    with pytest.raises(AssertionError):
        check(cfg)


def test_the_unbroken_example_mixer_passes_the_same_checks(broken):
    """The controls' base: the plugin's token_shift itself passes (so a failure above is the
    defect's)."""
    cfg = tiny(DEC, PositionConfig(name="none"), mixer=MixerConfig(name="token_shift"))
    passed = []
    for check in (test_invariants.test_padding_never_changes_real_outputs_right_and_left,
                  test_invariants.test_packed_documents_equal_each_document_alone,
                  test_cache.test_incremental_decoding_equals_full_prefix,
                  test_invariants.test_future_tokens_never_change_earlier_logits,
                  test_selected_rows_continue_like_recompute,
                  test_chunked_prefill_of_left_padded_rows_then_decoding_equals_each_row_alone):
        check(cfg)  # each raises AssertionError on a defect (the controls above show it)
        passed.append(check.__name__)
    assert len(passed) == 6


def test_a_state_copies_rows_and_counts_its_bytes():
    class Two(State):
        def __init__(self):
            self.a = torch.arange(6.0).view(3, 2)
            self.b = torch.arange(3)

    s = Two()
    t = s.select(torch.tensor([2, 2, 0]))
    assert t.a.tolist() == [[4, 5], [4, 5], [0, 1]] and t.b.tolist() == [2, 2, 0]
    assert s.nbytes == 6 * 4 + 3 * 8
    t.reset()
    assert not t.a.any() and s.a.any()  # a copy, not a view


def test_sequence_visibility_is_built_once_per_window_and_forward():
    from blocklab.model.position import NoPosition

    pos = NoPosition(PositionConfig(), d_model=8, d_head=2, n_heads=4, max_seq_len=16,
                     causal=True)
    seq = Sequence(positions=torch.arange(6).expand(2, 6), valid=None, segments=None,
                   causal=True, position=pos)
    assert seq.visibility(None) is seq.visibility(None)
    assert seq.visibility(3) is seq.visibility(3) and seq.visibility(3) is not seq.visibility(None)


@params("decoder", "encoder")
def test_padding_that_shares_a_documents_segment_id_never_moves_its_positions(cfg):
    """Regression: with ``segments=`` and default positions, padding with the document's own
    segment id advanced the positions (a left-padded row with ``segments=1`` differed from the
    row alone by 4.7 in the logits); positions, windows and valid now all count real tokens."""
    model = build_model(cfg).eval()
    real = torch.randint(0, VOCAB, (1, 9))
    ids = torch.cat((torch.randint(0, VOCAB, (1, 4)), real), 1)
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[:, :4] = False
    with torch.no_grad():
        alone = model(real)
        padded = model(ids, valid=valid, segments=torch.ones_like(ids))
    torch.testing.assert_close(padded[valid], alone[0], atol=ATOL, rtol=0)

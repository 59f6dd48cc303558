"""The ``chunked`` experiment's measurement is what it claims: its held-out needles lie wholly
inside a chunk earlier than the question's (or inside the question's own), checked against an
independent reading of the token string, and the arms' own models (untrained) confirm the
premise: no token of an earlier chunk reaches the question through an all-chunked stack, while
one global layer carries it (each with a negative control)."""

from __future__ import annotations

import pytest
import torch

from blocklab.data import synthetic as syn
from blocklab.repro.experiments import chunked as ch

VOCAB = syn.Vocab(16, 16, ch.N_VALUES)


def needles(tokens: list[int]) -> list[int]:
    """Start positions of ``MARK k v`` triples (an independent reading of the sequence)."""
    return [p for p, t in enumerate(tokens) if t == syn.MARK]


def misplaced(e: syn.Example, chunk: int, where: str) -> list[str]:
    """What is wrong with an example's layout (empty: nothing)."""
    tokens, out = e.tokens, []
    length = len(tokens)
    question = length - 2
    if tokens[length - 3] != syn.SEP or not e.targets[-1] or any(e.targets[:-1]):
        out.append("the question is not 'SEP k -> v' at the end")
    starts = needles(tokens)
    gold = [p for p in starts if tokens[p + 1] == tokens[question]]
    if len(gold) != 1 or tokens[gold[0] + 2] != tokens[-1]:
        out.append("no single needle holds the question's key and the answer")
    for p in starts:
        if p // chunk != (p + 2) // chunk:
            out.append(f"needle at {p} straddles a chunk boundary")
        elif (p // chunk < question // chunk) != (where == "earlier chunk"):
            out.append(f"needle at {p} is in chunk {p // chunk}, the question in "
                       f"{question // chunk}")
        if not (tokens[p + 1] in VOCAB.keys and tokens[p + 2] in VOCAB.values):
            out.append(f"needle at {p} is not MARK key value")
    return out


@pytest.mark.parametrize("size", ["quick", "full"])
@pytest.mark.parametrize("where", ch.PLACEMENTS)
def test_held_out_needles_lie_where_they_are_said_to(size, where) -> None:
    s = ch.SETTINGS[size]
    exs = ch.examples(VOCAB, size=size, where=where)
    assert len(exs) == s["n"] and all(len(e.tokens) == s["length"] for e in exs)
    for e in exs:
        assert len(needles(e.tokens)) == s["distractors"] + 1
        assert not misplaced(e, s["chunk"], where), misplaced(e, s["chunk"], where)
    if where == "earlier chunk":  # every earlier chunk holds gold needles
        query_chunk = (s["length"] - 2) // s["chunk"]
        assert {e.meta["gold_chunk"] for e in exs} == set(range(query_chunk))


def test_the_layout_check_catches_a_misplaced_needle() -> None:
    """Negative control: a needle moved across a boundary, or into the question's chunk."""
    s = ch.SETTINGS["quick"]
    e = ch.examples(VOCAB, size="quick", where="earlier chunk")[0]
    p, c = e.meta["gold_index"], s["chunk"]
    for to in ((p // c + 1) * c - 2, s["length"] - 6):  # straddling; in the question's chunk
        tokens = list(e.tokens)
        triple = tokens[p:p + 3]
        tokens[p:p + 3] = [VOCAB.filler[0]] * 3
        tokens[to:to + 3] = triple
        assert misplaced(syn.Example(tokens, e.targets), c, "earlier chunk")
    with pytest.raises(ValueError, match="where="):
        ch.placed_needles(syn.example_rng(0, 0), VOCAB, 64, 16, n_distractors=0, where="nowhere")


def _model(arm_name: str, size: str = "quick") -> torch.nn.Module:
    from blocklab.config import compose, validate_train
    from blocklab.model import build_model
    from blocklab.repro.runner import RUN_DEFAULTS
    from blocklab.train.run import to_train_config

    arm = next(a for a in ch.arms(size) if a.name == arm_name)
    tc = validate_train(to_train_config(compose("train", [*RUN_DEFAULTS, *arm.overrides])))
    tc.model.vocab_size = VOCAB.size
    torch.manual_seed(0)
    return build_model(tc.model).eval()


@torch.no_grad()
def _answer_moves(model: torch.nn.Module, where: str) -> bool:
    """Whether changing the gold needle's value changes the logits at the question."""
    e = ch.examples(VOCAB, size="quick", where=where)[0]
    p = e.meta["gold_index"]
    a = torch.tensor([e.tokens[:-1]])
    b = a.clone()
    b[0, p + 2] = VOCAB.values[0] if e.tokens[p + 2] != VOCAB.values[0] else VOCAB.values[1]
    return not torch.allclose(model(a)[0, -1], model(b)[0, -1], atol=1e-6)


def test_an_earlier_chunk_reaches_the_question_only_through_a_global_layer() -> None:
    chunked, hybrid, full = (_model(n) for n in (ch.ALL_CHUNKED, ch.HYBRID, ch.FULL))
    assert not _answer_moves(chunked, "earlier chunk")  # out of reach: chance is the ceiling
    assert _answer_moves(hybrid, "earlier chunk") and _answer_moves(full, "earlier chunk")
    assert _answer_moves(chunked, "same chunk")  # negative control: the probe sees a change


def test_the_arms_differ_in_the_mixer_alone_and_the_breaks_are_caught() -> None:
    for size in ("quick", "full"):
        arms = {a.name: set(a.overrides) for a in ch.arms(size)}
        shared = set.intersection(*arms.values())
        assert arms[ch.FULL] == shared
        assert all(o.startswith("model.mixer.") for a in arms.values() for o in a - shared)
        assert ch.size_of(next(iter(ch.arms(size)))) == size
    exp = ch.make("quick")
    assert set(exp.breaks) == {"no-global", "chunks-ignored"}
    checks = exp.sizes["quick"].checks
    good = {ch.ALL_CHUNKED: (0.06, 1.0), ch.HYBRID: (0.98, 1.0), ch.FULL: (0.99, 1.0)}

    def results(rates):
        return {arm: {w: [ch.ms.Tally(round(r * 256), 256)] for w, r in
                      zip(ch.PLACEMENTS, rs)} for arm, rs in rates.items()}

    assert all(c.evaluate(results(good))[1] for c in checks)
    for broken in ({**good, ch.HYBRID: good[ch.ALL_CHUNKED]},  # no-global
                   {**good, ch.ALL_CHUNKED: good[ch.FULL]}):  # chunks-ignored
        assert not all(c.evaluate(results(broken))[1] for c in checks)

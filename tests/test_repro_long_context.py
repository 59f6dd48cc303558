"""``long_context`` measures what it claims: forced choice picks, per item, the label whose
total log-likelihood after the prompt is highest — checked against scoring each label by its
own forward, for one-token and several-token labels, plain and segment by segment through the
evaluation carry (negative control: a scorer reading one position off is caught); the held-out
items are the training data's format over the held-out haystack, from the repro seed; the arms
differ in their strategy overrides alone and the break makes the window arm the global one. The
quick protocol itself runs in tests/test_repro.py (QUICK_GROUPS)."""

from __future__ import annotations

import random

import pytest
import torch

from blocklab.objectives import CausalLM, SegmentedLM
from blocklab.repro import measure as ms
from blocklab.repro.experiments import long_context as lc

VOCAB = 48


def _model(*overrides: str) -> torch.nn.Module:
    from blocklab.config import compose, validate_train
    from blocklab.config.compose import model_to_dict
    from blocklab.model import build_model
    from blocklab.repro.runner import RUN_DEFAULTS
    from blocklab.train.run import to_train_config

    tc = validate_train(to_train_config(compose("train", [
        *RUN_DEFAULTS, "model/position=rope", "model.d_model=32", "model.n_heads=2",
        "model.d_ff=64", "model.n_layers=2", "model.max_seq_len=16", f"model.vocab_size={VOCAB}",
        *overrides])))
    torch.manual_seed(0)
    return build_model(model_to_dict(tc.model)).eval()


def _brute(objective, model, items: lc.Items) -> list[int]:
    """Each label scored alone: one forward over prompt + label, its tokens' log-probs summed."""
    out = []
    for p in items.prompts:
        scores = []
        for lab in items.labels:
            ids = torch.tensor([p + lab])
            with torch.no_grad():
                nll = objective.token_nll(model, ids)[0]
            scores.append(-float(nll[len(p) - 1:].sum()))
        out.append(max(range(len(scores)), key=scores.__getitem__))
    return out


def _items(labels: list[list[int]], n: int = 12) -> lc.Items:
    rng = random.Random(0)
    prompts = [[1] + [rng.randrange(4, VOCAB) for _ in range(rng.randint(20, 40))]
               for _ in range(n)]
    return lc.Items(prompts, labels, [rng.randrange(len(labels)) for _ in range(n)])


@pytest.mark.parametrize("labels", [[[5], [6], [7], [8]], [[5, 9], [5, 10, 11], [12], [13, 9]]],
                         ids=["one-token", "several-token"])
@pytest.mark.parametrize("segmented", [False, True], ids=["plain", "segments"])
def test_forced_choice_is_the_best_label_scored_alone(labels, segmented) -> None:
    if segmented:
        model = _model("model.mixer.mem_len=8", "data.segment_mode=split", "data.seq_len=8",
                       "data.doc_len=48", "data.min_len=32", "data.curriculum=[]",
                       "model.max_seq_len=8")
        objective = SegmentedLM(seg_len=8, mode="split")
    else:
        model, objective = _model(), CausalLM()
    items = _items(labels)
    best = _brute(objective, model, items)
    for answers in (best, [(b + 1) % len(labels) for b in best]):
        got = lc.forced_choice(objective, model, lc.Items(items.prompts, labels, answers),
                               pad=0, batch_size=5)
        assert got.trials == len(best)
        assert got.hits == (len(best) if answers is best else 0)


def test_a_scorer_one_position_off_is_caught(monkeypatch) -> None:
    """Negative control: forced choice fed logits shifted by one position no longer agrees
    with the labels scored alone."""
    model, objective = _model(), CausalLM()
    items = _items([[5], [6], [7], [8]], n=24)
    best = _brute(objective, model, items)

    class Shifted(CausalLM):
        def logits(self, model, batch, **kw):
            out = super().logits(model, batch, **kw)
            return torch.cat((out[:, :1], out[:, :-1]), 1)

    got = lc.forced_choice(Shifted(), model, lc.Items(items.prompts, items.labels, best), pad=0)
    assert got.hits < got.trials


def test_arms_differ_in_their_strategy_alone_and_the_break_makes_window_global() -> None:
    for size in ("quick", "full"):
        arms = lc.arms(size)
        s = lc.SETTINGS[size]
        assert len({a.overrides for a in arms}) == len(arms) == len(s["arms"])
        base = set(lc._base(s))
        for a in arms:
            extra = [o for o in a.overrides if o not in base]
            assert tuple(extra) == lc._strategy(
                next(k for k, v in lc.NAMES.items() if v == a.name), s)
        broken = lc.make(size).breaks["window-ignored"][1](arms)
        by = {a.name: a for a in broken}
        assert by[lc.NAMES["window"]].overrides == by[lc.NAMES["global"]].overrides


def test_the_state_checks_catch_the_break_on_synthetic_results() -> None:
    exp = lc.make("quick")
    arms = exp.sizes["quick"].arms
    good = {a.name: {lc.STATE_RATIO: [ms.Scalar(16.0 if a.name == lc.NAMES["global"] else 1.0)]}
            for a in arms}
    state = [c for c in exp.sizes["quick"].checks if c.metric == lc.STATE_RATIO]
    assert state and all(c.evaluate(good)[1] for c in state)
    bad = {**good, lc.NAMES["window"]: {lc.STATE_RATIO: [ms.Scalar(16.0)]}}
    assert not all(c.evaluate(bad)[1] for c in state)


def test_held_out_items_are_the_training_format_over_the_held_out_haystack() -> None:
    from tokenizers import Tokenizer

    from blocklab.config import compose
    from blocklab.data.babi import TASK_LABELS
    from blocklab.data.babilong import PROMPT
    from blocklab.data.babilong_train import haystack_documents, split_sentences, tokenizer_for
    from blocklab.train.run import to_train_config

    tc = to_train_config(compose("train", ["data=babilong", "tokenizer=byte",
                                           "data.babilong_facts=2"]))
    tok, specials = tokenizer_for(tc.data, tc.tokenizer, haystack_documents("shakespeare"))
    items = lc.held_out(tc.data, tok.to_str(), specials.bos, length=400, n=6)
    again = lc.held_out(tc.data, tok.to_str(), specials.bos, length=400, n=6)
    other = lc.held_out(tc.data, tok.to_str(), specials.bos, length=400, n=6, seed=0)
    assert items == again and items.prompts != other.prompts
    decode = Tokenizer.from_str(tok.to_str()).decode
    _, val = split_sentences(haystack_documents("shakespeare"))
    labels = TASK_LABELS[lc.TASK]
    assert [decode(lab) for lab in items.labels] == [" " + x for x in labels]
    for p, a in zip(items.prompts, items.answers):
        assert p[0] == specials.bos and 400 - 12 <= len(p) + len(items.labels[a]) <= 400
        text = decode(p[1:])
        assert text.endswith(" Answer:") and "\n\n" in text
        context, question = text.rsplit("\n\n", 1)
        assert PROMPT.format(context=context, question=question[:-len(" Answer:")]) == text
        # the answer is the asked actor's last room (qa1), read from the context's facts
        actor = question.split()[-2].rstrip("?")
        moves = [s for s in context.replace(".", ".\n").split("\n") if actor + " " in s
                 and any(x in s for x in labels)]
        assert moves and labels[a] in moves[-1]
        # haystack text from the held-out part (the last 10 % of the sentences)
        assert any(s[:30] in context for s in val)

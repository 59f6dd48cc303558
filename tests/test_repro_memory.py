"""The memory experiments measure what they claim: ``memory_recall``'s held-out documents put
the fact segments before its question and its carried reading equals the plain forward when
the memory holds the whole document; ``xl_memory``'s carried losses equal the plain per-token
losses under the same condition (each with a negative control: a bounded memory differs); the
arms differ in their memory options alone and the checks catch each break on synthetic
results. The quick protocols themselves run in tests/test_repro.py (QUICK_GROUPS)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blocklab.data import synthetic as syn
from blocklab.repro import measure as ms
from blocklab.repro.experiments import memory_recall as mr
from blocklab.repro.experiments import xl_memory as xl


def _model(overrides: tuple[str, ...], extra: tuple[str, ...] = ()) -> torch.nn.Module:
    from omegaconf import OmegaConf

    from blocklab.config import compose, validate_train
    from blocklab.config.compose import model_to_dict
    from blocklab.model import build_model
    from blocklab.repro.runner import RUN_DEFAULTS
    from blocklab.train.run import to_train_config

    tc = validate_train(to_train_config(compose("train", [*RUN_DEFAULTS, *overrides])))
    cfg = OmegaConf.create(model_to_dict(tc.model))
    if cfg.vocab_size is None:  # the tokenizer's size, filled in by training
        cfg.vocab_size = 96
    for item in extra:  # model keys changed after validation (a memory the rules refuse)
        key, _, value = item.partition("=")
        OmegaConf.update(cfg, key, None if value == "null" else int(value))
    torch.manual_seed(0)
    return build_model(OmegaConf.to_container(cfg)).eval(), tc


def _arm(exp, name: str, size: str = "quick"):
    arms = exp.arms(size) if hasattr(exp, "arms") else exp._protocol(size).arms
    return next(a for a in arms if a.name == name)


@pytest.mark.parametrize("size", ["quick", "full"])
def test_held_out_facts_lie_segments_before_their_questions(size) -> None:
    s = mr.SETTINGS[size]
    vocab = syn.Vocab(16, 16, mr.N_VALUES)
    for n in s["measured"]:
        docs = mr.examples(vocab, size=size, segments=n)
        assert len(docs) == s["n"]
        for d in docs[:32]:
            t = s["seg"]
            assert len(d.tokens) == n * t and d.meta["segments_back"] == n - 1
            answers = [u for u, on in enumerate(d.targets) if on]
            assert len(answers) == s["pairs"] and min(answers) >= (n - 1) * t
            for u in answers:  # the key's record is in the first segment, nowhere later
                k = d.tokens[u - 1]
                assert k in d.tokens[1:t] and k not in d.tokens[t:u - 1]


def test_carried_accuracy_equals_the_plain_forward_when_the_memory_holds_everything() -> None:
    arm = _arm(mr, mr.XL)
    whole, tc = _model(arm.overrides, ("mixer.mem_len=null",))
    vocab = ms.vocab_of(tc.data)
    docs = mr.examples(vocab, size="quick", segments=2)[:48]
    plain = ms.accuracy(whole, docs)
    carried = mr.carried_accuracy(whole, docs, seg_len=mr.SETTINGS["quick"]["seg"])
    assert (carried.hits, carried.trials) == (plain.hits, plain.trials) and plain.trials == 48
    # the hits themselves, and a bounded memory's logits differ (control)
    from blocklab.data.segment_collate import SegmentCollate
    from blocklab.model.carry import run_segments

    batch = SegmentCollate("split", 16)(docs)

    def logits(model):
        carry = model.new_cache(48, 32, carry=True, mem="eval")
        with torch.no_grad():
            return run_segments(model, batch["input_ids"], seg_len=16, cache=carry,
                                valid=batch["valid"], segments=batch["segments"])

    real = batch["valid"]  # a document's last token is no input: its slot is padding
    with torch.no_grad():
        full = whole(batch["input_ids"], valid=real)[real]
    torch.testing.assert_close(logits(whole)[real], full, atol=1e-5, rtol=1e-5)
    none, _ = _model(_arm(mr, mr.NONE).overrides)
    none.load_state_dict(whole.state_dict())
    with pytest.raises(AssertionError):
        torch.testing.assert_close(logits(none)[real], full, atol=1e-5, rtol=1e-5)


def test_xl_carried_losses_equal_the_plain_losses_when_the_memory_holds_everything() -> None:
    on = _arm(xl, xl.ON).overrides
    model, _ = _model(on, ("mixer.mem_len=null",))
    torch.manual_seed(1)
    ids = torch.randint(0, model.embed.weight.shape[0], (3, 4 * 16 + 1))
    carried = xl.carried_losses(model, ids, 16)
    with torch.no_grad():
        plain = F.cross_entropy(model(ids[:, :-1]).float().transpose(1, 2), ids[:, 1:],
                                reduction="none")
    torch.testing.assert_close(carried, plain, atol=1e-5, rtol=1e-5)
    bounded, _ = _model(on, ("mixer.mem_len=8",))
    bounded.load_state_dict(model.state_dict())
    with pytest.raises(AssertionError):  # control: a memory of 8 tokens reads less
        torch.testing.assert_close(xl.carried_losses(bounded, ids, 16), plain, atol=1e-5,
                                   rtol=1e-5)


def _results(rates: dict[str, dict[str, float]], scalar: bool) -> dict:
    def tally(r):
        return ms.Scalar(r) if scalar else ms.Tally(round(r * 256), 256)
    return {arm: {m: [tally(r)] for m, r in metrics.items()} for arm, metrics in rates.items()}


def test_the_arms_differ_in_their_memory_alone_and_the_checks_catch_each_break() -> None:
    for size in ("quick", "full"):
        arms = {a.name: set(a.overrides) for a in mr.arms(size)}
        shared = set.intersection(*arms.values())
        assert arms[mr.NONE] == shared and arms[mr.XL_DROPPED] == arms[mr.XL]
        assert all(o.startswith(("model.mixer.", "model/mixer=", "model.memory_tokens"))
                   for a in arms.values() for o in a - shared)
        assert mr.size_of(next(iter(mr.arms(size)))) == size
    metric = mr._metric(2)
    checks = mr.make("quick").sizes["quick"].checks
    good = {mr.NONE: {metric: 0.06}, mr.XL: {metric: 1.0}, mr.RETRIEVAL: {metric: 0.86},
            mr.XL_DROPPED: {metric: 0.055}}
    assert all(c.evaluate(_results(good, False))[1] for c in checks)
    for broken in ({**good, mr.XL: good[mr.NONE]}, {**good, mr.RETRIEVAL: {metric: 0.3}},
                   {**good, mr.NONE: {metric: 0.5}}, {**good, mr.XL: good[mr.XL_DROPPED]},
                   {**good, mr.XL_DROPPED: good[mr.XL]}):
        assert not all(c.evaluate(_results(broken, False))[1] for c in checks)
    # xl_memory: memory on below off at the segment start, and relied on
    checks = xl.make("quick").sizes["quick"].checks
    ok = {xl.OFF: {xl.FIRST: 2.27}, xl.ON: {xl.FIRST: 2.23}, xl.DROPPED: {xl.FIRST: 2.41},
          xl.LONGER: {xl.FIRST: 2.3}}
    assert all(c.evaluate(_results(ok, True))[1] for c in checks)
    for broken in ({**ok, xl.ON: ok[xl.OFF]}, {**ok, xl.DROPPED: {xl.FIRST: 2.2}}):
        assert not all(c.evaluate(_results(broken, True))[1] for c in checks)
    arms = {a.name: a for a in xl._protocol("full").arms}
    assert set(arms[xl.ON].overrides) - set(arms[xl.OFF].overrides) == {
        f"model.mixer.mem_len={xl.SETTINGS['full']['mem']}"}
    assert arms[xl.LONGER].overrides == arms[xl.ON].overrides == arms[xl.DROPPED].overrides

"""blocklab-repro stability (issue 47, item 3): the small-scale proxies of Wortsman et al. 2023
(arXiv 2309.14322). The arms are the paper's recipe field by field on the Shakespeare
characters, the learning-rate sensitivity is the paper's definition, the measured attention
logit and log Z agree with a direct computation, and each check fails where it should. The
quick protocol and its break: tests/test_repro.py (QUICK_GROUPS)."""

from __future__ import annotations

import math

import pytest
import torch

from blocklab.repro import experiments as ex
from blocklab.repro import protocol as pr
from blocklab.repro.experiments import stability as st
from blocklab.repro.experiments import stability_checks as sc
from blocklab.repro.measure import Scalar


def _config(arm: pr.Arm):
    from blocklab.config import compose, validate_train
    from blocklab.train.run import to_train_config

    return validate_train(to_train_config(compose("train", list(arm.overrides))))


def test_the_arms_are_the_papers_recipe():
    """AdamW (0.9, 0.95), eps 1e-8, independent decay 1e-4, clip 1, warmup 10 % then cosine,
    on experiment=shakespeare_char's model; the knobs change only what they name; every run
    has one seed and one data order; the depth arms are 24 layers with their block and warmup."""
    exp = ex.experiment("stability", "full")
    arms = {a.name: a for a in exp.sizes["full"].arms}
    assert len(arms) == 3 * 6 + 4
    seen = set()
    for name, arm in arms.items():
        tc = _config(arm)
        o, s, m, d = tc.optim, tc.schedule, tc.model, tc.data
        assert (o.name, list(o.betas), o.eps, o.weight_decay_mode, o.weight_decay,
                o.grad_clip) == ("adamw", [0.9, 0.95], 1e-8, "independent", 1e-4, 1.0), name
        assert (s.name, s.min_lr_ratio, tc.trainer.max_steps, tc.trainer.threads) == (
            "cosine", 0.01, st.STEPS["full"], 1)
        assert (d.corpus, tc.tokenizer.name.value, d.seq_len, d.batch_size, tc.seed) == (
            "shakespeare", "char", 64, 12, 0)
        assert m.norm.name == "layernorm" and m.position.name == "learned"
        parsed = sc.split_name(name)
        if parsed is not None:
            knob, lr = parsed
            seen.add(parsed)
            assert o.lr == lr and s.warmup_ratio == 0.1 and m.block.name == "pre"
            assert (m.n_layers, m.d_model, m.n_heads) == (4, 128, 4)
            assert (m.mixer.get("qk_norm"), m.mixer.get("qk_norm_scope", "head")) == (
                ("layernorm", "head") if knob == "qk-norm" else (None, "head"))
            assert o.z_loss == (1e-4 if knob == "z-loss" else 0.0)
            continue
        assert (m.n_layers, m.d_model, o.lr, m.mixer.get("qk_norm"), o.z_loss) == (
            24, 64, st.DEPTH_LR, None, 0.0)
        block, warm = {"pre-norm": ("pre", True), "post-norm no warmup": ("post", False),
                       "post-norm warmup": ("post", True),
                       "deepnorm": ("deepnorm", False)}[name.removeprefix("depth 24 ")]
        assert m.block.name == block
        assert (s.warmup_ratio, s.warmup_steps) == ((0.1, None) if warm else (None, 0))
    assert seen == {(k, lr) for k in st.KNOBS for lr in st.GRID["full"]}


def _results(losses: dict[str, list[float]], logits: dict[str, list[float]] | None = None,
             lrs=(1e-3, 1e-2, 1e-1)):
    out: dict = {}
    for arm, values in losses.items():
        for i, lr in enumerate(lrs):
            row = out.setdefault(sc.arm_name(arm, lr), {})
            row[sc.LOSS] = [Scalar(values[i])]
            row[sc.LOGZ] = [Scalar(1.0)]
            if logits:
                row[sc.LOGIT] = [Scalar(logits[arm][i])]
    return out


def test_sensitivity_is_the_papers_definition():
    """Mean over the grid of min(loss, initial) - the arm's best; a diverged (non-finite or
    above the initial loss) run reads as the initial loss."""
    assert sc.capped(float("nan"), 4.5) == sc.capped(7.0, 4.5) == 4.5
    assert sc.capped(2.0, 4.5) == 2.0
    losses = [2.0, 1.5, sc.capped(float("inf"), 4.5)]
    assert sc.sensitivity(losses) == pytest.approx((0.5 + 0.0 + 3.0) / 3)
    assert sc.sensitivity([1.7, 1.7]) == 0.0


def test_the_grid_checks_pass_and_fail_where_they_should():
    lrs = (1e-3, 1e-2, 1e-1)
    growth = sc.LogitGrowth("baseline", lrs, 3.0)
    for top, passed in ((3.1, True), (2.9, False)):
        r = _results({"baseline": [2, 2, 2]}, {"baseline": [1.0, top, 0.5]}, lrs)
        assert growth.evaluate(r)[1] is passed
    sens = sc.Sensitivity("qk-norm", lrs, other="baseline", ratio=0.7, slack=0.05)
    base = [2.0, 1.8, 4.0]  # sensitivity (0.2 + 0 + 2.2) / 3 = 0.8
    assert sens.evaluate(_results({"baseline": base, "qk-norm": [1.9, 1.8, 2.4]}, lrs=lrs))[1]
    # the negative controls: the same arm twice (ratio 1), a lower sensitivity at a worse best
    assert not sens.evaluate(_results({"baseline": base, "qk-norm": base}, lrs=lrs))[1]
    assert not sens.evaluate(_results({"baseline": base, "qk-norm": [1.9, 1.9, 1.9]},
                                      lrs=lrs))[1]
    degrades = sc.Degrades("baseline", lrs, 0.1)
    assert degrades.evaluate(_results({"baseline": base}, lrs=lrs))[1]
    assert not degrades.evaluate(_results({"baseline": [2.0, 1.8, 1.85]}, lrs=lrs))[1]
    bounded = sc.Bounded("qk-norm", lrs, other="baseline", factor=3.0)
    ok = {"baseline": [1, 5, 30.0], "qk-norm": [1, 2, 9.0]}
    assert bounded.evaluate(_results({"baseline": base, "qk-norm": base}, ok, lrs))[1]
    ok["qk-norm"][-1] = 11.0
    assert not bounded.evaluate(_results({"baseline": base, "qk-norm": base}, ok, lrs))[1]
    reported = sc.Reported("z-loss", lrs, other="baseline")
    assert reported.evaluate(_results({"baseline": base, "z-loss": base}, lrs=lrs))[1]
    part = _results({"baseline": base, "qk-norm": base}, lrs=lrs)  # --only: a rate left out
    del part[sc.arm_name("qk-norm", lrs[1])]
    assert sens.evaluate(part) == ("not measured (--only)", False)


def test_the_depth_checks():
    pre, bad, warm, deep = (st.depth_name(a) for a in st.DEPTH)
    gap = sc.Gap(bad, pre, 0.2)
    closes = sc.Closes(bad, pre, (warm, deep), 0.5)

    def results(**loss):
        names = {"pre": pre, "bad": bad, "warm": warm, "deep": deep}
        return {names[k]: {sc.LOSS: [Scalar(v)]} for k, v in loss.items()}

    good = results(pre=2.0, bad=2.5, warm=2.3, deep=2.1)  # deep closes 0.8 of the gap
    assert gap.evaluate(good)[1] and closes.evaluate(good)[1]
    near = results(pre=2.0, bad=2.15, warm=2.1, deep=2.1)
    assert not gap.evaluate(near)[1]
    half_not = results(pre=2.0, bad=2.5, warm=2.3, deep=2.4)  # best closes 0.4
    assert not closes.evaluate(half_not)[1]
    assert not closes.evaluate(results(pre=2.0, bad=1.9, warm=1.0, deep=1.0))[1]  # no gap


def test_the_breaks_make_arms_equal():
    from blocklab.repro.runner import run_key

    for size in pr.SIZES:
        exp = ex.experiment("stability", size)
        arms = exp.sizes[size].arms
        broken = {a.name: a for a in exp.breaks["qk-norm-off"][1](arms)}
        for lr in st.GRID[size]:
            assert (run_key(broken[sc.arm_name("qk-norm", lr)], 0)
                    == run_key(broken[sc.arm_name("baseline", lr)], 0))
        if size == "quick":  # no depth arms: no depth break
            assert set(exp.breaks) == {"qk-norm-off"}
            continue
        deep = {a.name: a for a in exp.breaks["deepnorm-as-post"][1](arms)}
        donor = run_key(deep[st.depth_name("post-norm no warmup")], 0)
        assert run_key(deep[st.depth_name("deepnorm")], 0) == donor
        assert run_key(deep[st.depth_name("post-norm warmup")], 0) == donor
        assert run_key(deep[st.depth_name("pre-norm")], 0) != donor


def _tiny(**kw):
    from blocklab.config import AttentionConfig, ModelConfig, PositionConfig
    from blocklab.model import build_model

    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                   max_seq_len=16, position=PositionConfig(name="learned"),
                                   attention=AttentionConfig(bias=False), **kw)).eval()


@torch.no_grad()
def _direct(model, ids):
    """The largest causal q.k/sqrt(d) and the lowest head entropy, from the fused projection's
    output (hooked) and a softmax written here."""
    outs = []
    hooks = [m.qkv.register_forward_hook(lambda mod, i, o: outs.append(o))
             for m in model.modules() if hasattr(m, "qkv")]
    try:
        logits = model(ids)
    finally:
        for h in hooks:
            h.remove()
    b, t = ids.shape
    best, entropy = -math.inf, math.inf
    for o in outs:
        qkv = o.view(b, t, 3 * 2, -1)
        q, k = qkv[:, :, :2].transpose(1, 2), qkv[:, :, 2:4].transpose(1, 2)
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        allowed = torch.ones(t, t, dtype=torch.bool).tril()
        best = max(best, float(s.masked_fill(~allowed, -math.inf).max()))
        p = s.masked_fill(~allowed, -math.inf).softmax(-1)
        h = -(p * p.clamp_min(1e-30).log()).sum(-1).mean(dim=(0, 2))  # (H,)
        entropy = min(entropy, float(h.min()))
    return best, entropy, torch.logsumexp(logits, -1)


def test_the_probe_reads_what_a_direct_computation_reads():
    """Largest attention logit, lowest entropy and log Z against a direct computation; scaling
    the query rows by 3 scales the logit by 3 (the probe reads the raw score, before any
    softmax); the hook is left off afterwards."""
    model = _tiny()
    ids = torch.randint(8, 40, (3, 12))
    got = st.probe(model, ids)
    best, entropy, logz = _direct(model, ids)
    assert got["max attention logit"] == pytest.approx(best, rel=1e-5)
    assert got["min attention entropy"] == pytest.approx(entropy, rel=1e-4)
    assert got["log Z mean"] == pytest.approx(float(logz.mean()), rel=1e-5)
    assert got["max |log Z|"] == pytest.approx(float(logz.abs().max()), rel=1e-5)
    assert all(m.stats is None for m in model.modules() if hasattr(m, "stats"))
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "qkv"):
                m.qkv.weight[: 2 * m.d_head] *= 3
    assert st.probe(model, ids)["max attention logit"] == pytest.approx(
        _direct(model, ids)[0], rel=1e-5)
    assert st.probe(model, ids)["max attention logit"] > 2.5 * got["max attention logit"]


def test_the_initial_model_is_the_one_training_starts_from():
    """The initial loss's model: the run's config built after seeding with its seed equals, bit
    for bit, the model training builds (seed_everything, then LitModel); another seed differs
    (the negative control)."""
    import dataclasses

    import lightning as L

    from blocklab.config import compose, validate_train
    from blocklab.train.module import LitModel
    from blocklab.train.run import to_train_config

    exp = ex.experiment("stability", "quick")
    tc = to_train_config(compose("train", list(exp.sizes["quick"].arms[0].overrides)))
    tc = validate_train(dataclasses.replace(tc, model=dataclasses.replace(tc.model,
                                                                          vocab_size=92)))
    L.seed_everything(tc.seed, workers=True, verbose=False)
    trained = LitModel(tc, meta={}, flops_per_token=1.0, peak_flops=None,
                       resumed_optim=None).model.state_dict()
    ours = st.initial_model(tc).state_dict()
    other = st.initial_model(dataclasses.replace(tc, seed=tc.seed + 1)).state_dict()
    assert trained.keys() == ours.keys()
    assert all(torch.equal(trained[k], ours[k]) for k in ours)
    assert not all(torch.equal(other[k], ours[k]) for k in ours)

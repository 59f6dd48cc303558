"""The recall-against-state experiment's deliberate defects: each break trains its rows with a
mixer that has exactly the named defect (checked against a brute-force reference), composes
into a valid run, and touches only the rows it names."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from blocklab.repro import measure as ms
from blocklab.repro.experiments.recall_state import (
    IDENTITY_MAP,
    RECALL_STATE,
    TIME_INVARIANT,
    IdentityMapLinear,
    TimeInvariantSSM,
)

BREAKS = {"taylor-identity": ("based ", IDENTITY_MAP, IdentityMapLinear),
          "ssm-input-independent": ("ssm ", TIME_INVARIANT, TimeInvariantSSM)}


def _config(arm_overrides: tuple[str, ...]):
    """The arm's validated train config as its run composes it (64 ids: the task's vocabulary)."""
    from blocklab.config import compose, validate_train
    from blocklab.repro.runner import RUN_DEFAULTS
    from blocklab.train.run import to_train_config

    tc = validate_train(to_train_config(compose("train", [*RUN_DEFAULTS, *arm_overrides])))
    tc.model.vocab_size = 64
    return tc


def _built(arm_overrides: tuple[str, ...]):
    """The arm's model as its run builds it."""
    from blocklab.model import build_model

    return build_model(_config(arm_overrides).model)


def _model(arm_overrides: tuple[str, ...]):
    torch.manual_seed(0)
    overrides = [o for o in arm_overrides if not o.startswith(("data.curriculum", "optim.lr"))]
    return _built(tuple(overrides)).eval()


@pytest.mark.parametrize("what", list(BREAKS))
def test_a_break_swaps_the_mixer_of_its_rows_only(what) -> None:
    prefix, name, cls = BREAKS[what]
    assert what in RECALL_STATE.training_breaks
    arms = RECALL_STATE.sizes["full"].arms
    broken = RECALL_STATE.breaks[what][1](arms)
    changed = [b for a, b in zip(arms, broken) if a != b]
    assert {b.name for b in changed} == {a.name for a in arms if a.name.startswith(prefix)}
    assert changed and all(b.overrides[-1] == f"model.mixer.name={name}" for b in changed)
    model = _model(changed[0].overrides)  # a valid run whose every mixer has the defect
    mixers = [m for m in model.modules() if isinstance(m, cls.__mro__[1])]
    assert mixers and all(type(m) is cls for m in mixers)


def test_the_identity_map_is_linear_attention_with_phi_the_identity() -> None:
    """The broken Based layer's output is ``Σ_{j<=i} (q_i·k_j) v_j / (Σ_{j<=i} q_i·k_j +
    eps)`` of its own projections (after the short convolution), computed pair by pair."""
    from blocklab.model.linear import EPS

    arm = next(a for a in RECALL_STATE.breaks["taylor-identity"][1](
        RECALL_STATE.sizes["full"].arms) if a.name.startswith("based f4"))
    model = _model(arm.overrides)
    layer = next(m for m in model.modules() if isinstance(m, IdentityMapLinear))
    seen = {}
    layer.register_forward_hook(lambda mod, args, out: seen.update(x=args[0], y=out))
    ids = torch.randint(8, 64, (2, 23))
    with torch.no_grad():
        model(ids)
        x = seen["x"]
        taps = layer.conv.kernel_size[0]  # the short convolution: causal, depthwise
        x = F.conv1d(x.transpose(1, 2), layer.conv.weight, layer.conv.bias, padding=taps - 1,
                     groups=x.shape[-1])[..., : x.shape[1]].transpose(1, 2)
        h, e, dv = layer.n_heads, layer.d_key, layer.d_value
        q, k, v = layer.qkv(x).split((h * e, h * e, h * dv), -1)
        b, t, _ = x.shape
        q, k, v = (z.reshape(b, t, h, -1).double() for z in (q, k, v))
        heads = []
        for i in range(t):
            s = torch.einsum("bhe,bjhe->bjh", q[:, i], k[:, : i + 1])  # (B, i+1, H)
            num = torch.einsum("bjh,bjhv->bhv", s, v[:, : i + 1])
            heads.append(num / (s.sum(1)[..., None] + EPS))
        y = layer.out(torch.stack(heads, 1).reshape(b, t, -1).float())
    assert layer.features == e  # feature_dim features per head, not 1 + D + D²
    torch.testing.assert_close(seen["y"], y, rtol=1e-3, atol=1e-4)


def test_the_time_invariant_ssm_selects_the_same_at_every_token() -> None:
    """Δ, B and C of the broken SSM do not depend on the input (every token, every row the
    same), where the selective SSM's do; the layer's output still does."""
    from blocklab.model.ssm import SelectiveSSM

    arm = next(a for a in RECALL_STATE.sizes["full"].arms if a.name.startswith("ssm s4"))
    selective = next(m for m in _model(arm.overrides).modules() if isinstance(m, SelectiveSSM))
    broken = TimeInvariantSSM.__new__(TimeInvariantSSM)
    broken.__dict__ = selective.__dict__  # the same weights, the broken selection
    u = torch.randn(3, 11, selective.d_inner)
    with torch.no_grad():
        for dt, B, C in (broken.selection(u), broken.selection(u * 2 + 1)):
            for z in (dt, B, C):
                assert torch.equal(z, z[:1, :1].expand_as(z))
        assert all(torch.equal(a, b) for a, b in zip(broken.selection(u),
                                                     broken.selection(-u)))
        dt, B, C = selective.selection(u)
        assert not torch.allclose(B, B[:1, :1].expand_as(B))


def test_a_break_of_rows_the_size_lacks_is_refused(tmp_path, monkeypatch, capsys) -> None:
    """The quick size has no Based or SSM row: the break would change nothing and pass, so
    it is refused in one line (exit 2), nothing written."""
    from blocklab.repro import main

    monkeypatch.chdir(tmp_path)
    for what in BREAKS:
        with pytest.raises(SystemExit) as e:
            main(["recall_state", "--size", "quick", "--break", what])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"--break {what}: changes no row" in err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "outputs").exists()


def test_only_trains_the_named_arms_and_never_passes(tmp_path, monkeypatch) -> None:
    """``--only``: the arms whose names contain the words, nothing else trained; checks of
    arms left out read 'not measured' and fail, so a part of a table never passes."""
    from blocklab.repro import runner

    exp = dataclasses.replace(RECALL_STATE, measure=lambda run, arm: {
        "accuracy": ms.Tally(99, 100), "state bytes": ms.Scalar(1.0)})
    trained = []

    def fake(arm, sweep, seed, root, *, experiment, log):
        trained.append(arm.name)
        return tmp_path / arm.name, 1, {"seed": seed, "select": "x", "mode": "max",
                                        "chosen_lr": 1e-3, "tried": [], "untried": []}

    monkeypatch.setattr(runner, "train_sweep", fake)
    out = runner.run(exp, size="quick", seeds=1, root=tmp_path, only=("attention",),
                     log=lambda s: None)
    assert trained == ["attention 64/4"] and set(out.measurements) == {"attention 64/4"}
    assert not out.passed
    verdicts = {r["expected"]: r for r in out.rows}
    assert sum(r["observed"] == "not measured (--only)" for r in out.rows) == 2
    assert any(r["passed"] for r in verdicts.values())  # attention >= 0.95 itself is checked


def test_only_naming_no_arm_is_refused(tmp_path, monkeypatch, capsys) -> None:
    from blocklab.repro import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["recall_state", "--size", "quick", "--only", "mamba"])
    assert e.value.code == 2 and "--only 'mamba': names no arm" in capsys.readouterr().err
    assert not (tmp_path / "outputs").exists()


def test_the_flip_flop_row_trains_the_task_and_is_measured_beyond_its_gaps(monkeypatch) -> None:
    """The selection row trains flip_flop alone (validation on it, a fixed budget: no early
    stop) and is measured on held-out sequences 4x as long with writes 10x sparser, plus the
    trained distribution; the break turns its mixer time-invariant like the other SSM rows."""
    from pathlib import Path
    from types import SimpleNamespace

    from blocklab.data.synthetic import Vocab
    from blocklab.repro.experiments import recall_state as recall

    arm = recall.flip_flop_arm()
    assert arm in RECALL_STATE.sizes["full"].arms and arm not in RECALL_STATE.sizes["quick"].arms
    assert not any(o.startswith("callbacks") for o in arm.overrides)
    from blocklab.model.ssm import SelectiveSSM

    tc = _config(arm.overrides)
    ssms = [m for m in _built(arm.overrides).modules() if isinstance(m, SelectiveSSM)]
    assert len(ssms) == 2 and all(type(m) is SelectiveSSM for m in ssms)  # selective, 2 layers
    assert {k for k, v in dataclasses.asdict(tc.data.tasks).items() if v} == {"flip_flop"}
    assert tc.data.val_tasks == ["flip_flop"] and tc.data.curriculum == []
    assert tc.data.seq_len == tc.data.min_len == recall.FLIP_FLOP_LENGTH

    seen: list = []
    monkeypatch.setattr(ms, "load", lambda run: SimpleNamespace(model=None, vocab=Vocab()))
    monkeypatch.setattr(ms, "accuracy", lambda model, examples: seen.append(examples)
                        or ms.Tally(1, 1))
    assert set(recall._measure(Path("run"), arm)) == {"accuracy", "accuracy at the trained gaps"}
    far, trained = seen
    assert len(far) == len(trained) == recall.N_MEASURED
    assert {len(e.tokens) for e in far} == {4 * recall.FLIP_FLOP_LENGTH + 1}
    assert {len(e.tokens) for e in trained} == {recall.FLIP_FLOP_LENGTH + 1}
    mean = [sum(e.meta["distance"] for e in ex) / len(ex) for ex in (far, trained)]
    assert mean[0] > 5 * mean[1]  # the last write much farther back than in training
    assert all(sum(e.targets) == 1 for e in far + trained)  # one read, at the end

    (broken,) = RECALL_STATE.breaks["ssm-input-independent"][1]((arm,))
    assert broken.overrides[-1] == f"model.mixer.name={TIME_INVARIANT}"


def test_each_full_row_trains_with_one_head_and_its_family_s_rates() -> None:
    """Zoology's and Based's layout: one head for every mixer that has heads (the hybrid keeps
    the two it was measured with); the linear-attention and convolution rows sweep Based's
    higher rates first, the attention rows attention's, the SSM rows attention's without 3e-3.
    The built models agree with the overrides."""
    from blocklab.model.attention import SoftmaxAttention
    from blocklab.model.linear import LinearAttention
    from blocklab.repro.experiments.recall_state import RECURRENT_SWEEP, SSM_SWEEP, SWEEP

    for arm in RECALL_STATE.sizes["full"].arms:
        if arm.name.endswith(" flip-flop"):
            continue
        based_rates = arm.name.startswith(("based", "linear", "gated conv"))
        want = (RECURRENT_SWEEP if based_rates else SSM_SWEEP if arm.name.startswith("ssm")
                else SWEEP["full"])
        assert arm.sweep == want, arm.name
        layers = [m for m in _built(arm.overrides).modules()
                  if isinstance(m, (SoftmaxAttention, LinearAttention))]
        assert {m.n_heads for m in layers} <= ({2} if "hybrid" in arm.name else {1}), arm.name
        assert bool(layers) == (arm.name.startswith(("attention", "window", "based", "linear",
                                                     "hybrid"))), arm.name
    assert {a.sweep for a in RECALL_STATE.sizes["quick"].arms} == {SWEEP["quick"]}

"""blocklab-repro: the checks decide pass/fail correctly (on hand-made tallies, including the
borderline cases), measurements are what they claim (exact sequence layouts), runs are cached
by content and a break reuses them, and the command's exit codes and usage errors."""

from __future__ import annotations

import json
import math

import pytest

from blocklab.data import synthetic as syn
from blocklab.data.tasks.mqar import mqar
from blocklab.repro import checks as ck
from blocklab.repro import experiments as ex
from blocklab.repro import measure as ms
from blocklab.repro import protocol as pr
from blocklab.repro.experiments.mqar import elimination_line
from blocklab.repro.runner import run_key, with_lr
from inprocess import SAFETY_S


def _t(rate: float, n: int = 200) -> ms.Tally:
    return ms.Tally(round(rate * n), n)


def test_at_least_and_at_most_hold_on_every_seed() -> None:
    res = {"a": {"acc": [_t(0.97), _t(0.96), _t(0.99)]}}
    assert ck.AtLeast("a", "acc", 0.95).evaluate(res)[1]
    res["a"]["acc"][1] = _t(0.94)  # one seed below: the pooled mean (0.967) must not rescue it
    assert not ck.AtLeast("a", "acc", 0.95).evaluate(res)[1]
    assert ck.AtMost("a", "acc", 0.99).evaluate(res)[1]
    assert not ck.AtMost("a", "acc", 0.98).evaluate(res)[1]


def test_beats_needs_every_seed_and_separated_intervals() -> None:
    res = {"a": {"m": [_t(0.8), _t(0.82)]}, "b": {"m": [_t(0.3), _t(0.35)]}}
    assert ck.Beats("a", "m", other="b").evaluate(res)[1]
    assert not ck.Beats("b", "m", other="a").evaluate(res)[1]
    # every seed above, but with 20 trials per seed the intervals overlap: not established
    close = {"a": {"m": [_t(0.6, 20), _t(0.6, 20)]}, "b": {"m": [_t(0.5, 20), _t(0.5, 20)]}}
    assert not ck.Beats("a", "m", other="b").evaluate(close)[1]
    # identical runs (a broken variant that trains a like b) can never beat each other
    same = {"a": {"m": [_t(0.7)]}, "b": {"m": [_t(0.7)]}}
    assert not ck.Beats("a", "m", other="b").evaluate(same)[1]


def test_at_chance_and_close() -> None:
    chance = 1 / 64
    assert ck.AtChance("a", "far", chance=chance).evaluate({"a": {"far": [ms.Tally(4, 256)]}})[1]
    assert not ck.AtChance("a", "far", chance=chance).evaluate(
        {"a": {"far": [ms.Tally(40, 256)]}})[1]
    res = {"a": {"n": [_t(0.93)]}, "b": {"n": [_t(0.95)]}}
    assert ck.Close("a", "n", other="b", tolerance=0.05).evaluate(res)[1]
    assert not ck.Close("a", "n", other="b", tolerance=0.01).evaluate(res)[1]
    with pytest.raises(KeyError, match="no measurement"):
        ck.AtLeast("zzz", "n", 0.5).evaluate(res)


def test_elimination_line() -> None:
    assert elimination_line(1) == 1.0
    assert math.isclose(elimination_line(4), (1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)


def test_recall_at_gap_layout() -> None:
    vocab = syn.Vocab()
    items = ms.recall_at_gap(vocab, n=20, pairs=4, gap=5)
    for e in items:
        assert len(e.tokens) == 1 + 8 + 5 + 3 and e.tokens[0] == syn.BOS
        keys, values = e.tokens[1:9:2], e.tokens[2:9:2]
        assert len(set(keys)) == 4 and len(set(values)) == 4
        assert e.tokens[-3:] == [syn.SEP, keys[-1], values[-1]]
        assert e.targets == [False] * (len(e.tokens) - 1) + [True]
        assert all(t in vocab.filler for t in e.tokens[9:14])
        assert e.tokens.index(values[-1]) == len(e.tokens) - 1 - e.meta["distance"]
    assert items != ms.recall_at_gap(vocab, n=20, pairs=4, gap=5, seed=1)


def test_mqar_spread_layout_and_distances() -> None:
    vocab = syn.Vocab()
    for i in range(30):
        e = mqar(syn.example_rng(0, i, "t"), vocab, 64, pairs=4)
        assert len(e.tokens) == 64 and sum(e.targets) == 4
        pairs = dict(zip(e.tokens[1:9:2], e.tokens[2:9:2]))
        answers = [t for t, on in enumerate(e.targets) if on]
        asked = [e.tokens[t - 1] for t in answers]
        assert sorted(asked) == sorted(pairs)  # every key asked once
        for t, d in zip(answers, e.meta["distances"]):
            assert e.tokens[t - 2] == syn.SEP and e.tokens[t] == pairs[e.tokens[t - 1]]
            assert e.tokens[t - d] == e.tokens[t]  # the distance points at the stored value
    with pytest.raises(ValueError, match="need length"):
        mqar(syn.example_rng(0, 0), vocab, 20, pairs=4)


def test_mqar_zoology_layout_is_the_papers() -> None:
    """Zoology's _mqar: records ``k v`` first, then each key once at the start of a 2-token
    slot with its value after it (the target), one constant filler id everywhere else; no
    BOS, no SEP; keys and values from disjoint ranges."""
    vocab = syn.Vocab(n_filler=4, n_keys=32, n_values=32)
    for i in range(40):
        n, length = (4, 64) if i % 2 else (16, 256)
        e = mqar(syn.example_rng(0, i, "z"), vocab, length, pairs=n, layout="zoology")
        assert len(e.tokens) == length == len(e.targets) and sum(e.targets) == n
        keys, values = e.tokens[0:2 * n:2], e.tokens[1:2 * n:2]
        assert set(keys) <= set(vocab.keys) and set(values) <= set(vocab.values)
        assert len(set(keys)) == n and not any(e.targets[:2 * n])
        answers = [t for t, on in enumerate(e.targets) if on]
        assert all((t - 2 * n) % 2 == 1 for t in answers)  # the second token of a slot
        assert sorted(e.tokens[t - 1] for t in answers) == sorted(keys)  # each key once
        for t, d in zip(sorted(answers, key=lambda t: keys.index(e.tokens[t - 1])),
                        e.meta["distances"]):
            assert e.tokens[t] == values[keys.index(e.tokens[t - 1])]
            assert e.tokens[t - d] == e.tokens[t]
        queried = {t - 1 for t in answers} | set(answers)
        assert {e.tokens[j] for j in range(2 * n, length) if j not in queried} == {
            vocab.filler[0]}
    with pytest.raises(ValueError, match="need length >= 16"):
        mqar(syn.example_rng(0, 0), vocab, 15, pairs=4, layout="zoology")


def test_mqar_zoology_query_slots_follow_the_power_law() -> None:
    """One pair: its slot g (0 = right after the record) is drawn with p ∝ (g + 1)^(a - 1),
    a = 0.01: the observed frequency of each of the 8 nearest slots within 4 standard errors
    of that (deterministic seeds)."""
    vocab = syn.Vocab(n_filler=4, n_keys=8, n_values=8)
    length, draws = 66, 20000
    slots = (length - 2) // 2
    weights = [(g + 1) ** (0.01 - 1) for g in range(slots)]
    counts = [0] * slots
    for i in range(draws):
        e = mqar(syn.example_rng(1, i, "p"), vocab, length, pairs=1, layout="zoology")
        counts[(e.targets.index(True) - 2) // 2] += 1
    for g in range(8):
        p = weights[g] / sum(weights)
        assert abs(counts[g] / draws - p) <= 4 * math.sqrt(p * (1 - p) / draws), (g, counts[g])


def test_mqar_pairs_in_the_mixture_and_their_rules() -> None:
    """data.mqar_pairs gives Zoology's layout with exactly that many pairs; with
    data.mqar_min_pairs the count is drawn per sequence from the range (every value occurs);
    both are validated in one line each."""
    from blocklab.config import ConfigError, DataConfig, TaskWeights
    from blocklab.data.mixture import Mixture

    base = {"tasks": TaskWeights(needle=0, mqar=1), "seq_len": 64, "min_len": 41,
            "n_keys": 16, "n_values": 16, "n_filler": 16, "curriculum": []}
    fixed = Mixture(DataConfig(mqar_pairs=8, **base))
    assert {fixed(i).meta["n_records"] for i in range(50)} == {8}
    ranged = Mixture(DataConfig(mqar_pairs=8, mqar_min_pairs=2, **base))
    counts = {ranged(i).meta["n_records"] for i in range(300)}
    assert counts == set(range(2, 9))
    assert fixed.fingerprint() != ranged.fingerprint()
    zoology = Mixture(DataConfig(mqar_pairs=8, mqar_layout="zoology", **base))
    assert syn.SEP not in zoology(0).tokens and syn.SEP in fixed(0).tokens
    assert zoology.fingerprint() != fixed.fingerprint()
    for kw, match in ((dict(mqar_pairs=8, mqar_min_pairs=9), "mqar_min_pairs=9"),
                      (dict(mqar_min_pairs=2), "needs data.mqar_pairs"),
                      (dict(mqar_pairs=0), "mqar_pairs=0"),
                      (dict(mqar_pairs=17), "at least 86 tokens"),
                      (dict(mqar_pairs=17, min_len=90, seq_len=128), "n_keys=16"),
                      (dict(mqar_pairs=8, mqar_layout="grid"), "mqar_layout='grid'"),
                      (dict(mqar_layout="zoology"), "needs data.mqar_pairs"),
                      (dict(mqar_pairs=11, mqar_layout="zoology", min_len=43),
                       r"zoology layout\) needs sequences of at least 44 tokens")):
        with pytest.raises(ConfigError, match=match):
            Mixture(DataConfig(**{**base, **kw}))


def test_target_hits_reads_the_next_token_argmax() -> None:
    """A model whose logits are the one-hot of the *next* token scores 1.0; one that predicts
    the current token scores 0 (the shift is checked, not assumed)."""
    import torch

    class Next(torch.nn.Module):
        def __init__(self, seqs, shift):
            super().__init__()
            self.seqs, self.shift = seqs, shift

        def forward(self, ids, valid=None):
            out = torch.zeros(*ids.shape, 300)
            for b, seq in enumerate(self.seqs):
                for t in range(len(seq)):
                    j = min(t + self.shift, len(seq) - 1)
                    out[b, t, seq[j]] = 1.0
            return out

    items = ms.recall_at_gap(syn.Vocab(), n=3, pairs=2, gap=1)
    seqs = [e.tokens for e in items]
    assert ms.accuracy(Next(seqs, 1), items).rate == 1.0
    assert ms.accuracy(Next(seqs, 0), items).rate == 0.0


def test_breaks_change_an_arm_and_reuse_runs() -> None:
    """A break makes one arm train (or be measured) exactly like another, so its runs are
    already trained (same cache key) and the check that separates the two arms must fail --
    unless it is a defect of training itself (``training_breaks``: new runs,
    tests/test_repro_shakespeare.py)."""
    for name in ex.names():
        exp = ex.experiment(name, "quick")
        arms = exp.sizes["quick"].arms
        keys = {run_key(a, 0) for a in arms}
        for what, (_, breaker) in exp.breaks.items():
            if what in exp.training_breaks:
                continue
            broken = breaker(arms)
            assert [a.name for a in broken] == [a.name for a in arms]
            changed = [b for a, b in zip(arms, broken) if a != b]
            assert changed, f"{name} --break {what} changes nothing"
            for b in changed:
                assert run_key(b, 0) in keys  # no new training
                twins = [a for a in arms if a.name != b.name and (a.overrides, a.eval_model, a.sweep)
                         == (b.overrides, b.eval_model, b.sweep)]
                assert twins, f"{name} --break {what}: {b.name} is like no other arm"


@pytest.mark.parametrize("name", ex.names())
def test_protocols_compose_and_validate(name: str) -> None:
    """Every arm of every size is a valid training config (composed and validated, nothing
    trained). Arms with the same overrides (a quick arm that is also a full one) compose once.
    One test per experiment, so that the workers share them."""
    from blocklab.config import compose, validate_train
    from blocklab.repro.runner import RUN_DEFAULTS
    from blocklab.train.run import to_train_config

    composed: dict[tuple[str, ...], object] = {}
    for size in pr.SIZES:
        arms = ex.experiment(name, size).sizes[size].arms
        # a swept arm composed at its first rate (the others differ in optim.lr alone)
        for arm in [with_lr(a, a.sweep.lrs[0]) if a.sweep else a for a in arms]:
            if arm.overrides not in composed:  # raises ConfigError when invalid
                composed[arm.overrides] = validate_train(to_train_config(
                    compose("train", [*RUN_DEFAULTS, *arm.overrides])))
            tc = composed[arm.overrides]
            lr = [o for o in arm.overrides if o.startswith("optim.lr=")]
            assert len(lr) <= 1 and (not lr or tc.optim.lr == float(lr[0].split("=")[1]))
            steps = [o for o in arm.overrides if o.startswith("trainer.max_steps=")]
            if not steps:  # a recipe's own length (experiment=...: its full size)
                assert arm.overrides[0].startswith("experiment=") and size == "full"
                steps = [f"trainer.max_steps={tc.trainer.max_steps}"]
            assert steps and tc.trainer.max_steps == int(steps[-1].split("=")[1])
            assert not tc.probes.enabled and not tc.checkpoint_probes.enabled


def _fake_runs(monkeypatch, values: dict[float, float | None]) -> list[float]:
    """Runs whose last logged val/accuracy is ``values[lr]`` (None: never logged), made by a
    stand-in for training; returns the rates trained, in order."""
    from blocklab.repro import runner

    trained: list[float] = []

    def train_arm(arm, seed, root, *, experiment, log=print):
        lr = float(next(o for o in arm.overrides if o.startswith("optim.lr=")).split("=")[1])
        trained.append(lr)
        run = root / "runs" / f"{run_key(arm, seed)}-seed{seed}"
        (run / "logs" / "version_0").mkdir(parents=True)
        value = values[lr]
        rows = ["step,val/accuracy,val/loss"] + (
            ["100,0.1,2.0", f"200,{value},1.0"] if value is not None else ["100,,2.0"])
        (run / "logs" / "version_0" / "metrics.csv").write_text("\n".join(rows) + "\n")
        (run / "summary.json").write_text(json.dumps({"step": 200}))
        return run, True

    monkeypatch.setattr(runner, "train_arm", train_arm)
    return trained


@pytest.mark.parametrize(("values", "sweep", "chosen", "tried"), [
    ({1e-3: 0.5, 3e-3: 0.9, 3e-4: 0.7}, pr.Sweep((1e-3, 3e-3, 3e-4)), 3e-3, 3),
    ({1e-3: 0.9, 3e-3: 0.9, 3e-4: 0.7}, pr.Sweep((1e-3, 3e-3, 3e-4)), 1e-3, 3),  # tie: earlier
    ({1e-3: None, 3e-3: 0.2, 3e-4: None}, pr.Sweep((1e-3, 3e-3, 3e-4)), 3e-3, 3),
    ({1e-3: 0.5, 3e-3: 0.995, 3e-4: 1.0}, pr.Sweep((1e-3, 3e-3, 3e-4), enough=0.99), 3e-3, 2),
    ({1e-3: 0.5, 3e-3: 0.9, 3e-4: 0.7}, pr.Sweep((1e-3, 3e-3, 3e-4), mode="min"), 1e-3, 3),
])
def test_a_sweep_measures_the_rate_best_on_validation(tmp_path, monkeypatch, values, sweep,
                                                      chosen, tried):
    from blocklab.repro.runner import train_sweep

    trained = _fake_runs(monkeypatch, values)
    arm = pr.Arm("a", ("model.n_layers=2",), sweep=sweep)
    run_dir, n, entry = train_sweep(arm, sweep, 0, tmp_path, experiment="x", log=lambda s: None)
    assert trained == list(sweep.lrs[:tried]) and n == tried
    assert run_dir == tmp_path / "runs" / f"{run_key(with_lr(arm, chosen), 0)}-seed0"
    assert entry["chosen_lr"] == chosen and [t["lr"] for t in entry["tried"]] == trained
    assert [t["val/accuracy"] for t in entry["tried"]] == [values[lr] for lr in trained]
    assert entry["untried"] == list(sweep.lrs[tried:])


def test_a_swept_experiment_reports_every_rate_and_measures_the_chosen_run(tmp_path,
                                                                           monkeypatch):
    from blocklab.repro.runner import run, table

    _fake_runs(monkeypatch, {1e-3: 0.5, 3e-3: 0.9})
    arm = pr.Arm("a", ("model.n_layers=2",), sweep=pr.Sweep((1e-3, 3e-3)))
    measured = []

    def measure(run_dir, arm):
        measured.append(run_dir)
        return {"accuracy": ms.Tally(9, 10)}

    exp = pr.Experiment("x", "X", "ref", "protocol", {"quick": pr.Protocol(
        (arm,), (ck.AtLeast("a", "accuracy", 0.8),))}, measure)
    outcome = run(exp, size="quick", seeds=2, root=tmp_path, log=lambda s: None)
    assert outcome.passed and outcome.trained == 4
    assert measured == [tmp_path / "runs" / f"{run_key(with_lr(arm, 3e-3), s)}-seed{s}"
                        for s in (0, 1)]
    assert [e["chosen_lr"] for e in outcome.sweeps["a"]] == [3e-3, 3e-3]
    text = table(exp, outcome)
    assert "| a | 0 | val/accuracy 0.001: 0.500 (200), 0.003*: 0.900 (200) | 0.003 |" in text


def test_the_recall_state_figure_plots_every_measured_arm(tmp_path) -> None:
    from blocklab.repro.experiments.recall_state import RECALL_STATE, figure
    from blocklab.repro.runner import Outcome

    arms = RECALL_STATE.sizes["full"].arms
    measurements = {a.name: {"accuracy": [{"hits": 9, "trials": 10, "rate": 0.9}] * 2,
                             "state bytes": [{"hits": 0, "trials": 0, "rate": 1024.0 * (i + 1)}]
                             * 2} for i, a in enumerate(arms)}
    outcome = Outcome("recall_state", "full", 2, None, [], measurements, {}, 1.0, 0)
    files = figure(RECALL_STATE, outcome, tmp_path)
    assert files == {"figure": str(tmp_path / "recall_state.png")}
    assert (tmp_path / "recall_state.png").stat().st_size > 10_000
    only_flip_flop = Outcome("recall_state", "full", 2, None, [], {
        a: m for a, m in measurements.items() if a.endswith(" flip-flop")}, {}, 1.0, 0)
    assert only_flip_flop.measurements  # --only flip-flop: no recall cell, so no figure
    assert figure(RECALL_STATE, only_flip_flop, tmp_path / "none") == {}


def test_recall_state_arms_differ_only_in_the_mixer_within_a_cell() -> None:
    """Every arm of a cell trains the same data, depth, width and budget: the mixer (its
    positions and head count) is the only difference; each state size is its own arm."""
    from blocklab.repro.experiments.recall_state import CELLS, RECALL_STATE

    for size in ("quick", "full"):
        arms = RECALL_STATE.sizes[size].arms
        for length, pairs in CELLS[size]:
            cell = [a for a in arms if a.name.endswith(f" {length}/{pairs}")]
            shared = set.intersection(*(set(a.overrides) for a in cell))
            for a in cell:
                rest = set(a.overrides) - shared
                assert all(o.startswith(("model/mixer=", "model/position=", "model.mixer.",
                                         "model.mixer.window=", "model.n_heads="))
                           for o in rest), rest
            assert len({a.overrides for a in cell}) == len(cell)
            assert f"data.mqar_pairs={pairs}" in shared and "data.mqar_layout=zoology" in shared


def test_cli_usage_errors_and_list(tmp_path, monkeypatch, capsys) -> None:
    from blocklab.repro import main

    monkeypatch.chdir(tmp_path)
    main(["--list"])
    out = capsys.readouterr().out
    for name in ex.names():
        assert name in out
    assert "--break one-layer" in out and "--break window-ignored" in out
    for argv, code, message in ((["mqar", "--break", "nothing"], 2,
                                 "--break nothing: not a defect of mqar"),
                                (["mqar", "--seeds", "0"], 2, "--seeds 0"),
                                ([], 2, "name an experiment"),
                                (["nope"], 2, "invalid choice")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == code and message in capsys.readouterr().err, argv
    assert not (tmp_path / "outputs").exists()  # nothing written by a refused command


# experiment -> models its quick protocol trains; receptive_field measures the runs mqar trained
QUICK_GROUPS = [{"mqar": 2, "receptive_field": 0}, {"extrapolation": 3}, {"recall_state": 3},
                {"chunked": 3}, {"sinks": 1}, {"listops": 3}, {"xl_memory": 2},
                {"memory_recall": 3}, {"long_context": 3}, {"stability": 6}]


@pytest.mark.slow
@pytest.mark.parametrize("group", QUICK_GROUPS,
                         ids=["mqar+receptive_field", "extrapolation", "recall_state", "chunked",
                              "sinks", "listops", "xl_memory", "memory_recall",
                              "long_context", "stability"])
def test_quick_protocols_pass_and_their_breaks_fail(tmp_path, group) -> None:
    """The CI subset of every reference experiment meets its expected result, and every
    deliberate defect makes the same check fail, reusing the trained runs. In order within a
    group: the receptive-field experiment measures the run mqar trained (no training of its
    own). Each group's models are the values of QUICK_GROUPS (chunked, sinks, listops: about 45
    CPU-seconds each with their breaks, one thread; docs/reproductions.md)."""
    from blocklab.repro.runner import run, write

    trained = {}
    for name in group:
        exp = ex.experiment(name, "quick")
        good = run(exp, size="quick", seeds=None, root=tmp_path, log=lambda s: None)
        write(exp, good, tmp_path / name)
        assert good.passed, name + ": " + "; ".join(
            f"{r['expected']}: {r['observed']}" for r in good.rows if not r["passed"])
        saved = json.loads((tmp_path / name / "result.json").read_text())
        assert saved["passed"] is True and saved["checks"] == good.rows
        trained[name] = good.trained
        for what in set(exp.breaks) - exp.training_breaks:  # those: tests/test_repro_recall.py
            bad = run(exp, size="quick", seeds=None, root=tmp_path, broken=what,
                      log=lambda s: None)
            assert bad.trained == 0  # the broken arms are already trained
            assert not bad.passed, f"{name} --break {what} still passes"
    assert trained == group


def test_the_quick_groups_cover_every_experiment_once() -> None:
    # shakespeare_char: tests/test_repro_shakespeare.py (its breaks train runs of their own)
    names = [name for group in QUICK_GROUPS for name in group] + ["shakespeare_char"]
    assert sorted(names) == sorted(ex.names())


@pytest.mark.slow
def test_a_preempted_repro_exits_7_with_the_command_that_resumes_it(tmp_path) -> None:
    """SIGTERM while an arm trains: exit 7 and one line naming this same blocklab-repro command
    (not a traceback and exit 1); running that command resumes the arm from its checkpoint."""
    import os
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    root = tmp_path / "repro"
    args = ["mqar", "--size", "quick", "--root", str(root)]

    def repro(fault: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(sys.executable).parent / "blocklab-repro"), *args],
                              capture_output=True, text=True, timeout=SAFETY_S, cwd=tmp_path,
                              env={**os.environ, "BLOCKLAB_FAULT": fault})

    r = repro("SIGTERM@step:1")
    assert r.returncode == 7, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("preempted (SIGTERM) after step ")
    how = "; resume exactly with: "
    assert last.endswith(how + "blocklab-repro " + shlex.join(args)), last
    ckpt = Path(last.split("checkpoint ")[1].split(" written")[0])
    assert ckpt.is_dir() and ckpt.parent.parent.parent == root / "runs"
    again = repro("SIGTERM@step:4")  # the printed command, stopped again a little later
    assert again.returncode == 7, again.stderr[-3000:]
    assert f"-> {ckpt.parent.parent} (resuming)" in again.stderr

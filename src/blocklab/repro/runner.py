"""Train an experiment's arms (or reuse finished runs), measure them, check the expectations and
write the report.

Runs are cached by content: ``<root>/runs/<hash of overrides + seed>/``, so a rerun of the
check (or a *break* that trains an arm exactly like another one) retrains nothing, and a run that
was interrupted resumes from its newest checkpoint (``resume=``), exactly.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocklab.config.migrate import legacy_override
from blocklab.files import storage_error, write_text_atomic
from blocklab.repro import checks as ck
from blocklab.repro.measure import Scalar, Tally
from blocklab.repro.protocol import Arm, Experiment, Sweep

# Every run of a reference experiment: no probes during or after training (the experiment
# measures what it checks itself), CSV logs, quiet.
RUN_DEFAULTS = ("probes=none", "probes@checkpoint_probes=none", "logger=csv",
                "trainer.progress_bar=false", "trainer.keep_checkpoints=1")


@dataclass
class Outcome:
    experiment: str
    size: str
    seeds: int
    broken: str | None
    rows: list[dict[str, Any]]  # one per check: expected, observed, passed
    measurements: dict[str, dict[str, list[dict[str, Any]]]]
    runs: dict[str, list[str]]
    seconds: float
    trained: int  # runs trained (not reused) by this invocation
    files: dict[str, str] = field(default_factory=dict)
    # arm -> one entry per seed: every rate tried, its selection value and steps, the chosen one
    sweeps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(r["passed"] for r in self.rows)


def run_key(arm: Arm, seed: int) -> str:
    """The finished run of ``arm`` at ``seed`` kept under this key. Overrides are hashed in
    the spelling earlier versions recorded (``model.mixer.window`` as ``model.attention.window``,
    config/migrate.py), so the runs they trained are still found."""
    spelled = [legacy_override(o) for o in arm.overrides]
    return hashlib.sha256(json.dumps([spelled, seed]).encode()).hexdigest()[:12]


def _finished(run_dir: Path) -> bool:
    return (run_dir / "summary.json").is_file()


def train_arm(arm: Arm, seed: int, root: Path, *, experiment: str, log=print) -> tuple[Path, bool]:
    """The run directory of ``arm`` at ``seed`` (trained now unless finished before) and
    whether it was trained by this call."""
    from blocklab.checkpoint import list_checkpoints
    from blocklab.config import compose
    from blocklab.train.run import train

    run_dir = root / "runs" / f"{run_key(arm, seed)}-seed{seed}"
    if _finished(run_dir):
        return run_dir, False
    resume = [f"resume={run_dir}"] if run_dir.is_dir() and list_checkpoints(run_dir) else []
    overrides = [*RUN_DEFAULTS, *arm.overrides, f"seed={seed}", f"data.seed={1234 + seed}",
                 f"experiment_name=repro_{experiment}", f"run_dir={run_dir}", *resume]
    log(f"train {arm.name} seed {seed} -> {run_dir}" + (" (resuming)" if resume else ""))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "repro_arm.json").write_text(json.dumps(
        {"experiment": experiment, "arm": arm.name, "seed": seed,
         "overrides": list(arm.overrides)}, indent=1))
    train(compose("train", overrides), overrides)
    return run_dir, True


def with_lr(arm: Arm, lr: float) -> Arm:
    """The arm trained at learning rate ``lr`` (its own run key: cached like any arm)."""
    return Arm(arm.name, (*arm.overrides, f"optim.lr={lr!r}"), arm.eval_model)


def last_value(run_dir: Path, metric: str) -> float | None:
    """The last logged value of ``metric`` in a finished run's metrics (None: never logged or
    not finite)."""
    import math

    from blocklab.train.metrics import read_rows

    values = [r[metric] for r in read_rows(run_dir) if r.get(metric) not in (None, "")]
    value = float(values[-1]) if values else None
    return value if value is not None and math.isfinite(value) else None


def train_sweep(arm: Arm, sweep: Sweep, seed: int, root: Path, *, experiment: str,
                log=print) -> tuple[Path, int, dict[str, Any]]:
    """Train ``arm`` at each rate of ``sweep`` (what is missing) and return the run chosen by
    its selection metric, the number of runs trained, and the sweep's record for the report."""
    tried: list[dict[str, Any]] = []
    best: tuple[Path, float | None, float] | None = None
    trained = 0
    for lr in sweep.lrs:
        run_dir, new = train_arm(with_lr(arm, lr), seed, root, experiment=experiment, log=log)
        trained += new
        value = last_value(run_dir, sweep.select)
        steps = json.loads((run_dir / "summary.json").read_text()).get("step")
        tried.append({"lr": lr, sweep.select: value, "steps": steps, "run": str(run_dir)})
        if best is None or sweep.better(value, best[1]):
            best = (run_dir, value, lr)
        if sweep.suffices(value):
            break
    assert best is not None, "a sweep has at least one rate"
    entry = {"seed": seed, "select": sweep.select, "mode": sweep.mode, "chosen_lr": best[2],
             "tried": tried, "untried": [lr for lr in sweep.lrs[len(tried):]]}
    log(f"{arm.name} seed {seed}: lr {best[2]:g} chosen ({sweep.select} "
        + ", ".join(f"{t['lr']:g}: {_fmt(t[sweep.select])}" for t in tried) + ")")
    return best[0], trained, entry


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def chosen(arm: str, only: tuple[str, ...] | list[str]) -> bool:
    """Whether ``--only`` keeps the arm named ``arm`` (every arm without ``--only``)."""
    return not only or any(w in arm for w in only)


def run(exp: Experiment, *, size: str, seeds: int | None, root: Path, broken: str | None = None,
        only: tuple[str, ...] = (), log=print) -> Outcome:
    """Train (what is missing), measure, check. ``only``: the arms whose names contain one of
    these words (a part of the table: the checks of other arms are "not measured", so it never
    passes)."""
    t0 = time.perf_counter()
    protocol = exp.sizes[size]
    arms = protocol.arms
    if broken is not None:
        arms = exp.breaks[broken][1](arms)
    if only:
        arms = tuple(a for a in arms if chosen(a.name, only))
    n_seeds = seeds or protocol.seeds
    results: ck.Results = {}
    runs: dict[str, list[str]] = {}
    sweeps: dict[str, list[dict[str, Any]]] = {}
    trained = 0
    for arm in arms:
        for seed in range(n_seeds):
            if arm.sweep is None:
                run_dir, new = train_arm(arm, seed, root, experiment=exp.name, log=log)
            else:
                run_dir, new, entry = train_sweep(arm, arm.sweep, seed, root,
                                                  experiment=exp.name, log=log)
                sweeps.setdefault(arm.name, []).append(entry)
            trained += new
            runs.setdefault(arm.name, []).append(str(run_dir))
            for metric, tally in exp.measure(run_dir, arm).items():
                results.setdefault(arm.name, {}).setdefault(metric, []).append(tally)
    rows = []
    for check in protocol.checks:
        if not {check.arm, getattr(check, "other", check.arm)} <= results.keys():
            rows.append({"expected": check.expected(), "observed": "not measured (--only)",
                         "passed": False})
            continue
        observed, passed = check.evaluate(results)
        rows.append({"expected": check.expected(), "observed": observed, "passed": passed})
    measurements = {arm: {m: [{"hits": t.hits, "trials": t.trials, "rate": t.rate} for t in ts]
                          for m, ts in metrics.items()} for arm, metrics in results.items()}
    return Outcome(exp.name, size, n_seeds, broken, rows, measurements, runs,
                   round(time.perf_counter() - t0, 1), trained, sweeps=sweeps)


def table(exp: Experiment, outcome: Outcome) -> str:
    """The markdown report: expectations (expected, observed, verdict), then every measurement."""
    lines = [f"# {exp.title}", "", f"Reference: {exp.reference}", "", f"Protocol: {exp.protocol}",
             "", f"Size {outcome.size}, {outcome.seeds} seed(s)"
             + (f", BROKEN: {exp.breaks[outcome.broken][0]}" if outcome.broken else "")
             + f"; {outcome.seconds:.0f} s ({outcome.trained} runs trained).", "",
             "| expected | observed | verdict |", "|---|---|---|"]
    lines += [f"| {r['expected']} | {r['observed']} | {'pass' if r['passed'] else 'MISS'} |"
              for r in outcome.rows]
    lines += ["", "| arm | measurement | pooled [95% CI] (per seed) |", "|---|---|---|"]
    for arm, metrics in outcome.measurements.items():
        for metric, ts in metrics.items():
            tallies = [Tally(t["hits"], t["trials"]) if t["trials"] else Scalar(t["rate"])
                       for t in ts]
            lines.append(f"| {arm} | {metric} | {ck.describe(tallies)} |")
    if outcome.sweeps:
        lines += ["", "Learning-rate sweeps: each rate's last validation value (steps trained); "
                  "the measured run is the one marked *.", "",
                  "| arm | seed | rates tried | chosen |", "|---|---|---|---|"]
        for arm, entries in outcome.sweeps.items():
            for e in entries:
                tried = ", ".join(f"{t['lr']:g}{'*' if t['lr'] == e['chosen_lr'] else ''}: "
                                  f"{_fmt(t[e['select']])} ({t['steps']})" for t in e["tried"])
                if e["untried"]:
                    tried += " (not needed: " + ", ".join(f"{lr:g}" for lr in e["untried"]) + ")"
                lines.append(f"| {arm} | {e['seed']} | {e['select']} {tried} | "
                             f"{e['chosen_lr']:g} |")
    return "\n".join(lines) + "\n"


def write(exp: Experiment, outcome: Outcome, out: Path) -> None:
    """``table.md`` and ``result.json`` into ``out``; a failed write is one StorageError line
    (the trained runs are kept: rerunning the command only measures and writes)."""
    try:
        _write(exp, outcome, out)
    except OSError as e:
        raise storage_error(e, f"repro results {out}", "the trained runs are kept: rerun the "
                            "same command to write them (nothing is retrained)") from None


def _write(exp: Experiment, outcome: Outcome, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "table.md", table(exp, outcome))
    outcome.files = {"table": str(out / "table.md"), "result": str(out / "result.json")}
    if exp.figure is not None:
        outcome.files |= exp.figure(exp, outcome, out)
    payload = {"experiment": outcome.experiment, "size": outcome.size, "seeds": outcome.seeds,
               "broken": outcome.broken, "passed": outcome.passed, "checks": outcome.rows,
               "measurements": outcome.measurements, "runs": outcome.runs,
               "seconds": outcome.seconds, "trained": outcome.trained, "sweeps": outcome.sweeps,
               "reference": exp.reference, "protocol": exp.protocol}
    write_text_atomic(out / "result.json", json.dumps(payload, indent=1))


def report(exp: Experiment, outcome: Outcome, stream=sys.stdout) -> None:
    print(table(exp, outcome), file=stream)
    verdict = "PASS" if outcome.passed else "FAIL"
    missed = sum(not r["passed"] for r in outcome.rows)
    print(f"{verdict}: {exp.name} ({outcome.size}, {outcome.seeds} seed(s))"
          + (f": {missed} of {len(outcome.rows)} expectations missed" if missed else "")
          + (f"; results in {outcome.files['table']}" if outcome.files else ""), file=stream)

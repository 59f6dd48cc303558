"""The end of a run: ``summary.json`` and the lines printed after training.

Each metric is its last logged value *and the step it comes from* (``metric_steps``): every
launch's rows (``logs/version_*/metrics.csv``, one row a step) with this launch's on top, so a
resume that trained nothing new, or a metric not logged at the last step, still reports the
number with its step, and the printout marks a number older than the run's last step. The best
checkpoint (train/best.py) is named in both, and so are the run's precision and what the
stability monitors found (train/monitors.py: a divergence and the first monitor out of its
range; their own readings stay in ``summary.json`` and ``monitors/``, not in the printout).
"""

from __future__ import annotations

from pathlib import Path

from blocklab import checkpoint as ckpt
from blocklab.eval.report import strict_json
from blocklab.plotting import finite_float, finite_int
from blocklab.train.best import describe
from blocklab.train.metrics import read_rows
from blocklab.train.monitor_plots import describe as describe_monitors
from blocklab.train.monitor_plots import read_report

#: trainer.precision -> what it means for the run's numbers (one line in the summary)
PRECISIONS = {
    "32-true": "fp32 weights and math", "32": "fp32 weights and math",
    "64-true": "fp64 weights and math", "64": "fp64 weights and math",
    "16-mixed": "fp16 autocast, fp32 weights, with dynamic loss scaling (GradScaler)",
    "16": "fp16 autocast, fp32 weights, with dynamic loss scaling (GradScaler)",
    "bf16-mixed": "bf16 autocast, fp32 weights, no loss scaling (bf16 has fp32's range)",
    "bf16": "bf16 autocast, fp32 weights, no loss scaling (bf16 has fp32's range)",
    "16-true": "fp16 weights and math, no loss scaling",
    "bf16-true": "bf16 weights and math, no loss scaling",
}


def describe_precision(precision: str) -> str:
    """``16-mixed: fp16 autocast, ... loss scaling`` — one line."""
    return f"{precision}: {PRECISIONS.get(str(precision), 'as Lightning defines it')}"


def latest_metrics(run_dir: Path, this_launch: dict[str, tuple[int, float]]
                   ) -> dict[str, tuple[int, float]]:
    """metric -> (step, value) of its newest logged row: the run's logs, then ``this_launch``
    (what this process wrote: it holds the rows of a run without a CSV log, ``logger=none``)."""
    out: dict[str, tuple[int, float]] = {}
    for row in read_rows(run_dir):
        step = finite_int(row.get("step"))
        for name, cell in row.items():
            value = finite_float(cell)
            if step is None or value is None or name in ("step", "epoch"):
                continue
            if name not in out or step >= out[name][0]:
                out[name] = (step, value)
    for name, (step, value) in this_launch.items():
        if name not in out or step >= out[name][0]:
            out[name] = (step, value)
    return out


def write_summary(run_dir: Path, step: int, lit, probes) -> None:
    """``summary.json`` and the printout: where everything is, each metric (marked with its
    step when older than the last one), the best checkpoint, the final probes."""
    latest = latest_metrics(run_dir, lit.latest)
    last = ckpt.list_checkpoints(run_dir)
    best = lit.best
    best_path = run_dir / "checkpoints" / ckpt.best_name(best) if best else None
    info = {"run_dir": str(run_dir), "step": step, "params": lit.meta.get("params"),
            "tokens_seen": lit.tokens_seen,
            "metrics": {k: v for k, (_, v) in sorted(latest.items())},
            "metric_steps": {k: s for k, (s, _) in sorted(latest.items())},
            "probes": probes.summary if probes else None,
            "last_checkpoint": str(last[-1]) if last else None,
            "best_checkpoint": {**best, "path": str(best_path)} if best else None,
            # each key a resume changed, and the first step it applied to
            "resume_changes": lit.meta.get("resume_changes", []),
            "precision": describe_precision(lit.cfg.trainer.precision),
            "monitors": describe_monitors(read_report(run_dir)) if lit.cfg.monitors.every
            else describe_monitors(None), "monitor_report": read_report(run_dir)}
    (run_dir / "summary.json").write_text(strict_json(info, indent=2))
    print(f"\nrun directory   {run_dir}")
    print(f"checkpoints     {run_dir / 'checkpoints'} (newest: {last[-1].name if last else '-'}"
          f"; best: {describe(best)})")
    if best:
        print(f"best checkpoint {best_path} (blocklab-eval ckpt={run_dir}{ckpt.BEST})")
    print(f"config          {run_dir / 'config.yaml'}")
    print(f"logs            {run_dir / 'logs'}")
    print(f"precision       {info['precision']}")
    print(f"monitors        {info['monitors']}")
    for k, (at, value) in sorted(latest.items()):
        if k.startswith("monitor/"):
            continue  # per layer: in summary.json, monitors/monitors.json and the figures
        print(f"{k:<15} {value:.4g}" + (f" (step {at})" if at != step else ""))
    if probes:
        from blocklab.eval.report import format_report

        print(f"\nprobes ({probes.summary['spec']}, held-out seed {lit.cfg.probes.seed}) on the final model:")
        print(format_report(probes.summary, probes.cells))
        for k, f in probes.files.items():
            print(f"{k:<15} {f}")


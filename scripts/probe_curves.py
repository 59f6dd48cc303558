"""Checkpoint-probe curves of one run: every logged metric whose name starts with a prefix
(default: the hops probe's accuracy per hop count) against the training step, as a markdown
table on stdout and a line plot.

Usage::

    .venv/bin/python scripts/probe_curves.py outputs/variable_tracking/<run> \\
        --out docs/figures/variable_tracking_hops.png
    .venv/bin/python scripts/probe_curves.py RUN --prefix probe/aggregation_ --line 0.25

The checkpoint probes (``probes@checkpoint_probes=...``) log ``probe/<kind>_<cell>/accuracy`` at
every checkpoint; this reads them back from the run's ``logs/version_*/metrics.csv`` (resumed
runs included, through blocklab-compare's reader).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blocklab.compare.runs import read_curves


def curves(run: Path, prefix: str) -> dict[str, list[tuple[int, float]]]:
    """The matching ``.../accuracy`` series, named by their cell (``1 hops``, ...)."""
    out = {}
    for name, series in read_curves(run).items():
        if name.startswith(prefix) and name.endswith("/accuracy"):
            out[name[len(prefix):-len("/accuracy")].replace("_", " ")] = series
    return dict(sorted(out.items()))


def table(series: dict[str, list[tuple[int, float]]]) -> str:
    steps = sorted({s for points in series.values() for s, _ in points})
    lines = ["| step | " + " | ".join(series) + " |", "|---:|" + "---:|" * len(series)]
    for step in steps:
        cells = [dict(points).get(step) for points in series.values()]
        lines.append(f"| {step:,} | " + " | ".join("-" if v is None else f"{v:.2f}"
                                                  for v in cells) + " |")
    return "\n".join(lines)


def plot(series: dict[str, list[tuple[int, float]]], path: Path, *, title: str,
         line: float | None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for name, points in series.items():
        ax.plot(*zip(*points), marker="o", markersize=3, label=name)
    if line is not None:
        ax.axhline(line, color="grey", linestyle=":", label=f"copy line {line:g}")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("training step")
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a run directory")
    p.add_argument("--prefix", default="probe/hops_", help="metric name prefix")
    p.add_argument("--out", type=Path, default=None, help="the PNG to write (none: table only)")
    p.add_argument("--line", type=float, default=0.5, help="a reference line (copy line)")
    p.add_argument("--title", default="variable tracking: accuracy by hops")
    a = p.parse_args(argv)
    series = curves(a.run, a.prefix)
    if not series:
        print(f"{a.run}: no metric starting with {a.prefix!r} ending in /accuracy (were "
              "checkpoint probes on?)", file=sys.stderr)
        return 3
    print(table(series))
    if a.out is not None:
        print(plot(series, a.out, title=a.title, line=a.line))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``blocklab-compare``'s two plots: the loss curves of every run on one log axis
(``loss_curves.png``) and the needle headline as grouped bars with Wilson intervals and the
copy-any-value line (``probe_accuracy.png``) — a run that only learned to copy *some* in-context
value sits on that line, not above it.

Figures come from :mod:`blocklab.plotting` (matplotlib lazily, object API only); runs are
labelled by their varied axes, as in the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from blocklab.compare.text import unique_labels
from blocklab.plotting import colours, new_figure, no_data, plain_log_axis, save_png


def plot_loss_curves(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """train/loss against step per run (solid), val/loss dashed with markers, log y."""
    fig = new_figure((10, 5.5))
    ax = fig.add_subplot()
    plotted = False
    for r, colour, label in zip(rows, colours(len(rows)), unique_labels(rows)):
        curves = r.get("curves") or {}
        train = [(s, v) for s, v in curves.get("train/loss", []) if v > 0]
        val = [(s, v) for s, v in curves.get("val/loss", []) if v > 0]
        if train:
            ax.plot(*zip(*train), color=colour, lw=1.3, label=label)
        if val:
            ax.plot(*zip(*val), color=colour, ls="--", marker="o", ms=4, lw=1.1,
                    label=None if train else label)
        plotted = plotted or bool(train or val)
    if plotted:
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  ncol=1 if len(rows) <= 20 else 2)
    else:
        no_data(ax, "no logged losses (logs/version_*/metrics.csv)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("train/loss (solid) and val/loss (dashed, markers)")
    ax.grid(True, which="both", alpha=0.3)
    return save_png(fig, path)


def _accuracy_bars(ax: Any, runs: Sequence[Mapping[str, Any]], width: float) -> None:
    """Within / beyond bars side by side per run, Wilson intervals as error bars."""
    for offset, key, colour, name in ((-width / 2, "needle_in", "#1f77b4", "within train length"),
                                      (width / 2, "needle_beyond", "#ff7f0e",
                                       "beyond train length")):
        xs, ys, lo, hi = [], [], [], []
        for i, r in enumerate(runs):
            acc = r.get(key)
            if acc is None:
                continue
            low, high = r.get(f"{key}_ci") or (None, None)
            xs.append(i + offset)
            ys.append(acc)
            lo.append(max(0.0, acc - low) if low is not None else 0.0)
            hi.append(max(0.0, high - acc) if high is not None else 0.0)
        if xs:
            ax.bar(xs, ys, width, color=colour, label=name, yerr=[lo, hi], capsize=3,
                   error_kw={"elinewidth": 1, "ecolor": "black"})


def _copy_lines(ax: Any, runs: Sequence[Mapping[str, Any]]) -> None:
    """The copy-any-value line 1/(k+1): one across the plot when all runs share it, else one
    short line over each run's bars."""
    copies = [r.get("copy_any_value") for r in runs]
    distinct = {round(c, 9) for c in copies if c is not None}
    if len(distinct) == 1:
        c = distinct.pop()
        ax.axhline(c, color="dimgray", ls=":", lw=1.2, label=f"copy-any-value ({c:.3g})")
        return
    labelled = False
    for i, c in enumerate(copies):
        if c is not None:
            ax.hlines(c, i - 0.45, i + 0.45, color="dimgray", ls=":", lw=1.2,
                      label=None if labelled else "copy-any-value 1/(k+1)")
            labelled = True


def plot_probe_accuracy(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path | None:
    """Grouped bars per run: needle accuracy within vs beyond the training length, Wilson
    interval error bars, and the copy-any-value line. None (nothing written) when no run has
    needle results."""
    runs = [r for r in rows if r.get("needle_in") is not None or r.get("needle_beyond") is not None]
    if not runs:
        return None
    fig = new_figure((max(6.0, 1.1 * len(runs) + 2.5), 5.0))
    ax = fig.add_subplot()
    _accuracy_bars(ax, runs, width=0.38)
    _copy_lines(ax, runs)
    variants = sorted({str(r.get("needle_variant")) for r in runs})
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels(unique_labels(runs, sep="\n"), fontsize=8,
                       rotation=0 if len(runs) <= 6 else 30,
                       ha="center" if len(runs) <= 6 else "right")
    ax.set_xlim(-0.7, len(runs) - 0.3)
    ax.set_ylim(0, 1.22)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("needle accuracy (95% Wilson CI)")
    ax.set_title(f"needle retrieval ({', '.join(variants)})")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", ncol=3)
    return save_png(fig, path)

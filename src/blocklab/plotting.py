"""The one place blocklab's PNG figures are made and saved, shared by the probe plots
(``blocklab.eval.plots``) and ``blocklab-compare`` (``blocklab.compare.plots``).

It lives at the top of the package, not under ``eval``, so the compare tool can use it without
depending on the evaluation code, and it stays importable without torch or matplotlib: both
tools read results (CSV cells, JSON summaries) that any Python can produce, and the compare tool
must run on a machine with no torch at all. matplotlib is imported lazily, inside the functions,
and only through its object API (``Figure`` + the Agg canvas): no ``pyplot``, no global figure
state, no GUI backend, so plotting is safe in worker processes and tests.

Also here: :func:`finite_float` / :func:`finite_int`, which read a number out of whatever a
results table holds (floats, CSV strings, ``""``, ``"None"``, ``"nan"``) — the plots and the
compare table treat missing and N/A values the same way.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

#: Resolution of every PNG written through :func:`save_png`.
DPI = 120


def finite_float(value: Any) -> float | None:
    """A finite float, or None for missing / N/A / unparsable values (booleans are not
    numbers here)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def finite_int(value: Any) -> int | None:
    """:func:`finite_float`, rounded to the nearest integer."""
    out = finite_float(value)
    return None if out is None else round(out)


def new_figure(figsize: tuple[float, float]) -> Any:
    """A matplotlib ``Figure`` (constrained layout) attached to its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` as a PNG (white background, :data:`DPI`), creating parent folders."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, format="png", facecolor="white")
    return out


def colours(n: int) -> list[Any]:
    """``n`` distinct qualitative colours: tab10 for up to 10 series, tab20 beyond (cycling
    when there are more than 20)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def no_data(ax: Any, message: str) -> None:
    """A grey note in the middle of an empty axes, saying why nothing was drawn."""
    ax.text(0.5, 0.5, message, transform=ax.transAxes, ha="center", va="center",
            fontsize=11, color="dimgray", bbox={"facecolor": "white", "edgecolor": "lightgray"})


def plain_log_axis(axis: Any) -> None:
    """Log-scale tick labels (major and minor) as plain numbers: 20, 5.35, 0.02, 10,000 rather
    than matplotlib's mathtext ``5.35×10^0`` (a loss curve over a narrow range) or ``1e4``."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
            return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"

    axis.set_major_formatter(Plain(labelOnlyBase=False))
    axis.set_minor_formatter(Plain(labelOnlyBase=False))


def fit_text(text: str, width_in: float, fontsize: float) -> str:
    """``text`` with each line wrapped to about ``width_in`` inches at ``fontsize`` points (a
    long run title never runs off the figure)."""
    import textwrap

    chars = max(20, int(width_in * 72 / (0.55 * fontsize)))
    return "\n".join(w for line in text.splitlines() for w in (textwrap.wrap(line, chars)
                                                               or [""]))


def add_note(fig: Any, note: str) -> None:
    """``note`` under the axes, small, left-aligned: the figure's bottom label, which the
    constrained layout makes room for (the figure grows to hold it)."""
    if not note:
        return
    note = fit_text(note, fig.get_size_inches()[0] - 0.2, 7)
    grow_for(fig, note, 7)
    fig.supxlabel(note, x=0.01, ha="left", fontsize=7, color="#444444")


def grow_for(fig: Any, text: str, fontsize: float) -> None:
    """Make the figure taller by the height of ``text``'s lines (a wrapped title or note), so
    the constrained layout keeps room for the axes."""
    w, h = fig.get_size_inches()
    fig.set_size_inches(w, h + (text.count("\n") + 1) * fontsize * 1.35 / 72)

"""The drawing of probe results (docs/probes.md, "Grids and reports"): accuracy heatmaps over
length (one panel per variant, or one panel of rows), perplexity against length, and the
helpers the probe kinds draw their own figures with (``blocklab.eval.kinds``: each kind picks
its rows, labels and titles; nothing here knows a kind).

Every function takes ``cells``, the rows of the long-form results table (dicts; numbers may
also be CSV strings, and ``""``/``"None"``/``"nan"`` read as missing). A ``*_figure`` function
returns the matplotlib Figure, so a test can read what it draws; ``plot_*`` saves it as a PNG
and returns the path. Figures are made and saved through :mod:`blocklab.plotting` (matplotlib
imported lazily, object API only: no ``pyplot``, no global state, no GUI backend), so importing
this module loads neither matplotlib nor torch.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from blocklab.plotting import (
    add_note,
    colours,
    finite_float,
    finite_int,
    fit_text,
    grow_for,
    new_figure,
    no_data,
    plain_log_axis,
    save_png,
)

_NA_COLOUR = "#b0b0b0"
_MISSING_COLOUR = "#f2f2f2"
_TRAIN_COLOUR = "#d62728"

Cell = Mapping[str, Any]

# --------------------------------------------------------------------------- helpers


def _is_na(cell: Cell, key: str = "accuracy") -> bool:
    status = str(cell.get("status") or "").strip().lower()
    return status.startswith("n/a") or finite_float(cell.get(key)) is None


def select(cells: Iterable[Cell], probe: str) -> list[Cell]:
    rows = [c for c in cells if str(c.get("probe") or "").strip().lower() == probe]
    if not rows:
        raise ValueError(f"no cells with probe == {probe!r} to plot")
    return rows


def variant_of(cell: Cell) -> str:
    v = cell.get("variant")
    return "default" if v is None or str(v).strip() == "" else str(v)


def _mean(values: Iterable[float | None], weights: Iterable[float | None] | None = None) -> float | None:
    """Weighted mean of the non-None values (weights default to 1; missing weights count 1)."""
    vals = list(values)
    ws = [1.0] * len(vals) if weights is None else [w if w and w > 0 else 1.0 for w in weights]
    pairs = [(v, w) for v, w in zip(vals, ws) if v is not None]
    if not pairs:
        return None
    return sum(v * w for v, w in pairs) / sum(w for _, w in pairs)


def ok_mean(cells: Iterable[Cell], key: str = "accuracy") -> float | None:
    """Mean of ``key`` over the cells that are not N/A, weighted by their ``n``."""
    ok = [c for c in cells if not _is_na(c)]
    return _mean((finite_float(c.get(key)) for c in ok), (finite_float(c.get("n")) for c in ok))


def first_values(rows: Iterable[Cell], key: str) -> list[float]:
    """Distinct non-missing values of ``key``, in order of first appearance."""
    seen: list[float] = []
    for r in rows:
        v = finite_float(r.get(key))
        if v is not None and not any(math.isclose(v, s, rel_tol=1e-9) for s in seen):
            seen.append(v)
    return seen


def _ratio_label(length: int, train_length: int | None) -> str:
    if not train_length:
        return ""
    return f"×{length / train_length:.3g}"


def cells_note(rows: Iterable[Cell], *, beyond: int | None = None) -> str:
    """The footnote every probe figure carries: items per cell (n, or its range), the interval
    drawn, and each distinct reason a cell is N/A (a grey "N/A" never stands unexplained)."""
    rows = list(rows)
    ns = sorted({n for r in rows if not _is_na(r) and (n := finite_int(r.get("n")))})
    parts = []
    if ns:
        parts.append(f"n = {ns[0]} items per cell" if len(ns) == 1 else
                     f"n = {ns[0]}-{ns[-1]} items per cell")
    reasons: dict[str, str] = {}  # one per length: its cells differ only in drawn sizes
    for r in rows:
        if str(r.get("status") or "").startswith("n/a"):
            at = f"N/A at {r.get('length')}" if r.get("length") else "N/A"
            reasons.setdefault(at, str(r.get("status")).removeprefix("n/a: "))
    lines = ["; ".join(parts)] if parts else []
    for at, reason in list(reasons.items())[:4]:
        lines.append(f"{at}: " + (reason if len(reason) <= 110 else reason[:107] + "..."))
    if len(reasons) > 4:
        lines.append(f"N/A: {len(reasons) - 4} more lengths, their reasons in cells.csv")
    return "\n".join(lines)


# --------------------------------------------------------------------------- needle


def _train_position(lengths: Sequence[int], train_length: int | None
                    ) -> tuple[int | None, float | None]:
    """Where the training length sits on the heatmap's length axis: its column when it is one
    of the lengths, else a fractional x (log-interpolated) when it falls between two columns."""
    if not train_length:
        return None, None
    if train_length in lengths:
        return list(lengths).index(train_length), None
    if lengths[0] < train_length < lengths[-1]:
        j = max(k for k, n in enumerate(lengths) if n < train_length)
        lo, hi = math.log(lengths[j]), math.log(lengths[j + 1])
        return None, j + (math.log(train_length) - lo) / (hi - lo)
    return None, None


def _draw_panel(ax: Any, acc: Any, state: Any, cmap: Any, font: int) -> Any:
    """The heatmap of one panel with its cell labels ("0.87", "N/A") and a light cell grid;
    returns the image (for the colour bar)."""
    import numpy as np
    from matplotlib.patches import Rectangle

    n_rows, n_cols = acc.shape
    masked = np.ma.masked_where(state != 1, acc)
    image = ax.imshow(masked, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto",
                      interpolation="nearest")
    for i, j in zip(*np.nonzero(state == 0)):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=_MISSING_COLOUR,
                               edgecolor="none"))
    for i in range(n_rows):
        for j in range(n_cols):
            if state[i, j] == 1:
                r, g, b, _ = cmap(acc[i, j])
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(j, i, f"{acc[i, j]:.2f}", ha="center", va="center", fontsize=font,
                        color="white" if dark else "black")
            elif state[i, j] == 2:
                ax.text(j, i, "N/A", ha="center", va="center", fontsize=font, color="black")
    ax.set_xticks(np.arange(-0.5, n_cols, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, n_rows, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.tick_params(which="minor", length=0)
    return image


def _mark_train_length(ax: Any, lengths: Sequence[int], train_length: int | None,
                       n_rows: int) -> None:
    """Box the training-length column (bold red tick), or draw a dashed line where it falls
    between columns, or say in the axis label that it lies outside them."""
    from matplotlib.patches import Rectangle

    train_col, train_x = _train_position(lengths, train_length)
    if train_col is not None:
        ax.add_patch(Rectangle((train_col - 0.5, -0.5), 1, n_rows, fill=False,
                               edgecolor=_TRAIN_COLOUR, linewidth=3, clip_on=False, zorder=5))
        for lbl, n in zip(ax.get_xticklabels(), lengths):
            if n == train_length:
                lbl.set_color(_TRAIN_COLOUR)
                lbl.set_fontweight("bold")
    elif train_x is not None:
        ax.axvline(train_x, color=_TRAIN_COLOUR, linestyle="--", linewidth=2.5, zorder=5)
        ax.set_xlabel(f"context length (tokens); dashed line: train L={train_length:,}")
    elif train_length:
        side = "<" if train_length < lengths[0] else ">"
        ax.set_xlabel(f"context length (tokens); train L={train_length:,} {side} all columns")


def _length_labels(lengths: Sequence[int], train_length: int | None) -> list[str]:
    labels = []
    for n in lengths:
        parts = [f"{n:,}"]
        if train_length:
            parts.append("train L" if n == train_length else _ratio_label(n, train_length))
        labels.append("\n".join(parts))
    return labels


def _grid_arrays(rows: Iterable[Cell], row_of: Mapping[Any, int], col: Mapping[int, int],
                 key_of: Any) -> tuple[Any, Any]:
    """(accuracy, state) arrays of one heatmap panel, rows × lengths; state is 0 for an absent
    cell, 1 for a value, 2 for N/A. Repeated cells are averaged, weighted by n."""
    import numpy as np

    groups: dict[tuple[int, int], list[Cell]] = defaultdict(list)
    for r in rows:
        k, n = key_of(r), finite_int(r.get("length"))
        if k in row_of and n is not None:
            groups[(row_of[k], col[n])].append(r)
    acc = np.full((len(row_of), len(col)), np.nan)
    state = np.zeros((len(row_of), len(col)), dtype=int)
    for (i, j), grp in groups.items():
        mean = ok_mean(grp)
        if mean is None:
            state[i, j] = 2
        else:
            acc[i, j], state[i, j] = mean, 1
    return acc, state


def _lengths_of(rows: Sequence[Cell], probe: str) -> list[int]:
    lengths = sorted({n for r in rows if (n := finite_int(r.get("length"))) is not None})
    if not lengths:
        raise ValueError(f"{probe} cells carry no 'length' to plot")
    return lengths


def panels_figure(cells: Iterable[Cell], *, probe: str, row_key: str, row_label: str,
                  train_length: int | None, title: str) -> Any:
    """Accuracy heatmaps (``row_key`` as a percentage × length), one panel per variant of
    ``probe``'s cells (the needle grid: depth × length).

    N/A cells (accuracy None or status "n/a: ...") are grey with "N/A"; absent cells are
    blank. The training length is boxed (or a dashed line if it falls between columns)."""
    from matplotlib import colormaps

    rows = select(cells, probe)
    lengths = _lengths_of(rows, probe)
    row_keys = sorted({finite_float(r.get(row_key)) for r in rows},
                      key=lambda d: (d is None, d if d is not None else 0.0))
    variants = list(dict.fromkeys(variant_of(r) for r in rows))
    col = {n: j for j, n in enumerate(lengths)}
    row_of = {d: i for i, d in enumerate(row_keys)}

    cmap = colormaps["viridis"].with_extremes(bad=_NA_COLOUR)
    n_var, n_rows, n_cols = len(variants), len(row_keys), len(lengths)
    panel_w = max(2.6, 0.85 * n_cols + 1.3)
    fig = new_figure((panel_w * n_var + 1.2, max(2.8, 0.48 * n_rows + 2.0)))
    axes = fig.subplots(1, n_var, squeeze=False)[0]
    font = 9 if n_cols <= 8 else 7
    xticklabels = _length_labels(lengths, train_length)
    ylabels = ["—" if d is None else f"{100 * d:.0f}%" for d in row_keys]

    image = None
    for ax, variant in zip(axes, variants):
        vrows = [r for r in rows if variant_of(r) == variant]
        acc, state = _grid_arrays(vrows, row_of, col, lambda r: finite_float(r.get(row_key)))
        image = _draw_panel(ax, acc, state, cmap, font)
        ax.set_xticks(range(n_cols), xticklabels, fontsize=8)
        ax.set_yticks(range(n_rows), ylabels, fontsize=8)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(row_label)
        _mark_train_length(ax, lengths, train_length, n_rows)
        subtitle = variant
        copy_vals = first_values(vrows, "copy_any_value")
        if copy_vals:
            subtitle += f"\ncopy-any-value line = {', '.join(f'{v:.2f}' for v in copy_vals[:3])}"
        ax.set_title(subtitle, fontsize=10)

    fig.colorbar(image, ax=list(axes), label="accuracy", shrink=0.9, pad=0.02)
    title = fit_text(title, fig.get_size_inches()[0], 12)
    grow_for(fig, title, 12)
    fig.suptitle(title, fontsize=12)
    add_note(fig, cells_note(rows))
    return fig


def grid_figure(cells: Iterable[Cell], *, probe: str, row_key: str, row_label: str,
                heading: str, train_length: int | None, title: str = "") -> Any:
    """One heatmap of ``probe``'s accuracy, ``row_key`` (variant, or a number such as hops or
    margin) × length, drawn like the needle heatmap (N/A grey, absent blank, training length
    boxed); the chance and copy lines of each row in its tick label; ``heading`` above
    ``title``."""
    from matplotlib import colormaps

    rows = select(cells, probe)
    lengths = _lengths_of(rows, probe)
    numeric = row_key != "variant"

    def key_of(r: Cell) -> Any:
        return finite_int(r.get(row_key)) if numeric else variant_of(r)

    keys = list(dict.fromkeys(key_of(r) for r in rows))
    if numeric:
        keys = sorted(k for k in keys if k is not None)
    row_of = {k: i for i, k in enumerate(keys)}
    acc, state = _grid_arrays(rows, row_of, {n: j for j, n in enumerate(lengths)}, key_of)
    labels = []
    for k in keys:
        krows = [r for r in rows if key_of(r) == k]
        copy_v, chance_v = first_values(krows, "copy_any_value"), first_values(krows, "chance")
        lines = [str(k)]
        if copy_v:
            lines.append(f"copy {copy_v[0]:.2f}")
        if chance_v:
            lines.append(f"chance {chance_v[0]:.2g}")
        labels.append("\n".join(lines))
    cmap = colormaps["viridis"].with_extremes(bad=_NA_COLOUR)
    n_rows, n_cols = len(keys), len(lengths)
    fig = new_figure((max(4.0, 0.95 * n_cols + 3.0), max(2.8, 0.75 * n_rows + 1.8)))
    ax = fig.subplots()
    image = _draw_panel(ax, acc, state, cmap, 9 if n_cols <= 8 else 7)
    ax.set_xticks(range(n_cols), _length_labels(lengths, train_length), fontsize=8)
    ax.set_yticks(range(n_rows), labels, fontsize=8)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(row_label)
    _mark_train_length(ax, lengths, train_length, n_rows)
    fig.colorbar(image, ax=ax, label="accuracy", shrink=0.9, pad=0.02)
    heading = fit_text(f"{heading}\n{title}" if title else heading,
                       fig.get_size_inches()[0] * 0.75, 10)
    grow_for(fig, heading, 10)
    ax.set_title(heading, fontsize=10)
    add_note(fig, cells_note(rows))
    return fig


# --------------------------------------------------------------------------- perplexity


def _ppl_curve(rows: Sequence[Cell], variant: str, lengths: Sequence[int]) -> list[float]:
    """Mean perplexity of ``variant`` at each length; NaN (a break in the line) where N/A."""
    ys = []
    for n in lengths:
        grp = [r for r in rows if variant_of(r) == variant and finite_int(r.get("length")) == n
               and not _is_na(r, "ppl")]
        vals = [p for r in grp if (p := finite_float(r.get("ppl"))) is not None and p > 0]
        ys.append(_mean(vals) if vals else math.nan)
    return ys


def plot_perplexity(cells: Iterable[Cell], path: str | os.PathLike[str], *,
                    train_length: int | None, title: str = "", text: str = "") -> Path:
    """:func:`perplexity_figure`, saved as a PNG at ``path``."""
    return save_png(perplexity_figure(cells, train_length=train_length, title=title,
                                      text=text), path)


def perplexity_figure(cells: Iterable[Cell], *, train_length: int | None,
                      title: str = "", text: str = "") -> Any:
    """Perplexity against context length (log2 x, log y), one line per variant; N/A points
    (ppl None) are skipped and break the line; dashed vertical line at the training length;
    ``text`` (what was read) under the title, the N/A reasons in a footnote."""
    from matplotlib.ticker import NullFormatter, NullLocator

    rows = select(cells, "perplexity")
    lengths = sorted({n for r in rows if (n := finite_int(r.get("length"))) is not None and n > 0})
    if not lengths:
        raise ValueError("perplexity cells carry no positive 'length' to plot")
    variants = list(dict.fromkeys(variant_of(r) for r in rows))
    markers = "osD^vP*X"

    fig = new_figure((7.5, 4.6))
    ax = fig.subplots()
    any_data = False
    for k, (variant, colour) in enumerate(zip(variants, colours(len(variants)))):
        ys = _ppl_curve(rows, variant, lengths)
        if all(math.isnan(y) for y in ys):
            continue
        any_data = True
        ax.plot(lengths, ys, color=colour, marker=markers[k % len(markers)], linewidth=1.8,
                markersize=6, label=variant)

    ax.set_xscale("log", base=2)
    lo_x, hi_x = lengths[0], lengths[-1]
    if train_length:
        lo_x, hi_x = min(lo_x, train_length), max(hi_x, train_length)
    ax.set_xlim(lo_x / 1.3, hi_x * 1.3)
    ax.set_xticks(lengths, [f"{n:,}" for n in lengths], fontsize=8)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    if any_data:
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
    else:
        no_data(ax, "no perplexity to plot (all cells N/A)")
    if train_length:
        ax.axvline(train_length, color=_TRAIN_COLOUR, linestyle="--", linewidth=1.6,
                   label=f"train length ({train_length:,})")
    ax.set_xlabel("context length (tokens, log2 scale)")
    ax.set_ylabel("perplexity (log scale)" if any_data else "perplexity")
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=9, loc="best")
    heading = title or "Perplexity by context length"
    ax.set_title(f"{heading}\non {text}" if text else heading, fontsize=10 if text else 12)
    add_note(fig, "\n".join(line for line in cells_note(rows).splitlines()
                            if line.startswith("N/A")))
    return fig

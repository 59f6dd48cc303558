"""``blocklab-compare``: one table (and two plots) over many training runs.

Point it at run directories, or at directories holding them (a Hydra multirun sweep, an
``outputs/<experiment>`` folder; searched up to 3 levels deep), and it lists one row per run:
the config keys that differ between the runs (the *varied axes*), the parameter count, the
run's status, final losses, headline probe numbers and throughput. Partial sweeps are fine:
a crashed or still-running job is listed with whatever it left behind.

Outputs (into ``--out``): ``compare.csv`` (raw values), ``compare.md`` (the table printed to
stdout, plus the plots), ``loss_curves.png`` and ``probe_accuracy.png``.

A run directory is a directory holding ``config.yaml`` (the resolved training config) or a
sweep's ``status.json``; ``summary.json``, ``status.json`` and ``logs/version_*/metrics.csv``
are read when present. matplotlib is imported lazily and only through its object API.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from blocklab.eval.plots import finite_float, finite_int
from blocklab.train.run import flatten

MAX_DEPTH = 3
RUN_MARKERS = ("config.yaml", "status.json")

# Config keys that never count as an experimental axis (paths, resume bookkeeping, logging,
# probe settings, UI). Entries ending in "." are prefixes.
BOOKKEEPING = ("run_dir", "resume", "out_root", "allow_data_change", "logger.", "probes.",
               "checkpoint_probes.", "trainer.progress_bar")

# Result columns, after the run name and the varied axes. ``ppl_*`` only when some run has them.
METRIC_COLUMNS = ("params", "status", "step", "train_loss", "val_loss", "needle_in",
                  "needle_beyond", "eff_len", "litm_gap", "ppl_L", "ppl_max", "tokens_per_s",
                  "error")
OPTIONAL_COLUMNS = ("ppl_L", "ppl_max")
CSV_EXTRA = ("path", "job", "needle_variant", "ppl_max_len")
ERROR_CHARS = 80

_MISSING = object()


class CompareError(ValueError):
    """A user-facing problem (bad path, no runs, unknown sort column): one line, exit code 2."""

    exit_code = 2


# --------------------------------------------------------------------------- small helpers


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when missing, half-written or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_config(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    from omegaconf import OmegaConf

    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:  # unreadable / half-written YAML: list the run without a config
        return None
    return data if isinstance(data, dict) else None


def is_bookkeeping(key: str) -> bool:
    return any(key == b.rstrip(".") or (b.endswith(".") and key.startswith(b))
               for b in BOOKKEEPING)


def _canon(value: Any) -> str:
    """A hashable, order-stable form of a config value for equality tests."""
    if value is _MISSING:
        return "\x00missing"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True, default=str)


def show_value(value: Any) -> str:
    """How a config value reads in a table / legend (YAML-ish: null, true, [a, b])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {show_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return fmt_float(value)
    return str(value)


def fmt_float(x: float) -> str:
    """4 significant digits; large magnitudes as whole numbers rather than 1.501e+04."""
    if math.isfinite(x) and 1e4 <= abs(x) < 1e12:
        return f"{x:.0f}"
    return f"{x:.4g}"


def short_key(key: str) -> str:
    """``model.position.name`` -> ``position``; ``model.d_model`` -> ``d_model``."""
    parts = key.split(".")
    if len(parts) > 1 and parts[-1] == "name":
        parts = parts[:-1]
    return parts[-1]


# --------------------------------------------------------------------------- discovery


def _is_run_dir(path: Path) -> bool:
    return any((path / m).is_file() for m in RUN_MARKERS)


def find_runs(path: str | Path, max_depth: int = MAX_DEPTH) -> list[Path]:
    """Run directories at or below ``path`` (``path`` itself counts as depth 0). The search does
    not descend into a run directory (its checkpoints hold config.yaml copies) nor into hidden
    directories (``.hydra``)."""
    root = Path(path)
    if not root.is_dir():
        return []
    found: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        if _is_run_dir(d):
            found.append(d)
            return
        if depth >= max_depth:
            return
        try:
            children = sorted(c for c in d.iterdir() if c.is_dir() and not c.name.startswith("."))
        except OSError:
            return
        for c in children:
            walk(c, depth + 1)

    walk(root, 0)
    return found


# --------------------------------------------------------------------------- logs


def _version_key(p: Path) -> tuple[int, str]:
    m = re.fullmatch(r"version_(\d+)", p.parent.name)
    return (int(m.group(1)) if m else 1 << 30, p.parent.name)


def read_curves(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every numeric column of ``logs/version_*/metrics.csv`` as sorted ``(step, value)`` lists.
    Versions (resumed runs) are read in version order; for a step logged more than once, the
    later row wins. Empty cells are skipped, so train and val rows of one step merge."""
    files = sorted(Path(run_dir).glob("logs/version_*/metrics.csv"), key=_version_key)
    series: dict[str, dict[int, float]] = {}
    for f in files:
        try:
            with f.open(newline="") as fh:
                for row in csv.DictReader(fh):
                    step = finite_int(row.get("step"))
                    if step is None:
                        continue
                    for col, cell in row.items():
                        if col in (None, "step", "epoch"):
                            continue
                        v = finite_float(cell)
                        if v is not None:
                            series.setdefault(col, {})[step] = v
        except (OSError, csv.Error, UnicodeDecodeError):
            continue
    return {k: sorted(v.items()) for k, v in series.items()}


def _last(curve: Sequence[tuple[int, float]] | None) -> float | None:
    return curve[-1][1] if curve else None


# --------------------------------------------------------------------------- probes


def _distractors(variant: str) -> int | None:
    m = re.search(r"(\d+)\s*distractor", variant)
    return int(m.group(1)) if m else None


def needle_headline(probes: Mapping[str, Any] | None) -> dict[str, Any]:
    """The needle variant with the most distractors: accuracies within / beyond the training
    length with their Wilson intervals, effective length and the copy-any-value line."""
    needle = (probes or {}).get("needle")
    if not isinstance(needle, Mapping) or not needle:
        return {}
    variants = [(k, v) for k, v in needle.items() if isinstance(v, Mapping)]
    if not variants:
        return {}
    name, s = max(variants, key=lambda kv: (_distractors(kv[0]) is not None,
                                            _distractors(kv[0]) or 0))
    within = s.get("within_train_length") or {}
    beyond = s.get("beyond_train_length") or {}
    k = _distractors(name)
    copy = finite_float(s.get("copy_any_value"))
    if copy is None and k is not None:
        copy = 1 / (k + 1)
    return {
        "needle_variant": name,
        "needle_in": finite_float(within.get("accuracy")),
        "needle_in_ci": (finite_float(within.get("ci_low")), finite_float(within.get("ci_high"))),
        "needle_beyond": finite_float(beyond.get("accuracy")),
        "needle_beyond_ci": (finite_float(beyond.get("ci_low")), finite_float(beyond.get("ci_high"))),
        "eff_len": finite_int(s.get("effective_length")),
        "copy_any_value": copy,
    }


def litm_gap(probes: Mapping[str, Any] | None) -> float | None:
    """best_worst_gap of the ``kv_records/m=<m>`` curve with the largest m."""
    litm = (probes or {}).get("litm")
    if not isinstance(litm, Mapping):
        return None
    curves = []
    for k, v in litm.items():
        m = re.fullmatch(r"kv_records/m=(\d+)", str(k))
        if m and isinstance(v, Mapping):
            curves.append((int(m.group(1)), v))
    if not curves:
        return None
    return finite_float(max(curves, key=lambda c: c[0])[1].get("best_worst_gap"))


def sliding_ppl(probes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Sliding-window perplexity at the training length and at the largest length that has a
    value (``ppl_max_len`` says which)."""
    rows = (probes or {}).get("perplexity")
    if not isinstance(rows, list):
        return {}
    sliding = [(finite_int(r.get("length")), finite_float(r.get("ppl"))) for r in rows
               if isinstance(r, Mapping) and r.get("variant") == "sliding"]
    sliding = [(n, p) for n, p in sliding if n is not None and p is not None]
    if not sliding:
        return {}
    train_length = finite_int((probes or {}).get("train_length"))
    at_train = [p for n, p in sliding if n == train_length]
    n_max, p_max = max(sliding)
    return {"ppl_L": at_train[-1] if at_train else None, "ppl_max": p_max,
            "ppl_max_len": n_max}


# --------------------------------------------------------------------------- runs


_PARAM_CACHE: dict[str, int | None] = {}


def count_params(model: Any) -> int | None:
    """Parameter count of a model config dict; None when it is missing or not valid."""
    if not isinstance(model, Mapping):
        return None
    key = _canon(model)
    if key not in _PARAM_CACHE:
        try:
            from blocklab.config import model_config
            from blocklab.model.estimate import count_params as _count

            _PARAM_CACHE[key] = int(_count(model_config(dict(model))))
        except Exception:  # any invalid / older config: leave the cell blank
            _PARAM_CACHE[key] = None
    return _PARAM_CACHE[key]


def _first_line(text: Any, limit: int = ERROR_CHARS) -> str | None:
    if text is None:
        return None
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    if not lines:
        return None
    line = lines[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """Everything one run directory tells (varied axes are filled in by :func:`collect`)."""
    d = Path(run_dir)
    config = _read_config(d / "config.yaml")
    status = _read_json(d / "status.json")
    summary = _read_json(d / "summary.json")
    curves = read_curves(d)
    metrics = (summary or {}).get("metrics") or {}
    probes = (summary or {}).get("probes")
    probes = probes if isinstance(probes, Mapping) else None

    job = finite_int((status or {}).get("job"))
    if status and status.get("status"):
        state = str(status["status"])
    else:
        state = "ok" if summary is not None else "incomplete"
    name = d.name
    if job is not None:
        run = f"job {job}" if name == str(job) else f"job {job} {name}"
    else:
        run = name

    def final(summary_key: str) -> float | None:
        v = finite_float(metrics.get(summary_key))
        return v if v is not None else _last(curves.get(summary_key))

    step = finite_int((summary or {}).get("step"))
    if step is None:
        steps = [c[-1][0] for c in curves.values() if c]
        step = max(steps) if steps else None

    row: dict[str, Any] = {
        "run": run, "name": name, "path": str(d), "job": job,
        "config": flatten(config) if config else {},
        "has_config": config is not None,
        "params": count_params((config or {}).get("model")),
        "status": state, "step": step,
        "train_loss": final("train/loss"), "val_loss": final("val/loss"),
        "needle_in": None, "needle_beyond": None, "eff_len": None, "litm_gap": litm_gap(probes),
        "ppl_L": None, "ppl_max": None, "ppl_max_len": None,
        "tokens_per_s": final("train/tokens_per_s"),
        "error": _first_line((status or {}).get("error")),
        "overrides": list((status or {}).get("overrides") or []),
        "has_probes": probes is not None,
        "curves": curves,
    }
    row.update(needle_headline(probes))
    row.update(sliding_ppl(probes))
    return row


def varied_keys(configs: Iterable[Mapping[str, Any]]) -> list[str]:
    """Flattened (dotted) config keys whose values differ between the configs, bookkeeping keys
    excluded, in order of first appearance. A key present in some configs and absent from
    others counts as varied. Nested or already-flat mappings are both accepted."""
    flats = [flatten(c) for c in configs]
    if len(flats) < 2:
        return []
    order: dict[str, None] = {}
    for f in flats:
        for k in f:
            if not is_bookkeeping(k):
                order.setdefault(k)
    return [k for k in order if len({_canon(f.get(k, _MISSING)) for f in flats}) > 1]


def _label(row: Mapping[str, Any], keys: Sequence[str], sep: str = ", ") -> str:
    if not keys or not row.get("has_config"):
        return str(row["run"])
    shorts = [short_key(k) for k in keys]
    if len(set(shorts)) < len(shorts):  # ambiguous short names: keep the full keys
        shorts = list(keys)
    return sep.join(f"{s}={show_value(row['config'].get(k))}" if k in row["config"]
                    else f"{s}=-" for s, k in zip(shorts, keys))


def _default_order(row: Mapping[str, Any]) -> tuple:
    job = row.get("job")
    return (job is None, job if job is not None else 0, str(row.get("name")), row.get("path"))


def collect(paths: str | Path | Iterable[str | Path]) -> list[dict[str, Any]]:
    """One dict per run found under ``paths`` (each a run directory or a folder holding runs),
    in job-number-then-name order. Keys: ``run``, ``name``, ``path``, ``job``, every varied axis
    (dotted config key -> value), ``axes`` (the varied keys, in order), ``label`` (short axis
    values), ``config`` (flattened), the metric columns (:data:`METRIC_COLUMNS`), probe details
    (``needle_in_ci``/``needle_beyond_ci`` Wilson bounds, ``copy_any_value``, ...) and
    ``curves`` (metric -> [(step, value)]). Raises :class:`CompareError` for a path that does not
    exist or holds no runs."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    seen: set[Path] = set()
    rows = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise CompareError(f"blocklab-compare: {p}: no such file or directory")
        runs = find_runs(p)
        if not runs:
            raise CompareError(f"blocklab-compare: {p}: no run directories (a folder holding "
                               f"config.yaml or status.json) within {MAX_DEPTH} levels")
        for r in runs:
            key = r.resolve()
            if key not in seen:
                seen.add(key)
                rows.append(load_run(r))
    keys = varied_keys([r["config"] for r in rows if r["has_config"]])
    for r in rows:
        r["axes"] = keys
        for k in keys:
            r[k] = r["config"].get(k) if r["has_config"] else None
        r["label"] = _label(r, keys)
    rows.sort(key=_default_order)
    return rows


# --------------------------------------------------------------------------- table


def table_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    axes = list(rows[0]["axes"]) if rows else []
    metric = [c for c in METRIC_COLUMNS
              if c not in OPTIONAL_COLUMNS or any(r.get(c) is not None for r in rows)]
    return ["run", *axes, *metric]


def sort_rows(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    """Sort by ``column`` (a leading ``-`` sorts descending); missing values always last.
    Numbers sort numerically, anything else by its text."""
    desc = column.startswith("-")
    col = column[1:] if desc else column
    if rows and col not in table_columns(rows) and col not in rows[0]:
        raise CompareError(f"blocklab-compare: --sort {column}: unknown column (choose from: "
                           f"{', '.join(table_columns(rows))})")
    present = [r for r in rows if r.get(col) is not None and r.get(col) != ""]
    missing = [r for r in rows if r.get(col) is None or r.get(col) == ""]

    def key(r: Mapping[str, Any]) -> tuple:
        v = r.get(col)
        n = finite_float(v)
        return (0, n, "") if n is not None else (1, 0.0, show_value(v))

    present.sort(key=key, reverse=desc)
    return present + missing


def _cell_md(value: Any, column: str) -> str:
    if value is None or value == "":
        return "-"
    if column in ("params", "step", "eff_len") and finite_int(value) is not None:
        text = str(finite_int(value))
    elif isinstance(value, float):
        text = fmt_float(value)
    else:
        text = show_value(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _cell_csv(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, tuple, Mapping, bool)):
        return show_value(value)
    return value


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    cols = list(columns or table_columns(rows))
    numeric = {c for c in cols
               if any(finite_float(r.get(c)) is not None for r in rows)
               and all(r.get(c) is None or finite_float(r.get(c)) is not None for r in rows)}
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "|".join("---:" if c in numeric else "---" for c in cols) + "|"]
    lines += ["| " + " | ".join(_cell_md(r.get(c), c) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def write_csv(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    cols = table_columns(rows)
    extra = [c for c in CSV_EXTRA if c not in cols
             and (not c.startswith("ppl") or any(r.get(c) is not None for r in rows))]
    out = Path(path)
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*cols, *extra])
        for r in rows:
            w.writerow([_cell_csv(r.get(c)) for c in (*cols, *extra)])
    return out


def write_markdown(rows: Sequence[Mapping[str, Any]], path: str | Path, *, sources: Sequence[str],
                   plots: Sequence[str] = ()) -> Path:
    axes = list(rows[0]["axes"]) if rows else []
    parts = ["# blocklab-compare", "",
             f"{len(rows)} runs from: " + ", ".join(f"`{s}`" for s in sources), "",
             "Varied axes: " + (", ".join(f"`{a}`" for a in axes) if axes else "none"), "",
             markdown_table(rows), "",
             "needle_in / needle_beyond: accuracy within / beyond the training length of the "
             "needle variant with the most distractors; eff_len: its effective length; "
             "litm_gap: best-worst gap of the kv_records curve with the most records; ppl_L / "
             "ppl_max: sliding-window perplexity at the training length / the largest length.",
             ""]
    parts += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    out = Path(path)
    out.write_text("\n".join(parts).rstrip() + "\n")
    return out


# --------------------------------------------------------------------------- plots


def _new_figure(figsize: tuple[float, float]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _colours(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _unique_labels(rows: Sequence[Mapping[str, Any]], sep: str = ", ") -> list[str]:
    labels = [_label(r, r.get("axes") or [], sep) for r in rows]
    return [f"{lab} ({r['run']})" if labels.count(lab) > 1 else lab
            for lab, r in zip(labels, rows)]


def plot_loss_curves(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """train/loss against step per run (solid), val/loss dashed with markers, log y."""
    fig = _new_figure((10, 5.5))
    ax = fig.add_subplot()
    plotted = False
    for r, colour, label in zip(rows, _colours(len(rows)), _unique_labels(rows)):
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
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  ncol=1 if len(rows) <= 20 else 2)
    else:
        ax.text(0.5, 0.5, "no logged losses (logs/version_*/metrics.csv)",
                transform=ax.transAxes, ha="center", va="center", color="dimgray")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("train/loss (solid) and val/loss (dashed, markers)")
    ax.grid(True, which="both", alpha=0.3)
    out = Path(path)
    fig.savefig(out, dpi=120, format="png", facecolor="white")
    return out


def plot_probe_accuracy(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path | None:
    """Grouped bars per run: needle accuracy within vs beyond the training length, Wilson
    interval error bars, and the copy-any-value line. None (nothing written) when no run has
    needle results."""
    runs = [r for r in rows if r.get("needle_in") is not None or r.get("needle_beyond") is not None]
    if not runs:
        return None
    fig = _new_figure((max(6.0, 1.1 * len(runs) + 2.5), 5.0))
    ax = fig.add_subplot()
    width = 0.38
    labels = _unique_labels(runs, sep="\n")
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
    copies = [r.get("copy_any_value") for r in runs]
    distinct = {round(c, 9) for c in copies if c is not None}
    if len(distinct) == 1:
        c = distinct.pop()
        ax.axhline(c, color="dimgray", ls=":", lw=1.2, label=f"copy-any-value ({c:.3g})")
    else:
        labelled = False
        for i, c in enumerate(copies):
            if c is not None:
                ax.hlines(c, i - 0.45, i + 0.45, color="dimgray", ls=":", lw=1.2,
                          label=None if labelled else "copy-any-value 1/(k+1)")
                labelled = True
    variants = sorted({str(r.get("needle_variant")) for r in runs})
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels(labels, fontsize=8, rotation=0 if len(runs) <= 6 else 30,
                       ha="center" if len(runs) <= 6 else "right")
    ax.set_xlim(-0.7, len(runs) - 0.3)
    ax.set_ylim(0, 1.22)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("needle accuracy (95% Wilson CI)")
    ax.set_title(f"needle retrieval ({', '.join(variants)})")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", ncol=3)
    out = Path(path)
    fig.savefig(out, dpi=120, format="png", facecolor="white")
    return out


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="blocklab-compare",
        description="Compare training runs: one row per run with the config keys that differ "
                    "between them, losses, probe headlines and throughput.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a run directory or a folder holding run directories (a sweep; "
                        f"searched {MAX_DEPTH} levels deep)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="where compare.csv/.md and the plots go (default: the PATH when one "
                        "was given, else ./outputs/compare_<timestamp>)")
    p.add_argument("--sort", metavar="COLUMN", default=None,
                   help="sort by this column, missing values last (prefix '-' for descending, "
                        "e.g. --sort=-needle_in); default: job number, then name")
    p.add_argument("--no-plots", action="store_true", help="skip loss_curves.png and "
                   "probe_accuracy.png")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        rows = collect(args.paths)
        if args.sort:
            rows = sort_rows(rows, args.sort)
    except CompareError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code

    if args.out:
        out = Path(args.out)
    elif len(args.paths) == 1:
        out = Path(args.paths[0])
    else:
        out = Path("outputs") / f"compare_{dt.datetime.now():%Y-%m-%d_%H-%M-%S}"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"blocklab-compare: {out}: cannot create output directory ({e.strerror})",
              file=sys.stderr)
        return CompareError.exit_code

    print(markdown_table(rows))
    written = [write_csv(rows, out / "compare.csv")]
    plots: list[Path] = []
    if not args.no_plots:
        plots.append(plot_loss_curves(rows, out / "loss_curves.png"))
        probe = plot_probe_accuracy(rows, out / "probe_accuracy.png")
        if probe is None:
            print("blocklab-compare: no run has probe results; skipped probe_accuracy.png",
                  file=sys.stderr)
        else:
            plots.append(probe)
    written.append(write_markdown(rows, out / "compare.md", sources=args.paths,
                                  plots=[str(p) for p in plots]))
    print(f"wrote {', '.join(str(p) for p in [*written, *plots])}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

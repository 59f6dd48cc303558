"""Finding run directories and reading what each one left behind, for ``blocklab-compare``.

A run directory holds ``config.yaml`` (the resolved training config) or a sweep's
``status.json``. Read when present: ``status.json`` (sweep job number, status, error,
overrides), ``summary.json`` (final metrics and probe summaries), ``logs/version_*/metrics.csv``
(the loss curves; one version per resume), and for the parameter count ``run.json``,
``summary.json`` or the newest checkpoint's ``meta.json``. Any of them may be missing or
half-written — a crashed or still-running job is listed with whatever it left behind.

Nothing here imports torch (the parameter count is read from the run's files, never recomputed
from the config), so the tool runs wherever the results were copied to.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from blocklab.compare.text import run_label
from blocklab.plotting import finite_float, finite_int
from blocklab.provenance import flatten, is_bookkeeping

MAX_DEPTH = 3
RUN_MARKERS = ("config.yaml", "status.json")
ERROR_CHARS = 80

_MISSING = object()


class CompareError(ValueError):
    """A user-facing problem (bad path, no runs, unknown sort column): one line, exit code 2."""

    exit_code = 2


# --------------------------------------------------------------------------- files


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when missing, half-written, not an object or not a
    regular file (a FIFO in someone's run directory would block ``read_text`` for ever)."""
    if not path.is_file():
        return None
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


def _first_line(text: Any, limit: int = ERROR_CHARS) -> str | None:
    if text is None:
        return None
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    if not lines:
        return None
    line = lines[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _count(value: Any) -> int | None:
    n = finite_int(value)
    return n if n is not None and n >= 0 else None


def _checkpoint_step(path: Path) -> int:
    m = re.fullmatch(r"step-(\d+)", path.name)
    return int(m.group(1)) if m else -1


def read_params(run_dir: str | Path, summary: Mapping[str, Any] | None = None) -> int | None:
    """The run's parameter count as training recorded it: ``run.json`` (written when a run
    starts), else ``summary.json`` (``summary`` when already read), else the ``meta.json`` of
    the newest checkpoint that records it; None when no file has it."""
    d = Path(run_dir)
    for data in (_read_json(d / "run.json"), summary or _read_json(d / "summary.json")):
        n = _count((data or {}).get("params"))
        if n is not None:
            return n
    for ckpt in sorted(d.glob("checkpoints/step-*"), key=_checkpoint_step, reverse=True):
        n = _count((_read_json(ckpt / "meta.json") or {}).get("params"))
        if n is not None:
            return n
    return None


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
        if not f.is_file():  # a FIFO or a directory is no log
            continue
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


# --------------------------------------------------------------------------- probe headlines


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


def _run_name(d: Path, job: int | None) -> str:
    if job is None:
        return d.name
    return f"job {job}" if d.name == str(job) else f"job {job} {d.name}"


def _status(status: Mapping[str, Any], summary: Mapping[str, Any] | None) -> str:
    """The sweep's word for the job when it wrote one, else "ok" once training wrote its
    summary, else "incomplete" (crashed outside a sweep, or still running)."""
    if status.get("status"):
        return str(status["status"])
    return "ok" if summary is not None else "incomplete"


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """Everything one run directory tells (varied axes are filled in by :func:`collect`)."""
    d = Path(run_dir)
    config = _read_config(d / "config.yaml")
    status = _read_json(d / "status.json") or {}
    summary = _read_json(d / "summary.json")
    curves = read_curves(d)
    metrics = (summary or {}).get("metrics") or {}
    probes = (summary or {}).get("probes")
    probes = probes if isinstance(probes, Mapping) else None
    job = finite_int(status.get("job"))

    metric_steps = (summary or {}).get("metric_steps")
    metric_steps = metric_steps if isinstance(metric_steps, Mapping) else {}

    def final(key: str) -> tuple[float | None, int | None]:
        """(the run's last value of ``key``, the step it comes from; None where unknown)."""
        v, curve = finite_float(metrics.get(key)), curves.get(key)
        if v is None:
            return (curve[-1][1], curve[-1][0]) if curve else (None, None)
        at = finite_int(metric_steps.get(key))
        if at is None and curve and curve[-1][1] == v:  # a summary from before metric_steps
            at = curve[-1][0]
        return v, at

    step = finite_int((summary or {}).get("step"))
    if step is None:
        steps = [c[-1][0] for c in curves.values() if c]
        step = max(steps) if steps else None
    (train_loss, train_at), (val_loss, val_at) = final("train/loss"), final("val/loss")
    tokens_per_s, tokens_at = final("train/tokens_per_s")

    row: dict[str, Any] = {
        "run": _run_name(d, job), "name": d.name, "path": str(d), "job": job,
        "config": flatten(config) if config else {},
        "has_config": config is not None,
        "params": read_params(d, summary),
        "status": _status(status, summary), "step": step,
        "train_loss": train_loss, "val_loss": val_loss,
        "train_loss_step": train_at, "val_loss_step": val_at, "tokens_per_s_step": tokens_at,
        "needle_in": None, "needle_beyond": None, "eff_len": None, "litm_gap": litm_gap(probes),
        "ppl_L": None, "ppl_max": None, "ppl_max_len": None,
        "tokens_per_s": tokens_per_s,
        "error": _first_line(status.get("error")),
        "overrides": list(status.get("overrides") or []),
        "has_probes": probes is not None,
        "curves": curves,
    }
    row.update(needle_headline(probes))
    row.update(sliding_ppl(probes))
    return row


def _canon(value: Any) -> str:
    """A hashable, order-stable form of a config value for equality tests."""
    if value is _MISSING:
        return "\x00missing"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True, default=str)


def varied_keys(configs: Iterable[Mapping[str, Any]]) -> list[str]:
    """Flattened (dotted) config keys whose values differ between the configs, bookkeeping keys
    (``blocklab.provenance.BOOKKEEPING``) excluded, in order of first appearance. A key present
    in some configs and absent from others counts as varied. Nested or already-flat mappings
    are both accepted."""
    flats = [flatten(c) for c in configs]
    if len(flats) < 2:
        return []
    order: dict[str, None] = {}
    for f in flats:
        for k in f:
            if not is_bookkeeping(k):
                order.setdefault(k)
    return [k for k in order if len({_canon(f.get(k, _MISSING)) for f in flats}) > 1]


def _default_order(row: Mapping[str, Any]) -> tuple:
    job = row.get("job")
    return (job is None, job if job is not None else 0, str(row.get("name")), row.get("path"))


def _run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """The run directories under each path, each once (by resolved path), in search order."""
    seen: set[Path] = set()
    out = []
    for p in map(Path, paths):
        if not p.exists():
            raise CompareError(f"blocklab-compare: {p}: no such file or directory")
        runs = find_runs(p)
        if not runs:
            raise CompareError(f"blocklab-compare: {p}: no run directories (a folder holding "
                               f"config.yaml or status.json) within {MAX_DEPTH} levels")
        for r in runs:
            if r.resolve() not in seen:
                seen.add(r.resolve())
                out.append(r)
    return out


def collect(paths: str | Path | Iterable[str | Path]) -> list[dict[str, Any]]:
    """One dict per run found under ``paths`` (each a run directory or a folder holding runs),
    in job-number-then-name order. Keys: ``run``, ``name``, ``path``, ``job``, every varied axis
    (dotted config key -> value), ``axes`` (the varied keys, in order), ``label`` (short axis
    values), ``config`` (flattened), the metric columns (``blocklab.compare.table
    .METRIC_COLUMNS``), probe details (``needle_in_ci``/``needle_beyond_ci`` Wilson bounds,
    ``copy_any_value``, ...) and ``curves`` (metric -> [(step, value)]). Raises
    :class:`CompareError` for a path that does not exist or holds no runs."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows = [load_run(r) for r in _run_dirs(paths)]
    keys = varied_keys([r["config"] for r in rows if r["has_config"]])
    for r in rows:
        r["axes"] = keys
        for k in keys:
            r[k] = r["config"].get(k) if r["has_config"] else None
        r["label"] = run_label(r, keys)
    rows.sort(key=_default_order)
    return rows

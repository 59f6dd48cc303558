"""What the stability monitors (train/monitors.py) leave in ``<run dir>/monitors/``: one PNG
per monitor (its curves over the steps, one line per layer or parameter group, its limit
dashed, the divergence step marked) and ``monitors.json`` (every series, the loss, and the
findings); and the line the run summary prints about them (:func:`describe`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

#: monitor -> (title, y label, log scale) of its figure, in the order written
FIGURES = {
    "attn_logit_max": ("largest pre-softmax attention logit", "logit", False),
    "attn_entropy_min": ("lowest mean attention entropy of a head", "nats", False),
    "logz": ("output log Z (logsumexp of the logits)", "log Z", False),
    "residual_rms": ("residual stream RMS after each block", "RMS", True),
    "residual_max": ("largest |activation| of the residual stream", "|x|", True),
    "update_ratio": ("update / parameter RMS ratio per group", "ratio", True),
    "grad_norm": ("gradient norm (before clipping)", "norm", True),
}

MONITORS_JSON = "monitors.json"


def figure_of(key: str) -> tuple[str, str]:
    """(figure, line label) of a series key: ``monitor/residual_rms/decoder.3`` ->
    (``residual_rms``, ``decoder.3``)."""
    if key == "train/grad_norm":
        return "grad_norm", "grad norm"
    parts = key.split("/", 2)
    if parts[1].startswith("logz_"):
        return "logz", parts[1].removeprefix("logz_")
    return parts[1], parts[2] if len(parts) > 2 else parts[1]


def write_outputs(out: Path, series: dict[str, list[list[float]]], losses: list[list[float]],
                  report: dict[str, Any], cfg: Any) -> list[Path]:
    """``monitors.json`` and one PNG per monitor that has readings; returns the files."""
    out.mkdir(parents=True, exist_ok=True)
    data = {"every": cfg.every, "batch_size": cfg.batch_size, "series": series,
            "loss": losses, "report": report, "summary": describe(report)}
    path = out / MONITORS_JSON
    path.write_text(json.dumps(_finite(data), indent=1))
    written = [path]
    by_figure: dict[str, dict[str, list[list[float]]]] = {}
    for key, points in series.items():
        fig, label = figure_of(key)
        by_figure.setdefault(fig, {})[label] = points
    for name, (title, ylabel, log) in FIGURES.items():
        if name in by_figure:
            written.append(plot(out / f"{name}.png", by_figure[name], title, ylabel, log,
                                report, _limit(name, cfg)))
    return written


def _limit(name: str, cfg: Any) -> float | None:
    """The limit line of a figure with one absolute limit (relative ones differ per line)."""
    return {"attn_logit_max": cfg.attn_logit_max, "attn_entropy_min": cfg.attn_entropy_min,
            "logz": cfg.logz_max, "update_ratio": cfg.update_ratio_max}.get(name)


def plot(path: Path, lines: dict[str, list[list[float]]], title: str, ylabel: str, log: bool,
         report: dict[str, Any], limit: float | None) -> Path:
    from blocklab.plotting import colours, new_figure, save_png

    fig = new_figure((7.0, 4.0))
    ax = fig.add_subplot()
    for (label, points), colour in zip(lines.items(), colours(len(lines))):
        steps = [p[0] for p in points]
        values = [p[1] if math.isfinite(p[1]) else float("nan") for p in points]
        if log:
            values = [v if v > 0 else float("nan") for v in values]
        ax.plot(steps, values, label=label, color=colour, marker="." if len(points) < 30 else None)
    if limit is not None and (not log or limit > 0):
        ax.axhline(limit, color="gray", linestyle="--", linewidth=1, label=f"limit {limit:g}")
    diverged = report.get("diverged")
    if diverged:
        ax.axvline(diverged["step"], color="red", linestyle=":", linewidth=1.2,
                   label=f"diverged (step {diverged['step']})")
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(lines) > 8 else 1)
    return save_png(fig, path)


def _finite(value: Any) -> Any:
    """JSON without NaN / inf (strings instead, as the run's other JSON files)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _reading(found: dict[str, Any]) -> str:
    rel, value, limit = found["relation"], float(found["value"]), float(found["limit"])
    shown = f"|{value:.4g}|" if rel == "|.|<=" else f"{value:.4g}"
    sign = "<" if rel == ">=" else ">"
    return f"{found['name']} at step {found['step']} ({shown} {sign} limit {limit:.4g})"


def describe(report: dict[str, Any] | None) -> str:
    """The summary's line: divergence and the first monitor out of its range, or, without a
    divergence, every monitor that left its range."""
    if not report:
        return "monitors off (monitors.every=0)"
    first, outs, div = report.get("first_out_of_range"), report.get("out_of_range") or [], \
        report.get("diverged")
    if div:
        low = div.get("running_min")
        low = "-" if low is None else f"{float(low):.4g}"
        why = f"; {div['why']}" if div.get("why") else ""
        line = (f"diverged at step {div['step']} (loss {float(div['loss']):.4g}, running min "
                f"{low}{why})")
        return line + ("; first monitor out of range: " + _reading(first) if first
                       else "; no monitor left its range before it")
    window = report.get("loss_window", 1)
    what = "loss" if window == 1 else f"loss averaged over ~{window} steps"
    line = f"no divergence ({what} within {report.get('diverged_above', 1.0):g} nats of its " \
           "running minimum)"
    if not outs:
        return line + "; every monitor stayed in its range"
    more = f" (and {len(outs) - 3} more)" if len(outs) > 3 else ""
    return line + "; out of range: " + "; ".join(_reading(f) for f in outs[:3]) + more


def read_report(run_dir: Path) -> dict[str, Any] | None:
    """The findings in ``<run dir>/monitors/monitors.json``, or None (monitors off)."""
    path = Path(run_dir) / "monitors" / MONITORS_JSON
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text()).get("report")
    except (OSError, ValueError):
        return None

"""Plots for the position-extrapolation study (docs/position_extrapolation.md): perplexity and
needle accuracy against evaluation length, one line per position scheme, from the final probe
summaries of a sweep made by ``blocklab-train experiment=position_extrapolation``.

    .venv/bin/python scripts/extrapolation_plots.py outputs/position_extrapolation/<sweep> \
        --out docs/figures
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml


def load(sweep: Path) -> dict[str, dict]:
    """position scheme -> final probe summary (jobs without one are reported and skipped)."""
    out = {}
    for job in sorted(p for p in sweep.iterdir() if (p / "config.yaml").exists()):
        cfg = yaml.safe_load((job / "config.yaml").read_text())
        name = cfg["model"]["position"]["name"]
        summary = job / "summary.json"
        probes = json.loads(summary.read_text()).get("probes") if summary.exists() else None
        if not probes:
            print(f"{job}: no final probe summary (failed or unfinished); skipped", file=sys.stderr)
            continue
        out[name] = probes
    return out


def table(runs: dict[str, dict]) -> str:
    """Markdown: perplexity (non-overlapping / sliding) and needle accuracy by length."""
    any_run = next(iter(runs.values()))
    lengths = sorted({r["length"] for r in any_run["perplexity"]})
    head = "| position | " + " | ".join(f"ppl@{n} (non-ov / slide)" for n in lengths) + " | " \
        + " | ".join(f"needle@{n}" for n in lengths) + " |"
    lines = [head, "|---|" + "---:|" * (2 * len(lengths))]
    for name, s in runs.items():
        ppl = {(r["variant"], r["length"]): r["ppl"] for r in s["perplexity"]}
        (needle,) = s["needle"].values()
        acc = needle["accuracy_by_length"]

        def f(x):
            return "N/A" if x is None else f"{x:.2f}"

        cells = [f"{f(ppl.get(('nonoverlapping', n)))} / {f(ppl.get(('sliding', n)))}"
                 for n in lengths]
        cells += [f(acc.get(str(n))) for n in lengths]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, dict], out: Path) -> list[Path]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out.mkdir(parents=True, exist_ok=True)
    train_length = next(iter(runs.values()))["train_length"]
    files = []
    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    for ax, mode in zip(fig.subplots(1, 2, sharey=True), ("nonoverlapping", "sliding")):
        for name, s in runs.items():
            pts = sorted((r["length"], r["ppl"]) for r in s["perplexity"]
                         if r["variant"] == mode and r["ppl"] is not None)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.axvline(train_length, color="grey", ls="--", lw=1)
        ax.set_title(f"perplexity, {mode.replace('nonoverlapping', 'non-overlapping')} windows")
        ax.set_xlabel("evaluation length (tokens; dashed: training length)")
        ax.grid(alpha=0.3)
    fig.axes[0].set_ylabel("perplexity (held-out Markov text)")
    fig.axes[1].legend(fontsize=8)
    fig.tight_layout()
    files.append(out / "extrapolation_perplexity.png")
    fig.savefig(files[-1], dpi=120)

    fig = Figure(figsize=(6, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for name, s in runs.items():
        (needle,) = s["needle"].values()
        pts = sorted((int(k), v) for k, v in needle["accuracy_by_length"].items() if v is not None)
        ax.plot(*zip(*pts), marker="o", label=name)
        copy_line = needle["copy_any_value"]
    ax.axhline(copy_line, color="grey", ls=":", lw=1, label=f"copy-any-value ({copy_line:.2f})")
    ax.axvline(train_length, color="grey", ls="--", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("evaluation length (tokens; dashed: training length)")
    ax.set_ylabel("needle accuracy (2 distractors)")
    ax.set_title("retrieval beyond the training length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    files.append(out / "extrapolation_needle.png")
    fig.savefig(files[-1], dpi=120)
    return files


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--out", type=Path, default=Path("docs/figures"))
    args = ap.parse_args()
    runs = load(args.sweep)
    if not runs:
        print(f"{args.sweep}: no finished jobs with probe summaries", file=sys.stderr)
        return 2
    print(table(runs))
    for f in plot(runs, args.out):
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

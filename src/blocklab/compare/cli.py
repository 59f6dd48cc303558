"""The ``blocklab-compare`` command: parse the arguments, collect the runs, print the markdown
table and write ``compare.csv``, ``compare.md`` and the plots into ``--out``.

User errors (a missing path, a folder with no runs, an unknown ``--sort`` column, an output
folder that cannot be made) are one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from blocklab.compare.plots import plot_loss_curves, plot_probe_accuracy
from blocklab.compare.runs import MAX_DEPTH, CompareError, collect
from blocklab.compare.table import markdown_table, sort_rows, write_csv, write_markdown
from blocklab.errors import standard_output


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="blocklab-compare",
        description="Compare training runs: one row per run with the config keys that differ "
                    "between them, losses, probe headlines and throughput.",
        epilog="Docs: docs/sweeps.md (sweeps and comparison).")
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


def _out_dir(out: str | None, paths: list[str]) -> Path:
    if out:
        return Path(out)
    if len(paths) == 1:
        return Path(paths[0])
    return Path("outputs") / f"compare_{dt.datetime.now():%Y-%m-%d_%H-%M-%S}"


def _plots(rows: list[dict], out: Path) -> list[Path]:
    plots = [plot_loss_curves(rows, out / "loss_curves.png")]
    probe = plot_probe_accuracy(rows, out / "probe_accuracy.png")
    if probe is None:
        print("blocklab-compare: no run has probe results; skipped probe_accuracy.png",
              file=sys.stderr)
    else:
        plots.append(probe)
    return plots


@standard_output()  # a full disk: one line, exit 6; a reader gone (| head): exit 141
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``blocklab-compare``; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        rows = collect(args.paths)
        if args.sort:
            rows = sort_rows(rows, args.sort)
    except CompareError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code

    out = _out_dir(args.out, args.paths)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"blocklab-compare: {out}: cannot create output directory ({e.strerror})",
              file=sys.stderr)
        return CompareError.exit_code

    print(markdown_table(rows))
    written = [write_csv(rows, out / "compare.csv")]
    plots = [] if args.no_plots else _plots(rows, out)
    written.append(write_markdown(rows, out / "compare.md", sources=args.paths,
                                  plots=[str(p) for p in plots]))
    print(f"wrote {', '.join(str(p) for p in [*written, *plots])}", file=sys.stderr)
    return 0

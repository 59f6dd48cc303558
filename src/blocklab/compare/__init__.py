"""``blocklab-compare``: one table (and two plots) over many training runs.

Point it at run directories, or at directories holding them (a Hydra multirun sweep, an
``outputs/<experiment>`` folder; searched up to 3 levels deep), and it lists one row per run:
the config keys that differ between the runs (the *varied axes*; bookkeeping keys such as paths,
logging, cadence and training length never count, see ``blocklab.provenance.BOOKKEEPING``), the
parameter count, the run's status, final losses, headline probe numbers and throughput. Partial
sweeps are fine: a crashed or still-running job is listed with whatever it left behind.

Outputs (into ``--out``): ``compare.csv`` (raw values), ``compare.md`` (the table printed to
stdout, plus the plots), ``loss_curves.png`` and ``probe_accuracy.png``.

The tool reads files only and never imports torch, so it runs on a laptop holding copied
results as well as on the training machine. Its parts, one job each:

- :mod:`blocklab.compare.runs` finds run directories and reads them (config, status, summary,
  metrics.csv curves, parameter count, probe headlines), and collects the rows;
- :mod:`blocklab.compare.table` chooses, sorts and writes the columns (markdown, CSV);
- :mod:`blocklab.compare.plots` draws the loss curves and the probe accuracy bars;
- :mod:`blocklab.compare.text` says how values and runs read in all of them;
- :mod:`blocklab.compare.cli` is the command line (:func:`main`).
"""

from __future__ import annotations

from blocklab.compare.cli import main
from blocklab.compare.plots import plot_loss_curves, plot_probe_accuracy
from blocklab.compare.runs import (
    MAX_DEPTH,
    CompareError,
    collect,
    find_runs,
    load_run,
    read_curves,
    read_params,
    varied_keys,
)
from blocklab.compare.table import (
    METRIC_COLUMNS,
    markdown_table,
    sort_rows,
    write_csv,
    write_markdown,
)

__all__ = [
    "MAX_DEPTH", "METRIC_COLUMNS", "CompareError", "collect", "find_runs", "load_run", "main",
    "markdown_table", "plot_loss_curves", "plot_probe_accuracy", "read_curves", "read_params",
    "sort_rows", "varied_keys", "write_csv", "write_markdown",
]

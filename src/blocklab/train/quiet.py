"""Lightning's own chatter kept out of a run's output unless asked (``trainer.quiet=false``).

Lightning prints, at every Trainer it builds, an advertisement for its cloud logger
(litlogger, litmodels), "GPU available: ..., used: ..." / "TPU available: ..." lines, and
"`Trainer.fit` stopped: `max_steps=N` reached." -- four times over in a 2x2 sweep, none of it
about the run. They are INFO records of Lightning's rank-zero loggers, and a warning when a GPU
is present but unused; what blocklab prints itself (the summary, where everything is) and every
warning about the run are kept.

Lightning's warnings go through Python's ``warnings``, which prints each with the source line
that raised it (``.../lightning/pytorch/trainer/connectors/data_connector.py:434:
PossibleUserWarning: ...``). Inside :func:`lightning_quiet` the ones that are noise for a
blocklab run (:data:`NOISE`) are dropped, and every other warning raised in Lightning's code is
one line in blocklab's form, ``warning: lightning: <message>``; warnings of other code are left
as they are. ``trainer.quiet=false`` shows all of it as Lightning writes it."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import PurePath

#: Lightning's loggers of informational lines: accelerator availability, the litlogger /
#: litmodels tips, "Trainer.fit stopped", the process-group set-up of each rank.
CHATTY = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
          "lightning.fabric.utilities.distributed", "lightning.pytorch.utilities.distributed",
          "lightning.pytorch.accelerators.cuda")

#: Lightning's warnings that say nothing about a blocklab run (message patterns):
NOISE = (
    r"(GPU|TPU) available but not used",
    # a resume writes into its run's checkpoints/ on purpose (retention and replacement are
    # BlocklabCheckpointIO's)
    r"Checkpoint directory .* exists and is not empty",
    # on every machine with more than two cores, whatever the data: blocklab's batches come
    # from memory-mapped prepared shards or seeded generators, measured at >= 1,600x what
    # llama_tiny consumes on 2 cores with no worker (docs/results.md, "Real corpora");
    # data.num_workers is there for a loader that is slow
    r"The '\w+' does not have many workers",
    # a resumed run directory at another path (copied, moved): blocklab keeps every periodic
    # checkpoint and reads none of the "best model" fields this warning says are not reloaded
    r"The dirpath has changed from",
    # lightning 2.6 on torch 2.13 (also ignored process-wide by the command line, cli.py)
    r".*LeafSpec",
)

#: The packages whose warnings are Lightning's (by the file that raised them).
LIGHTNING = frozenset({"lightning", "lightning_fabric", "pytorch_lightning"})


def from_lightning(filename: str) -> bool:
    return not LIGHTNING.isdisjoint(PurePath(filename).parts)


def _one_line(shown):
    """A ``warnings.showwarning`` printing Lightning's warnings as one line of blocklab's form
    on stderr and handing every other warning to ``shown`` (the one in place before)."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if not from_lightning(str(filename)):
            shown(message, category, filename, lineno, file, line)
            return
        text = next((s.strip() for s in str(message).splitlines() if s.strip()), "")
        print(f"warning: lightning: {text}", file=sys.stderr, flush=True)

    return show


@contextlib.contextmanager
def lightning_quiet(quiet: bool = True) -> Iterator[None]:
    """Inside: Lightning's information lines and its noise (:data:`NOISE`) dropped and its
    other warnings one line each (``quiet``), or everything shown as Lightning writes it (not
    ``quiet``); the loggers' levels and the warning filters restored after."""
    loggers = [logging.getLogger(name) for name in CHATTY]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        with warnings.catch_warnings():  # restores the filters and showwarning
            if quiet:
                for pattern in NOISE:
                    warnings.filterwarnings("ignore", message=pattern)
                warnings.showwarning = _one_line(warnings.showwarning)
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)

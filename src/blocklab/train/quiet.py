"""Lightning's own chatter kept out of a run's output unless asked (``trainer.quiet=false``).

Lightning prints, at every Trainer it builds, an advertisement for its cloud logger
(litlogger, litmodels), "GPU available: ..., used: ..." / "TPU available: ..." lines, and
"`Trainer.fit` stopped: `max_steps=N` reached." -- four times over in a 2x2 sweep, none of it
about the run. They are INFO records of Lightning's rank-zero loggers, and a warning when a GPU
is present but unused; what blocklab prints itself (the summary, where everything is) and every
warning about the run are untouched."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

#: Lightning's loggers of informational lines: accelerator availability, the litlogger /
#: litmodels tips, "Trainer.fit stopped", the process-group set-up of each rank.
CHATTY = ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda",
          "lightning.fabric.utilities.rank_zero", "lightning.fabric.utilities.distributed",
          "lightning.pytorch.utilities.distributed")


@contextlib.contextmanager
def lightning_quiet(quiet: bool = True) -> Iterator[None]:
    """Inside: Lightning's information lines and its "GPU/TPU available but not used" warning
    dropped (``quiet``), or shown (not ``quiet``); the loggers' levels restored after."""
    loggers = [logging.getLogger(name) for name in CHATTY]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        with warnings.catch_warnings():
            if quiet:
                warnings.filterwarnings("ignore", message=r"(GPU|TPU) available but not used")
                # a resume writes into its run's checkpoints/ on purpose (retention and
                # replacement are BlocklabCheckpointIO's)
                warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and "
                                                          r"is not empty")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)

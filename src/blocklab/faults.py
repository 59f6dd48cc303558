"""Faults at deterministic points, for tests: ``BLOCKLAB_FAULT="<SIGNAL>@<point>:<step>"``
(comma-separated for several) makes the process send itself the signal there, through the same
handlers a real signal reaches:

- ``step:N``: as optimizer step N starts (N steps done; e.g. ``SIGTERM@step:23``);
- ``save:N``: right after checkpoint ``step-N`` is written, before anything else runs
  (``SIGKILL@save:15`` leaves a complete checkpoint 15 and nothing after it);
- ``aside:N``: while ``step-N`` is re-saved, between its two renames (the old copy moved aside
  to ``.old-step-N-<pid>``, the new one not yet in place);
- ``read:N``: a reader of a run directory (``blocklab-eval``, ``resume=``) has chosen checkpoint
  ``step-N`` and not yet opened it.

A test that sent a signal from outside after watching for a file would race the training loop
on a loaded machine; these fire at the same point every time.
"""

from __future__ import annotations

import os
import signal

ENV = "BLOCKLAB_FAULT"


def faults() -> list[tuple[signal.Signals, str, int]]:
    """The configured ``(signal, point, step)`` triples."""
    out = []
    for item in os.environ.get(ENV, "").split(","):
        if not item.strip():
            continue
        try:
            name, where = item.strip().split("@")
            point, step = where.split(":")
            out.append((signal.Signals[name], point, int(step)))
        except (ValueError, KeyError):
            raise ValueError(f"{ENV}={item!r}: expected <SIGNAL>@<step|save|aside|read>:<N>, e.g. "
                             "SIGKILL@save:15") from None
    return out


def maybe_fault(point: str, step: int) -> None:
    """Send the configured signal for ``(point, step)`` to this process, if any."""
    for sig, p, n in faults():
        if p == point and n == step:
            os.kill(os.getpid(), sig)

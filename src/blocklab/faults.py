"""Faults at deterministic points, for tests: ``BLOCKLAB_FAULT="<SIGNAL>@<point>:<step>"``
(comma-separated for several) makes the process send itself the signal there, through the same
handlers a real signal reaches:

- ``step:N``: as optimizer step N starts (N steps done; e.g. ``SIGTERM@step:23``);
- ``save:N``: right after checkpoint ``step-N`` is written, before anything else runs
  (``SIGKILL@save:15`` leaves a complete checkpoint 15 and nothing after it);
- ``shard:N``: in a corpus preparation (data/prepare.py), right after its N-th shard is written
  into the temporary folder (``SIGKILL@shard:1``: a preparation killed half-way);
- ``publish:N``: just before the N-th finished preparation of the process is renamed into
  place — a trained BPE tokenizer first, if there is one, then the corpus
  (``SIGKILL@publish:1`` with the byte tokenizer: killed just before the corpus's rename).
- ``aside:N``: while ``step-N`` is re-saved, between its two renames (the old copy moved aside
  to ``.old-step-N-<pid>``, the new one not yet in place);
- ``dir-tmp:N``, ``dir-filled:N``, ``dir-aside:N``, ``dir-placed:N``: in the N-th directory the
  process writes whole (files.write_dir_atomic: checkpoints, probe reports, exports, imports,
  prepared corpora), when its temporary is made (before it is filled), when it is complete
  (before the rename), between the two renames of a replacement, and once it is in place
  (the replaced copy not yet deleted);
- ``read:N``: a reader of a run directory (``blocklab-eval``, ``resume=``) has chosen checkpoint
  ``step-N`` and not yet opened it;
- ``token:N``: ``blocklab-generate`` has written (and flushed) the N-th sampled token of the
  process (``SIGKILL@token:5``: killed mid-sample, five tokens already on stdout).

An item may end in ``#job=N``: it then fires only in the process running job N of a multirun
(Hydra's job number; :mod:`blocklab.sweep` names it in ``$BLOCKLAB_SWEEP_JOB`` while the job
runs), e.g. ``SIGKILL@step:3#job=1`` kills job 1 as its step 3 starts and leaves the others.

A test that sent a signal from outside after watching for a file would race the training loop
on a loaded machine; these fire at the same point every time.
"""

from __future__ import annotations

import os
import signal

ENV = "BLOCKLAB_FAULT"
JOB_ENV = "BLOCKLAB_SWEEP_JOB"


def faults() -> list[tuple[signal.Signals, str, int]]:
    """The configured ``(signal, point, step)`` triples that apply to this process."""
    out = []
    for item in os.environ.get(ENV, "").split(","):
        item, _, only = item.partition("#")
        if not item.strip() or not _this_job(only, item):
            continue
        try:
            name, where = item.strip().split("@")
            point, step = where.split(":")
            out.append((signal.Signals[name], point, int(step)))
        except (ValueError, KeyError):
            raise ValueError(f"{ENV}={item!r}: expected <SIGNAL>@<step|save|shard|publish|aside|read|token|dir-<stage>>:<N>, "
                             "e.g. SIGKILL@save:15") from None
    return out


def maybe_fault(point: str, step: int) -> None:
    """Send the configured signal for ``(point, step)`` to this process, if any."""
    for sig, p, n in faults():
        if p == point and n == step:
            os.kill(os.getpid(), sig)


def _this_job(only: str, item: str) -> bool:
    """Whether an item's ``#job=N`` selector (empty: every process) names the running job."""
    if not only:
        return True
    key, _, n = only.partition("=")
    if key.strip() != "job" or not n.strip().isdigit():
        raise ValueError(f"{ENV}={(item + '#' + only).strip()!r}: expected <item>#job=<N> (N a "
                         "multirun job number)")
    return os.environ.get(JOB_ENV) == str(int(n))

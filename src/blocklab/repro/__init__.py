"""``blocklab-repro``: reference experiments with a known expected result, checked.

Each experiment (one module of :mod:`blocklab.repro.experiments`; registry axis
``experiment``) is a protocol — arms (a name and the ``blocklab-train`` overrides that make
it), seeds, a measurement on each trained checkpoint — and a list of expectations taken from the literature (docs/reproductions.md).
``blocklab-repro <name> --seeds 3`` trains what is missing (runs are cached by their exact
overrides and seed under ``outputs/repro/runs/``, so a rerun only re-measures), prints
observed against expected, writes ``result.json`` and ``table.md``, and exits 1 when an
expectation is missed. ``--size quick`` is the CPU-sized subset CI runs; ``--break <what>``
applies a deliberate defect (a 1-layer model in the attention row, the window ignored, ...)
under which the check must fail — the test that the check can fail.

Parts: :mod:`blocklab.repro.measure` (held-out accuracy on a trained checkpoint),
:mod:`blocklab.repro.protocol` (what an experiment is),
:mod:`blocklab.repro.experiments` (the experiments: protocols and expectations, one module each),
:mod:`blocklab.repro.runner` (training arms, checking, reporting), and
:mod:`blocklab.repro.cli` (the command line).
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    """The ``blocklab-repro`` console script (torch is imported only when an experiment runs)."""
    from blocklab.repro.cli import main as run

    run(argv)

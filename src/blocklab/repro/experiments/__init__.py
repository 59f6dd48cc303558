"""The reference experiments as components: one module per experiment holds its protocol per
size, its measurement, its expectations and its breaks, and a ``make(size) -> Experiment``
(what an experiment is: :mod:`blocklab.repro.protocol`). ``blocklab-repro`` looks experiments
up by name (registry axis ``experiment``) and names none.

A user adds an experiment like any component (docs/extending.md)::

    from blocklab.registry import register
    from blocklab.repro.protocol import Experiment

    @register("experiment", "my_study")
    def my_study(size: str) -> Experiment:
        ...

and runs it with ``blocklab-repro my_study`` (the plugin imported first: ``BLOCKLAB_PLUGINS``
or an entry point).
"""

from __future__ import annotations

from collections.abc import Callable

from blocklab.repro.experiments import (
    chunked,
    extrapolation,
    listops,
    long_context,
    memory_recall,
    mqar,
    recall_state,
    receptive_field,
    shakespeare_char,
    sinks,
    stability,
    xl_memory,
)
from blocklab.repro.protocol import Experiment


def experiment(name: str, size: str) -> Experiment:
    """The experiment ``name`` with its measurement sized for ``size`` (user plugins loaded
    first); ``KeyError`` for an unknown name."""
    from blocklab.registry import table

    return table("experiment")[name](size)


def names() -> list[str]:
    """Every experiment: blocklab's in listing order, then registered ones."""
    from blocklab.registry import names as axis_names

    return axis_names("experiment")


EXPERIMENTS: dict[str, Callable[[str], Experiment]] = {
    "mqar": mqar.make,
    "extrapolation": extrapolation.make,
    "receptive_field": receptive_field.make,
    "shakespeare_char": shakespeare_char.make,
    "recall_state": recall_state.make,
    "listops": listops.make,
    "chunked": chunked.make,
    "sinks": sinks.make,
    "xl_memory": xl_memory.make,
    "memory_recall": memory_recall.make,
    "long_context": long_context.make,
    "stability": stability.make,
}

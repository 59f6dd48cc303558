"""What a reference experiment is: its protocol (arms, seeds, sizes), measurement and
expectations (:class:`Experiment`), and the helpers breaks are made of. The experiments
themselves are components, one module each in :mod:`blocklab.repro.experiments`.

Each experiment states the published result it checks and how blocklab's protocol differs from
the paper's (CPU-sized); ``quick`` is the subset CI runs, ``full`` the documented one. Arms are
``blocklab-train`` overrides on top of ``base``; a *break* rewrites the arms so that the
expected result must be missed (the proof that the check can fail).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from blocklab.repro import checks as ck
from blocklab.repro import measure as ms

SIZES = ("quick", "full")


@dataclass(frozen=True)
class Arm:
    """One measured configuration: a display name, its ``blocklab-train`` overrides, and
    ``eval_model``: ``key=value`` overrides of the *model* config applied to the trained weights
    when measuring (e.g. ``mixer.window=16``: the same weights under a local window). Runs
    are keyed by ``overrides`` alone, so arms that differ only in ``eval_model`` share them."""

    name: str
    overrides: tuple[str, ...]
    eval_model: tuple[str, ...] = ()
    sweep: Sweep | None = None  # a learning-rate sweep: one run per rate, the best measured


@dataclass(frozen=True)
class Sweep:
    """Train an arm once per learning rate (``optim.lr``, tried in the order given) and measure,
    per seed, the run whose last logged ``select`` is best (``mode``): the training run's own
    validation stream, never the held-out examples the experiment reports on. ``enough``:
    rates after the first whose value is beyond it are not trained (a value past the early
    stopping threshold cannot be beaten by much; Zoology trains every rate)."""

    lrs: tuple[float, ...]
    select: str = "val/accuracy"
    mode: str = "max"
    enough: float | None = None

    def better(self, a: float | None, b: float | None) -> bool:
        """Whether value ``a`` beats ``b`` (None: no value; ties keep the earlier rate)."""
        if a is None:
            return False
        return b is None or (a > b if self.mode == "max" else a < b)

    def suffices(self, value: float | None) -> bool:
        if self.enough is None or value is None:
            return False
        return value > self.enough if self.mode == "max" else value < self.enough


@dataclass(frozen=True)
class Protocol:
    """What one size of an experiment trains and measures."""

    arms: tuple[Arm, ...]
    checks: tuple[ck.Check, ...]
    seeds: int = 1  # default number of seeds (``--seeds`` overrides)


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    reference: str  # the published result, with its citation
    protocol: str  # how blocklab's protocol follows / differs from the paper's
    sizes: dict[str, Protocol]
    # (run directory, arm) -> {metric: tally}
    measure: Callable[[Path, Arm], dict[str, ms.Tally]]
    # name -> (what it breaks, arms -> broken arms)
    breaks: dict[str, tuple[str, Callable[[tuple[Arm, ...]], tuple[Arm, ...]]]] = field(
        default_factory=dict)
    # breaks that train runs of their own (a defect of training itself, not arms swapped)
    training_breaks: frozenset[str] = frozenset()
    # (experiment, outcome, output directory) -> {name: path} of figures written beside the table
    figure: Callable[[Experiment, Any, Path], dict[str, str]] | None = None


def swap(arms: tuple[Arm, ...], victim: str, donor: str) -> tuple[Arm, ...]:
    """Arm ``victim`` keeps its name but trains exactly like ``donor`` (a broken variant whose
    runs are the donor's: no extra training)."""
    by_name = {a.name: a for a in arms}
    return tuple(replace(a, overrides=by_name[donor].overrides) if a.name == victim else a
                 for a in arms)


def swap_all(arms: tuple[Arm, ...], victim_word: str, donor_word: str) -> tuple[Arm, ...]:
    """:func:`swap` for every arm whose name contains ``victim_word`` (its donor: the same
    name with ``donor_word``)."""
    for a in arms:
        if victim_word in a.name:
            arms = swap(arms, a.name, a.name.replace(victim_word, donor_word))
    return arms

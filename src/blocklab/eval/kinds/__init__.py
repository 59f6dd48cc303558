"""Probe kinds as components: one module per kind holds its cells (token and text space), its
summary, its report lines, its plots and its headline scalars (:class:`ProbeKind`,
``base.py``); its settings' dataclass, with its rules, is on the config floor
(``blocklab.config.probe_schema``). The driver (``eval/probes.py``), the report, the plots and
the training callback iterate over :func:`kinds`; none of them names a kind.

A user adds a kind like any component (docs/extending.md, "Probe kinds")::

    from blocklab.eval.kinds import ProbeKind
    from blocklab.registry import register

    @register("probe", "first_token")
    class FirstToken(ProbeKind):
        name = "first_token"
        config = FirstTokenConfig  # a dataclass subclassing blocklab.config.ProbeKindConfig
        ...

and sets it under ``probes.kinds.first_token`` (``enabled: true`` and its own keys).
blocklab's own kinds are written the same way (every job a method of the class, settings read
through ``cls.settings(spec)``), so each of their modules is an example to copy.
"""

from __future__ import annotations

from blocklab.eval.kinds.aggregation import Aggregation
from blocklab.eval.kinds.babilong import Babilong
from blocklab.eval.kinds.base import ProbeKind
from blocklab.eval.kinds.hops import Hops
from blocklab.eval.kinds.litm import Litm
from blocklab.eval.kinds.multi_needle import MultiNeedle
from blocklab.eval.kinds.needle import Needle


def kinds() -> list[type[ProbeKind]]:
    """Every probe kind, blocklab's in report order and then registered ones (user plugins
    loaded first)."""
    from blocklab.registry import table

    return list(table("probe").values())


__all__ = ["PROBE_KINDS", "ProbeKind", "kinds"]

PROBE_KINDS: dict[str, type[ProbeKind]] = {
    "needle": Needle,
    "litm": Litm,
    "multi_needle": MultiNeedle,
    "hops": Hops,
    "aggregation": Aggregation,
    "babilong": Babilong,
}

"""What a probe kind is: one component holding everything about one kind of probe, so that the
driver, the report, the plots and the training callback iterate over kinds instead of naming
them (docs/extending.md, "Probe kinds").

A kind is a class with a ``name`` (its registry key, the ``probe`` column of its cells and the
key of its summary) and ``config`` (its settings' dataclass, on the config floor, which carries
the kind's rules as ``check``), and classmethods for each job:

- ``token_cells`` / ``text_cells``: the grid cells and their items in each space (a kind that
  has no form in a space reports one N/A cell there);
- ``summary``: the numbers the kind's report states, from the cell rows and scored examples;
- ``report_lines``: its block of the printed table;
- ``figures``: its plots (file stem -> matplotlib Figure; the report saves them);
- ``headline``: the scalars the training callback logs; ``tables``: logger tables.

The defaults fit a grid kind — cells keyed by ``variant`` and ``length``, accuracy and partial
credit by length, pooled with a Wilson interval — so a new kind often only builds cells.
"""

from __future__ import annotations

from typing import Any, ClassVar

from blocklab.config import ProbeKindConfig, ProbeSpec, kind_settings
from blocklab.eval.aggregate import grid_summary
from blocklab.eval.items import Cell


def fmt(x: float | None, spec: str = ".3f") -> str:
    """A number of the printed table (N/A for a missing one)."""
    return "N/A" if x is None else format(x, spec)


def grid_lines(title: str, what: str, per: dict[str, Any]) -> list[str]:
    """A grid kind's block of the printed table: a length header, then accuracy (and partial
    credit when it differs) per variant, with the pooled interval and the chance / copy lines."""
    if not per:
        return []
    lengths = list(dict.fromkeys(x for s in per.values() for x in s["accuracy_by_length"]))
    lines = [f"{title} (argmax accuracy: {what}):",
             "  " + f"{'length':<14}" + "".join(f"{x:>8}" for x in lengths)]
    for variant, s in per.items():
        acc = s["accuracy_by_length"]
        lines.append("  " + f"{variant:<14}" + "".join(f"{fmt(acc.get(x)):>8}" for x in lengths))
        part = s["partial_by_length"]
        if any(part.get(x) is not None and part.get(x) != acc.get(x) for x in lengths):
            lines.append("  " + f"{'  partial':<14}"
                         + "".join(f"{fmt(part.get(x)):>8}" for x in lengths))
        p = s["pooled"]
        extra = (f", occurrence line {fmt(s['winner_share'])}"
                 if s.get("winner_share") is not None else "")
        lines.append(f"    pooled {fmt(p['accuracy'])} [{fmt(p['ci_low'])}, "
                     f"{fmt(p['ci_high'])}] n={p['n']} (copy-any-value "
                     f"{fmt(s['copy_any_value'])}, chance {fmt(s['chance'], '.2g')}{extra})")
    return lines


class ProbeKind:
    """Base of a probe kind (see the module docstring); subclass it and register the subclass
    with ``register("probe", name)``."""

    name: ClassVar[str] = ""
    config: ClassVar[type] = ProbeKindConfig
    title: ClassVar[str] = ""  # the printed table's block title
    what: ClassVar[str] = "the gold answer"  # what its argmax accuracy counts
    row_key: ClassVar[str] = "variant"  # the heatmap's rows (a cell key)
    row_label: ClassVar[str] = "variant"  # ... and their axis label
    heading: ClassVar[str] = ""  # the heatmap's title

    @classmethod
    def settings(cls, spec: ProbeSpec) -> Any:
        """This kind's settings in ``spec`` (``probes.<name>``, or ``probes.kinds.<name>``)."""
        return kind_settings(spec, cls.name, cls.config)

    @classmethod
    def configured(cls, spec: ProbeSpec) -> bool:
        """Whether ``spec`` has settings for this kind (blocklab's kinds always do; a user
        kind when ``probes.kinds`` names it): only those get cells and a summary, so loading
        a plugin changes no report that does not ask for its kinds."""
        return isinstance(getattr(spec, cls.name, None), cls.config) or cls.name in (
            spec.kinds or {})

    @classmethod
    def adapt(cls, spec: ProbeSpec, tc: Any) -> ProbeSpec:
        """``spec`` with this kind's settings fitted to the checkpoint's training config ``tc``
        (e.g. items drawn as the run trained them) where the user left them to it; the default
        changes nothing."""
        return spec

    @classmethod
    def cells(cls, builder: Any, spec: ProbeSpec, train_length: int,
              max_length: int | None) -> list[Cell]:
        """The kind's cells on ``builder`` (its ``space`` says which form)."""
        make = cls.token_cells if builder.space == "token" else cls.text_cells
        return make(spec, builder, train_length, max_length)

    @classmethod
    def token_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                    max_length: int | None) -> list[Cell]:
        return cls.unavailable("token")

    @classmethod
    def text_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                   max_length: int | None) -> list[Cell]:
        return cls.unavailable("text")

    @classmethod
    def unavailable(cls, space: str) -> list[Cell]:
        """One N/A cell: the kind has no form in ``space`` (reported, never an error)."""
        return [Cell({"probe": cls.name, "variant": "all", "length": 0}, [],
                     f"n/a: probe kind {cls.name!r} has no {space}-space form")]

    @classmethod
    def summary(cls, rows: list[dict[str, Any]], examples: list[dict[str, Any]], *,
                train_length: int, threshold: float) -> dict[str, Any]:
        return grid_summary(rows, cls.name)

    @classmethod
    def variants(cls, summary: dict[str, Any]) -> dict[str, Any]:
        """Per-variant summaries (a kind whose summary nests them says where)."""
        return summary

    @classmethod
    def report_lines(cls, summary: dict[str, Any]) -> list[str]:
        return grid_lines(cls.title or cls.name, cls.what, cls.variants(summary))

    @classmethod
    def figures(cls, cells: list[dict[str, Any]], *, train_length: int | None,
                title: str) -> dict[str, Any]:
        """File stem -> Figure (the report saves ``<stem>.png``)."""
        from blocklab.eval.plots import grid_figure

        return {cls.name: grid_figure(cells, probe=cls.name, row_key=cls.row_key,
                                      row_label=cls.row_label,
                                      heading=cls.heading or cls.title or cls.name,
                                      train_length=train_length, title=title)}

    @classmethod
    def headline(cls, summary: dict[str, Any]) -> dict[str, float]:
        """The pooled accuracy of every variant, for the loggers."""
        out = {}
        for variant, s in cls.variants(summary).items():
            if s["pooled"]["accuracy"] is not None:
                tag = variant.replace(" ", "_")
                out[f"probe/{cls.name}_{tag}/accuracy"] = s["pooled"]["accuracy"]
        return out

    @classmethod
    def tables(cls, summary: dict[str, Any]) -> dict[str, tuple[list[str], list[list[Any]]]]:
        return {}

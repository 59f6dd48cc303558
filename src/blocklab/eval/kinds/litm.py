"""The lost-in-the-middle probe kind: key–value records with the gold record's position swept,
the query-aware layout and the closed-book / oracle baselines; its summary is the curve's shape
(Liu et al. 2023, arXiv 2307.03172; docs/probes.md, "Lost in the middle")."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from blocklab.config import LitmProbeConfig, ProbeSpec
from blocklab.data import synthetic as syn
from blocklab.data.tasks.kv_records import kv_records
from blocklab.eval.aggregate import position_curve_summary
from blocklab.eval.items import Cell, NotApplicable, ProbeItem, answer_item, fits, lengths_of
from blocklab.eval.kinds.base import ProbeKind, fmt
from blocklab.eval.plots import add_note, cells_note, first_values, ok_mean, select, variant_of
from blocklab.eval.textspace import TextBuilder
from blocklab.plotting import colours, finite_int, new_figure, no_data

Row = Mapping[str, Any]


# ----------------------------------------------------- the figure's and the report's helpers


_LITM_CURVES = ("kv_records", "query_aware")
_LITM_STYLE = {"kv_records": ("-", "o", -0.006), "query_aware": ("--", "s", 0.006)}


def _litm_points(curve_rows: Iterable[Row], variant: str, m: int
                 ) -> tuple[list[float], list[float], list[float], list[float]]:
    """(relative position, accuracy, lower error, upper error) of one variant's curve at m
    records; positions whose cells are all N/A are left out."""
    groups: dict[float, list[Cell]] = defaultdict(list)
    for r in curve_rows:
        pos = finite_int(r.get("gold_position"))
        if variant_of(r) != variant or finite_int(r.get("n_records")) != m or pos is None:
            continue
        groups[pos / (m - 1) if m > 1 else 0.0].append(r)
    xs, ys, lo_err, hi_err = [], [], [], []
    for x in sorted(groups):
        y = ok_mean(groups[x])
        if y is None:
            continue
        lo, hi = ok_mean(groups[x], "ci_low"), ok_mean(groups[x], "ci_high")
        xs.append(x)
        ys.append(y)
        lo_err.append(max(0.0, y - lo) if lo is not None else 0.0)
        hi_err.append(max(0.0, hi - y) if hi is not None else 0.0)
    return xs, ys, lo_err, hi_err


def _litm_reference_lines(ax: Any, rows: Sequence[Row], curve_rows: Sequence[Row],
                          colour: Mapping[int, Any]) -> bool:
    """Oracle / closed-book means, per-m copy-any-value and chance as horizontal lines; True
    when an oracle or closed-book mean was drawn."""
    plotted = False
    for variant, c, ls in (("oracle", "black", "-."), ("closed_book", "dimgray", "--")):
        mean = ok_mean([r for r in rows if variant_of(r) == variant])
        if mean is not None:
            plotted = True
            ax.axhline(mean, color=c, linestyle=ls, linewidth=1.4,
                       label=f"{variant} (mean {mean:.2f})")
    for m, c in colour.items():
        vals = first_values((r for r in curve_rows if finite_int(r.get("n_records")) == m),
                             "copy_any_value")
        if vals:
            ax.axhline(vals[0], color=c, linestyle=":", linewidth=1.6,
                       label=f"copy-any-value, m={m} ({vals[0]:.3f})")
    chances = first_values(rows, "chance")
    if len(chances) == 1:
        ax.axhline(chances[0], color="silver", linestyle=(0, (1, 3)), linewidth=1.4,
                   label=f"chance ({chances[0]:.3f})")
        return plotted
    for m, c in colour.items():
        vals = first_values((r for r in rows if finite_int(r.get("n_records")) == m), "chance")
        if vals:
            ax.axhline(vals[0], color=c, linestyle=(0, (1, 3)), linewidth=1.0,
                       alpha=0.7, label=f"chance, m={m} ({vals[0]:.3f})")
    return plotted


def _curve_label(rows: Sequence[Row], variant: str, m: int, train_length: int | None) -> str:
    """``kv_records, m=8 (≤ 180 tokens)``, saying when the prompts are longer than the model's
    training length."""
    lengths = [n for r in rows if variant_of(r) == variant
               and finite_int(r.get("n_records")) == m and (n := finite_int(r.get("length")))]
    if not lengths:
        return f"{variant}, m={m}"
    longest = max(lengths)
    beyond = f", beyond train L {train_length:,}" if train_length and longest > train_length else ""
    return f"{variant}, m={m} (≤ {longest:,} tokens{beyond})"


def _lines(litm: dict[str, Any]) -> list[str]:
    if not litm:
        return []
    lines = ["lost in the middle (accuracy by gold record position):"]
    for k, s in litm.items():
        if "accuracy_by_gold_position" in s:
            curve = " ".join(f"{p}:{fmt(v, '.2f')}" for p, v in
                             s["accuracy_by_gold_position"].items())
            lines.append(f"  {k:<20} {curve}  gap {s['best_worst_gap']:.2f} middle drop "
                         f"{s['middle_drop']:+.2f} primacy {s['primacy']:+.2f} recency "
                         f"{s['recency']:+.2f} (copy-any-value {s['copy_any_value']:.3f})")
        else:
            lines.append(f"  {k:<20} {fmt(s['accuracy'])} [{fmt(s['ci_low'])}, "
                         f"{fmt(s['ci_high'])}] n={s['n']} (chance {fmt(s['chance'])})")
    return lines


class Litm(ProbeKind):
    """Lost in the middle (token and text space)."""

    name = "litm"
    config = LitmProbeConfig

    @classmethod
    def record_counts(cls, spec: ProbeSpec, unit: int, most: Callable[[int], int]
                      ) -> list[tuple[int, int | None]]:
        """(record count, the length it was sized for) of each curve: ``n_records`` (no
        length), or with ``lengths`` the most records whose prompts fit each length
        (``most(length)``; 0 when not even one record and the question fit: an N/A cell),
        each count once."""
        p = cls.settings(spec)
        if not p.lengths:
            return [(m, None) for m in p.n_records]
        out: list[tuple[int, int | None]] = []
        for length in lengths_of(p.lengths, unit):
            m = most(length)
            if m == 0 or m not in [k for k, _ in out]:
                out.append((m, length))
        return out

    @classmethod
    def none_fit(cls, length: int) -> Cell:
        """The N/A cell of a length that holds no record beside the question."""
        return Cell({"probe": cls.name, "variant": "kv_records", "length": length,
                     "n_records": 0, "gold_position": None}, [],
                    NotApplicable(f"length {length} holds no record beside the question").status)

    @classmethod
    def token_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                    max_length: int | None) -> list[Cell]:
        """Gold position swept over m key–value records, the query-aware layout, closed-book
        (the records removed: only ``BOS SEP k``) and oracle (only the gold record)
        baselines. With ``lengths`` m is the most records whose query-aware prompt (3m + 6
        tokens) fits each length."""
        p, vocab = cls.settings(spec), builder.vocab
        chance = 1 / vocab.n_values
        cap = min(vocab.n_keys, vocab.n_values)
        cells = []
        for m, target in cls.record_counts(spec, train_length,
                                           lambda length: max(0, min((length - 6) // 3, cap))):
            if m == 0:
                cells.append(cls.none_fit(target))
                continue
            if m > cap:
                raise ValueError(f"probes.litm.n_records={m}: more records than the vocabulary "
                                 f"has keys/values ({vocab.n_keys}/{vocab.n_values})")
            golds = sorted({round(g * (m - 1)) for g in p.gold})
            for variant in ("kv_records", "query_aware") if p.query_aware else ("kv_records",):
                qa = variant == "query_aware"
                length = 3 * m + 4 + (2 if qa else 0)
                for j in golds:
                    key = {"probe": cls.name, "variant": variant, "length": length,
                           "n_records": m, "gold_position": j}
                    cell = Cell(key, [], fits(length, max_length), copy_any_value=1 / m,
                                chance=chance)
                    salt = f"probe:litm:{variant}:{m}:{j}"
                    for i in range(p.n if cell.na is None else 0):
                        ex = kv_records(syn.example_rng(spec.seed, i, salt), vocab, length,
                                        gold=j, query_aware=qa, seed=spec.seed)
                        cell.items.append(answer_item(key, ex, distance=3 * (m - j)))
                    cells.append(cell)
        if p.baselines:
            m = max([c.key["n_records"] for c in cells] + list(p.n_records) + [1])
            for variant in ("closed_book", "oracle"):
                length = 4 if variant == "closed_book" else 7
                key = {"probe": cls.name, "variant": variant, "length": length,
                       "n_records": 0 if variant == "closed_book" else 1, "gold_position": None}
                cell = Cell(key, [], fits(length, max_length), chance=chance,
                            copy_any_value=None if variant == "closed_book" else 1.0)
                salt = f"probe:litm:{variant}"
                for i in range(p.n if cell.na is None else 0):
                    rng = syn.example_rng(spec.seed, i, salt)
                    if variant == "closed_book":  # a full example's draw, records removed
                        ex = kv_records(rng, vocab, 3 * m + 4, seed=spec.seed)
                        k, v = ex.tokens[-2], ex.tokens[-1]
                        ex = syn.Example([syn.BOS, syn.SEP, k, v], [False] * 3 + [True],
                                         {"candidates": [v]})
                    else:
                        ex = kv_records(rng, vocab, 7, gold=0, seed=spec.seed)
                    cell.items.append(answer_item(key, ex))
                cells.append(cell)
        return cells

    @classmethod
    def most_records(cls, b: TextBuilder, spec: ProbeSpec, length: int) -> int:
        """The most records whose query-aware text prompts (the longer layout) fit ``length``
        tokens, judged on the first few items of a probe draw (a cell's length is then its
        longest item's, which may pass ``length`` by a token or two: it is stated, and
        flagged when beyond the training length)."""
        def longest(m: int) -> int:
            return max(cls.text_item(b, syn.example_rng(spec.seed, i, f"probe:text-litm:fit:{m}"),
                                     {}, m, 0, True).meta["n_tokens"] for i in range(4))

        lo, hi = 0, 1
        while longest(hi) <= length:
            lo, hi = hi, hi * 2
            if hi > 4096:
                return lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if longest(mid) <= length else (lo, mid)
        return lo

    @classmethod
    def text_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                   max_length: int | None) -> list[Cell]:
        """In text: JSON-like key–value records (``probes.text.record``), the gold record's
        position swept; a cell's length is its longest item's. With ``lengths`` m is the most
        records that fit each length."""
        p, b = cls.settings(spec), builder
        cells = []
        for m, target in cls.record_counts(spec, train_length,
                                           lambda length: cls.most_records(b, spec, length)):
            if m == 0:
                cells.append(cls.none_fit(target))
                continue
            golds = sorted({round(g * (m - 1)) for g in p.gold})
            for variant in ("kv_records", "query_aware") if p.query_aware else ("kv_records",):
                for j in golds:
                    key = {"probe": cls.name, "variant": variant, "n_records": m,
                           "gold_position": j}
                    salt = f"probe:text-litm:{variant}:{m}:{j}"
                    items = [cls.text_item(b, syn.example_rng(spec.seed, i, salt), key, m, j,
                                           variant == "query_aware") for i in range(p.n)]
                    cells.append(cls._text_cell(key, items, max_length, 1 / m))
        if p.baselines:
            for variant, m in (("closed_book", 0), ("oracle", 1)):
                key = {"probe": cls.name, "variant": variant, "n_records": m,
                       "gold_position": None}
                salt = f"probe:text-litm:{variant}"
                items = [cls.text_item(b, syn.example_rng(spec.seed, i, salt), key, m, 0, False)
                         for i in range(p.n)]
                cells.append(cls._text_cell(key, items, max_length, 1.0 if m else None))
        return cells

    @classmethod
    def _text_cell(cls, key: dict[str, Any], items: list[ProbeItem], max_length: int | None,
                   copy_any_value: float | None) -> Cell:
        """A text cell of ``items``: its length is its longest item's."""
        length = max(it.meta["n_tokens"] for it in items)
        cell = Cell({**key, "length": length}, [], fits(length, max_length),
                    copy_any_value=copy_any_value, chance=16.0 ** -8)
        if cell.na is None:
            cell.items = items
            for it in items:
                it.cell = cell.key
        return cell

    @classmethod
    def text_item(cls, b: TextBuilder, rng: random.Random, key: dict[str, Any], m: int, j: int,
                  query_aware: bool) -> ProbeItem:
        """One text item: ``m`` records (none: closed book), the gold one at ``j``."""
        t = b.t
        n = max(m, 1)
        keys = [f"{rng.getrandbits(32):08x}" for _ in range(n)]
        values = [f"{rng.getrandbits(32):08x}" for _ in range(n)]
        question = t.record_question.format(key=keys[j])
        prefix = t.record_answer_prefix.format(key=keys[j])
        records = ",\n".join(t.record.format(key=k, value=v) for k, v in zip(keys, values))
        context = ("{\n" + records + "\n}") if m else ""
        if query_aware:
            context = question + "\n" + context
        b.context_tokens = b.ntok(context)
        others = [v for i, v in enumerate(values) if i != j] if m else []
        return b.item(key, b.tail(question, prefix, context), values[j], others, None,
                      {"n_records": m})

    @classmethod
    def summary(cls, rows: list[dict[str, Any]], examples: list[dict[str, Any]], *,
                train_length: int, threshold: float) -> dict[str, Any]:
        """Per curve (``<variant>/m=<records>``): accuracy by gold position and its shape
        (:func:`position_curve_summary`); the closed-book and oracle baselines as is."""
        out: dict[str, Any] = {}
        lc = [c for c in rows if c["probe"] == cls.name]
        for variant in ("kv_records", "query_aware"):
            for m in sorted({c["n_records"] for c in lc if c["variant"] == variant}):
                curve = {c["gold_position"]: c["accuracy"] for c in lc
                         if c["variant"] == variant and c["n_records"] == m and c["n"]}
                if curve:
                    out[f"{variant}/m={m}"] = {
                        "accuracy_by_gold_position": {str(k): v for k, v in
                                                      sorted(curve.items())},
                        **position_curve_summary(curve), "copy_any_value": 1 / m}
        for variant in ("closed_book", "oracle"):
            for c in lc:
                if c["variant"] == variant and c["n"]:
                    out[variant] = {k: c[k] for k in ("n", "accuracy", "ci_low", "ci_high",
                                                      "chance")}
        return out

    @classmethod
    def report_lines(cls, summary: dict[str, Any]) -> list[str]:
        return _lines(summary)

    @classmethod
    def figures(cls, cells: list[dict[str, Any]], *, train_length: int | None,
                title: str) -> dict[str, Any]:
        """Lost-in-the-middle accuracy against relative gold position, one colour per m.

        kv_records solid, query_aware dashed, Wilson 95% error bars; oracle / closed_book means,
        per-m copy-any-value and chance as horizontal reference lines (Liu et al. 2023, "Lost in
        the Middle", arXiv 2307.03172)."""
        rows = select(cells, cls.name)
        curve_rows = [r for r in rows if variant_of(r) in _LITM_CURVES]
        ms = sorted({m for r in curve_rows if (m := finite_int(r.get("n_records"))) is not None})
        colour = dict(zip(ms, colours(len(ms))))

        fig = new_figure((8.8, 4.8))
        ax = fig.subplots()
        plotted = False
        for variant in _LITM_CURVES:
            ls, marker, dx = _LITM_STYLE[variant]
            for m in ms:
                xs, ys, lo_err, hi_err = _litm_points(curve_rows, variant, m)
                if not xs:
                    continue
                plotted = True
                ax.errorbar([x + dx for x in xs], ys, yerr=[lo_err, hi_err], color=colour[m],
                            linestyle=ls, marker=marker, markersize=5, linewidth=1.8,
                            capsize=3, elinewidth=1,
                            label=_curve_label(curve_rows, variant, m, train_length))
        plotted = _litm_reference_lines(ax, rows, curve_rows, colour) or plotted

        if not plotted:
            no_data(ax, "no accuracy to plot (all cells N/A)")
        ax.set_xlim(-0.05, 1.05)
        ax.set_ylim(0.0, 1.05)
        ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0],
                      ["0\n(first)", "0.25", "0.5", "0.75", "1\n(last)"])
        ax.set_xlabel("relative gold position  gold_position / (m − 1)")
        ax.set_ylabel("accuracy (Wilson 95% CI)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
                      frameon=False)
        heading = "Lost in the middle: accuracy by gold-record position"
        ax.set_title(f"{heading}\n{title}" if title else heading, fontsize=10 if title else 12)
        add_note(fig, cells_note(rows))
        return {"litm": fig}

    @classmethod
    def headline(cls, summary: dict[str, Any]) -> dict[str, float]:
        """Mean accuracy and best–worst gap of every curve."""
        out = {}
        for name, s in summary.items():
            if "best_worst_gap" in s:
                curve = s["accuracy_by_gold_position"]
                out[f"probe/litm_{name}/mean"] = sum(curve.values()) / len(curve)
                out[f"probe/litm_{name}/gap"] = s["best_worst_gap"]
        return out

    @classmethod
    def tables(cls, summary: dict[str, Any]) -> dict[str, tuple[list[str], list[list[Any]]]]:
        """Each curve: accuracy by gold position."""
        rows = [[curve, int(pos), acc] for curve, s in summary.items()
                for pos, acc in (s.get("accuracy_by_gold_position") or {}).items()]
        return {"litm": (["curve", "gold_position", "accuracy"], rows)} if rows else {}

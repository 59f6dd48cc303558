"""The needle-in-a-haystack probe kind: lengths × depths, once per distractor count; its
summary states accuracy within / beyond the training length and the effective context length
(docs/probes.md, "Needle in a haystack")."""

from __future__ import annotations

import random
from typing import Any

from blocklab.config import NeedleProbeConfig, ProbeSpec, needle_min_length
from blocklab.data import synthetic as syn
from blocklab.data.tasks.needle import needle
from blocklab.eval.aggregate import distance_view, effective_length, pooled
from blocklab.eval.items import Cell, NotApplicable, ProbeItem, answer_item, fits, lengths_of
from blocklab.eval.kinds.base import ProbeKind, fmt
from blocklab.eval.textspace import KEYS, TextBuilder

EFFECTIVE_RULE = ("effective length = the largest evaluated length L whose accuracy (pooled over "
                  "depths) is >= {t} at L and at every shorter evaluated length (RULER rule; N/A "
                  "lengths end the run)")


def _lines(variant: str, s: dict[str, Any]) -> list[str]:
    lengths = list(s["accuracy_by_length"])
    w, b = s["within_train_length"], s["beyond_train_length"]
    eff = s["effective_length"]
    return [
        f"needle, {variant} (argmax accuracy pooled over depths; copy-any-value "
        f"{fmt(s['copy_any_value'])}, chance {fmt(s['chance'])}):",
        "  length    " + "".join(f"{x:>8}" for x in lengths),
        "  accuracy  " + "".join(f"{fmt(s['accuracy_by_length'][x]):>8}" for x in lengths),
        f"  within training length {fmt(w['accuracy'])} "
        f"[{fmt(w['ci_low'])}, {fmt(w['ci_high'])}] n={w['n']}; beyond "
        f"{fmt(b['accuracy'])} [{fmt(b['ci_low'])}, {fmt(b['ci_high'])}] n={b['n']}",
        f"  effective length {eff if eff is not None else 'none'} "
        f"(threshold {s['threshold']}: {s['rule'].split(' = ', 1)[1]})",
    ]


class Needle(ProbeKind):
    """Needle in a haystack (token and text space)."""

    name = "needle"
    config = NeedleProbeConfig

    @classmethod
    def grid(cls, spec: ProbeSpec, train_length: int):
        """(distractors, length, depth, cell key) for every cell, in report order."""
        p = cls.settings(spec)
        for nd in p.n_distractors:
            for length in lengths_of(p.lengths, train_length):
                for depth in p.depths:
                    yield nd, length, depth, {"probe": cls.name, "variant": f"{nd} distractors",
                                              "length": length, "depth": depth,
                                              "n_distractors": nd}

    @classmethod
    def token_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                    max_length: int | None) -> list[Cell]:
        """For each distractor count, lengths × depths, ``n`` items per cell. Fillers rotate
        over the samples (repeated phrase, i.i.d., Markov text)."""
        p, vocab = cls.settings(spec), builder.vocab
        cells = []
        for nd, length, depth, key in cls.grid(spec, train_length):
            na = fits(length, max_length)
            if na is None and length < needle_min_length(nd):
                na = NotApplicable(f"length {length} < {needle_min_length(nd)} for {nd + 1} "
                                   "needles").status
            cell = Cell(key, [], na, copy_any_value=1 / (nd + 1), chance=1 / vocab.n_values)
            if na is None:
                salt = f"probe:needle:{nd}:{length}:{depth}"
                for i in range(p.n):
                    ex = needle(syn.example_rng(spec.seed, i, salt), vocab, length,
                                n_distractors=nd, depth=depth,
                                filler=p.fillers[i % len(p.fillers)], seed=spec.seed)
                    cell.items.append(answer_item(key, ex, distance=ex.meta["query_index"]
                                                  - ex.meta["gold_index"],
                                                  actual_depth=ex.meta["depth"]))
            cells.append(cell)
        return cells

    @classmethod
    def text_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                   max_length: int | None) -> list[Cell]:
        """The grid in text: the needle sentence ``probes.text.needle`` at the sentence
        boundary nearest each depth, distractor needles at other boundaries."""
        p = cls.settings(spec)
        cells = []
        for nd, length, depth, key in cls.grid(spec, train_length):
            cell = Cell(key, [], fits(length, max_length), copy_any_value=1 / (nd + 1),
                        chance=1 / 90000)  # 5-digit values
            if cell.na is None:
                salt = f"probe:text-needle:{nd}:{length}:{depth}"
                try:
                    cell.items = [cls.text_item(builder, syn.example_rng(spec.seed, i, salt),
                                                key, length, depth, nd) for i in range(p.n)]
                except NotApplicable as e:
                    cell.na = e.status
            cells.append(cell)
        return cells

    @classmethod
    def text_item(cls, b: TextBuilder, rng: random.Random, key: dict[str, Any], length: int,
                  depth: float, nd: int) -> ProbeItem:
        """One text item: the gold needle and ``nd`` distractors in a haystack of ``length``
        tokens (haystack sentences dropped one by one until it fits)."""
        t = b.t
        names = rng.sample(KEYS, nd + 1)
        values = [str(v) for v in rng.sample(range(10000, 100000), nd + 1)]
        needles = [t.needle.format(key=k, value=v) for k, v in zip(names, values)]
        question = t.question.format(key=names[0])
        prefix = t.answer_prefix.format(key=names[0])
        fixed = (b.ntok(" ".join(needles)) + b.ntok(b.tail(question, prefix, ""))
                 + 3 + len(b.head()))  # + answer tokens (a 5-digit value: ~2-3 tokens)
        budget = length - fixed
        if budget < 4:
            raise NotApplicable(f"length {length} too short for the needles and the question "
                                f"(needs > {fixed + 4} tokens)")
        hay = b.hay(rng, budget)
        core = fixed
        for _ in range(50):
            if len(hay) < 2:  # no haystack to hide a needle in: not a probe at this length
                break
            text, marker = cls.insert(b, rng, hay, needles, depth)
            item = b.item(key, b.tail(question, prefix, text), values[0], values[1:], marker,
                          {"n_distractors": nd})
            if item.meta["n_tokens"] <= length:
                return item
            core = item.meta["n_tokens"] - sum(b.sent_ntok(s) for s in hay)
            hay = hay[:-1]  # one sentence too many: drop one and rebuild (never the needle)
        raise NotApplicable(f"length {length} leaves no haystack (two sentences at least) "
                            f"around the {nd + 1} needles, the question and the answer (about "
                            f"{core} tokens)")

    @classmethod
    def insert(cls, b: TextBuilder, rng: random.Random, hay: list[str], needles: list[str],
               depth: float) -> tuple[str, str]:
        """Insert the gold needle at the sentence boundary nearest ``depth`` of the haystack's
        tokens, distractors at other random boundaries; return (text, gold needle)."""
        bounds = [0]
        for s in hay:
            bounds.append(bounds[-1] + b.ntok(" " + s))
        total = bounds[-1]
        gold_slot = min(range(len(bounds)), key=lambda k: abs(bounds[k] - depth * total))
        free = [k for k in range(len(bounds)) if k != gold_slot] or [gold_slot]
        slots = {gold_slot: [needles[0]]}
        for n in needles[1:]:
            slots.setdefault(rng.choice(free), []).append(n)
        parts = []
        for k in range(len(bounds)):
            parts += slots.get(k, [])
            if k < len(hay):
                parts.append(hay[k])
        b.context_tokens = b.ntok(" ".join(parts))
        return " ".join(parts), needles[0]

    @classmethod
    def summary(cls, rows: list[dict[str, Any]], examples: list[dict[str, Any]], *,
                train_length: int, threshold: float) -> dict[str, Any]:
        """Per needle variant: accuracy by length (pooled over depths), within / beyond the
        training length, the effective length under :data:`EFFECTIVE_RULE`, the baselines and
        the accuracy by needle distance."""
        out = {}
        mine = [c for c in rows if c["probe"] == cls.name]
        for variant in dict.fromkeys(c["variant"] for c in mine):
            vc = [c for c in mine if c["variant"] == variant]
            by_len: dict[int, float | None] = {}
            for length in sorted({c["length"] for c in vc}):
                lc = [c for c in vc if c["length"] == length]
                by_len[length] = (None if any(c["n"] == 0 for c in lc)
                                  else pooled(lc)["accuracy"])
            ok = [c for c in vc if c["n"]]
            ex = [e for e in examples if e["probe"] == cls.name and e["variant"] == variant]
            out[variant] = {
                "accuracy_by_length": {str(k): v for k, v in by_len.items()},
                "within_train_length": pooled([c for c in ok if c["length"] <= train_length]),
                "beyond_train_length": pooled([c for c in ok if c["length"] > train_length]),
                "effective_length": effective_length(by_len, threshold),
                "threshold": threshold, "rule": EFFECTIVE_RULE.format(t=threshold),
                "n_not_applicable": sum(1 for c in vc if not c["n"]),
                "copy_any_value": vc[0]["copy_any_value"], "chance": vc[0]["chance"],
                "by_distance": distance_view(ex),
            }
        return out

    @classmethod
    def report_lines(cls, summary: dict[str, Any]) -> list[str]:
        return [line for variant, s in summary.items() for line in _lines(variant, s)]

    @classmethod
    def figures(cls, cells: list[dict[str, Any]], *, train_length: int | None,
                title: str) -> dict[str, Any]:
        """``niah``: accuracy heatmaps (depth × length), one panel per variant."""
        from blocklab.eval.plots import panels_figure

        return {"niah": panels_figure(
            cells, probe=cls.name, row_key="depth", row_label="needle depth",
            train_length=train_length,
            title="Needle in a haystack: accuracy by depth and length"
            + (f"\n{title}" if title else ""))}

    @classmethod
    def headline(cls, summary: dict[str, Any]) -> dict[str, float]:
        """Accuracy within / beyond the training length and the effective length per
        variant."""
        out = {}
        for variant, s in summary.items():
            tag = variant.replace(" ", "_")
            for part in ("within_train_length", "beyond_train_length"):
                if s[part]["accuracy"] is not None:
                    out[f"probe/needle_{tag}/{part}"] = s[part]["accuracy"]
            out[f"probe/needle_{tag}/effective_length"] = float(s["effective_length"] or 0)
        return out

    @classmethod
    def tables(cls, summary: dict[str, Any]) -> dict[str, tuple[list[str], list[list[Any]]]]:
        """The effective length per variant."""
        rows = [[variant, s.get("effective_length"), s.get("threshold"),
                 s["within_train_length"]["accuracy"], s["beyond_train_length"]["accuracy"]]
                for variant, s in summary.items()]
        return {"effective_length": (["variant", "effective_length", "threshold",
                                      "within_train_length", "beyond_train_length"], rows)
                } if rows else {}

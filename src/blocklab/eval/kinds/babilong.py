"""The BABILong probe kind (Kuratov et al. 2024, arXiv 2406.10149; booydar/babilong): bAbI's
reasoning tasks (data/babi.py, a seeded world simulation) hidden in real text — every fact of
a story inserted, in order, at sentence boundaries of the haystack (``probes.text.haystack``)
by data/babilong.py's ``build_sample``, inside one depth band of the context, the whole prompt
sized in the model's own tokens — and the question at the end. Cells: task × length × depth
band, text space only (its token-space form is one N/A cell).

Two scores per item: forced choice — every label of the task is a candidate continuation
(``" " + label``, tokenized jointly with the prompt), correct iff the gold label's total
log-prob is strictly the highest (a tie is wrong: a model that cannot tell the labels apart
never scores) — and the greedy generation judged by BABILong's single-label rule
(``answer_correct``). Prompts: eval/babilong_prompts.py; the dataset export:
eval/babilong_export.py. docs/probes.md, "BABILong"."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from blocklab.config import BabilongProbeConfig, ProbeSpec
from blocklab.data import babi
from blocklab.data.babilong import PROMPT, TooShort, build_sample
from blocklab.eval.aggregate import wilson_interval
from blocklab.eval.babilong_prompts import frame
from blocklab.eval.items import Cell, NotApplicable, ProbeItem, lengths_of
from blocklab.eval.kinds.base import ProbeKind, fmt
from blocklab.eval.textspace import TextBuilder

#: Extra tokens reserved beside the prompt's parts: joint tokenization may merge differently
#: at the seams (an item that still overflows is rebuilt with the overflow reserved).
SEAM = 2
SCORES = (("choice", "forced choice"), ("exact", "generation"))
#: How far (a fraction of the context) a fact may lie outside its band: facts go to sentence
#: boundaries, and a story's facts fill part of a short context themselves. Beyond it the band
#: cannot hold the story at this length: the cell is N/A, never a mislabelled depth.
BAND_SLACK = 0.1
#: Haystack draws tried per item before its band counts as unable to hold the story.
BAND_TRIES = 6


class Babilong(ProbeKind):
    """BABILong (text space only); see the module docstring."""

    name = "babilong"
    config = BabilongProbeConfig
    title = "BABILong"

    @classmethod
    def configured(cls, spec: ProbeSpec) -> bool:
        """Only when enabled: a spec that does not ask for it reports exactly as before."""
        return super().configured(spec) and cls.settings(spec).enabled

    @classmethod
    def adapt(cls, spec: ProbeSpec, tc: Any) -> ProbeSpec:
        """Stories as the checkpoint trained on them: ``facts: null`` takes a ``data=babilong``
        run's ``data.babilong_facts`` (a model trained on 2-fact stories is probed on 2-fact
        stories, not on qa1's usual up-to-10)."""
        p = cls.settings(spec)
        data = getattr(tc, "data", None)
        trained = getattr(data, "babilong_facts", None)
        if (p.facts is not None or trained is None or not cls.configured(spec)
                or str(getattr(data.name, "value", data.name)) != cls.name):
            return spec
        return dataclasses.replace(spec, **{cls.name: dataclasses.replace(p, facts=trained)})

    # ------------------------------------------------------------------------------ items
    @classmethod
    def text_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                   max_length: int | None) -> list[Cell]:
        """task × length × depth band, ``n`` items each (a story drawn per item; the same
        stories at every depth band and prompt style)."""
        p, b = cls.settings(spec), builder
        cells: list[Cell] = []
        records: list[dict[str, Any]] = []
        for task in p.tasks:
            for length in lengths_of(p.lengths, train_length):
                for lo, hi in p.depths:
                    key = {"probe": cls.name, "variant": task, "task": task, "length": length,
                           "depth": f"{lo:g}-{hi:g}", "depth_lo": lo, "depth_hi": hi}

                    def make(rng: random.Random, key=key, task=task, length=length,
                             band=(lo, hi)) -> ProbeItem:
                        item, record = cls.text_item(b, rng, key=key, task=task, length=length,
                                                     band=band, style=p.prompt, facts=p.facts)
                        records.append(record)
                        return item

                    # one salt for every band: item i holds the same story and haystack at
                    # each band (paired), only where its facts go differs
                    salt = f"probe:text-babilong:{task}:{length}"
                    cells.append(b.cell(key, length, max_length, p.n, spec.seed, salt, make,
                                        copy_any_value=None,
                                        chance=1 / len(babi.TASK_LABELS[task])))
        if p.export:  # the items of the cells that were built (never an N/A cell's part)
            from blocklab.eval.babilong_export import export

            built = {(c.key["task"], c.key["length"], c.key["depth"]) for c in cells
                     if c.na is None}
            export(p.export, [r for r in records if (r["task"], r["length"],
                                                     f"{r['depth'][0]:g}-{r['depth'][1]:g}")
                              in built], name=cls.name, tokenizer=b.tok.name)
        if p.export_only:
            for c in cells:
                c.items, c.na = [], c.na or f"n/a: exported only ({p.export})"
        return cells

    @classmethod
    def text_item(cls, b: TextBuilder, rng: random.Random, *, key: dict[str, Any], task: str,
                  length: int, band: tuple[float, float], style: str,
                  facts: int | None = None) -> tuple[ProbeItem, dict[str, Any]]:
        """One item and its export record: a story, hidden in the haystack so that the whole
        prompt and the longest label fit ``length`` tokens; N/A when they cannot."""
        story = babi.story(task, rng, n_facts=None if task == "qa4" else facts)
        labels = list(story.labels)
        before, after = frame(style == "plain", task, story.question, PROMPT, b.chat)
        head = b.head()
        reserve = (len(head) + b.ntok(before) + b.ntok(after) + SEAM
                   + max(b.ntok(" " + label) for label in labels))
        lo, hi = band
        for _ in range(BAND_TRIES):  # another haystack run when the facts spill out
            sample, text, prompt, answer, cands = cls._fit(b, story, labels, length, band,
                                                           reserve, before, after, head, rng)
            off = max(max(lo - d, d - hi, 0.0) for d in sample.depths)
            if off <= BAND_SLACK:
                break
        else:
            raise NotApplicable(f"length {length}: the {len(story.facts)} facts of a {task} "
                                f"story fill the context past the depth band {lo:g}-{hi:g} "
                                f"(a fact {off:.2f} outside it in each of {BAND_TRIES} "
                                "haystack draws)")
        meta = {"n_tokens": len(head) + len(prompt) + len(answer), "band_overflow": round(off, 4),
                "context_tokens": sample.n_tokens, "n_facts": len(story.facts),
                "target": story.answer,
                "fact_depths": [round(d, 4) for d in sample.depths],
                "supporting_depths": [round(d, 4) for d in sample.supporting_depths]}
        item = ProbeItem(cell=key, prompt=head + prompt, answer=answer, candidates=cands,
                         gold=labels.index(story.answer), answer_text=story.answer,
                         labels=labels, question=story.question, meta=meta)
        record = {"task": task, "length": length, "depth": list(band), "prompt_style": style,
                  "input": text, "context": sample.context, "question": story.question,
                  "target": story.answer, "labels": labels, "gold": item.gold,
                  "facts": list(story.facts), "bos": bool(head),
                  "prompt_tokens": len(item.prompt), "context_tokens": sample.n_tokens,
                  "label_tokens": [len(c) for c in cands], **{k: meta[k] for k in (
                      "fact_depths", "supporting_depths")}}
        return item, record

    @staticmethod
    def _fit(b: TextBuilder, story: Any, labels: list[str], length: int,
             band: tuple[float, float], reserve: int, before: str, after: str,
             head: list[int], rng: random.Random) -> tuple[Any, str, list, list, list]:
        """One haystack draw of ``story`` whose whole prompt and longest label fit ``length``
        (the reserve grown where joint tokenization came out longer than its parts)."""
        state = rng.getstate()
        for _ in range(4):
            rng.setstate(state)
            try:
                sample = build_sample(story, b.sentences, length, b.ntok, rng,
                                      depth=band, reserve=reserve)
            except TooShort as e:
                raise NotApplicable(str(e)) from None
            text = before + sample.context + after
            prompt, answer, _ = b.joint(text, " " + story.answer)
            cands = [b.joint(text, " " + label)[1] for label in labels]
            total = len(head) + len(prompt) + max(len(c) for c in cands)
            if total <= length:
                return sample, text, prompt, answer, cands
            reserve += total - length
        raise NotApplicable(f"length {length}: the prompt does not fit after 4 tries")

    # ---------------------------------------------------------------------------- summary
    @classmethod
    def summary(cls, rows: list[dict[str, Any]], examples: list[dict[str, Any]], *,
                train_length: int, threshold: float) -> dict[str, Any]:
        """Per task: each score (forced choice, generation) by length × depth band, by length
        (pooled over bands) and pooled, with Wilson intervals; the chance line 1/labels."""
        out: dict[str, Any] = {}
        mine = [r for r in rows if r["probe"] == cls.name]
        for task in dict.fromkeys(r["task"] for r in mine if "task" in r):
            tr = [r for r in mine if r.get("task") == task]
            s: dict[str, Any] = {"chance": tr[0]["chance"],
                                 "n_not_applicable": sum(1 for r in tr if not r["n"])}
            for score, _ in SCORES:
                s[score] = {
                    "by_length_depth": {str(r["length"]): {} for r in tr},
                    "by_length": {}, "pooled": cls._pool(tr, score)}
                for r in tr:
                    s[score]["by_length_depth"][str(r["length"])][r["depth"]] = (
                        r.get(score) if r["n"] else None)
                for length in dict.fromkeys(r["length"] for r in tr):
                    s[score]["by_length"][str(length)] = cls._pool(
                        [r for r in tr if r["length"] == length], score)
            out[task] = s
        return out

    @staticmethod
    def _pool(rows: list[dict[str, Any]], score: str) -> dict[str, Any]:
        """Successes and trials summed over cells, with the Wilson interval."""
        ok = [r for r in rows if r["n"]]
        n = sum(r["n"] for r in ok)
        k = sum(round(r[score] * r["n"]) for r in ok)
        lo, hi = wilson_interval(k, n)
        return {"n": n, "accuracy": k / n if n else None, "ci_low": lo if n else None,
                "ci_high": hi if n else None}

    @classmethod
    def report_lines(cls, summary: dict[str, Any]) -> list[str]:
        if not summary:
            return []
        lines = ["BABILong (forced choice over the labels / greedy generation, single-label "
                 "rule):"]
        for task, s in summary.items():
            lengths = list(s["choice"]["by_length"])
            lines.append(f"  {task:<18}" + "".join(f"{x:>12}" for x in lengths))
            depths = list(dict.fromkeys(d for v in s["choice"]["by_length_depth"].values()
                                        for d in v))
            for d in depths:
                cells = [f"{fmt(s['choice']['by_length_depth'][x].get(d), '.2f')}/"
                         f"{fmt(s['exact']['by_length_depth'][x].get(d), '.2f')}"
                         for x in lengths]
                lines.append(f"    {'depth ' + d:<16}" + "".join(f"{c:>12}" for c in cells))
            for score, what in SCORES:
                p = s[score]["pooled"]
                lines.append(f"    pooled {what} {fmt(p['accuracy'])} [{fmt(p['ci_low'])}, "
                             f"{fmt(p['ci_high'])}] n={p['n']} (chance {fmt(s['chance'])})")
        return lines

    @classmethod
    def headline(cls, summary: dict[str, Any]) -> dict[str, float]:
        """Each task's pooled forced-choice and generation accuracy."""
        out = {}
        for task, s in summary.items():
            for score, _ in SCORES:
                acc = s[score]["pooled"]["accuracy"]
                if acc is not None:
                    out[f"probe/{cls.name}_{task}/{score}"] = acc
        return out

    @classmethod
    def tables(cls, summary: dict[str, Any]) -> dict[str, tuple[list[str], list[list[Any]]]]:
        """Accuracy per task × length × depth band, both scores."""
        rows = [[task, int(length), depth, acc, s["exact"]["by_length_depth"][length][depth]]
                for task, s in summary.items()
                for length, per in s["choice"]["by_length_depth"].items()
                for depth, acc in per.items()]
        cols = ["task", "length", "depth", "choice", "generation"]
        return {cls.name: (cols, rows)} if rows else {}

    @classmethod
    def figures(cls, cells: list[dict[str, Any]], *, train_length: int | None,
                title: str) -> dict[str, Any]:
        """Per task a heatmap (depth band × length, forced choice), and one figure of
        accuracy against length (both scores, Wilson intervals, chance lines)."""
        from blocklab.eval.plots import grid_figure

        rows = [r for r in cells if r.get("probe") == cls.name]
        out = {}
        for task in dict.fromkeys(r.get("task") for r in rows):
            tr = [{**r, "variant": r["depth"], "accuracy": r.get("choice"),
                   "copy_any_value": None} for r in rows if r.get("task") == task]
            out[f"{cls.name}_{task}"] = grid_figure(
                tr, probe=cls.name, row_key="variant", row_label="depth band of the facts",
                heading=f"BABILong {task}: forced-choice accuracy by depth and length",
                train_length=train_length, title=title)
        out[f"{cls.name}_curves"] = cls._curves(rows, train_length, title)
        return out

    @classmethod
    def _curves(cls, rows: list[dict[str, Any]], train_length: int | None, title: str) -> Any:
        """Accuracy against length per task, pooled over the depth bands: forced choice solid,
        generation dashed, Wilson 95% error bars, each task's chance line dotted."""
        from blocklab.plotting import colours, new_figure, no_data

        tasks = list(dict.fromkeys(r.get("task") for r in rows))
        fig = new_figure((8.8, 4.8))
        ax = fig.subplots()
        drawn = False
        for task, colour in zip(tasks, colours(len(tasks))):
            tr = [r for r in rows if r.get("task") == task]
            lengths = sorted({r["length"] for r in tr})
            for score, what in SCORES:
                pts = [(x, cls._pool([r for r in tr if r["length"] == x], score))
                       for x in lengths]
                pts = [(x, q) for x, q in pts if q["accuracy"] is not None]
                if not pts:
                    continue
                drawn = True
                ys = [q["accuracy"] for _, q in pts]
                err = [[y - q["ci_low"] for y, (_, q) in zip(ys, pts)],
                       [q["ci_high"] - y for y, (_, q) in zip(ys, pts)]]
                ax.errorbar([x for x, _ in pts], ys, yerr=err, color=colour, marker="o",
                            linestyle="-" if score == "choice" else "--", capsize=3,
                            label=f"{task} {what}")
            ax.axhline(tr[0]["chance"], color=colour, linestyle=":", linewidth=1.0)
        if not drawn:
            no_data(ax, "no accuracy to plot (all cells N/A)")
        lengths = sorted({r["length"] for r in rows}) or [1]
        if train_length and train_length <= lengths[-1]:
            ax.axvline(train_length, color="grey", linewidth=0.8, label="train L")
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{x:,}" for x in lengths])
        ax.minorticks_off()
        ax.set_ylim(0.0, 1.05)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("accuracy (Wilson 95% CI; dotted: chance)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        heading = "BABILong: accuracy against length"
        ax.set_title(f"{heading}\n{title}" if title else heading, fontsize=10)
        return fig

"""The variable-tracking probe kind (RULER, arXiv 2404.06654): chains of assignments
``x1 = v; x2 = x1; ...`` scattered through the haystack with distractor chains; answer the
queried chain's root value. Cells: hops × length; the summary adds accuracy by the depth of the
farthest hop. docs/probes.md, "More probe kinds"."""

from __future__ import annotations

import random
import string
from functools import partial
from typing import Any

from blocklab.config import HopsProbeConfig, ProbeSpec, multihop_min_length
from blocklab.config.checks import require
from blocklab.data import synthetic as syn
from blocklab.data.tasks.multihop import multihop
from blocklab.eval import textspace
from blocklab.eval.aggregate import depth_view, grid_summary
from blocklab.eval.items import (
    FILLER_CYCLE,
    Cell,
    NotApplicable,
    ProbeItem,
    answers_item,
    fits,
    lengths_of,
)
from blocklab.eval.kinds.base import ProbeKind
from blocklab.eval.textspace import VALUES, TextBuilder

HOP_ROOT = "VAR {name} = {value}."
HOP_LINK = "VAR {name} = VAR {parent}."
HOP_QUESTION = "What is the value of VAR {name}?"
HOP_PREFIX = "The value of VAR {name} is"


class Hops(ProbeKind):
    """Variable tracking (token and text space); rows of its heatmap are hop counts."""

    name = "hops"
    config = HopsProbeConfig
    title = "variable tracking"
    what = "root value of the queried chain"
    row_key = "hops"
    row_label = "hops (assignments in the chain)"
    heading = "Variable tracking: accuracy by hops and length"

    @classmethod
    def token_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                    max_length: int | None) -> list[Cell]:
        """Variable tracking: hops × lengths, ``distractor_chains`` other chains of the same
        length; ``farthest_depth`` is the depth of the queried chain's root statement (uniform),
        ``hop_depths`` every statement's, in chain order (token space)."""
        p, vocab = cls.settings(spec), builder.vocab
        c = p.distractor_chains
        cells = []
        for h in p.hops:
            need = multihop_min_length(h, c)
            for length in lengths_of(p.lengths, train_length):
                key = {"probe": cls.name, "variant": f"{h} hops", "hops": h, "length": length}
                na = fits(length, max_length)
                if na is None and length < need:
                    na = NotApplicable(f"length {length} < {need} for {c + 1} chains of {h} "
                                       "hops").status
                cell = Cell(key, [], na, copy_any_value=1 / (c + 1), chance=1 / vocab.n_values)
                if na is None:
                    salt = f"probe:hops:{h}:{c}:{length}"
                    for i in range(p.n):
                        ex = multihop(syn.example_rng(spec.seed, i, salt), vocab, length,
                                      hops=h, distractor_chains=c,
                                      filler=FILLER_CYCLE[i % len(FILLER_CYCLE)], seed=spec.seed)
                        m = ex.meta
                        cell.items.append(answers_item(
                            key, ex, farthest_depth=m["farthest_depth"],
                            hop_depths=m["hop_depths"], actual_depth=m["farthest_depth"],
                            distance=m["query_index"] - m["hop_indices"][0]))
                cells.append(cell)
        return cells

    @classmethod
    def text_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                   max_length: int | None) -> list[Cell]:
        """Variable tracking (RULER, arXiv 2404.06654): a chain of ``h`` assignments — ``VAR A
        = 12345.`` (the root), then ``VAR B = VAR A.`` … — and ``distractor_chains`` other
        chains of the same shape (disjoint names and values), interleaved; the question names
        the queried chain's last variable, the answer is its root value, the candidates every
        chain's root value, gold first (copy line 1/chains). ``h`` counts assignments, as in the
        token-space builder: ``1 hops`` is a single lookup. Names are five random capitals,
        unique per item and absent from the haystack; root values random 5-digit numbers,
        each occurring once.

        Depths: each chain's root at a uniform depth ``d0`` and its later statements at sorted
        uniform depths in ``[d0, 1)``, so the statement farthest from the question (the root)
        is uniform over the context and every chain reads in order. Meta: ``hop_depths`` and
        ``hop_tokens`` of the queried chain's statements in chain order, ``farthest_depth``
        (the root's; also ``actual_depth``) and ``distance`` (root to the prompt's end)."""
        p, b = cls.settings(spec), builder
        require(all(h >= 1 for h in p.hops), "probes.hops.hops", list(p.hops),
                "each hop count must be >= 1")
        require(p.distractor_chains >= 0, "probes.hops.distractor_chains", p.distractor_chains,
                "must be >= 0")
        chains = p.distractor_chains + 1
        cells = []
        for h in p.hops:
            for length in lengths_of(p.lengths, train_length):
                key = {"probe": cls.name, "variant": f"{h} hops", "hops": h, "length": length}
                make = partial(cls.text_item, b, key=key, hops=h, chains=chains, length=length)
                cells.append(b.cell(key, length, max_length, p.n, spec.seed,
                                    f"probe:text-hops:{h}:{chains}:{length}", make,
                                    copy_any_value=1 / chains, chance=1 / len(VALUES)))
        return cells

    @classmethod
    def variable_names(cls, b: TextBuilder, rng: random.Random, n: int) -> list[str]:
        """``n`` distinct names of five random capitals, none occurring in the haystack."""
        names: list[str] = []
        while len(names) < n:
            name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
            if name not in names and "VAR" not in name and name not in b.hay_text:
                names.append(name)
        return names

    @classmethod
    def text_item(cls, b: TextBuilder, rng: random.Random, *, key: dict[str, Any], hops: int,
                  chains: int, length: int) -> ProbeItem:
        """One text item: ``chains`` chains of ``hops`` assignments; see :meth:`text_cells`."""
        names = cls.variable_names(b, rng, chains * hops)
        roots = [str(v) for v in rng.sample(VALUES, chains)]
        stmts: list[str] = []
        depths: list[float] = []
        for c in range(chains):
            ns = names[c * hops:(c + 1) * hops]
            stmts += [HOP_ROOT.format(name=ns[0], value=roots[c])]
            stmts += [HOP_LINK.format(name=ns[k], parent=ns[k - 1]) for k in range(1, hops)]
            d0 = textspace.draw_depth(rng)
            depths += [d0, *sorted(d0 + (1 - d0) * textspace.draw_depth(rng)
                                   for _ in range(hops - 1))]
        last = names[hops - 1]
        lay = b.scatter(rng, length, stmts, depths, HOP_QUESTION.format(name=last),
                        HOP_PREFIX.format(name=last), roots[0])
        for s in stmts:
            b.count(lay.text, s, 1)
        for r in roots:
            b.count(lay.text, r, 1)
        root_at = [lay.tokens[c * hops] for c in range(chains)]
        alts = [roots[c] for c in sorted(range(1, chains), key=lambda c: root_at[c])]
        return b.probe_item(key, lay, [roots[0]], alts, {
            "hop_depths": lay.depths[:hops], "hop_tokens": lay.tokens[:hops],
            "farthest_depth": lay.depths[0], "actual_depth": lay.depths[0],
            "distance": len(lay.prompt) + len(b.head()) - lay.tokens[0]}, multi=False)

    @classmethod
    def summary(cls, rows: list[dict[str, Any]], examples: list[dict[str, Any]], *,
                train_length: int, threshold: float) -> dict[str, Any]:
        """Variable tracking: per hop count, accuracy by length and pooled; accuracy by hops
        (pooled over lengths) and, per hop count, by the depth of the farthest hop (the root
        statement) in :data:`DEPTH_BINS` bins."""
        per = grid_summary(rows, cls.name)
        hc = [c for c in rows if c["probe"] == cls.name]
        ex = [e for e in examples if e["probe"] == cls.name]
        for variant, s in per.items():
            s["hops"] = next(c["hops"] for c in hc if c["variant"] == variant)
            s["by_farthest_depth"] = depth_view([e for e in ex if e["variant"] == variant],
                                                "farthest_depth")
        return {"by_hops": per,
                "accuracy_by_hops": {str(s["hops"]): s["pooled"]["accuracy"] for s in per.values()},
                "by_farthest_depth": depth_view(ex, "farthest_depth")} if per else {}

    @classmethod
    def variants(cls, summary: dict[str, Any]) -> dict[str, Any]:
        return summary.get("by_hops") or {}

    @classmethod
    def report_lines(cls, summary: dict[str, Any]) -> list[str]:
        lines = super().report_lines(summary)
        rows = summary.get("by_farthest_depth") or []
        if rows:
            lines.append("  by farthest-hop depth (all hop counts): " + " ".join(
                f"[{r['depth_from']:.1f},{r['depth_to']:.1f}):{r['accuracy']:.2f}" for r in rows))
        return lines

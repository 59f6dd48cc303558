"""The multi-needle probe kind: RULER's multi-key, multi-value and multi-query needles (arXiv
2404.06654), every needle at its own uniform depth; its generator in token space lives here too
(a probe only, never a training task). docs/probes.md, "More probe kinds"."""

from __future__ import annotations

import random
from functools import partial
from typing import Any

from blocklab.config import (
    MULTI_NEEDLE_VARIANTS,
    MultiNeedleProbeConfig,
    ProbeSpec,
    multi_needle_answer_length,
    multi_needle_min_length,
)
from blocklab.config.checks import require
from blocklab.data import synthetic as syn
from blocklab.eval import textspace
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
from blocklab.eval.textspace import MULTI_KEYS, VALUES, TextBuilder, join_and

# Question templates (the needle sentence is ``probes.text.needle``); none states how many
# answers there are.
MULTI_VALUE_QUESTION = "What are all the special magic numbers for {key}?"
MULTI_VALUE_PREFIX = "The special magic numbers for {key} are"
MULTI_QUERY_QUESTION = "What are the special magic numbers for {keys}?"
MULTI_QUERY_PREFIX = "The special magic numbers for {keys} are"


class MultiNeedle(ProbeKind):
    """Multi-key / multi-value / multi-query needles (token and text space); summary, report,
    heatmap and headline are a grid kind's (per variant)."""

    name = "multi_needle"
    config = MultiNeedleProbeConfig
    title = "multi-needle"
    what = "all answers right; partial = share of answers found"
    row_label = "needle variant"
    heading = "Multi-key / multi-value / multi-query needles"

    @classmethod
    def token_example(cls, rng: random.Random, vocab: syn.Vocab, length: int, *,
                      variant: str = "multikey", keys: int = 4, values: int = 4, queries: int = 2,
                      filler: str = "iid", seed: int = 0) -> syn.Example:
        """RULER's needle variants (arXiv 2404.06654), exactly ``length`` tokens, every needle at
        an independently drawn uniform depth:

        - ``multikey``:   ``BOS hay(MARK k_i v_i, i < keys) SEP k_g → v_g``
        - ``multivalue``: every one of ``keys`` keys carries ``values`` values (``keys × values``
          needles ``MARK k v``); ``SEP k_g → `` its values *in order of appearance*
        - ``multiquery``: ``keys`` needles; ``SEP k_a k_b … → v_a v_b …`` (``queries``
          distinct keys asked at once, the values *in the order asked*)

        Keys and values are distinct within a sequence (a value occurs once in the context).
        ``meta``: ``depths`` (of every needle, in order of appearance), ``gold_depths`` and
        ``gold_indices`` (the answer's needles, in answer order), ``answers`` (every in-context
        alternative answer: each value (multikey); each key's run of values (multivalue); the
        values of the asked keys shifted by s = 0..keys-1 places in the order of appearance
        (multiquery)) with the gold one at ``gold``."""
        if variant not in MULTI_NEEDLE_VARIANTS:
            raise ValueError(f"multi_needle: unknown variant {variant!r}; known: "
                             f"{', '.join(MULTI_NEEDLE_VARIANTS)}")
        need = multi_needle_min_length(variant, keys, values, queries)
        if length < need:
            raise ValueError(f"multi_needle: length {length} too short for {variant} with "
                             f"keys={keys}, values={values}, queries={queries} (needs >= {need})")
        per_key = values if variant == "multivalue" else 1
        n_q = queries if variant == "multiquery" else 1
        ks = rng.sample(vocab.keys, keys)
        vs = rng.sample(vocab.values, keys * per_key)
        n_answer = multi_needle_answer_length(variant, values, queries)
        hay_len = length - 1 - 3 * keys * per_key - 1 - n_q - n_answer
        hay = syn.filler_tokens(rng, vocab, hay_len, filler, seed)
        pairs = [(ks[i], vs[i * per_key + j]) for i in range(keys) for j in range(per_key)]
        slots = [rng.randint(0, hay_len) for _ in pairs]
        tokens, at = syn.place_inserts(rng, hay, [(s, rng.random(), [syn.MARK, k, v])
                                       for s, (k, v) in zip(slots, pairs)])
        seen = sorted(range(len(pairs)), key=lambda j: at[j])  # needles in order of appearance
        depths = [slots[j] / hay_len for j in seen]
        key_order = list(dict.fromkeys(pairs[j][0] for j in seen))
        run = {k: [pairs[j][1] for j in seen if pairs[j][0] == k] for k in key_order}
        if variant == "multiquery":
            asked = rng.sample(range(keys), queries)  # indices into key_order, in the order asked
            query = [key_order[a] for a in asked]
            answers = [[run[key_order[(a + s) % keys]][0] for a in asked] for s in range(keys)]
            gold = 0
        else:
            query = [ks[0]]  # ks is a random sample: key 0 is a random key
            answers = [run[k] if variant == "multivalue" else run[k][:1] for k in key_order]
            gold = answers.index(run[ks[0]])
        answer = answers[gold]
        gold_j = [next(j for j in range(len(pairs)) if pairs[j][1] == v) for v in answer]
        tokens += [syn.SEP, *query, *answer]
        return syn.Example(tokens, [False] * (len(tokens) - n_answer) + [True] * n_answer, {
            "task": "multi_needle", "variant": variant, "keys": keys, "values": per_key,
            "queries": n_q, "depths": depths, "gold_depths": [slots[j] / hay_len for j in gold_j],
            "gold_indices": [at[j] for j in gold_j], "query_index": len(tokens) - n_answer - n_q,
            "answers": answers, "gold": gold, "filler": filler})

    @classmethod
    def token_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                    max_length: int | None) -> list[Cell]:
        """Multi-key / multi-value / multi-query needles: variants × lengths, ``n`` items per cell,
        every needle at its own uniform depth (``depths``: all needles, ``gold_depths``: the
        answer's, in answer order)."""
        p, vocab = cls.settings(spec), builder.vocab
        cells = []
        for variant in p.variants:
            n_answer = multi_needle_answer_length(variant, p.values, p.queries)
            need = multi_needle_min_length(variant, p.keys, p.values, p.queries)
            n_cands = p.keys  # one alternative answer per key (multikey/-value), per shift (-query)
            for length in lengths_of(p.lengths, train_length):
                key = {"probe": cls.name, "variant": variant, "length": length}
                na = fits(length, max_length)
                if na is None and length < need:
                    na = NotApplicable(f"length {length} < {need} for {variant} (keys={p.keys}, "
                                       f"values={p.values}, queries={p.queries})").status
                cell = Cell(key, [], na, copy_any_value=1 / n_cands,
                            chance=(1 / vocab.n_values) ** n_answer)
                if na is None:
                    salt = f"probe:multi_needle:{variant}:{length}"
                    for i in range(p.n):
                        ex = cls.token_example(
                            syn.example_rng(spec.seed, i, salt), vocab, length, variant=variant,
                            keys=p.keys, values=p.values, queries=p.queries,
                            filler=FILLER_CYCLE[i % len(FILLER_CYCLE)], seed=spec.seed)
                        m = ex.meta
                        cell.items.append(answers_item(
                            key, ex, depths=m["depths"], gold_depths=m["gold_depths"],
                            actual_depth=m["gold_depths"][0],
                            distance=m["query_index"] - min(m["gold_indices"])))
                cells.append(cell)
        return cells

    @classmethod
    def text_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                   max_length: int | None) -> list[Cell]:
        """RULER's multi-key, multi-value and multi-query needles (arXiv 2404.06654, Sec. 3)
        in the needle sentence ``probes.text.needle``, every needle at its own uniform depth,
        drawn per item; keys and values distinct within an item. Cells: variant × length.

        - ``multikey``: ``keys`` needles, one key asked (``probes.text.question``);
        - ``multivalue``: each of ``keys`` keys carries ``values`` values (``keys × values``
          needles, so the asked key is not the only repeated one); one key asked, the gold
          continuation lists its values in their order of appearance;
        - ``multiquery``: ``keys`` needles, ``queries`` keys asked at once, the gold
          continuation lists their values in the order asked.

        Several answers: ``answer_texts`` holds each value (the scorer requires every one in
        the generation and reports the share found), ``answer_text`` and ``answer`` the values
        joined by ", ". Candidates, gold first, as in the token-space builder: every key's value
        (multikey); every key's run of values, keys in order of appearance (multivalue); the
        asked keys' values shifted by s = 0 … keys − 1 places in the order of appearance
        (multiquery). Copy line: answering with a random one of them, 1/keys. Meta: ``depths``
        and ``needle_tokens`` of every needle in order of appearance, ``gold_depths`` and
        ``gold_tokens`` of the answer's needles in answer order, ``actual_depth`` (the first
        answer's) and ``distance`` (farthest answer needle to the prompt's end)."""
        p, b = cls.settings(spec), builder
        bad = [v for v in p.variants if v not in MULTI_NEEDLE_VARIANTS]
        require(not bad, "probes.multi_needle.variants", list(p.variants),
                f"each one of {', '.join(MULTI_NEEDLE_VARIANTS)}")
        require(1 <= p.keys <= len(MULTI_KEYS), "probes.multi_needle.keys", p.keys,
                f"the text builder has {len(MULTI_KEYS)} distinct key names (1..{len(MULTI_KEYS)})")
        require(p.values >= 1, "probes.multi_needle.values", p.values, "must be >= 1")
        require(1 <= p.queries <= p.keys, "probes.multi_needle.queries", p.queries,
                f"must be in 1..keys ({p.keys})")
        cells = []
        for variant in p.variants:
            n_answers = {"multikey": 1, "multivalue": p.values, "multiquery": p.queries}[variant]
            for length in lengths_of(p.lengths, train_length):
                key = {"probe": cls.name, "variant": variant, "length": length}
                make = partial(cls.text_item, b, key=key, p=p, variant=variant, length=length)
                cells.append(b.cell(key, length, max_length, p.n, spec.seed,
                                    f"probe:text-multi_needle:{variant}:{length}", make,
                                    copy_any_value=1 / p.keys, chance=len(VALUES) ** -n_answers))
        return cells

    @classmethod
    def text_item(cls, b: TextBuilder, rng: random.Random, *, key: dict[str, Any], p: Any,
                  variant: str, length: int) -> ProbeItem:
        """One text item of ``variant`` (``p``: the kind's settings); see :meth:`text_cells`."""
        t = b.t
        per_key = p.values if variant == "multivalue" else 1
        names = rng.sample(MULTI_KEYS, p.keys)  # names[0], names[1], ...: random keys
        n = p.keys * per_key
        values = [str(v) for v in rng.sample(VALUES, n)]
        of = [i // per_key for i in range(n)]  # needle -> its key
        stmts = [t.needle.format(key=names[of[i]], value=values[i]) for i in range(n)]
        depths = [textspace.draw_depth(rng) for _ in range(n)]
        seen = sorted(range(n), key=lambda i: (depths[i], i))  # order of appearance
        key_order = list(dict.fromkeys(of[i] for i in seen))
        run = {k: [i for i in seen if of[i] == k] for k in key_order}  # needles of each key
        if variant == "multiquery":
            asked = list(range(p.queries))  # keys asked, in the order asked
            pos = [key_order.index(k) for k in asked]
            answers = [[run[key_order[(a + s) % p.keys]][0] for a in pos]
                       for s in range(p.keys)]
            keys = join_and([names[k] for k in asked])
            question = MULTI_QUERY_QUESTION.format(keys=keys)
            prefix = MULTI_QUERY_PREFIX.format(keys=keys)
        else:
            answers = [run[0]] + [run[k] for k in key_order if k != 0]
            if variant == "multikey":
                question, prefix = (t.question.format(key=names[0]),
                                    t.answer_prefix.format(key=names[0]))
            else:
                question, prefix = (MULTI_VALUE_QUESTION.format(key=names[0]),
                                    MULTI_VALUE_PREFIX.format(key=names[0]))
        golds = [values[i] for i in answers[0]]
        lay = b.scatter(rng, length, stmts, depths, question, prefix, ", ".join(golds))
        for s in stmts:
            b.count(lay.text, s, 1)
        for v in values:  # every value once: in its needle, never in the question
            b.count(lay.text, v, 1)
        far = min(lay.tokens[i] for i in answers[0])
        return b.probe_item(
            key, lay, golds, [", ".join(values[i] for i in a) for a in answers[1:]], {
                "depths": [lay.depths[i] for i in seen],
                "needle_tokens": [lay.tokens[i] for i in seen],
                "gold_depths": [lay.depths[i] for i in answers[0]],
                "gold_tokens": [lay.tokens[i] for i in answers[0]],
                "actual_depth": lay.depths[answers[0][0]],
                "distance": len(lay.prompt) + len(b.head()) - far},
            multi=variant != "multikey")

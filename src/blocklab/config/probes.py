"""Rules of a probe spec (``probes``, ``checkpoint_probes``, ``blocklab-eval probes``)."""

from __future__ import annotations

import os
import re
import string

from blocklab.config.checks import _check, _each, _finite, _one_of
from blocklab.config.schema import (
    FILLERS,
    MULTI_NEEDLE_VARIANTS,
    PROBE_SPACES,
    TEXT_HAYSTACKS,
    DataConfig,
    ProbeSpec,
    counting_min_length,
    multi_needle_min_length,
    multi_needle_needles,
    multihop_min_length,
)

_TEMPLATES = {  # text-space templates: placeholders each may use (and must use)
    "needle": ({"key", "value"}, {"value"}), "question": ({"key"}, set()),
    "answer_prefix": ({"key"}, set()), "record": ({"key", "value"}, {"value"}),
    "record_question": ({"key"}, set()), "record_answer_prefix": ({"key"}, set()),
}
_FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def _placeholders(template: str) -> set[str] | None:
    try:
        return {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError:  # unbalanced braces
        return None


def validate_probe_spec(spec: ProbeSpec, key: str = "probes", *, synthetic: bool | None = None,
                        data: DataConfig | None = None) -> ProbeSpec:
    """One probe spec. ``synthetic``: whether the model's vocabulary is the synthetic one (the
    token-space builder; False: a real tokenizer, the text-space builder; None: not known yet,
    then only ``space``-independent rules and an explicit ``space`` are checked). ``data``:
    the run's synthetic data config, against which the distractor and record counts of
    token-space probes are checked (the vocabulary must have enough distinct keys).

    Range rules apply whether or not a probe is enabled; "not empty", ``n >= 1`` and the
    vocabulary rules only to enabled probes. A one-record lost-in-the-middle grid (m = 1) is
    allowed: one point, no curve (m >= 2 draws one)."""
    k = key
    _check(bool(_FOLDER_NAME.fullmatch(spec.name or "")), f"{k}.name", spec.name,
           "a plain folder name (letters, digits, _ . + -)")
    _one_of(f"{k}.space", spec.space, PROBE_SPACES)
    space = spec.space
    if synthetic is not None:
        other = "token" if synthetic else "text"
        _check(space != ("text" if synthetic else "token"), f"{k}.space", space,
               "the synthetic vocabulary needs the token-space builder" if synthetic else
               "the token-space builder needs the synthetic vocabulary; this model has a real "
               "tokenizer", f"use {k}.space={other} (or auto)")
        space = other
    _check(spec.train_length is None or spec.train_length >= 1, f"{k}.train_length",
           spec.train_length, "must be null (the run's data.seq_len) or >= 1")
    _check(_finite(spec.threshold) and 0 < spec.threshold <= 1, f"{k}.threshold",
           spec.threshold, "must be in (0, 1] (an accuracy)")
    _check(spec.batch_size >= 1, f"{k}.batch_size", spec.batch_size, "must be >= 1")
    on = spec.enabled

    n = spec.needle
    live = on and n.enabled
    _each(f"{k}.needle.lengths", n.lengths, lambda x: _finite(x) and x > 0,
          "each length (a multiple of the training length) must be > 0", required=live)
    _each(f"{k}.needle.depths", n.depths, lambda x: _finite(x) and 0 <= x <= 1,
          "each depth must be in [0, 1]", required=live)
    _each(f"{k}.needle.n_distractors", n.n_distractors, lambda x: x >= 0,
          "each distractor count must be >= 0", required=live)
    _check(n.n >= 1 or not live, f"{k}.needle.n", n.n, "must be >= 1 (items per cell)",
           f"or {k}.needle.enabled=false")
    if live and space == "token":
        _check(bool(n.fillers) and set(n.fillers) <= set(FILLERS), f"{k}.needle.fillers",
               list(n.fillers), f"token-space needles need one or more of {', '.join(FILLERS)}")
        if data is not None and n.n_distractors:
            most, have = max(n.n_distractors), min(data.n_keys, data.n_values)
            _check(most + 1 <= have, f"{k}.needle.n_distractors", list(n.n_distractors),
                   f"{most} distractors need {most + 1} distinct keys and values; the "
                   f"synthetic vocabulary has data.n_keys={data.n_keys}, "
                   f"data.n_values={data.n_values}", f"use at most {have - 1} distractors")

    lt = spec.litm
    live = on and lt.enabled
    _each(f"{k}.litm.n_records", lt.n_records, lambda x: x >= 1,
          "each record count must be >= 1", required=live)
    _each(f"{k}.litm.gold", lt.gold, lambda x: _finite(x) and 0 <= x <= 1,
          "each gold position (a fraction of the records) must be in [0, 1]", required=live)
    _check(lt.n >= 1 or not live, f"{k}.litm.n", lt.n, "must be >= 1 (items per cell)",
           f"or {k}.litm.enabled=false")
    if live and space == "token" and data is not None and lt.n_records:
        most, have = max(lt.n_records), min(data.n_keys, data.n_values)
        _check(most <= have, f"{k}.litm.n_records", list(lt.n_records),
               f"{most} records need {most} distinct keys and values; the synthetic "
               f"vocabulary has data.n_keys={data.n_keys}, data.n_values={data.n_values}")

    _validate_new_kinds(spec, k, on, space, data)

    pp = spec.perplexity
    live = on and pp.enabled
    _each(f"{k}.perplexity.lengths", pp.lengths, lambda x: _finite(x) and x > 0,
          "each length (a multiple of the training length) must be > 0", required=live)
    _check(pp.tokens >= 1, f"{k}.perplexity.tokens", pp.tokens, "must be >= 1")
    _check(_finite(pp.stride) and 0 < pp.stride <= 1, f"{k}.perplexity.stride", pp.stride,
           "must be in (0, 1] (the fraction of each window scored)")

    t = spec.text
    _check(t.max_new_tokens >= 1, f"{k}.text.max_new_tokens", t.max_new_tokens, "must be >= 1")
    _check(t.margin_candidates >= 0, f"{k}.text.margin_candidates", t.margin_candidates,
           "must be >= 0")
    for name, (allowed, needed) in _TEMPLATES.items():
        value = getattr(t, name)
        fields = _placeholders(value)
        _check(fields is not None and fields <= allowed and needed <= fields,
               f"{k}.text.{name}", value,
               f"a template with the placeholders {{{'}, {'.join(sorted(allowed))}}}"
               + (f" ({{{'}, {'.join(sorted(needed))}}} required)" if needed else ""))
    if on and space == "text":
        _check(t.haystack in TEXT_HAYSTACKS or os.path.isfile(t.haystack),
               f"{k}.text.haystack", t.haystack,
               f"one of {', '.join(TEXT_HAYSTACKS)} or a path to a text file")
    return spec


def _longest(lengths: list[float], train_length: int) -> int:
    """The longest probe length in tokens (lengths are multiples of the training length)."""
    return max(1, round(max(lengths) * train_length))


def _validate_new_kinds(spec: ProbeSpec, k: str, on: bool, space: str,
                        data: DataConfig | None) -> None:
    """Multi-needle, variable tracking and aggregation: ranges always; "not empty", ``n >= 1``,
    the vocabulary (token space: enough distinct keys and values for one item) and "the longest
    length holds one item" (else every cell would be N/A) only when enabled."""
    tok = space == "token" and data is not None
    base = (spec.train_length or data.seq_len) if data is not None else 0
    at = f"training length {base}"
    mn = spec.multi_needle
    live = on and mn.enabled
    _each(f"{k}.multi_needle.variants", mn.variants, lambda x: x in MULTI_NEEDLE_VARIANTS,
          f"each variant must be one of {', '.join(MULTI_NEEDLE_VARIANTS)}", required=live)
    _each(f"{k}.multi_needle.lengths", mn.lengths, lambda x: _finite(x) and x > 0,
          "each length (a multiple of the training length) must be > 0", required=live)
    _check(mn.keys >= 1, f"{k}.multi_needle.keys", mn.keys, "must be >= 1 (needles per item)")
    _check(mn.values >= 1, f"{k}.multi_needle.values", mn.values,
           "must be >= 1 (values of each key, multivalue)")
    _check(1 <= mn.queries <= mn.keys, f"{k}.multi_needle.queries", mn.queries,
           f"must be in [1, keys={mn.keys}] (keys asked at once, multiquery)")
    _check(mn.n >= 1 or not live, f"{k}.multi_needle.n", mn.n, "must be >= 1 (items per cell)",
           f"or {k}.multi_needle.enabled=false")
    if live and tok:
        for variant in mn.variants:
            needles = multi_needle_needles(variant, mn.keys, mn.values)
            _check(mn.keys <= data.n_keys and needles <= data.n_values,
                   f"{k}.multi_needle.keys", mn.keys,
                   f"{variant} draws {mn.keys} distinct keys and {needles} distinct values; "
                   f"the synthetic vocabulary has data.n_keys={data.n_keys}, "
                   f"data.n_values={data.n_values}")
            need = multi_needle_min_length(variant, mn.keys, mn.values, mn.queries)
            longest = _longest(mn.lengths, base)
            _check(longest >= need, f"{k}.multi_needle.lengths", list(mn.lengths),
                   f"the longest length ({longest} tokens at the {at}) "
                   f"must hold one {variant} item ({need} tokens); every cell would be N/A")

    hp = spec.hops
    live = on and hp.enabled
    _each(f"{k}.hops.hops", hp.hops, lambda x: x >= 1, "each hop count must be >= 1",
          required=live)
    _each(f"{k}.hops.lengths", hp.lengths, lambda x: _finite(x) and x > 0,
          "each length (a multiple of the training length) must be > 0", required=live)
    _check(hp.distractor_chains >= 0, f"{k}.hops.distractor_chains", hp.distractor_chains,
           "must be >= 0 (0: the copy line is 1.0)")
    _check(hp.n >= 1 or not live, f"{k}.hops.n", hp.n, "must be >= 1 (items per cell)",
           f"or {k}.hops.enabled=false")
    if live and tok and hp.hops:
        chains, most = hp.distractor_chains + 1, max(hp.hops)
        _check(chains * most <= data.n_keys and chains <= data.n_values, f"{k}.hops.hops",
               list(hp.hops), f"{chains} chains of {most} hops need {chains * most} distinct "
               f"variables (keys) and {chains} values; the synthetic vocabulary has "
               f"data.n_keys={data.n_keys}, data.n_values={data.n_values}")
        need = multihop_min_length(min(hp.hops), hp.distractor_chains)
        longest = _longest(hp.lengths, base)
        _check(longest >= need, f"{k}.hops.lengths", list(hp.lengths),
               f"the longest length ({longest} tokens at the {at}) must "
               f"hold one item ({need} tokens); every cell would be N/A")

    ag = spec.aggregation
    live = on and ag.enabled
    _check(ag.candidates >= 2, f"{k}.aggregation.candidates", ag.candidates,
           "must be >= 2 (one candidate is the copy shortcut)")
    _each(f"{k}.aggregation.margins", ag.margins, lambda x: x >= 1,
          "each margin (winner count - runner-up count) must be >= 1", required=live)
    _each(f"{k}.aggregation.lengths", ag.lengths, lambda x: _finite(x) and x > 0,
          "each length (a multiple of the training length) must be > 0", required=live)
    _check(ag.n >= 1 or not live, f"{k}.aggregation.n", ag.n, "must be >= 1 (items per cell)",
           f"or {k}.aggregation.enabled=false")
    if live and tok and ag.margins:
        _check(ag.candidates <= data.n_values, f"{k}.aggregation.candidates", ag.candidates,
               f"needs {ag.candidates} distinct values; the synthetic vocabulary has "
               f"data.n_values={data.n_values}")
        need = counting_min_length(ag.candidates, min(ag.margins))
        longest = _longest(ag.lengths, base)
        _check(longest >= need, f"{k}.aggregation.lengths", list(ag.lengths),
               f"the longest length ({longest} tokens at the {at}) must "
               f"hold one item ({need} tokens); every cell would be N/A")

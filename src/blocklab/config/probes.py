"""Rules of a probe spec (``probes``, ``checkpoint_probes``, ``blocklab-eval probes``): the
spec's own keys, perplexity and the text-space templates here; each probe kind's rules live
with its settings (``check`` on its dataclass, config/probe_schema.py), and a user kind's are
found through the registry (``probes.kinds.<name>``)."""

from __future__ import annotations

import dataclasses
import os
import re
import string
from typing import Any

from blocklab.config.checks import _check, _each, _finite, _one_of
from blocklab.config.probe_schema import ProbeContext, ProbeKindConfig, kind_settings
from blocklab.config.schema import PROBE_SPACES, TEXT_HAYSTACKS, DataConfig, ProbeSpec

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
    _check(spec.text_grid is None or packaged_grid(spec.text_grid) is not None,
           f"{k}.text_grid", spec.text_grid,
           f"the name of a probe grid file (one of {', '.join(packaged_grids())})")
    if synthetic is not None:  # the tokenizer is known: the grid that fits it
        spec = grid_for(spec, synthetic)
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
    base = (spec.train_length or data.seq_len) if data is not None else 0
    _validate_kinds(spec, k, ProbeContext(k, on, space, data, base))

    pp = spec.perplexity
    live = on and pp.enabled
    _each(f"{k}.perplexity.lengths", pp.lengths, lambda x: _finite(x) and x > 0,
          "each length (a multiple of the training length) must be > 0", required=live)
    _check(pp.tokens >= 1, f"{k}.perplexity.tokens", pp.tokens, "must be >= 1")
    _check(_finite(pp.stride) and 0 < pp.stride <= 1, f"{k}.perplexity.stride", pp.stride,
           "must be in (0, 1] (the fraction of each window scored)")
    if live and space == "token":
        _check(pp.text == "auto", f"{k}.perplexity.text", pp.text,
               "the token-space builder reads held-out text of the training data's Markov "
               "chain: auto", f"{k}.perplexity.text=auto")
    elif live and space == "text":
        _check(pp.text in PERPLEXITY_TEXTS or os.path.isfile(pp.text), f"{k}.perplexity.text",
               pp.text, f"one of {', '.join(PERPLEXITY_TEXTS)} or a path to a text file")

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


def _validate_kinds(spec: ProbeSpec, k: str, ctx: ProbeContext) -> None:
    """Every probe kind's own rules: blocklab's kinds (the fields of the spec holding kind
    settings), then each user kind under ``probes.kinds`` (looked up in the registry, so an
    unknown name is one line naming ``probes.kinds.<name>``)."""
    for f in dataclasses.fields(spec):
        settings = getattr(spec, f.name)
        if isinstance(settings, ProbeKindConfig):
            settings.check(dataclasses.replace(ctx, key=f"{k}.{f.name}"))
    for name in spec.kinds or {}:
        at = f"{k}.kinds.{name}"
        _check(not isinstance(getattr(spec, name, None), ProbeKindConfig), at, spec.kinds[name],
               "a probe kind of blocklab's own is set at its own key", f"use {k}.{name}")
        from blocklab.registry import lookup

        config = lookup("probe", name, at).config
        kind_settings(spec, name, config, k).check(dataclasses.replace(ctx, key=at))


#: probes.perplexity.text's built-in choices (anything else is a path to a text file)
PERPLEXITY_TEXTS = ("auto", "validation", "shakespeare", "essay")


def packaged_grids() -> list[str]:
    """The probe grid files blocklab ships (``configs/probes/*.yaml``)."""
    from importlib.resources import files

    return sorted(f.name.removesuffix(".yaml") for f in (files("blocklab.configs") / "probes")
                  .iterdir() if f.name.endswith(".yaml"))


def packaged_grid(name: str) -> ProbeSpec | None:
    """The probe spec of ``configs/probes/<name>.yaml`` (None when there is no such file)."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    if not _FOLDER_NAME.fullmatch(name or ""):
        return None
    f = files("blocklab.configs") / "probes" / f"{name}.yaml"
    if not f.is_file():
        return None
    raw = OmegaConf.create(f.read_text())
    raw.pop("defaults", None)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ProbeSpec), raw))


def _changed(base: Any, spec: Any) -> Any:
    """The leaves of ``spec`` (plain nested dicts) that differ from ``base``, as a nested dict
    (``_MISSING`` when nothing differs)."""
    if isinstance(base, dict) and isinstance(spec, dict) and base.keys() == spec.keys():
        out = {k: d for k in spec if (d := _changed(base[k], spec[k])) is not _MISSING}
        return out or _MISSING
    return _MISSING if base == spec else spec


_MISSING = object()


def grid_for(spec: ProbeSpec, synthetic: bool) -> ProbeSpec:
    """The grid ``spec`` runs for a model whose vocabulary is synthetic (token space) or a real
    tokenizer's (text space): ``spec`` itself, except in text space when it names a
    ``text_grid`` — then that file's grid, with every key ``spec`` sets away from the schema's
    defaults (the command line's ``probes.needle.n=8``, say) applied on top. ``probes=auto``
    is the full grid in token space and ``text`` in text space: a text model's default
    probes fit it instead of running the token-space grid's thousands of items on it."""
    from omegaconf import OmegaConf

    if not dataclasses.is_dataclass(spec):  # a composed config (Python use): as data
        spec = OmegaConf.to_object(spec)
    if synthetic or not spec.text_grid:
        return dataclasses.replace(spec, text_grid=None) if spec.text_grid else spec

    grid = packaged_grid(spec.text_grid)
    if grid is None:
        return spec
    plain = OmegaConf.to_container(OmegaConf.structured(spec), enum_to_str=True)
    base = OmegaConf.to_container(OmegaConf.structured(
        ProbeSpec(name=spec.name, text_grid=spec.text_grid)), enum_to_str=True)
    changed = _changed(base, plain)
    merged = OmegaConf.merge(OmegaConf.structured(grid),
                             {} if changed is _MISSING else changed)
    return dataclasses.replace(OmegaConf.to_object(merged), text_grid=None)

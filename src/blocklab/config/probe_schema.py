"""The probe spec's schema: one settings dataclass per probe kind, each carrying its own rules
(``check``), the perplexity and text-space settings, and :class:`ProbeSpec` itself.

A probe kind's settings sit on the config floor (import-light, no torch) while the kind itself
— its cells, summary, report lines and plots — is a component in ``blocklab.eval.kinds``
(``PROBE_KINDS``; ``register("probe", name)`` for a user's own). blocklab's kinds are fields of
:class:`ProbeSpec`; a user kind's settings go under ``probes.kinds.<name>`` and are read onto
that kind's own dataclass by :func:`kind_settings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from blocklab.config.checks import _check, _each, _finite
from blocklab.config.choices import BABILONG_MIN_FACTS, BABILONG_PROMPTS, BABILONG_TASKS
from blocklab.config.facts import (
    FILLERS,
    MULTI_NEEDLE_VARIANTS,
    counting_min_length,
    multi_needle_min_length,
    multi_needle_needles,
    multihop_min_length,
)
from blocklab.errors import ConfigError

K = TypeVar("K")


@dataclass(frozen=True)
class ProbeContext:
    """What a kind's rules may look at besides its own settings: the dotted ``key`` of those
    settings, whether the spec is enabled (``on``), the builder's ``space`` (token / text /
    auto: not known yet), the run's ``data`` config (token space: the synthetic vocabulary;
    None when not known) and the training length lengths are multiples of (0: not known)."""

    key: str
    on: bool
    space: str
    data: Any = None
    train_length: int = 0

    @property
    def token(self) -> bool:
        """Token space with a known vocabulary: the vocabulary rules apply."""
        return self.space == "token" and self.data is not None

    def longest(self, lengths: list[float]) -> int:
        """The longest probe length in tokens (lengths are multiples of the training length)."""
        return max(1, round(max(lengths) * self.train_length))


class ProbeKindConfig:
    """Base of a probe kind's settings: ``enabled`` plus the kind's own fields, and ``check``,
    its rules. Range rules apply whether or not the kind is enabled; "not empty", ``n >= 1``
    and the vocabulary rules only while it is (``live``)."""

    enabled: bool

    def live(self, ctx: ProbeContext) -> bool:
        return ctx.on and self.enabled

    def check(self, ctx: ProbeContext) -> None:
        """Raise a one-line :class:`ConfigError` naming ``ctx.key``'s sub-key when a rule
        fails (nothing to check by default)."""


def _lengths(ctx: ProbeContext, lengths: list[float], live: bool) -> None:
    _each(f"{ctx.key}.lengths", lengths, lambda x: _finite(x) and x > 0,
          "each length (a multiple of the training length) must be > 0", required=live)


def _n(ctx: ProbeContext, n: int, live: bool) -> None:
    _check(n >= 1 or not live, f"{ctx.key}.n", n, "must be >= 1 (items per cell)",
           f"or {ctx.key}.enabled=false")


def _holds(ctx: ProbeContext, lengths: list[float], need: int, what: str) -> None:
    """The longest length holds one item, else every cell would be N/A."""
    longest = ctx.longest(lengths)
    _check(longest >= need, f"{ctx.key}.lengths", list(lengths),
           f"the longest length ({longest} tokens at the training length {ctx.train_length}) "
           f"must hold one {what} ({need} tokens); every cell would be N/A")


@dataclass
class NeedleProbeConfig(ProbeKindConfig):
    """Needle-in-a-haystack grid: lengths × depths, ``n`` seeded samples per cell, once per
    distractor count (0 = a single needle: a shortcut task, reported but never quoted alone)."""

    enabled: bool = True
    lengths: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 1.5, 2.0, 4.0])
    depths: list[float] = field(default_factory=lambda: [i / 10 for i in range(11)])
    n_distractors: list[int] = field(default_factory=lambda: [2])
    n: int = 64
    fillers: list[str] = field(default_factory=lambda: ["iid", "phrase", "markov"])

    def check(self, ctx: ProbeContext) -> None:
        k, live = ctx.key, self.live(ctx)
        _lengths(ctx, self.lengths, live)
        _each(f"{k}.depths", self.depths, lambda x: _finite(x) and 0 <= x <= 1,
              "each depth must be in [0, 1]", required=live)
        _each(f"{k}.n_distractors", self.n_distractors, lambda x: x >= 0,
              "each distractor count must be >= 0", required=live)
        _n(ctx, self.n, live)
        if not (live and ctx.space == "token"):
            return
        _check(bool(self.fillers) and set(self.fillers) <= set(FILLERS), f"{k}.fillers",
               list(self.fillers),
               f"token-space needles need one or more of {', '.join(FILLERS)}")
        data = ctx.data
        if data is not None and self.n_distractors:
            most, have = max(self.n_distractors), min(data.n_keys, data.n_values)
            _check(most + 1 <= have, f"{k}.n_distractors", list(self.n_distractors),
                   f"{most} distractors need {most + 1} distinct keys and values; the "
                   f"synthetic vocabulary has data.n_keys={data.n_keys}, "
                   f"data.n_values={data.n_values}", f"use at most {have - 1} distractors")


@dataclass
class LitmProbeConfig(ProbeKindConfig):
    """Lost in the middle: key–value records with the gold record's position swept, the
    query-aware layout, and closed-book (records absent) / oracle (only the gold record)
    baselines."""

    ADDED: ClassVar[dict[str, Any]] = {"lengths": []}  # later options and their defaults
    enabled: bool = True
    n_records: list[int] = field(default_factory=lambda: [8, 16, 32])
    # instead of n_records: as many records as fit in each of these multiples of the training
    # length (sized in the model's own tokens: a text tokenizer's records differ in length)
    lengths: list[float] = field(default_factory=list)
    gold: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])  # × (m-1)
    n: int = 64
    query_aware: bool = True
    baselines: bool = True

    def check(self, ctx: ProbeContext) -> None:
        k, live = ctx.key, self.live(ctx)
        _check(not (self.n_records and self.lengths), f"{k}.lengths", list(self.lengths),
               f"set either {k}.n_records (records per prompt) or {k}.lengths (as many "
               "records as fit each length), not both", f"{k}.n_records=[] to size by length")
        _each(f"{k}.lengths", self.lengths, lambda x: _finite(x) and x > 0,
              "each length (a multiple of the training length) must be > 0", required=False)
        _each(f"{k}.n_records", self.n_records, lambda x: x >= 1,
              "each record count must be >= 1", required=live and not self.lengths)
        _each(f"{k}.gold", self.gold, lambda x: _finite(x) and 0 <= x <= 1,
              "each gold position (a fraction of the records) must be in [0, 1]", required=live)
        _n(ctx, self.n, live)
        data = ctx.data
        if live and ctx.token and self.n_records:
            most, have = max(self.n_records), min(data.n_keys, data.n_values)
            _check(most <= have, f"{k}.n_records", list(self.n_records),
                   f"{most} records need {most} distinct keys and values; the synthetic "
                   f"vocabulary has data.n_keys={data.n_keys}, data.n_values={data.n_values}")


@dataclass
class MultiNeedleProbeConfig(ProbeKindConfig):
    """RULER's needle variants (arXiv 2404.06654) over a filler haystack, every needle at a
    depth drawn per item: ``multikey`` (``keys`` needles with distinct keys, one queried),
    ``multivalue`` (the queried key carries ``values`` values, all must be returned in order of
    appearance; in token space each of the ``keys`` keys carries as many, so a model copying
    every value it sees cannot pass), ``multiquery`` (``keys`` needles, ``queries`` of them
    asked at once, every value returned in the order asked)."""

    enabled: bool = False
    variants: list[str] = field(default_factory=lambda: ["multikey", "multivalue", "multiquery"])
    lengths: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])
    keys: int = 4
    values: int = 4
    queries: int = 2
    n: int = 64

    def check(self, ctx: ProbeContext) -> None:
        k, live = ctx.key, self.live(ctx)
        _each(f"{k}.variants", self.variants, lambda x: x in MULTI_NEEDLE_VARIANTS,
              f"each variant must be one of {', '.join(MULTI_NEEDLE_VARIANTS)}", required=live)
        _lengths(ctx, self.lengths, live)
        _check(self.keys >= 1, f"{k}.keys", self.keys, "must be >= 1 (needles per item)")
        _check(self.values >= 1, f"{k}.values", self.values,
               "must be >= 1 (values of each key, multivalue)")
        _check(1 <= self.queries <= self.keys, f"{k}.queries", self.queries,
               f"must be in [1, keys={self.keys}] (keys asked at once, multiquery)")
        _n(ctx, self.n, live)
        if not (live and ctx.token):
            return
        data = ctx.data
        for variant in self.variants:
            needles = multi_needle_needles(variant, self.keys, self.values)
            _check(self.keys <= data.n_keys and needles <= data.n_values, f"{k}.keys",
                   self.keys, f"{variant} draws {self.keys} distinct keys and {needles} "
                   f"distinct values; the synthetic vocabulary has data.n_keys={data.n_keys}, "
                   f"data.n_values={data.n_values}")
            _holds(ctx, self.lengths, multi_needle_min_length(variant, self.keys, self.values,
                                                              self.queries), f"{variant} item")


@dataclass
class HopsProbeConfig(ProbeKindConfig):
    """Variable tracking (multi-hop): a chain ``x1 = v; x2 = x1; ...`` of ``h`` assignments
    scattered in order through the haystack, with ``distractor_chains`` other chains; the
    question names the chain's last variable, the answer is its root value. Cells: hops ×
    length; every row records the depth of the farthest hop."""

    enabled: bool = False
    hops: list[int] = field(default_factory=lambda: [1, 2, 4])
    lengths: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])
    distractor_chains: int = 1
    n: int = 64

    def check(self, ctx: ProbeContext) -> None:
        k, live = ctx.key, self.live(ctx)
        _each(f"{k}.hops", self.hops, lambda x: x >= 1, "each hop count must be >= 1",
              required=live)
        _lengths(ctx, self.lengths, live)
        _check(self.distractor_chains >= 0, f"{k}.distractor_chains", self.distractor_chains,
               "must be >= 0 (0: the copy line is 1.0)")
        _n(ctx, self.n, live)
        if not (live and ctx.token and self.hops):
            return
        data = ctx.data
        chains, most = self.distractor_chains + 1, max(self.hops)
        _check(chains * most <= data.n_keys and chains <= data.n_values, f"{k}.hops",
               list(self.hops), f"{chains} chains of {most} hops need {chains * most} distinct "
               f"variables (keys) and {chains} values; the synthetic vocabulary has "
               f"data.n_keys={data.n_keys}, data.n_values={data.n_values}")
        _holds(ctx, self.lengths, multihop_min_length(min(self.hops), self.distractor_chains),
               "item")


@dataclass
class AggregationProbeConfig(ProbeKindConfig):
    """Counting: ``candidates`` ids (text: words) scattered through the haystack; the most
    frequent occurs ``margin`` times more often than the runner-up; answer the most frequent.
    Cells: margin × length."""

    enabled: bool = False
    candidates: int = 4
    margins: list[int] = field(default_factory=lambda: [1, 2, 4])
    lengths: list[float] = field(default_factory=lambda: [0.5, 1.0])
    n: int = 64

    def check(self, ctx: ProbeContext) -> None:
        k, live = ctx.key, self.live(ctx)
        _check(self.candidates >= 2, f"{k}.candidates", self.candidates,
               "must be >= 2 (one candidate is the copy shortcut)")
        _each(f"{k}.margins", self.margins, lambda x: x >= 1,
              "each margin (winner count - runner-up count) must be >= 1", required=live)
        _lengths(ctx, self.lengths, live)
        _n(ctx, self.n, live)
        if not (live and ctx.token and self.margins):
            return
        data = ctx.data
        _check(self.candidates <= data.n_values, f"{k}.candidates", self.candidates,
               f"needs {self.candidates} distinct values; the synthetic vocabulary has "
               f"data.n_values={data.n_values}")
        _holds(ctx, self.lengths, counting_min_length(self.candidates, min(self.margins)),
               "item")


def _band(x: Any) -> bool:
    return (isinstance(x, list | tuple) and len(x) == 2 and all(_finite(v) for v in x)
            and 0 <= x[0] <= x[1] <= 1)


@dataclass
class BabilongProbeConfig(ProbeKindConfig):
    """BABILong (Kuratov et al. 2024, arXiv 2406.10149): bAbI stories (data/babi.py) hidden in
    real text (``probes.text.haystack``), every fact inside one depth band of the context;
    scored by forced choice over the task's labels and by greedy generation under BABILong's
    single-label rule. Cells: task × length × depth band. Text space only. Off unless asked
    (``probes=babilong`` or ``probes.babilong.enabled=true``)."""

    # added after the default spec's hash was fixed: hashes only where set away from these
    ADDED: ClassVar[dict[str, Any]] = {
        "enabled": False, "tasks": ["qa1", "qa2", "qa3"], "lengths": [0.5, 1.0, 2.0],
        "depths": [[0.0, 1.0], [0.0, 0.33], [0.33, 0.67], [0.67, 1.0]], "n": 16,
        "prompt": "plain", "export": None, "export_only": False, "facts": None}
    enabled: bool = False
    tasks: list[str] = field(default_factory=lambda: ["qa1", "qa2", "qa3"])
    lengths: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])  # × train_length
    # depth bands [lo, hi] (fractions of the context's tokens): every fact of a story inside
    depths: list[list[float]] = field(default_factory=lambda: [
        [0.0, 1.0], [0.0, 0.33], [0.33, 0.67], [0.67, 1.0]])
    n: int = 16
    # facts per story (qa4: 2); null = a data=babilong run's data.babilong_facts, else usual
    facts: int | None = None
    prompt: str = "plain"  # plain | babilong
    # a folder: also write the items as a dataset (JSON lines + lm-eval task YAMLs)
    export: str | None = None
    export_only: bool = False  # with export: write the dataset, score nothing

    def check(self, ctx: ProbeContext) -> None:
        k, live = ctx.key, self.live(ctx)
        _each(f"{k}.tasks", self.tasks, lambda x: x in BABILONG_TASKS,
              f"each task must be one of {', '.join(BABILONG_TASKS)}", required=live)
        _lengths(ctx, self.lengths, live)
        _each(f"{k}.depths", self.depths, _band,
              "each depth band must be [lo, hi] with 0 <= lo <= hi <= 1", required=live)
        _n(ctx, self.n, live)
        told = [t for t in self.tasks if t != "qa4"]
        need = max((BABILONG_MIN_FACTS.get(t, 1) for t in told), default=1)
        _check(self.facts is None or (isinstance(self.facts, int) and self.facts >= need),
               f"{k}.facts", self.facts, f"must be null (as trained / each task's usual size) "
               f"or >= {need} (the fewest facts a question of {', '.join(told) or 'qa4'} rests on)")
        _check(self.prompt in BABILONG_PROMPTS, f"{k}.prompt", self.prompt,
               f"one of {', '.join(BABILONG_PROMPTS)}")
        _check(self.export is None or bool(str(self.export).strip()), f"{k}.export",
               self.export, "a folder to write the dataset to (or null)")
        _check(not self.export_only or self.export is not None, f"{k}.export_only",
               self.export_only, f"needs {k}.export (the folder to write)")


@dataclass
class PerplexityProbeConfig:
    """Perplexity vs evaluation length (decoders): non-overlapping chunks and a sliding window
    (each window scores only its last ``stride`` fraction of tokens)."""

    ADDED: ClassVar[dict[str, Any]] = {"text": "auto"}  # later options and their defaults
    enabled: bool = True
    lengths: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0, 4.0])
    tokens: int = 4096  # tokens scored per length and mode
    stride: float = 0.5  # sliding window: fraction of the window scored per step
    # text space: what is read, never cycled — auto (the run's validation text where it has
    # one, else shakespeare) | validation | shakespeare | essay | a path to a text file; token
    # space reads held-out text of the training data's Markov chain (auto)
    text: str = "auto"


@dataclass
class TextProbeConfig:
    """Text-space builder (real tokenizers): templates and haystack."""

    # the needles' filler, never repeated (a cell longer than it is N/A): essay (about 580
    # tokens of plain built-in sentences) | shakespeare (the installed plays; the text grid's)
    # | a path to a text file
    haystack: str = "essay"
    needle: str = "The special magic number for {key} is {value}."
    question: str = "What is the special magic number for {key}?"
    answer_prefix: str = "The special magic number for {key} is"
    record: str = '"{key}": "{value}"'  # litm: one key–value record per line
    record_question: str = 'What is the value of key "{key}"?'
    record_answer_prefix: str = 'The value of key "{key}" is "'
    chat_template: bool = False  # wrap question + answer prefix in the tokenizer's chat template
    # greedy generation length for the substring match (never fewer than the gold answer's
    # tokens + 4: a multi-value answer must fit)
    max_new_tokens: int = 16
    margin_candidates: int = 4  # multi-token answers: other in-context values scored per item
    add_bos: bool = True  # prepend the tokenizer's BOS once, at the start


@dataclass
class ProbeSpec:
    """One probe spec, rendered by the token-space builder (synthetic vocabularies) or the
    text-space builder (real tokenizers); scoring and reports are shared. Lengths are
    multiples of ``train_length`` (null = the checkpoint's ``data.seq_len``)."""

    enabled: bool = True
    name: str = "full"
    space: str = "auto"  # auto | token | text
    seed: int = 9999  # disjoint from training seeds: probe pairings are never trained on
    train_length: int | None = None
    # the grid for a real tokenizer (text space): a file of configs/probes/ whose grid replaces
    # this one there, the keys set away from this file's values kept (probes=auto: text)
    text_grid: str | None = None
    threshold: float = 0.8  # effective context length: accuracy >= threshold at every L' <= L
    batch_size: int = 64
    needle: NeedleProbeConfig = field(default_factory=NeedleProbeConfig)
    litm: LitmProbeConfig = field(default_factory=LitmProbeConfig)
    multi_needle: MultiNeedleProbeConfig = field(default_factory=MultiNeedleProbeConfig)
    hops: HopsProbeConfig = field(default_factory=HopsProbeConfig)
    aggregation: AggregationProbeConfig = field(default_factory=AggregationProbeConfig)
    babilong: BabilongProbeConfig = field(default_factory=BabilongProbeConfig)
    perplexity: PerplexityProbeConfig = field(default_factory=PerplexityProbeConfig)
    text: TextProbeConfig = field(default_factory=TextProbeConfig)
    # user probe kinds (register("probe", name)): name -> that kind's settings, read onto its
    # own dataclass (kind_settings); blocklab's kinds are the fields above
    kinds: dict[str, Any] = field(default_factory=dict)


def kind_settings(spec: ProbeSpec, name: str, config: type[K], key: str = "probes") -> K:
    """The settings of probe kind ``name`` in ``spec``: its field of :class:`ProbeSpec` for
    blocklab's kinds, else ``spec.kinds[name]`` read onto the kind's dataclass ``config`` (its
    defaults when the spec does not mention it). A value that is not such settings (an unknown
    key, a wrong type) is one :class:`ConfigError` line naming ``key.kinds.name``."""
    own = getattr(spec, name, None)
    if isinstance(own, config):
        return own
    raw = (spec.kinds or {}).get(name)
    if raw is None or isinstance(raw, config):
        return config() if raw is None else raw
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(config), raw))
    except Exception as e:  # omegaconf's errors span lines: keep the first
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"config error: {key}.kinds.{name}={raw!r}: not the settings of "
                          f"probe kind {name!r} ({config.__name__}): {why}") from None

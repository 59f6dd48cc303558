"""An example probe kind, ``first_value``: a row of distinct values, then ``SEP``; the answer is
the first value of the row (``BOS v1 v2 … vk SEP → v1``). Everything about it is here — its
settings with their rule, its token-space cells — and blocklab's driver, report, plots,
training callback and ``blocklab-compare`` take it like a built-in kind; summary, report
block, heatmap and headline are the defaults of a grid kind (per variant, by length).

Set it under ``probes.kinds.first_value`` (see ``configs/probes/first_value.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from blocklab.config import ProbeContext, ProbeKindConfig, ProbeSpec
from blocklab.config.checks import require
from blocklab.data import synthetic as syn
from blocklab.eval.items import Cell, ProbeItem, fits, lengths_of
from blocklab.eval.kinds import ProbeKind
from blocklab.registry import register


@dataclass
class FirstValueConfig(ProbeKindConfig):
    """Lengths (multiples of the training length) and items per cell."""

    enabled: bool = False
    lengths: list[float] = field(default_factory=lambda: [0.5, 1.0])
    n: int = 8

    def check(self, ctx: ProbeContext) -> None:
        require(all(x > 0 for x in self.lengths), f"{ctx.key}.lengths", list(self.lengths),
                "each length (a multiple of the training length) must be > 0")
        require(self.n >= 1 or not self.live(ctx), f"{ctx.key}.n", self.n,
                "must be >= 1 (items per cell)")


@register("probe", "first_value")
class FirstValue(ProbeKind):
    """Recall the first value of a row (token space only: in text space its one cell is
    N/A)."""

    name = "first_value"
    config = FirstValueConfig
    title = "first value"
    what = "the first value of the row"
    heading = "First value: accuracy by length"

    @classmethod
    def token_cells(cls, spec: ProbeSpec, builder: Any, train_length: int,
                    max_length: int | None) -> list[Cell]:
        p, vocab = cls.settings(spec), builder.vocab
        cells = []
        for length in lengths_of(p.lengths, train_length):
            k = max(1, min(length - 3, vocab.n_values))  # BOS, k values, SEP, the answer
            key = {"probe": cls.name, "variant": "first", "length": length}
            cell = Cell(key, [], fits(length, max_length), copy_any_value=1 / k,
                        chance=1 / vocab.n_values)
            for i in range(p.n if cell.na is None else 0):
                values = syn.example_rng(spec.seed, i, f"probe:first_value:{length}").sample(
                    vocab.values, k)
                cell.items.append(ProbeItem(
                    cell=key, prompt=[syn.BOS, *values, syn.SEP], answer=[values[0]],
                    candidates=[[v] for v in values], gold=0,
                    meta={"n_tokens": k + 3, "distance": k + 1}))
            cells.append(cell)
        return cells

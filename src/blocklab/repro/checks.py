"""Expectations over per-seed measurements, each printed as expected vs observed.

A measurement is a :class:`~blocklab.repro.measure.Tally` per (arm, metric, seed). Checks are
stated over seeds, never over one lucky run: ``AtLeast`` / ``AtMost`` hold for *every* seed;
``Beats`` needs every seed of one arm above every seed of the other *and* the pooled Wilson 95%
intervals apart; ``AtChance`` needs the pooled interval to reach down to the chance line (the
arm is not detectably above chance); ``Close`` bounds the difference of pooled rates.
"""

from __future__ import annotations

from dataclasses import dataclass

from blocklab.eval.aggregate import wilson_interval
from blocklab.repro.measure import Tally

Results = dict[str, dict[str, list[Tally]]]  # arm -> metric -> one tally per seed


def pooled(tallies: list[Tally]) -> Tally:
    return Tally(sum(t.hits for t in tallies), sum(t.trials for t in tallies))


def describe(tallies: list[Tally]) -> str:
    """``0.97 [0.95, 0.98] (seeds 0.96 0.98 0.97)``: pooled rate, its Wilson interval, seeds
    (for plain numbers, ``Scalar``: their mean and the seeds)."""
    if not any(t.trials for t in tallies):
        mean = sum(t.rate for t in tallies) / len(tallies)
        return f"{mean:.3f} (seeds " + " ".join(f"{t.rate:.3f}" for t in tallies) + ")"
    p = pooled(tallies)
    lo, hi = wilson_interval(p.hits, p.trials)
    return (f"{p.rate:.3f} [{lo:.3f}, {hi:.3f}] (seeds "
            + " ".join(f"{t.rate:.3f}" for t in tallies) + ")")


@dataclass(frozen=True)
class Check:
    arm: str
    metric: str

    def tallies(self, results: Results, arm: str | None = None) -> list[Tally]:
        arm = arm or self.arm
        try:
            return results[arm][self.metric]
        except KeyError:
            raise KeyError(f"no measurement {self.metric!r} of arm {arm!r}") from None

    def expected(self) -> str:
        raise NotImplementedError

    def evaluate(self, results: Results) -> tuple[str, bool]:
        """(observed, passed)."""
        raise NotImplementedError


@dataclass(frozen=True)
class AtLeast(Check):
    threshold: float = 0.0

    def expected(self) -> str:
        return f"{self.arm}: {self.metric} >= {self.threshold:g} on every seed"

    def evaluate(self, results: Results) -> tuple[str, bool]:
        ts = self.tallies(results)
        return describe(ts), all(t.rate >= self.threshold for t in ts)


@dataclass(frozen=True)
class AtMost(Check):
    threshold: float = 1.0

    def expected(self) -> str:
        return f"{self.arm}: {self.metric} <= {self.threshold:g} on every seed"

    def evaluate(self, results: Results) -> tuple[str, bool]:
        ts = self.tallies(results)
        return describe(ts), all(t.rate <= self.threshold for t in ts)


@dataclass(frozen=True)
class Beats(Check):
    other: str = ""

    def expected(self) -> str:
        return (f"{self.metric}: {self.arm} > {self.other} (every seed, and the pooled 95% "
                f"intervals apart)")

    def evaluate(self, results: Results) -> tuple[str, bool]:
        a, b = self.tallies(results), self.tallies(results, self.other)
        pa, pb = pooled(a), pooled(b)
        lo_a, _ = wilson_interval(pa.hits, pa.trials)
        _, hi_b = wilson_interval(pb.hits, pb.trials)
        ok = min(t.rate for t in a) > max(t.rate for t in b) and lo_a > hi_b
        return f"{self.arm} {describe(a)} vs {self.other} {describe(b)}", ok


@dataclass(frozen=True)
class LowerBy(Check):
    """A loss-like metric: the arm's at most the other arm's minus ``margin``, seed by seed."""

    other: str = ""
    margin: float = 0.0

    def expected(self) -> str:
        return f"{self.metric}: {self.arm} <= {self.other} - {self.margin:g} on every seed"

    def evaluate(self, results: Results) -> tuple[str, bool]:
        a, b = self.tallies(results), self.tallies(results, self.other)
        ok = len(a) == len(b) > 0 and all(x.rate <= y.rate - self.margin
                                          for x, y in zip(a, b, strict=True))
        return f"{self.arm} {describe(a)} vs {self.other} {describe(b)}", ok


@dataclass(frozen=True)
class AtChance(Check):
    chance: float = 0.0

    def expected(self) -> str:
        return (f"{self.arm}: {self.metric} at chance ({self.chance:.3f}): the pooled 95% "
                f"interval reaches it")

    def evaluate(self, results: Results) -> tuple[str, bool]:
        ts = self.tallies(results)
        p = pooled(ts)
        lo, _ = wilson_interval(p.hits, p.trials)
        return describe(ts), lo <= self.chance


@dataclass(frozen=True)
class Close(Check):
    other: str = ""
    tolerance: float = 0.05

    def expected(self) -> str:
        return f"{self.metric}: |{self.arm} - {self.other}| <= {self.tolerance:g} (pooled)"

    def evaluate(self, results: Results) -> tuple[str, bool]:
        a, b = pooled(self.tallies(results)), pooled(self.tallies(results, self.other))
        diff = abs(a.rate - b.rate)
        return f"{a.rate:.3f} vs {b.rate:.3f} (difference {diff:.3f})", diff <= self.tolerance

"""The stability experiment's quantities over a learning-rate grid (one arm per rate, named
``<arm> lr <rate>``), its checks and its figure (:mod:`blocklab.repro.experiments.stability`).

Learning-rate sensitivity is Wortsman et al. 2023's (arXiv 2309.14322):
``mean over the rates of min(loss(rate), initial loss) - min over the rates of the same``, the
best being the arm's own; a diverged run reads as its initial loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blocklab.repro import checks as ck
from blocklab.repro.protocol import Arm, swap

LOSS, LOGIT, LOGZ = "val loss", "max attention logit", "max |log Z|"
DEPTH_PREFIX = "depth "


def arm_name(arm: str, lr: float) -> str:
    return f"{arm} lr {lr:g}"


def split_name(name: str) -> tuple[str, float] | None:
    """``("qk-norm", 0.01)`` for ``"qk-norm lr 0.01"``; None for an arm of no grid."""
    arm, sep, lr = name.rpartition(" lr ")
    return (arm, float(lr)) if sep and not name.startswith(DEPTH_PREFIX) else None


def capped(loss: float, initial: float) -> float:
    """The paper's reading of a run's final loss: above the initial loss (or not finite), it
    reads as the initial loss (a diverged run)."""
    return initial if not math.isfinite(loss) else min(loss, initial)


def sensitivity(losses: list[float]) -> float:
    """Mean over the grid of each (capped) loss minus the best of them."""
    best = min(losses)
    return sum(x - best for x in losses) / len(losses)


def _f(x: float) -> str:
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.0f}"


@dataclass(frozen=True)
class Grid(ck.Check):
    """A check over the runs of arm ``group`` at ``lrs`` (``arm``: its first rate's run, the
    name the runner looks for); ``other_group``: a second arm's runs where it compares two."""

    group: str = ""
    lrs: tuple[float, ...] = ()
    other: str = ""
    other_group: str = ""

    def values(self, results: ck.Results, metric: str, group: str = "") -> list[list[float]]:
        """Per seed, the metric at each rate, in grid order."""
        per_lr = [[t.rate for t in self.tallies_of(results, arm_name(group or self.group, lr),
                                                   metric)] for lr in self.lrs]
        return [list(seed) for seed in zip(*per_lr, strict=True)]

    def evaluate(self, results: ck.Results) -> tuple[str, bool]:
        """(observed, passed); a grid with a rate left out (``--only``) is not measured."""
        groups = {self.group, self.other_group} - {""}
        if any(arm_name(g, lr) not in results for g in groups for lr in self.lrs):
            return "not measured (--only)", False
        return self.observe(results)

    def observe(self, results: ck.Results) -> tuple[str, bool]:
        raise NotImplementedError

    @staticmethod
    def tallies_of(results: ck.Results, arm: str, metric: str):
        try:
            return results[arm][metric]
        except KeyError:
            raise KeyError(f"no measurement {metric!r} of arm {arm!r}") from None


def _grid(cls, group: str, lrs: tuple[float, ...], metric: str, other: str = "", **kw):
    # ``other``: the run the runner also needs measured (the arm's own when it compares none)
    return cls(arm=arm_name(group, lrs[0]), metric=metric, group=group, lrs=lrs,
               other=arm_name(other or group, lrs[0]), other_group=other, **kw)


@dataclass(frozen=True)
class LogitGrowthCheck(Grid):
    factor: float = 3.0

    def expected(self) -> str:
        return (f"{self.group}: the largest attention logit at the two highest rates >= "
                f"{self.factor:g}x that at the lowest rate ({self.lrs[0]:g})")

    def observe(self, results: ck.Results) -> tuple[str, bool]:
        seeds = self.values(results, LOGIT)
        ratios = [max(v[-2:]) / v[0] for v in seeds]
        observed = "; ".join(", ".join(f"{lr:g}: {_f(x)}" for lr, x in zip(self.lrs, v))
                             + f" ({r:.1f}x)" for v, r in zip(seeds, ratios))
        return observed, all(r >= self.factor for r in ratios)


@dataclass(frozen=True)
class DegradesCheck(Grid):
    margin: float = 0.1

    def expected(self) -> str:
        return (f"{self.group}: the loss at the highest rate ({self.lrs[-1]:g}) >= the arm's "
                f"best + {self.margin:g}")

    def observe(self, results: ck.Results) -> tuple[str, bool]:
        seeds = self.values(results, LOSS)
        observed = "; ".join(f"{_f(v[-1])} vs best {_f(min(v))} (lr {self.lrs[v.index(min(v))]:g})"
                             for v in seeds)
        return observed, all(v[-1] >= min(v) + self.margin for v in seeds)


@dataclass(frozen=True)
class SensitivityCheck(Grid):
    ratio: float = 0.7
    slack: float = 0.05

    def expected(self) -> str:
        return (f"{self.group}: learning-rate sensitivity <= {self.ratio:g}x {self.other_group}'s,"
                f" and its best loss <= {self.other_group}'s best + {self.slack:g}")

    def observe(self, results: ck.Results) -> tuple[str, bool]:
        a, b = self.values(results, LOSS), self.values(results, LOSS, self.other_group)
        rows, ok = [], True
        for x, y in zip(a, b, strict=True):
            sa, sb = sensitivity(x), sensitivity(y)
            rows.append(f"sensitivity {_f(sa)} vs {_f(sb)} ({sa / sb if sb else math.inf:.2f}x); "
                        f"best {_f(min(x))} vs {_f(min(y))}")
            ok &= sa <= self.ratio * sb and min(x) <= min(y) + self.slack
        return "; ".join(rows), ok


@dataclass(frozen=True)
class ReportedCheck(Grid):
    """Measured and shown, not decided (passes): the effect may not exist at this scale."""

    def expected(self) -> str:
        return (f"{self.group} (reported, not decided): learning-rate sensitivity and largest "
                f"|log Z| against {self.other_group}'s (the paper: both lower)")

    def observe(self, results: ck.Results) -> tuple[str, bool]:
        a, b = self.values(results, LOSS), self.values(results, LOSS, self.other_group)
        za = self.values(results, LOGZ)
        zb = self.values(results, LOGZ, self.other_group)
        rows = [f"sensitivity {_f(sensitivity(x))} vs {_f(sensitivity(y))}; best {_f(min(x))} "
                f"vs {_f(min(y))}; max |log Z| over the grid {_f(max(p))} vs {_f(max(q))}"
                for x, y, p, q in zip(a, b, za, zb, strict=True)]
        return "; ".join(rows), True


@dataclass(frozen=True)
class BoundedCheck(Grid):
    factor: float = 3.0

    def expected(self) -> str:
        return (f"{self.group}: the largest attention logit at the highest rate "
                f"({self.lrs[-1]:g}) <= {self.other_group}'s / {self.factor:g}")

    def observe(self, results: ck.Results) -> tuple[str, bool]:
        a, b = self.values(results, LOGIT), self.values(results, LOGIT, self.other_group)
        return ("; ".join(f"{_f(x[-1])} vs {_f(y[-1])}" for x, y in zip(a, b)),
                all(x[-1] * self.factor <= y[-1] for x, y in zip(a, b, strict=True)))


def LogitGrowth(group, lrs, factor):
    return _grid(LogitGrowthCheck, group, lrs, LOGIT, factor=factor)


def Degrades(group, lrs, margin):
    return _grid(DegradesCheck, group, lrs, LOSS, margin=margin)


def Sensitivity(group, lrs, *, other, ratio, slack):
    return _grid(SensitivityCheck, group, lrs, LOSS, other, ratio=ratio, slack=slack)


def Reported(group, lrs, *, other):
    return _grid(ReportedCheck, group, lrs, LOSS, other)


def Bounded(group, lrs, *, other, factor):
    return _grid(BoundedCheck, group, lrs, LOGIT, other, factor=factor)


@dataclass(frozen=True)
class ClosesCheck(ck.Check):
    """``arm`` ends above ``other``; one of ``fixes`` ends at most ``arm - share x gap``."""

    other: str = ""
    fixes: tuple[str, ...] = ()
    share: float = 0.5

    def expected(self) -> str:
        return (f"{' or '.join(self.fixes)} closes >= {self.share:g} of the gap between "
                f"{self.arm} and {self.other} ({self.metric})")

    def evaluate(self, results: ck.Results) -> tuple[str, bool]:
        if not all(f in results for f in self.fixes):
            return "not measured (--only)", False
        bad, good = self.tallies(results), self.tallies(results, self.other)
        rows, ok = [], True
        for i, (x, y) in enumerate(zip(bad, good, strict=True)):
            gap = x.rate - y.rate
            fixed = {f: results[f][self.metric][i].rate for f in self.fixes}
            closed = {f: (x.rate - v) / gap if gap > 0 else math.nan for f, v in fixed.items()}
            rows.append(f"gap {_f(gap)}; " + ", ".join(f"{f} {_f(fixed[f])} (closes "
                                                        f"{closed[f]:.2f})" for f in self.fixes))
            ok &= gap > 0 and max(closed.values()) >= self.share
        return "; ".join(rows), ok


def Gap(arm: str, other: str, margin: float) -> ck.Check:
    """``arm``'s loss >= ``other``'s + ``margin`` on every seed."""
    return ck.LowerBy(other, LOSS, other=arm, margin=margin)


def Closes(arm: str, other: str, fixes: tuple[str, ...], share: float) -> ck.Check:
    return ClosesCheck(arm, LOSS, other=other, fixes=fixes, share=share)


def depth_break(arms: tuple[Arm, ...]) -> tuple[Arm, ...]:
    """The depth study's fixes (post-norm with warmup, DeepNorm) train exactly like post-norm
    without warmup."""
    donor = next((a.name for a in arms if a.name.endswith("post-norm no warmup")), None)
    if donor is None:
        return arms
    for a in arms:
        if a.name.endswith(("post-norm warmup", "deepnorm")):
            arms = swap(arms, a.name, donor)
    return arms


def figure(outcome: Any, out: Path) -> dict[str, str]:
    """``stability.png``: final loss against the rate per arm (log x; the initial loss dashed),
    the largest attention logit against the rate (log-log), the depth study's final losses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid: dict[str, list[tuple[float, float, float, float]]] = {}
    depth: dict[str, float] = {}
    initial = []
    for name, metrics in outcome.measurements.items():
        mean = {m: sum(t["rate"] for t in ts) / len(ts) for m, ts in metrics.items()}
        parsed = split_name(name)
        if parsed is None:
            depth[name.removeprefix(DEPTH_PREFIX)] = mean[LOSS]
            continue
        grid.setdefault(parsed[0], []).append((parsed[1], mean[LOSS], mean[LOGIT], mean[LOGZ]))
        initial.append(mean["initial loss"])
    if not grid and not depth:
        return {}
    panels = 3 if depth else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.4 * panels, 3.6))
    for arm, points in grid.items():
        points.sort()
        lrs = [p[0] for p in points]
        axes[0].plot(lrs, [p[1] for p in points], marker="o", label=arm)
        axes[1].plot(lrs, [p[2] for p in points], marker="o", label=arm)
    if initial:
        axes[0].axhline(sum(initial) / len(initial), ls="--", color="grey", lw=0.8,
                        label="initial loss")
    for ax, label in zip(axes[:2], ("final validation loss (nats / char)",
                                    "largest attention logit (end)")):
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")
    if depth:
        names = list(depth)
        axes[2].bar(range(len(names)), [depth[n] for n in names], color="tab:grey")
        axes[2].set_xticks(range(len(names)), [n.replace(" ", "\n", 2) for n in names],
                           fontsize=7)
        axes[2].set_ylabel("final validation loss")
        lo = min(depth.values())
        axes[2].set_ylim(max(0.0, lo - 0.3), max(depth.values()) + 0.1)
    fig.tight_layout()
    path = out / "stability.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {"figure": str(path)}

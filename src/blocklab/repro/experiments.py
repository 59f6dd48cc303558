"""The reference experiments: protocol (arms, seeds, sizes), measurement and expectations.

Each experiment states the published result it checks and how blocklab's protocol differs from
the paper's (CPU-sized); ``quick`` is the subset CI runs, ``full`` the documented one. Arms are
``blocklab-train`` overrides on top of ``base``; a *break* rewrites the arms so that the
expected result must be missed (the proof that the check can fail).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from blocklab.repro import checks as ck
from blocklab.repro import measure as ms

SIZES = ("quick", "full")


@dataclass(frozen=True)
class Arm:
    """One measured configuration: a display name, its ``blocklab-train`` overrides, and
    ``eval_model``: ``key=value`` overrides of the *model* config applied to the trained weights
    when measuring (e.g. ``mixer.window=16``: the same weights under a local window). Runs
    are keyed by ``overrides`` alone, so arms that differ only in ``eval_model`` share them."""

    name: str
    overrides: tuple[str, ...]
    eval_model: tuple[str, ...] = ()
    sweep: Sweep | None = None  # a learning-rate sweep: one run per rate, the best measured


@dataclass(frozen=True)
class Sweep:
    """Train an arm once per learning rate (``optim.lr``, tried in the order given) and measure,
    per seed, the run whose last logged ``select`` is best (``mode``): the training run's own
    validation stream, never the held-out examples the experiment reports on. ``enough``:
    rates after the first whose value is beyond it are not trained (a value past the early
    stopping threshold cannot be beaten by much; Zoology trains every rate)."""

    lrs: tuple[float, ...]
    select: str = "val/accuracy"
    mode: str = "max"
    enough: float | None = None

    def better(self, a: float | None, b: float | None) -> bool:
        """Whether value ``a`` beats ``b`` (None: no value; ties keep the earlier rate)."""
        if a is None:
            return False
        return b is None or (a > b if self.mode == "max" else a < b)

    def suffices(self, value: float | None) -> bool:
        if self.enough is None or value is None:
            return False
        return value > self.enough if self.mode == "max" else value < self.enough


@dataclass(frozen=True)
class Protocol:
    """What one size of an experiment trains and measures."""

    arms: tuple[Arm, ...]
    checks: tuple[ck.Check, ...]
    seeds: int = 1  # default number of seeds (``--seeds`` overrides)


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    reference: str  # the published result, with its citation
    protocol: str  # how blocklab's protocol follows / differs from the paper's
    sizes: dict[str, Protocol]
    # (run directory, arm) -> {metric: tally}
    measure: Callable[[Path, Arm], dict[str, ms.Tally]]
    # name -> (what it breaks, arms -> broken arms)
    breaks: dict[str, tuple[str, Callable[[tuple[Arm, ...]], tuple[Arm, ...]]]] = field(
        default_factory=dict)
    # breaks that train runs of their own (a defect of training itself, not arms swapped)
    training_breaks: frozenset[str] = frozenset()
    # (experiment, outcome, output directory) -> {name: path} of figures written beside the table
    figure: Callable[[Experiment, Any, Path], dict[str, str]] | None = None


def _swap(arms: tuple[Arm, ...], victim: str, donor: str) -> tuple[Arm, ...]:
    """Arm ``victim`` keeps its name but trains exactly like ``donor`` (a broken variant whose
    runs are the donor's: no extra training)."""
    by_name = {a.name: a for a in arms}
    return tuple(replace(a, overrides=by_name[donor].overrides) if a.name == victim else a
                 for a in arms)


def _swap_all(arms: tuple[Arm, ...], victim_word: str, donor_word: str) -> tuple[Arm, ...]:
    """:func:`_swap` for every arm whose name contains ``victim_word`` (its donor: the same
    name with ``donor_word``)."""
    for a in arms:
        if victim_word in a.name:
            arms = _swap(arms, a.name, a.name.replace(victim_word, donor_word))
    return arms


# ------------------------------------------------------------------------ associative recall

# Zoology (arXiv 2312.04927), MQAR: (sequence length, key-value pairs) that fit 2 cores. 64/4 is
# learned by step ~700; 128/8 was not within 4,000 steps here (2-layer 0.35-0.38, on the
# elimination line 0.34, with one or two curriculum stages, 2 or 4 heads, and pair counts drawn
# from 2..8), so the paper's longer settings are not in the protocol (docs/reproductions.md).
MQAR_SETTINGS = {"quick": ((64, 4),), "full": ((64, 4),)}
# When recall appears varied by seed with 2 heads (seed 2: on the elimination line through
# 3,000 steps at lr 1e-3, 3e-3 and 3e-4, although seed 2's initialisation with seed 0's data
# learned by step 600); with 4 heads every seed passed 0.99 by step 600-800 at lr 1e-3. quick
# runs seed 0 up to 1,200 steps; full 3 seeds up to 3,000 at each rate of the sweep.
MQAR_STEPS = {"quick": 1200, "full": 3000}
MQAR_SWEEP = {"quick": Sweep((1e-3,), enough=0.99),
              "full": Sweep((1e-3, 3e-3, 3e-4), enough=0.99)}
# Zoology stops at validation accuracy > 0.99; validation here is MQAR alone (copying, in the
# training mix, would count otherwise) at the full length (data.val_len, set per arm: where the
# held-out measurement is), every 100 steps; patience never ends a run by itself.
EARLY_STOP = ("data.val_tasks=[mqar]", "trainer.val_every_steps=100", "callbacks=early_stopping",
              "callbacks.early_stopping.monitor=val/accuracy", "callbacks.early_stopping.mode=max",
              "callbacks.early_stopping.patience=1000000",
              "callbacks.early_stopping.stopping_threshold=0.99")


def elimination_line(pairs: int) -> float:
    """What recall *without* matching keys scores on MQAR: every key is queried once and each
    answer stays in context, so guessing among the values not answered yet is right with
    probability 1/n, 1/(n-1), ..., 1 — on average H_n / n (0.52 at 4 pairs, 0.21 at 16)."""
    return sum(1 / k for k in range(1, pairs + 1)) / pairs


ONE_LAYER_SLACK = 0.05  # the 1-layer control may reach the elimination line, not beyond


def _mqar_arm(layers: int, length: int, pairs: int, size: str) -> Arm:
    start = max(32, 5 * pairs + 1)  # curriculum: records queried right away first, then spread
    return Arm(f"{layers}-layer {length}/{pairs}", (
        f"model.n_layers={layers}", f"data.seq_len={length}", f"model.max_seq_len={length}",
        f"data.mqar_pairs={pairs}", f"data.min_len={5 * pairs + 1}",
        f"data.curriculum=[[0,{start}],[500,{length}]]", f"trainer.max_steps={MQAR_STEPS[size]}",
        *EARLY_STOP, f"data.val_len={length}"), sweep=MQAR_SWEEP[size])


# 16 keys, 16 values, 16 filler ids: measured here, 2-layer recall at 64/4 goes 0.15 -> 0.87 ->
# 1.0 between steps 250, 500 and 1000; with 64 keys and values it stayed below 0.45 after 3,000
# steps (each key is seen 4x less often).
SMALL_VOCAB = ("data.n_keys=16", "data.n_values=16", "data.n_filler=16")
MQAR_BASE = (
    "model/position=rope", "model.d_model=64", "model.n_heads=4", "model.d_ff=128",
    *SMALL_VOCAB, "data.tasks.needle=0", "data.tasks.copy=0.5", "data.tasks.mqar=1",
    "data.batch_size=64", "optim.weight_decay=0.1", "schedule.warmup_steps=100",
)


def _mqar_protocol(size: str) -> Protocol:
    arms, checks = [], []
    for length, pairs in MQAR_SETTINGS[size]:
        two, one = (_mqar_arm(n, length, pairs, size) for n in (2, 1))
        arms += [two, one]
        checks += [ck.AtLeast(two.name, "accuracy", 0.95),
                   ck.AtMost(one.name, "accuracy", round(elimination_line(pairs)
                                                         + ONE_LAYER_SLACK, 3))]
    return Protocol(tuple(replace(a, overrides=MQAR_BASE + a.overrides) for a in arms),
                    tuple(checks), seeds=1 if size == "quick" else 3)


def cell_of(name: str) -> tuple[int, int]:
    """(length, pairs) of an arm named ``... <length>/<pairs>``."""
    length, pairs = name.split()[-1].split("/")
    return int(length), int(pairs)


def _mqar_measure(run: Path, arm: Arm) -> dict[str, ms.Tally]:
    t = ms.load(run, arm.eval_model)
    length, pairs = cell_of(arm.name)
    return {"accuracy": ms.accuracy(t.model, ms.mqar_examples(t.vocab, n=256, length=length,
                                                                pairs=pairs))}


MQAR = Experiment(
    name="mqar",
    title="Associative recall needs two attention layers (Zoology MQAR)",
    reference=("Arora et al. 2023, 'Zoology' (arXiv 2312.04927): 2-layer attention models solve "
               "multi-query associative recall (accuracy ~0.97-0.99 at every width and length "
               "shown); one-layer Transformers stay near chance (Bietti et al. 2023, 'Birth of a "
               "Transformer', arXiv 2306.00802): an induction circuit needs two layers."),
    protocol=("Zoology's MQAR layout (n key-value pairs, then the n keys queried in random "
              "order at random places among filler), (length, pairs) = (64, 4) (128/8 and "
              "256/16 were not learned within the CPU budget tried: docs/reproductions.md); "
              "held-out accuracy = argmax at the query positions over 256 sequences "
              "(probe seed). Differences, to fit 2 CPU cores: a synthetic vocabulary of 16 keys / "
              "16 values / 16 filler ids (the paper: 8,192 tokens), a SEP marker before each "
              "query, d_model 64 with 4 heads and an MLP, rotary positions (the paper: "
              "learned), copying sequences in the mix (weight 0.5: they bootstrap the "
              "induction circuit; without them 2 of 3 seeds stayed on the elimination line "
              "for 2,000 steps), AdamW wd 0.1 cosine, batch 64, a short-to-long curriculum (full "
              "length from step 500). Zoology's selection: per seed the best learning rate "
              "(full: 1e-3, 3e-3, 3e-4; quick: 1e-3) by the run's own validation accuracy on "
              "MQAR alone (never the held-out sequences reported), each run stopped at "
              "validation accuracy > 0.99 (the paper's rule) or after 1,200 (quick: seed 0) / "
              "3,000 (full: 3 seeds) steps; a rate is tried only when every rate before it "
              "stayed at or below 0.99. Control: the same model with one "
              "layer, expected at most 0.05 above the elimination line H_n/n (guessing among "
              "the values not answered yet: the answers stay in context here, unlike in "
              "Zoology's inputs; chance is 1/16)."),
    sizes={s: _mqar_protocol(s) for s in SIZES},
    measure=_mqar_measure,
    breaks={"one-layer": ("the 2-layer rows train a 1-layer model",
                          lambda arms: _swap_all(arms, "2-layer", "1-layer"))},
)


# ---------------------------------------------------------------------- position extrapolation

EXTRAP_SCHEMES = ("alibi", "sinusoidal", "learned")
EXTRAP = {  # size -> (training length, steps, d_model, needles per length)
    "quick": (32, 400, 64, 0),
    "full": (64, 3000, 128, 160),
}
ALIBI_PPL_RATIO_MAX = 1.1  # ALiBi: perplexity at 4L within 10% of that at L
SINUSOIDAL_PPL_RATIO_MIN = 2.0  # sinusoidal: at least doubled


def _extrap_protocol(size: str) -> Protocol:
    length, steps, d_model, _ = EXTRAP[size]
    if size == "quick":  # the language slice alone: perplexity beyond L, learned in seconds
        data = (*SMALL_VOCAB, "data.tasks.needle=0", "data.tasks.copy=0", "data.tasks.mqar=0",
                "data.tasks.markov_lm=1", f"data.min_len={length}", "data.curriculum=[]")
    else:  # docs/position_extrapolation.md's study
        short = length // 2
        data = ("data.tasks.needle=1", "data.tasks.copy=1", "data.tasks.mqar=1",
                "data.tasks.markov_lm=0.5", f"data.min_len={short}",
                f"data.curriculum=[[0,{short}],[{steps // 10},{length}]]")
    base = (*data, f"data.seq_len={length}", f"model.max_seq_len={8 * length}",
            f"model.d_model={d_model}", f"trainer.max_steps={steps}")
    arms = tuple(Arm(s, (f"model/position={s}", *base)) for s in EXTRAP_SCHEMES)
    ratio = "ppl 4L / ppl L"
    checks: tuple[ck.Check, ...] = (
        ck.AtMost("alibi", ratio, ALIBI_PPL_RATIO_MAX),
        ck.AtLeast("sinusoidal", ratio, SINUSOIDAL_PPL_RATIO_MIN))
    if size == "full":
        checks += (ck.Beats("alibi", "needle beyond L", other="sinusoidal"),
                   ck.Beats("alibi", "needle beyond L", other="learned"))
    return Protocol(arms, checks, seeds=1 if size == "quick" else 3)


def _extrap_measure_for(size: str) -> Callable[[Path, Arm], dict[str, ms.Tally]]:
    length, _, _, n = EXTRAP[size]

    def measure(run: Path, arm: Arm) -> dict[str, ms.Tally]:
        t = ms.load(run, arm.eval_model)
        model, vocab = t.model, t.vocab
        ppl = {k: ms.markov_perplexity(model, vocab, t.data_seed, length=k * length)
               for k in (1, 2, 4)}
        out: dict[str, ms.Tally] = {f"ppl {k}L": ms.Scalar(v) for k, v in ppl.items()}
        out["ppl 4L / ppl L"] = ms.Scalar(ppl[4] / ppl[1])
        if n:
            for k in (1, 2, 4):
                out[f"needle {k}L"] = ms.accuracy(model, ms.needle_examples(
                    vocab, n=n, length=k * length, n_distractors=2))
            out["needle beyond L"] = ck.pooled([out["needle 2L"], out["needle 4L"]])
        return out

    return measure


def _extrap_experiment(size_for_measure: str) -> Experiment:
    return Experiment(
        name="extrapolation",
        title="ALiBi extrapolates beyond the training length; sinusoidal positions do not",
        reference=("Press et al. 2022, 'Train Short, Test Long' (arXiv 2108.12409): trained at L, "
                   "ALiBi's perplexity stays flat beyond L and ALiBi holds longest; sinusoidal "
                   "positions fail right past L."),
        protocol=("Decoders that differ only in model/position (alibi, sinusoidal, learned), "
                  "max_seq_len 8L so every scheme indexes every length. Measured: perplexity on "
                  "held-out text of the training Markov chain in non-overlapping windows of L, "
                  "2L, 4L tokens (4,096 scored tokens each). Expected: ALiBi's perplexity at 4L "
                  f"within {ALIBI_PPL_RATIO_MAX:g}x of that at L, sinusoidal's at least "
                  f"{SINUSOIDAL_PPL_RATIO_MIN:g}x, on every seed (learned is reported: its rows "
                  "beyond L stay at their small initial values and barely move the model). "
                  "quick: the language slice alone, L = 32, d_model 64, 400 steps, 16-id "
                  "vocabulary. full: docs/position_extrapolation.md's study (L = 64, d_model "
                  "128, 3,000 steps on needles with 1-3 distractors, copying, MQAR and the "
                  "language slice), 3 seeds, plus needles with 2 distractors at 1L / 2L / 4L "
                  "(depth uniform): ALiBi above sinusoidal and above learned beyond L (2L and "
                  "4L pooled), every seed, pooled 95% intervals apart."),
        sizes={s: _extrap_protocol(s) for s in SIZES},
        measure=_extrap_measure_for(size_for_measure),
        breaks={"alibi-as-sinusoidal": ("the ALiBi row trains sinusoidal positions",
                                        lambda arms: _swap(arms, "alibi", "sinusoidal"))},
    )


# --------------------------------------------------------------- local attention receptive field

RF_WINDOW, RF_LAYERS, RF_PAIRS = 16, 2, 4
RF_FIELD = RF_LAYERS * (RF_WINDOW - 1)  # tokens back an all-local stack can see: 30
RF_N = {"quick": 64, "full": 128}
# gaps of filler between the records and the query (answer distance = gap + 3)
RF_NEAR_GAPS = tuple(range(RF_WINDOW - 3))  # distance 3 .. window - 1: inside one layer's window
RF_FAR_GAPS = tuple(range(RF_FIELD + 1, RF_FIELD + 9))  # every record beyond the receptive field


def _rf_protocol(size: str) -> Protocol:
    # 'global' is exactly MQAR's 2-layer 64/4 arm (the same runs serve both experiments);
    # 'local' is those weights measured with the window on every layer; 'local, trained' (full
    # only, no expectation) trains with the window.
    global_ = replace(_mqar_arm(RF_LAYERS, 64, RF_PAIRS, size), name="global")
    global_ = replace(global_, overrides=MQAR_BASE + global_.overrides)
    window = f"mixer.window={RF_WINDOW}"
    local = replace(global_, name="local", eval_model=(window,))
    arms = [local, global_]
    if size == "full":
        arms.append(replace(global_, name="local, trained",  # one rate: no expectation
                            overrides=(*global_.overrides, f"model.{window}"),
                            sweep=MQAR_SWEEP["quick"]))
    checks = (ck.AtLeast("local", "near", 0.9),
              ck.Close("local", "near", other="global", tolerance=0.05),
              ck.AtChance("local", "far", chance=1 / 16),
              ck.AtLeast("global", "far", 0.5))
    return Protocol(tuple(arms), checks, seeds=1 if size == "quick" else 3)


def _rf_measure_for(size: str) -> Callable[[Path, Arm], dict[str, ms.Tally]]:
    n = RF_N[size]

    def measure(run: Path, arm: Arm) -> dict[str, ms.Tally]:
        t = ms.load(run, arm.eval_model)
        model, vocab = t.model, t.vocab
        out = {}
        for name, gaps in (("near", RF_NEAR_GAPS), ("far", RF_FAR_GAPS),
                           ("between", tuple(range(RF_WINDOW - 3, RF_FIELD - 1)))):
            tally = ms.Tally()
            for gap in gaps:
                tally.add_tally(ms.accuracy(model, ms.recall_at_gap(vocab, n=n, pairs=RF_PAIRS,
                                                                    gap=gap)))
            out[name] = tally
        return out

    return measure


def _rf_experiment(size_for_measure: str) -> Experiment:
    return Experiment(
        name="receptive_field",
        title="Local attention cannot retrieve beyond its receptive field",
        reference=("Sliding-window attention (Longformer, arXiv 2004.05150; Mistral 7B, arXiv "
                   "2310.06825): an all-local causal stack of n layers with a window of w keys "
                   "sees n (w - 1) tokens back; information farther away cannot reach the "
                   "query, so retrieval there is at chance, and within one window the local "
                   "model retrieves as well as a global one."),
        protocol=(f"The mqar experiment's 2-layer rotary decoder (MQAR with "
                  f"{RF_PAIRS} pairs, 64 tokens) measured as trained ('global') and with "
                  f"model.mixer.window={RF_WINDOW} on every layer ('local', the same "
                  f"weights; receptive field {RF_FIELD}), on held-out 'BOS k1 v1 ... "
                  f"k{RF_PAIRS} v{RF_PAIRS} filler x gap SEP k{RF_PAIRS} -> v{RF_PAIRS}' "
                  f"sequences: near = the answer within one window of its value (distance "
                  f"3..{RF_WINDOW - 1}), far = every record beyond the receptive field (gap "
                  f"{RF_FAR_GAPS[0]}..{RF_FAR_GAPS[-1]}); 'between' is reported without an "
                  f"expectation (a 2-layer recall circuit reads the value one window back). "
                  f"Expected: local near >= 0.9 and within 0.05 of global (unchanged inside "
                  f"the field); local far at chance (1/16); global far >= 0.5 (the far items are "
                  f"solvable: the chance line is the window's doing). full also trains the "
                  f"model with the window ('local, trained', reported without an expectation: "
                  f"most MQAR queries lie outside a 16-token window; in 3,000 steps here it "
                  f"learned recall inside the window on one seed of three)."),
        sizes={s: _rf_protocol(s) for s in SIZES},
        measure=_rf_measure_for(size_for_measure),
        breaks={"window-ignored": ("the local row is measured without its window",
                                   lambda arms: tuple(replace(a, eval_model=())
                                                      if a.name == "local" else a
                                                      for a in arms))},
    )


def experiment(name: str, size: str) -> Experiment:
    """The experiment ``name`` with its measurement sized for ``size``."""
    if name == "shakespeare_char":  # its own module (it imports this one)
        from blocklab.repro.shakespeare import shakespeare_experiment

        return shakespeare_experiment(size)
    if name == "recall_state":
        from blocklab.repro.recall import RECALL_STATE

        return RECALL_STATE
    makers = {"mqar": lambda s: MQAR, "extrapolation": _extrap_experiment,
              "receptive_field": _rf_experiment}
    if name not in makers:
        raise KeyError(name)
    return makers[name](size)


NAMES = ("mqar", "extrapolation", "receptive_field", "shakespeare_char", "recall_state")

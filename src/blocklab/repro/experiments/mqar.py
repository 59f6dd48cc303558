"""The ``mqar`` experiment: associative recall needs two attention layers (Zoology's MQAR,
arXiv 2312.04927)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from blocklab.repro import checks as ck
from blocklab.repro import measure as ms
from blocklab.repro.protocol import SIZES, Arm, Experiment, Protocol, Sweep, swap_all

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


def mqar_arm(layers: int, length: int, pairs: int, size: str) -> Arm:
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
        two, one = (mqar_arm(n, length, pairs, size) for n in (2, 1))
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
                          lambda arms: swap_all(arms, "2-layer", "1-layer"))},
)


# ---------------------------------------------------------------------- position extrapolation


def make(size: str) -> Experiment:
    return MQAR

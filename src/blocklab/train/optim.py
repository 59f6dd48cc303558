"""AdamW with decoupled weight decay on matrices only, and learning-rate schedules."""

from __future__ import annotations

import math

import torch
from torch import nn

from blocklab.config import OptimConfig, ScheduleConfig


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


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr,
                             betas=tuple(cfg.betas), eps=cfg.eps)


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

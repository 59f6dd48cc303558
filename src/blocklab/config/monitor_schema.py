"""The training-stability monitors' settings (``monitors.*``; train/monitors.py): how often
they read a fixed batch, and the range each monitor is expected to stay in. Bookkeeping (they
observe the run, they never change it): left out of the config hash."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MonitorConfig:
    # every n optimizer steps, on a fixed batch (0 = off): attention logits and entropy,
    # output log Z, residual RMS and largest activation, update/parameter RMS ratios
    every: int = 50
    batch_size: int = 4  # rows of the fixed batch (the first validation batch's first rows)
    # the range each monitor should stay in; the first one to leave it is named in the run
    # summary (and a diverged run's summary says which left first, and at which step)
    attn_logit_max: float = 100.0  # largest pre-softmax attention logit (any layer)
    attn_entropy_min: float = 0.01  # lowest mean attention entropy of a head, in nats
    logz_max: float = 30.0  # |log Z| of the output logits (mean and largest)
    residual_max: float = 1000.0  # the residual stream's RMS (any layer), times its first value
    update_ratio_max: float = 0.1  # RMS(update) / RMS(parameter) of a parameter group
    grad_norm_max: float = 100.0  # gradient norm (pre-clip), times its first value
    # a run has diverged when its loss is non-finite, or when its loss averaged over about
    # loss_window steps (an exponential moving average: a mixture's step loss is noisy) is this
    # many nats above that average's running minimum; loss_window 1 = the raw step loss
    diverged_above: float = 1.0
    loss_window: int = 20

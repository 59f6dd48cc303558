"""The LightningModule: one objective, AdamW groups, a schedule, and checkpoint metadata.

Exact resume rests on three things saved here: the number of batches consumed (the data
module restarts from it), the RNG state (restored at the first training batch, after
everything that might have drawn from it during start-up) and Lightning's own optimizer,
scheduler and loop state.
"""

from __future__ import annotations

import functools
import math
import random
import sys
import time
import warnings
from typing import Any

import lightning as L
import torch
from torch import Tensor

from blocklab.config import ConfigError, TrainConfig
from blocklab.model import build_model
from blocklab.objectives import build_objective
from blocklab.registry import lookup
from blocklab.train.optim import build_optimizer

# Returning None from training_step is how a non-finite step is skipped (see _skip_or_stop).
warnings.filterwarnings("ignore", message=".*`training_step` returned `None`.*")


class NonFiniteError(FloatingPointError):
    """Loss or gradient went NaN/inf (exit code 5)."""

    exit_code = 5


class LitModel(L.LightningModule):
    def __init__(self, cfg: TrainConfig, *, meta: dict[str, Any] | None = None,
                 flops_per_token: float = 0.0, peak_flops: float = 0.0) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = build_model(cfg.model)
        self.objective = build_objective(cfg.model.family.name, cfg.data)
        self.meta = meta or {}  # run metadata saved with every checkpoint
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.batches_seen = 0
        self.tokens_seen = 0
        self.skipped_steps = 0  # non-finite steps skipped under trainer.skip_nonfinite
        self._pending_rng: dict[str, Any] | None = None
        self._t_last: float | None = None
        self._tokens_since = 0

    # ------------------------------------------------------------------------------ steps
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        if self._pending_rng is not None:  # first batch after a resume
            set_rng_state(self._pending_rng)
            self._pending_rng = None
        out = self.objective.loss(self.model, batch)
        loss, logged, count = out.loss, out.loss.detach(), out.count
        world = self.trainer.world_size
        if world > 1:
            # Normalize by the *global* number of targets: DDP averages gradients over ranks,
            # so total · W / global_count gives exactly the gradient of one process over the
            # global batch (per-rank means would weight ranks with fewer targets more).
            count = self.trainer.strategy.reduce(out.count.detach().float(), reduce_op="sum")
            loss = out.total * world / count.clamp(min=1)
            total = self.trainer.strategy.reduce(out.total.detach().clone(), reduce_op="sum")
            logged = total / count.clamp(min=1)
        if not torch.isfinite(logged):  # under DDP `logged` is global: every rank agrees
            self.batches_seen += 1  # the batch is consumed either way (exact resume)
            self._skip_or_stop(f"loss is {logged.item()}")
            return None  # no backward: every grad stays None, so AdamW changes nothing
        self.batches_seen += 1
        tokens = int(count)
        self.tokens_seen += tokens
        self._tokens_since += tokens
        self.log("train/loss", logged, prog_bar=True, batch_size=1)
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        norms = [p.grad.norm() for p in self.parameters() if p.grad is not None]
        if norms and not torch.isfinite(torch.stack(norms)).all():
            self._skip_or_stop("non-finite gradient")
            for p in self.parameters():  # skipped: AdamW leaves parameters without grads alone
                p.grad = None

    def _skip_or_stop(self, what: str) -> None:
        """``trainer.skip_nonfinite`` policy: skip (counted, logged) while under the limit,
        else stop before the optimizer step with the last checkpoint intact."""
        limit = self.cfg.trainer.skip_nonfinite
        if self.skipped_steps >= limit:
            hint = (f" (skipped {self.skipped_steps}, limit trainer.skip_nonfinite={limit})"
                    if limit else "; trainer.skip_nonfinite=N skips up to N such steps")
            raise NonFiniteError(f"numerical error: {what} at step {self.global_step}; no "
                                 f"optimizer step taken; the last checkpoint is intact{hint}")
        self.skipped_steps += 1
        print(f"warning: {what} at step {self.global_step}: step skipped "
              f"({self.skipped_steps}/{limit} allowed by trainer.skip_nonfinite)", file=sys.stderr)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        every = self.cfg.trainer.log_every_steps
        if every and (self.global_step % every == 0) and self._t_last is not None:
            dt = time.perf_counter() - self._t_last
            if dt > 0:
                rate = self._tokens_since / dt
                self.log("train/target_tokens_per_s", rate, batch_size=1)
                seq = batch.get("input_ids", batch.get("target_ids"))
                all_tokens = seq.numel() * self.trainer.world_size * every / dt
                self.log("train/tokens_per_s", all_tokens, batch_size=1)
                if self.flops_per_token:
                    achieved = all_tokens * self.flops_per_token
                    self.log("train/flops_per_s", achieved, batch_size=1)
                    if self.peak_flops:
                        self.log("train/mfu", achieved / self.peak_flops, batch_size=1)
            self._tokens_since = 0
            self._t_last = time.perf_counter()
        elif self._t_last is None:
            self._t_last = time.perf_counter()
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=1)
        self.log("train/tokens_seen", float(self.tokens_seen), batch_size=1)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        out = self.objective.loss(self.model, batch)
        self.log("val/loss", out.total / out.count.clamp(min=1), prog_bar=True,
                 batch_size=int(out.count), sync_dist=True)

    def configure_model(self) -> None:
        """Under ``trainer.strategy=model_parallel``: FSDP2, each transformer block its own
        shard unit, then the whole model (embeddings, tied head, final norms)."""
        mesh = getattr(self, "device_mesh", None) if self._trainer is not None else None
        if mesh is None or getattr(self, "_sharded", False):
            return
        from torch.distributed.fsdp import fully_shard

        from blocklab.model.blocks import Block

        dp = mesh["data_parallel"]
        for module in list(self.model.modules()):
            if isinstance(module, Block):
                fully_shard(module, mesh=dp)
        fully_shard(self.model, mesh=dp)
        self._sharded = True

    # -------------------------------------------------------------------------- optimizer
    def configure_optimizers(self) -> dict[str, Any]:
        opt = build_optimizer(self.model, self.cfg.optim)
        fn = lookup("schedule", self.cfg.schedule.name)
        lam = functools.partial(fn, cfg=self.cfg.schedule, max_steps=self.cfg.trainer.max_steps)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ------------------------------------------------------------------------- checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        rng = get_rng_state()
        ranks = [rng]
        if self.trainer.world_size > 1:  # every rank's generator (dropout differs per rank)
            import torch.distributed as dist

            ranks = [None] * self.trainer.world_size
            dist.all_gather_object(ranks, rng)
        checkpoint["blocklab"] = {
            **self.meta,
            "step": self.global_step,
            "batches_seen": self.batches_seen,
            "tokens_seen": self.tokens_seen,
            "skipped_steps": self.skipped_steps,
            "rng": ranks[0],
            "rng_ranks": ranks,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        meta = checkpoint.get("blocklab", {})
        self.batches_seen = int(meta.get("batches_seen", 0))
        self.tokens_seen = int(meta.get("tokens_seen", 0))
        self.skipped_steps = int(meta.get("skipped_steps", 0))
        ranks = meta.get("rng_ranks") or []
        rank = self.trainer.global_rank if self._trainer is not None else 0
        world = self.trainer.world_size if self._trainer is not None else 1
        # The same world size restores each rank's own generator; otherwise rank 0's.
        self._pending_rng = ranks[rank] if len(ranks) == world else meta.get("rng")


def get_rng_state() -> dict[str, Any]:
    """Global RNG state as weights_only-safe values (tensors, ints, lists)."""
    py = random.getstate()
    return {"torch": torch.get_rng_state(), "python": [py[0], list(py[1]), py[2]],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def check_finite_config(cfg: TrainConfig) -> None:
    """Rates and sizes of the training config (model rules live in config.validate_model)."""
    o, t, d = cfg.optim, cfg.trainer, cfg.data
    rules = [
        ("optim.lr", o.lr, o.lr > 0 and math.isfinite(o.lr), "must be > 0"),
        ("optim.weight_decay", o.weight_decay, o.weight_decay >= 0, "must be >= 0"),
        ("optim.grad_clip", o.grad_clip, o.grad_clip >= 0, "must be >= 0 (0 = off)"),
        ("trainer.max_steps", t.max_steps, t.max_steps >= 1, "must be >= 1"),
        ("trainer.accumulate", t.accumulate, t.accumulate >= 1, "must be >= 1"),
        ("trainer.skip_nonfinite", t.skip_nonfinite, t.skip_nonfinite >= 0,
         "must be >= 0 (0 = stop at the first non-finite step)"),
        ("data.batch_size", d.batch_size, d.batch_size >= 1, "must be >= 1"),
        ("data.seq_len", d.seq_len, d.seq_len >= 8, "must be >= 8"),
        ("schedule.warmup_steps", cfg.schedule.warmup_steps, cfg.schedule.warmup_steps >= 0,
         "must be >= 0"),
    ]
    for key, value, ok, rule in rules:
        if not ok:
            raise ConfigError(f"config error: {key}={value!r}: {rule}")

"""The LightningModule: one objective, the optimizer's parameter groups, a schedule, what a
logged row holds (loss, learning rate, throughput, gradient norm, peak memory), and checkpoint
metadata.

Exact resume rests on three things saved here: the number of batches consumed (the data
module restarts from it), the RNG state (restored at the first training batch, after
everything that might have drawn from it during start-up) and Lightning's own optimizer,
scheduler and loop state.
"""

from __future__ import annotations

import copy
import functools
import re
import sys
import time
import warnings
from typing import Any

import lightning as L
import torch
from torch import Tensor

from blocklab.config import OptimConfig, TrainConfig
from blocklab.config.validate import best_rule
from blocklab.data.tokenizer import Specials
from blocklab.model import build_model
from blocklab.objectives import build_objective
from blocklab.registry import lookup
from blocklab.train.best import better_record
from blocklab.train.optim import build_optimizer, resolved
from blocklab.train.rng import get_rng_state, set_rng_state

# Returning None from training_step is how a non-finite step is skipped (see _skip_or_stop).
warnings.filterwarnings("ignore", message=".*`training_step` returned `None`.*")


class NonFiniteError(FloatingPointError):
    """Loss or gradient went NaN/inf (exit code 5)."""

    exit_code = 5


class LitModel(L.LightningModule):
    def __init__(self, cfg: TrainConfig, *, meta: dict[str, Any] | None = None,
                 flops_per_token: float = 0.0, peak_flops: float = 0.0,
                 resumed_optim: OptimConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        # a resume: the optimizer config the checkpoint's state was made with
        self.resumed_optim = resumed_optim
        self._changed_settings: list[dict[str, Any]] | None = None
        self.model = build_model(cfg.model)
        self.objective = build_objective(cfg.model.family.name, cfg.data,
                                         Specials.from_dict((meta or {}).get("specials")))
        self.meta = meta or {}  # run metadata saved with every checkpoint
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.batches_seen = 0
        self.tokens_seen = 0
        self.skipped_steps = 0  # non-finite steps skipped under trainer.skip_nonfinite
        self._pending_rng: dict[str, Any] | None = None
        # data.segment_mode=stream: the state carried from one training batch to the next
        # (objectives/segmented.py), and a resumed checkpoint's, loaded at the first batch
        self.carry: Any = None
        self._pending_carry: dict[str, Any] | None = None
        # The running optimizer step's loss (summed over its micro-batches), and the token
        # counts since the last logged row (throughput).
        self._loss_total = self._loss_count = self._z_total = 0.0  # (z: optim.z_loss's log²Z)
        self._t_last: float | None = None
        self._tokens_since = self._seq_tokens_since = 0
        self._grad_norms: dict[str, Tensor] = {}  # the last optimizer step's, before clipping
        self._layers: list[tuple[str, list[Tensor]]] | None = None
        self.last_row: dict[str, float] = {}  # the row train/metrics.py made last, and its step
        self.last_row_step: int | None = None
        self._step_loss = self._step_z = None  # the last optimizer step's loss (and log²Z)
        self._step_lr: float | None = None  # the learning rate the last optimizer step ran with
        # the best checkpoint so far (train/best.py), and the (metric, mode) that decides it
        self.best: dict[str, Any] | None = None
        self.best_rule = best_rule(cfg)
        self.latest: dict[str, tuple[int, float]] = {}  # metric -> (step, value) last written
        if cfg.trainer.activation_checkpointing:
            checkpoint_blocks(self.model)

    # ------------------------------------------------------------------------------ steps
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        if self._pending_rng is not None:  # first batch after a resume
            set_rng_state(self._pending_rng)
            self._pending_rng = None
        out = self._loss(batch)
        loss, logged, count = out.loss, out.loss.detach(), out.count
        world, w = self.trainer.world_size, self.cfg.optim.z_loss  # z-loss: w · mean log²Z
        z = out.z if w else None
        if z is not None:
            loss = loss + w * z / count.clamp(min=1)
        if world > 1:
            # Normalize by the *global* number of targets: DDP averages gradients over ranks,
            # so total · W / global_count gives exactly the gradient of one process over the
            # global batch (per-rank means would weight ranks with fewer targets more).
            count = self.trainer.strategy.reduce(out.count.detach().float(), reduce_op="sum")
            loss = (out.total + (0 if z is None else w * z)) * world / count.clamp(min=1)
            z = None if z is None else self.trainer.strategy.reduce(z.detach(), reduce_op="sum")
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
        seq = batch.get("input_ids", batch.get("target_ids"))
        self._seq_tokens_since += seq.numel() * world
        self._loss_total += float(logged) * tokens
        self._loss_count += tokens
        self._z_total += 0.0 if z is None else float(z.detach())  # a row: its mean per target
        # Rows reach the loggers through blocklab.train.metrics (durable before a checkpoint);
        # Lightning's own logging only feeds the progress bar and the run summary.
        self.log("train/loss", logged, prog_bar=True, logger=False, batch_size=1)
        return loss

    def _loss(self, batch: dict[str, Tensor]) -> Any:
        """The objective's loss of a training batch; in a segment mode, read segment by segment
        (``trainer.bptt``): ``split`` from a fresh carry, ``stream`` through the run's carry,
        detached from the previous step's graph."""
        mode, bptt = self.cfg.data.segment_mode, self.cfg.trainer.bptt
        kw = {"z": True} if self.cfg.optim.z_loss else {}  # log²Z too: optim.z_loss
        if mode == "split":
            return self.objective.loss(self.model, batch, bptt=bptt, **kw)
        if mode != "stream":
            return self.objective.loss(self.model, batch, **kw)
        if self.carry is None:
            b, length = batch["input_ids"].shape
            self.carry = self.objective.new_carry(self.model, b, length=length)
            if self._pending_carry is not None:  # a resume: the checkpoint's state
                self.carry.load_state_dict(self._pending_carry)
                self._pending_carry = None
        else:
            self.carry.detach()
        return self.objective.loss(self.model, batch, carry=self.carry, **kw)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._step_lr = float(optimizer.param_groups[0]["lr"])  # the rate this step runs with
        norms = [p.grad.norm() for p in self.parameters() if p.grad is not None]
        if norms and not torch.isfinite(torch.stack(norms)).all():
            self._skip_or_stop("non-finite gradient")
            for p in self.parameters():  # skipped: AdamW leaves parameters without grads alone
                p.grad = None
            return
        mode = self.cfg.trainer.log_grad_norm
        if norms and mode != "none":  # kept as tensors: read (synchronized) on log steps only
            self._grad_norms = {"train/grad_norm": torch.linalg.vector_norm(torch.stack(norms))}
            if mode == "layer":
                self._grad_norms.update(self._layer_norms())

    def _layer_norms(self) -> dict[str, Tensor]:
        """The gradient norm of each block (``decoder.blocks.3``) and of each other top-level
        part (embeddings, final norm, head)."""
        if self._layers is None:
            groups: dict[str, list[Tensor]] = {}
            for name, p in self.model.named_parameters():
                match = re.match(r"(.*?\.\d+)\.", name)
                groups.setdefault(match.group(1) if match else name.rsplit(".", 1)[0], []).append(p)
            self._layers = list(groups.items())
        out = {}
        for name, params in self._layers:
            norms = [p.grad.norm() for p in params if p.grad is not None]
            if norms:
                out[f"train/grad_norm/{name}"] = torch.linalg.vector_norm(torch.stack(norms))
        return out

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
        self.carry = None  # a non-finite step's state is not carried on
        print(f"warning: {what} at step {self.global_step}: step skipped "
              f"({self.skipped_steps}/{limit} allowed by trainer.skip_nonfinite)", file=sys.stderr)

    def finish_step(self, *, log: bool) -> dict[str, float]:
        """Close the optimizer step just taken; with ``log``, its metrics row
        (:meth:`train_row`)."""
        self._step_loss = self._loss_total / self._loss_count if self._loss_count else None
        self._step_z = self._z_total / self._loss_count if self._loss_count else None
        self._loss_total = self._loss_count = self._z_total = 0.0
        if log:
            return self.train_row()
        if self._t_last is None:
            self._t_last, self._tokens_since, self._seq_tokens_since = time.perf_counter(), 0, 0
        return {}

    def train_row(self) -> dict[str, float]:
        """The row of the step :meth:`finish_step` closed: its loss (all its micro-batches,
        every rank), learning rate, tokens seen, and throughput since the last logged row."""
        row: dict[str, float] = {}
        if self._step_loss is not None:
            row["train/loss"] = self._step_loss
        if self.cfg.optim.z_loss and self._step_z is not None:  # unweighted: mean log²Z
            row["train/z_loss"] = self._step_z
        # the rate the step ran with: the scheduler has moved the optimizer's on by now
        row["train/lr"] = (self._step_lr if self._step_lr is not None
                           else float(self.trainer.optimizers[0].param_groups[0]["lr"]))
        row["train/tokens_seen"] = float(self.tokens_seen)
        now = time.perf_counter()
        if self._t_last is not None and now > self._t_last:
            dt = now - self._t_last
            row["train/target_tokens_per_s"] = self._tokens_since / dt
            row["train/tokens_per_s"] = all_tokens = self._seq_tokens_since / dt
            if self.flops_per_token:
                row["train/flops_per_s"] = all_tokens * self.flops_per_token
                if self.peak_flops:
                    row["train/mfu"] = row["train/flops_per_s"] / self.peak_flops
        self._t_last, self._tokens_since, self._seq_tokens_since = now, 0, 0
        for k, v in self._grad_norms.items():
            row[k] = float(v.full_tensor() if hasattr(v, "full_tensor") else v)
        row.update(peak_memory(self.device))
        for k, v in row.items():  # progress bar and run summary (not the loggers)
            self.log(k, v, logger=False, batch_size=1, prog_bar=k == "train/loss")
        return row

    @torch.no_grad()
    def validation_metrics(self) -> dict[str, float]:
        """``val/loss`` (mean loss) and ``val/accuracy`` (top-1 over the supervised targets) of
        the validation batches, on every rank together (each rank scores its shard; totals and
        counts are summed), with the model in eval mode. An objective whose loss does not count
        correct targets gives no ``val/accuracy``."""
        was_training = self.model.training
        self.model.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss, targets, correct
        counted = True
        try:
            with self.objective.reading():  # one pass (a segment mode's lanes continue)
                for batch in self.trainer.datamodule.validation_loader():
                    out = self.objective.loss(self.model,
                                              self.trainer.strategy.batch_to_device(batch))
                    counted = counted and out.correct is not None
                    sums += torch.stack([out.total.double(), out.count.double(),
                                         out.correct.double() if counted else sums.new_zeros(())])
        finally:
            self.model.train(was_training)
        if self.trainer.world_size > 1:
            sums = self.trainer.strategy.reduce(sums, reduce_op="sum")
        n = float(sums[1].clamp(min=1))
        row = {"val/loss": float(sums[0]) / n}
        if counted:
            row["val/accuracy"] = float(sums[2]) / n
        return row

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
        if self.resumed_optim is not None and self.resumed_optim != self.cfg.optim:
            # each group's settings this config gives otherwise than the checkpoint's config
            # did: a resume restores the checkpoint's over them (:meth:`on_train_start` puts
            # these back). Only these: a setting an optimizer evolves in its groups stays its.
            mine, theirs = _settings(opt), _settings(build_optimizer(self.model,
                                                                     self.resumed_optim))
            self._changed_settings = [{k: v for k, v in a.items() if k not in b or b[k] != v}
                                      for a, b in zip(mine, theirs, strict=True)]
        fn = lookup("schedule", self.cfg.schedule.name)
        max_steps = self.cfg.trainer.max_steps
        lam = functools.partial(fn, cfg=resolved(self.cfg.schedule, max_steps),
                                max_steps=max_steps)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_train_start(self) -> None:
        """Every hyper-parameter of the optimizer and the schedule is this run's config's. A
        resume restores the optimizer's groups (learning rate, weight decay, betas, eps, ...)
        and the scheduler's base rates as the checkpoint saved them, and the optimizer's rate
        as the checkpoint's schedule left it: a resume that changes any of them would train
        with the old ones. Put back here — the group settings this config changes, the
        schedule's base rate ``optim.lr``, and the rate of the next step from this run's
        schedule (``trainer.max_steps`` and ``schedule.*`` included) — every resumed step runs
        with what a run of this config has at that step: the same values, bit for bit, when
        nothing changed."""
        if self._changed_settings is not None:
            groups = self.trainer.optimizers[0].param_groups
            for group, changed in zip(groups, self._changed_settings, strict=True):
                group.update(copy.deepcopy(changed))
                if "lr" in changed:  # the schedule's base rate (LambdaLR's initial_lr)
                    group["initial_lr"] = changed["lr"]
        for config in self.trainer.lr_scheduler_configs:
            sched = config.scheduler
            if not isinstance(sched, torch.optim.lr_scheduler.LambdaLR):
                continue
            groups = sched.optimizer.param_groups
            sched.base_lrs = [group["initial_lr"] for group in groups]
            lrs = [base * fn(sched.last_epoch) for base, fn in zip(sched.base_lrs, sched.lr_lambdas)]
            for group, lr in zip(groups, lrs):
                group["lr"] = lr
            sched._last_lr = lrs

    # ------------------------------------------------------------------------- checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.best_rule is not None:  # this checkpoint, scored by its own step's row
            row = self.last_row if self.last_row_step == self.global_step else {}
            self.best = better_record(self.best, self.best_rule, self.global_step, row)
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
            "best": self.best,  # the best checkpoint so far (kept; `<run>:best`)
        }
        if self.cfg.data.segment_mode == "stream":  # the carried state, for a resume
            checkpoint["blocklab"]["carry"] = (self.carry.state_dict() if self.carry is not None
                                               else self._pending_carry)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        meta = checkpoint.get("blocklab", {})
        self.batches_seen = int(meta.get("batches_seen", 0))
        self.tokens_seen = int(meta.get("tokens_seen", 0))
        self.skipped_steps = int(meta.get("skipped_steps", 0))
        self.best = meta.get("best") if isinstance(meta.get("best"), dict) else None
        self._pending_carry, self.carry = meta.get("carry"), None
        ranks = meta.get("rng_ranks") or []
        rank = self.trainer.global_rank if self._trainer is not None else 0
        world = self.trainer.world_size if self._trainer is not None else 1
        # The same world size restores each rank's own generator; otherwise rank 0's.
        self._pending_rng = ranks[rank] if len(ranks) == world else meta.get("rng")


def _settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter group's settings (everything but its parameters), copied."""
    return [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
            for g in optimizer.param_groups]


def peak_memory(device: torch.device) -> dict[str, float]:
    """The process's high-water marks so far, in MiB: resident memory (CPU), and the CUDA
    allocator's maximum on a GPU."""
    out = {}
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB (bytes on macOS)
        out["train/cpu_rss_peak_mb"] = rss / (2**20 if sys.platform == "darwin" else 2**10)
    except ImportError:  # no resource module (Windows)
        pass
    if device.type == "cuda":
        out["train/cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def checkpoint_blocks(model: torch.nn.Module) -> int:
    """Activation checkpointing: each transformer block's forward runs under
    ``torch.utils.checkpoint`` (non-reentrant, RNG state preserved, so dropout draws the same
    masks when recomputed): its activations are recomputed in backward instead of kept.
    Losses and gradients are those of the plain model. Returns the number of blocks."""
    from blocklab.model.blocks import Block

    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for block in blocks:
        block.forward = functools.partial(_checkpointed, block)
    return len(blocks)


def _checkpointed(block: torch.nn.Module, x: Tensor, ctx: Any) -> Tensor:
    from torch.utils.checkpoint import checkpoint

    forward = type(block).forward
    if not torch.is_grad_enabled():  # evaluation, probes: nothing to recompute
        return forward(block, x, ctx)
    return checkpoint(forward, block, x, ctx, use_reentrant=False)

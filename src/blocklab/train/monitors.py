"""Training-stability monitors (``monitors.*``): every ``monitors.every`` optimizer steps, one
forward of a fixed batch — the first ``monitors.batch_size`` rows of the first validation batch,
built once, read through the run's objective so every family works — in eval mode without
gradients, and what it shows:

- each softmax layer's largest pre-softmax attention logit and its lowest per-head mean
  attention entropy (the ``stats`` hook of model/attention.py);
- the output logits' log Z (logsumexp over the vocabulary) at the supervised positions: mean,
  and largest |log Z|;
- the residual stream after each block: RMS and largest |activation| over real tokens;
- the update/parameter RMS ratio of each parameter group (embedding, attention, ffn, norm,
  other), from a copy of the parameters taken before the optimizer step of a monitor step.

Rows go into the step's metrics row (train/metrics.py), so every logger gets them
(``monitor/...`` keys). Each monitor has a range (``monitors.*`` limits; the residual stream
and ``train/grad_norm`` relative to their first reading): the first reading out of its range is
kept, and so is the first step the run diverged (loss non-finite, or its moving average over
about ``monitors.loss_window`` steps more than ``monitors.diverged_above`` nats over that
average's running minimum: one noisy batch of a task mixture is no divergence). Figures and
``monitors.json`` are written under ``<run dir>/monitors/`` when training ends or fails
(train/monitor_plots.py); the run summary reads them.

The readings change nothing: no gradient, no random draw (the generators' state is restored all
the same), the model back in its mode; a resumed run continues the series from its checkpoint.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor

from blocklab.objectives import IGNORE
from blocklab.train.rng import get_rng_state, set_rng_state

#: Parameter groups of the update ratio, in the order they are shown.
GROUPS = ("embedding", "attention", "ffn", "norm", "other")


def param_group(name: str) -> str:
    """The update-ratio group of a parameter, from its name: norms first (a q/k norm inside
    attention is a norm), then embeddings (token, type, position tables), the sequence mixer
    and cross-attention, the FFN; the rest (LM head, memory tokens, ...) is ``other``."""
    parts = name.lower().split(".")
    if any("norm" in p for p in parts):
        return "norm"
    if any("embed" in p or p in ("position", "wpe", "wte") for p in parts):
        return "embedding"
    if any(p in ("attn", "cross", "mixer") or "attn" in p for p in parts):
        return "attention"
    if any(p in ("ffn", "mlp") or "ffn" in p for p in parts):
        return "ffn"
    return "other"


def layer_name(module_name: str) -> str:
    """``decoder.blocks.3.attn`` -> ``decoder.3``; ``decoder.blocks.3.cross`` ->
    ``decoder.3.cross``; ``encoder.blocks.0`` -> ``encoder.0``."""
    name = re.sub(r"\.blocks\.(\d+)", r".\1", module_name)
    return re.sub(r"\.attn$", "", name) or "model"


def monitor_callbacks(cfg: Any, run_dir: Path) -> list:
    """The monitors of a run (none when ``monitors.every`` is 0)."""
    return [Monitors(cfg.monitors, run_dir)] if cfg.monitors.every > 0 else []


class Readings:
    """One monitor forward of ``model`` on ``batch`` through ``objective``: a flat dict
    ``monitor/<name>[/<layer>] -> float``."""

    def __init__(self, model: torch.nn.Module, objective: Any, pad: int) -> None:
        self.model, self.objective, self.pad = model, objective, pad
        self.blocks = [(layer_name(n), m) for n, m in model.named_modules()
                       if _is_block(m)]
        self.attention = [(layer_name(n), m) for n, m in model.named_modules()
                          if hasattr(m, "stats")]

    def real_masks(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Which positions hold real tokens, per stack: an encoder's ``valid`` /
        ``source_valid``; an encoder–decoder's decoder: its supervised positions (the target
        ends where its labels do); a decoder-only model: every id that is not padding."""
        out = {}
        if "source_valid" in batch:
            out["encoder"] = batch["source_valid"]
            out["decoder"] = batch["labels"] != IGNORE
        elif "valid" in batch:
            out["encoder"] = out["decoder"] = batch["valid"]
        elif "input_ids" in batch:
            out["decoder"] = batch["input_ids"] != self.pad
        return out

    @torch.no_grad()
    def __call__(self, batch: dict[str, Tensor]) -> dict[str, float]:
        masks = self.real_masks(batch)
        sums: dict[str, list[Tensor]] = {}  # layer -> [sum of squares, count, max |x|]
        hooks = [block.register_forward_hook(self._residual_hook(name, masks, sums))
                 for name, block in self.blocks]
        for _, m in self.attention:
            m.stats = []
        try:
            with self.objective.reading():
                logits = self.objective.target_logits(self.model, batch).float()
            stats = {name: list(m.stats or []) for name, m in self.attention}
        finally:
            for h in hooks:
                h.remove()
            for _, m in self.attention:
                m.stats = None
        row: dict[str, float] = {}
        for name, calls in stats.items():
            if not calls:
                continue  # a layer this forward did not reach
            row[f"monitor/attn_logit_max/{name}"] = max(float(c["logit_max"]) for c in calls)
            entropy = torch.stack([c["entropy"].float() for c in calls]).mean(0)  # (H,)
            row[f"monitor/attn_entropy_min/{name}"] = float(entropy.min())
        if logits.numel():
            logz = torch.logsumexp(logits, dim=-1)
            row["monitor/logz_mean"] = float(logz.mean())
            row["monitor/logz_max"] = float(logz.abs().max())
        for name, (sq, n, mx) in sums.items():
            row[f"monitor/residual_rms/{name}"] = float((sq / n.clamp(min=1)).sqrt())
            row[f"monitor/residual_max/{name}"] = float(mx)
        return row

    @staticmethod
    def _residual_hook(name: str, masks: dict[str, Tensor], sums: dict[str, list[Tensor]]):
        stack = name.split(".", 1)[0]

        def hook(module: torch.nn.Module, args: Any, out: Any) -> None:
            x = (out[0] if isinstance(out, tuple) else out).detach().float()
            mask = masks.get(stack)
            if mask is not None and tuple(mask.shape) == tuple(x.shape[:2]):
                x = x[mask.to(x.device)]  # (N, d): real tokens only
            x = x.reshape(-1, x.shape[-1])
            new = [x.square().sum(), x.new_tensor(float(x.numel())),
                   x.abs().max() if x.numel() else x.new_zeros(())]
            old = sums.get(name)  # a stack read segment by segment calls a block again
            sums[name] = new if old is None else [old[0] + new[0], old[1] + new[1],
                                                 torch.maximum(old[2], new[2])]
        return hook


def _is_block(m: torch.nn.Module) -> bool:
    from blocklab.model.blocks import Block

    return isinstance(m, Block)


class Monitors(L.Callback):
    """The monitors as a Lightning callback; placed after ``StepRow`` (which makes the step's
    row and closes its loss) and before ``DurableMetrics`` (which writes the row)."""

    def __init__(self, cfg: Any, run_dir: Path | None) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.batch: dict[str, Tensor] | None = None
        self.reader: Readings | None = None
        self.groups: dict[str, list[tuple[str, Tensor]]] | None = None
        self.before: dict[str, Tensor] | None = None  # parameter copies before a monitor step
        self._seen_step: int | None = None  # the optimizer steps done at the last boundary
        self._skipped = 0  # the module's count of skipped non-finite steps, then
        # the state a resume continues (state_dict): series, first readings, findings
        self.series: dict[str, list[list[float]]] = {}  # key -> [[step, value], ...]
        self.first: dict[str, float] = {}  # key -> first reading (relative ranges)
        self.out_of_range: dict[str, dict[str, Any]] = {}  # key -> its first reading outside
        self.first_out: dict[str, Any] | None = None
        self.diverged: dict[str, Any] | None = None
        self.running_min: float | None = None
        self.smoothed: float | None = None  # the loss's moving average (monitors.loss_window)
        self.losses: list[list[float]] = []

    # ------------------------------------------------------------------- lightning hooks
    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if (trainer.global_step + 1) % self.cfg.every:
            return  # the step about to be taken is not a monitor step
        self.before = {name: torch.cat([p.detach().float().reshape(-1) for _, p in params])
                       for name, params in self._groups(pl_module).items()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # mid-accumulation
        step, skipped = trainer.global_step, getattr(pl_module, "skipped_steps", 0)
        nonfinite, self._skipped = skipped > self._skipped, skipped
        if step == self._seen_step:  # a non-finite loss: no optimizer step was taken
            self._diverge(step + 1, math.nan, "non-finite loss")
            return
        self._seen_step = step
        loss = getattr(pl_module, "_step_loss", None)
        keep = step % self.cfg.every == 0  # series kept on monitor steps only (checkpoints)
        if loss is not None:
            self._loss(step, float(loss), keep=keep)
        if nonfinite:  # a non-finite gradient: the step changed nothing
            self._diverge(step, math.nan if loss is None else float(loss), "non-finite gradient")
        row = pl_module.last_row if pl_module.last_row_step == step else {}
        readings: dict[str, float] = {}
        if keep:
            readings = self.read(trainer, pl_module)
            row.update(readings)
        if "train/grad_norm" in row:  # range-checked on every logged row
            readings["train/grad_norm"] = row["train/grad_norm"]
        self.record(step, readings, keep=keep)

    def on_train_start(self, trainer, pl_module) -> None:
        self._seen_step = trainer.global_step
        self._skipped = getattr(pl_module, "skipped_steps", 0)

    def on_train_end(self, trainer, pl_module) -> None:
        self.write(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        from blocklab.train.module import NonFiniteError

        if isinstance(exception, NonFiniteError):
            self._diverge(trainer.global_step + 1, math.nan, str(exception).split(" at ")[0]
                          .removeprefix("numerical error: "))
        self.write(trainer, failed=True)

    def state_dict(self) -> dict[str, Any]:
        return {"series": self.series, "first": self.first, "out_of_range": self.out_of_range,
                "first_out": self.first_out, "diverged": self.diverged,
                "running_min": self.running_min, "smoothed": self.smoothed,
                "losses": self.losses}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            if hasattr(self, key):
                setattr(self, key, value)

    # -------------------------------------------------------------------------- readings
    def read(self, trainer, pl_module) -> dict[str, float]:
        """Every monitor's reading now (the update ratio: of the step just taken)."""
        model = pl_module.model
        if self.batch is None:
            self.batch = fixed_batch(trainer.datamodule, pl_module.objective,
                                     self.cfg.batch_size)
        if self.reader is None:
            self.reader = Readings(model, pl_module.objective, pl_module.objective.specials.pad)
        rng, training = get_rng_state(), model.training
        model.eval()
        try:
            row = self.reader(trainer.strategy.batch_to_device(self.batch))
        finally:
            model.train(training)
            set_rng_state(rng)
        if self.before is not None:
            row.update(self.update_ratios(pl_module))
            self.before = None
        return row

    def update_ratios(self, pl_module) -> dict[str, float]:
        """RMS(update) / RMS(parameter before the update) of each group: |Δ| / |p|."""
        out = {}
        for name, params in self._groups(pl_module).items():
            old = self.before[name]
            new = torch.cat([p.detach().float().reshape(-1) for _, p in params])
            out[f"monitor/update_ratio/{name}"] = float(
                (new - old).norm() / old.norm().clamp(min=1e-30))
        return out

    def _groups(self, pl_module) -> dict[str, list[tuple[str, Tensor]]]:
        if self.groups is None:
            groups: dict[str, list[tuple[str, Tensor]]] = {}
            seen: set[int] = set()
            for name, p in pl_module.model.named_parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    groups.setdefault(param_group(name), []).append((name, p))
            self.groups = {g: groups[g] for g in GROUPS if g in groups}
        return self.groups

    # --------------------------------------------------------------------------- ranges
    def limit(self, key: str, value: float) -> tuple[float, str] | None:
        """(limit, relation) of a monitor's range: its reading must stay ``relation`` it."""
        c, kind = self.cfg, key.split("/")[1]
        if key == "train/grad_norm" or kind in ("residual_rms", "residual_max"):
            first = self.first.setdefault(key, value)
            scale = c.grad_norm_max if key == "train/grad_norm" else c.residual_max
            return scale * abs(first), "<="
        return {"attn_logit_max": (c.attn_logit_max, "<="),
                "attn_entropy_min": (c.attn_entropy_min, ">="),
                "logz_mean": (c.logz_max, "|.|<="), "logz_max": (c.logz_max, "|.|<="),
                "update_ratio": (c.update_ratio_max, "<=")}.get(kind)

    def record(self, step: int, readings: dict[str, float], *, keep: bool = True) -> None:
        for key, value in readings.items():
            if keep:
                self.series.setdefault(key, []).append([step, value])
            rule = self.limit(key, value)
            if rule is None:
                continue
            limit, rel = rule
            inside = (value >= limit if rel == ">=" else
                      abs(value) <= limit if rel == "|.|<=" else value <= limit)
            if inside or key in self.out_of_range:
                continue
            found = {"name": key.removeprefix("monitor/"), "step": step, "value": value,
                     "limit": limit, "relation": rel}
            self.out_of_range[key] = found
            if self.first_out is None:
                self.first_out = found

    def _loss(self, step: int, loss: float, *, keep: bool = True) -> None:
        if keep or not math.isfinite(loss):
            self.losses.append([step, loss])
        if not math.isfinite(loss):
            self._diverge(step, loss, "non-finite loss")
            return
        # an exponential moving average of span loss_window (weight 2 / (window + 1))
        weight = 2.0 / (self.cfg.loss_window + 1)
        avg = loss if self.smoothed is None else self.smoothed + weight * (loss - self.smoothed)
        self.smoothed = avg
        if self.running_min is not None and avg > self.running_min + self.cfg.diverged_above:
            what = "the loss" if self.cfg.loss_window == 1 else (
                f"the loss averaged over ~{self.cfg.loss_window} steps")
            self._diverge(step, avg, f"{what} more than {self.cfg.diverged_above:g} nats over "
                          "its running minimum")
        self.running_min = avg if self.running_min is None else min(self.running_min, avg)

    def _diverge(self, step: int, loss: float, why: str) -> None:
        if self.diverged is None:
            self.diverged = {"step": step, "loss": loss, "running_min": self.running_min,
                             "why": why}

    # ---------------------------------------------------------------------------- output
    def report(self) -> dict[str, Any]:
        return {"diverged": self.diverged, "first_out_of_range": self.first_out,
                "out_of_range": sorted(self.out_of_range.values(), key=lambda f: f["step"]),
                "diverged_above": self.cfg.diverged_above, "loss_window": self.cfg.loss_window}

    def write(self, trainer, *, failed: bool = False) -> None:
        """``monitors.json`` and the figures (rank 0)."""
        if self.run_dir is None or not trainer.is_global_zero:
            return
        from blocklab.train.monitor_plots import describe, write_outputs

        write_outputs(Path(self.run_dir) / "monitors", self.series, self.losses, self.report(),
                      self.cfg)
        if failed:
            import sys

            print(f"monitors: {describe(self.report())}", file=sys.stderr)


def fixed_batch(datamodule: Any, objective: Any, rows: int) -> dict[str, Tensor]:
    """The first ``rows`` rows of the first validation batch (on the CPU, kept)."""
    with objective.reading():
        first = next(iter(datamodule.validation_loader()))
    n = next(iter(first.values())).shape[0]
    return {k: (v[:rows].clone() if isinstance(v, Tensor) and v.dim() and v.shape[0] == n
                else v) for k, v in first.items()}

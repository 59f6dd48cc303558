"""Lightning callbacks from the config: the ``callbacks`` group by name, and the Lightning
options of the trainer group (``trainer.max_time``, ``trainer.profiler``).

A callback component is ``fn(options: dict) -> list[lightning.Callback]``: its config file
``configs/callbacks/<name>.yaml`` holds ``<name>: {options}``, so several are chosen at once
(``callbacks=[early_stopping,lr_monitor]``) and each option is a dotted key
(``callbacks.early_stopping.patience=5``). A user's own is registered like any component
(``register("callback", "my_cb")``, docs/extending.md); an optional ``check(options, key)``
attribute states its rules, run with the rest of the config's validation (one line each).

blocklab validates inside its own metrics callback (train/metrics.py), not in Lightning's
validation loop, and stops only between optimizer steps: :class:`StepEarlyStopping` and
:class:`StepTimer` are Lightning's EarlyStopping and Timer checked where a step's row was just
written, so a stopped run ends on a whole optimizer step whose checkpoint resumes exactly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, Timer

from blocklab.config.schema import ROW_METRICS
from blocklab.errors import ConfigError


class StepEarlyStopping(EarlyStopping):
    """Lightning's EarlyStopping, checked once per logged row that holds ``monitor`` (a
    validation step for ``val/loss``): ``patience`` counts such checks; ``stopping_threshold``
    stops at the first check beyond it (Lightning's option: ``>`` for mode max, ``<`` for min)."""

    def __init__(self, *, monitor: str, mode: str, patience: int, min_delta: float,
                 stopping_threshold: float | None = None) -> None:
        super().__init__(monitor=monitor, mode=mode, patience=patience, min_delta=min_delta,
                         stopping_threshold=stopping_threshold,
                         check_on_train_epoch_end=False, verbose=False)
        self.stopped_step: int | None = None
        self.reason: str | None = None
        self._checked: int | None = None  # the step whose row was checked last

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Lightning's validation loop never runs here (validation is in the metrics row)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import torch

        row = getattr(pl_module, "last_row", None) or {}
        step = trainer.global_step
        if getattr(pl_module, "last_row_step", None) != step or self.monitor not in row \
                or self._checked == step:
            return
        self._checked = step  # each row is checked once (not again mid-accumulation)
        should_stop, reason = self._evaluate_stopping_criteria(torch.tensor(row[self.monitor]))
        should_stop = trainer.strategy.reduce_boolean_decision(should_stop, all=False)
        if should_stop and not trainer.should_stop:
            self.stopped_step, self.reason = trainer.global_step, reason
        trainer.should_stop = trainer.should_stop or should_stop


class StepTimer(Timer):
    """Lightning's Timer (``max_time``) checked after whole optimizer steps only. Its elapsed
    time is saved in the checkpoint: a resumed run counts on from there."""

    def __init__(self, duration: str, *, accumulate: int) -> None:
        super().__init__(duration=duration.strip(), interval="step", verbose=False)
        self.text, self.accumulate = duration.strip(), accumulate
        self.stopped_step: int | None = None

    def on_fit_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if self._offset:  # a resumed run whose time is already spent stops before a step
            super().on_fit_start(trainer, *args, **kwargs)
            self._record(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % self.accumulate:
            return  # mid-accumulation: the optimizer step is not done
        self._check_time_remaining(trainer)
        self._record(trainer)

    def _record(self, trainer: L.Trainer) -> None:
        if trainer.should_stop and self.stopped_step is None and (self.time_remaining() or 0) <= 0:
            self.stopped_step = trainer.global_step


def stop_reason(trainer: L.Trainer, max_steps: int) -> str | None:
    """Why a run ended before ``max_steps`` (a line for the user), or None."""
    for cb in trainer.callbacks:
        if isinstance(cb, StepTimer) and cb.stopped_step is not None:
            return (f"stopped at step {trainer.global_step} of {max_steps}: trainer.max_time="
                    f"{cb.text} reached")
        if isinstance(cb, StepEarlyStopping) and cb.stopped_step is not None:
            return f"stopped early at step {trainer.global_step} of {max_steps}: {cb.reason}"
    return None


def lightning_options(t: Any, run_dir: Path) -> list:
    """Callbacks for the trainer group's Lightning options (``trainer.max_time``) and the
    notice around ``trainer.compile``'s first step."""
    return ([StepTimer(t.max_time, accumulate=t.accumulate)] if t.max_time else []) + \
        ([CompileNotice()] if t.compile else [])


class CompileNotice(L.Callback):
    """``torch.compile`` compiles at the first forward and backward, which can take a minute:
    a line before the first step and one after it, with its time (rank 0)."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._done = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import sys
        import time

        if self._started is None and trainer.is_global_zero:
            print("compile: compiling the model (torch.compile; the first steps take longer) "
                  "...", file=sys.stderr, flush=True)
        if self._started is None:
            self._started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import sys
        import time

        if not self._done and self._started is not None:
            self._done = True
            if trainer.is_global_zero:
                print(f"compile: compiled; the first step took "
                      f"{time.perf_counter() - self._started:.1f} s", file=sys.stderr,
                      flush=True)


def profiler(name: str | None, run_dir: Path) -> Any:
    """Lightning's profiler by name, its report written under ``<run dir>/profiler/``."""
    if not name:
        return None
    from lightning.pytorch import profilers

    cls = {"simple": profilers.SimpleProfiler, "advanced": profilers.AdvancedProfiler,
           "pytorch": profilers.PyTorchProfiler}[name]
    return cls(dirpath=run_dir / "profiler", filename=name)


def user_callbacks(callbacks: dict[str, Any]) -> list:
    """The ``callbacks`` config's Lightning callbacks, in the order given."""
    from blocklab.registry import lookup

    out: list = []
    for name, options in callbacks.items():
        made = lookup("callback", name, f"callbacks.{name}")(dict(options or {}))
        out += list(made)
    return out


# --------------------------------------------------------------------- built-in callbacks
@dataclasses.dataclass
class EarlyStoppingOptions:
    monitor: str = "val/loss"
    mode: str = "min"
    patience: int = 3  # checks (validation steps, for val/loss) without improvement
    min_delta: float = 0.0  # an improvement smaller than this does not count
    # stop at the first check beyond this (mode max: >, min: <); null = patience only
    stopping_threshold: float | None = None


@dataclasses.dataclass
class LrMonitorOptions:
    logging_interval: str = "step"  # step | epoch
    log_momentum: bool = False


class Builtin:
    """A built-in callback: its options as a dataclass (unknown keys refused by name), its
    rules, and how it is built."""

    def __init__(self, options: type, build: Callable[[Any], list],
                 rules: Callable[[Any, str], None] | None = None,
                 watched: Callable[[Any], tuple[str, str]] | None = None) -> None:
        self.options, self.build, self.rules = options, build, rules
        if watched is not None:  # what the validator asks (config.validate.watched)
            self.watches = lambda given, key: watched(self.parse(given, key))

    def parse(self, given: dict[str, Any], key: str) -> Any:
        known = [f.name for f in dataclasses.fields(self.options)]
        for k, v in given.items():
            if k not in known:
                raise ConfigError(f"config error: {key}.{k}={v!r}: unknown option; options: "
                                  f"{', '.join(known)}")
        return self.options(**given)

    def check(self, given: dict[str, Any], key: str) -> None:
        opts = self.parse(given, key)
        if self.rules is not None:
            self.rules(opts, key)

    def __call__(self, given: dict[str, Any]) -> list:
        return self.build(self.parse(given, "callbacks"))


def _fail(key: str, value: Any, rule: str) -> ConfigError:
    return ConfigError(f"config error: {key}={value!r}: {rule}")


def _early_stopping_rules(o: EarlyStoppingOptions, key: str) -> None:
    if o.monitor not in ROW_METRICS:
        raise _fail(f"{key}.monitor", o.monitor, f"one of {', '.join(ROW_METRICS)} (the "
                    "metrics of a step's logged row)")
    if o.mode not in ("min", "max"):
        raise _fail(f"{key}.mode", o.mode, "one of min, max")
    if not isinstance(o.patience, int) or o.patience < 1:
        raise _fail(f"{key}.patience", o.patience, "must be an integer >= 1")
    if not isinstance(o.min_delta, int | float) or o.min_delta < 0:
        raise _fail(f"{key}.min_delta", o.min_delta, "must be >= 0")
    t = o.stopping_threshold
    if t is not None and (isinstance(t, bool) or not isinstance(t, int | float)
                          or not math.isfinite(t)):
        raise _fail(f"{key}.stopping_threshold", t, "must be a finite number or null")


def _lr_monitor_rules(o: LrMonitorOptions, key: str) -> None:
    if o.logging_interval not in ("step", "epoch"):
        raise _fail(f"{key}.logging_interval", o.logging_interval, "one of step, epoch")


def _early_stopping(o: EarlyStoppingOptions) -> list:
    threshold = None if o.stopping_threshold is None else float(o.stopping_threshold)
    return [StepEarlyStopping(monitor=o.monitor, mode=o.mode, patience=o.patience,
                              min_delta=float(o.min_delta), stopping_threshold=threshold)]


def _lr_monitor(o: LrMonitorOptions) -> list:
    from lightning.pytorch.callbacks import LearningRateMonitor

    return [LearningRateMonitor(logging_interval=o.logging_interval, log_momentum=o.log_momentum)]


@dataclasses.dataclass
class NoOptions:
    pass


CALLBACKS = {
    "early_stopping": Builtin(EarlyStoppingOptions, _early_stopping, _early_stopping_rules,
                              lambda o: (o.monitor, o.mode)),
    "lr_monitor": Builtin(LrMonitorOptions, _lr_monitor, _lr_monitor_rules),
    "none": Builtin(NoOptions, lambda o: []),
}


# ------------------------------------------------------------------ what a run shows
def progress_bar(enabled: bool) -> list:
    """The training bar (:class:`StepProgressBar`), where rich is installed."""
    if not enabled:
        return []
    try:
        from lightning.pytorch.callbacks import RichProgressBar
    except (ImportError, ModuleNotFoundError):
        return []

    class StepProgressBar(RichProgressBar):
        """Optimizer steps done out of ``max_steps`` (a resumed run starts at its checkpoint's
        step), and the metrics the run logs to the bar (losses), not Lightning's epoch counter
        or logger version."""

        @property
        def total_train_batches(self) -> int | float:
            return self.trainer.max_steps

        def _get_train_description(self, current_epoch: int) -> str:
            return "step"

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            super().on_train_epoch_start(trainer, pl_module)
            self._update(self.train_progress_bar_id, trainer.global_step)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if not self.is_disabled and self.train_progress_bar_id is None:
                self._initialize_train_progress_bar_id()  # a run resumed mid-epoch
            self._update(self.train_progress_bar_id, trainer.global_step)
            self._update_metrics(trainer, pl_module)
            self.refresh()

        def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
            items = super().get_metrics(trainer, pl_module)
            items.pop("v_num", None)
            return items

    return [StepProgressBar(leave=True)]

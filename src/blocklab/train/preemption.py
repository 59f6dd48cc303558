"""SIGTERM (a cluster preempting the job): finish the step, write its checkpoint, stop, and
exit with the "preempted, resumable" code 7 (``blocklab.train.run.Preempted``).

Lightning's signal connector records SIGTERM and raises at the end of the current batch; this
callback runs just before that, in ``on_train_batch_end``, and saves the checkpoint of the
finished step (on every rank: saving is collective under DDP).

Ctrl-C (SIGINT) is treated the same way: the first one is turned into the SIGTERM path above
(the running step finishes, its checkpoint is written, exit code 7); a second Ctrl-C aborts at
once, as Python's default does.

Tests signal the process at a deterministic step with ``BLOCKLAB_FAULT`` (blocklab/faults.py)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning as L

from blocklab.faults import maybe_fault


class Preemption(L.Callback):
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.saved = False
        self.signal_name = "SIGTERM"  # what stopped the run, for the message
        self._previous_sigint = None

    def on_train_start(self, trainer, pl_module) -> None:
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore_sigint()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore_sigint()

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None

    def _on_sigint(self, signum, frame) -> None:
        """First Ctrl-C: finish the step, checkpoint it, exit 7 (through Lightning's SIGTERM
        handling); a second one raises KeyboardInterrupt as usual."""
        self.signal_name = "SIGINT"
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\ninterrupt: finishing the current step and writing its checkpoint (Ctrl-C again "
              "to abort without one)", file=sys.stderr)
        os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        maybe_fault("step", trainer.global_step)  # tests: a signal before this step runs

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if getattr(trainer, "received_sigterm", False) and not self.saved:
            self.saved = True
            step = trainer.global_step
            trainer.save_checkpoint(self.run_dir / "checkpoints" / f"step-{step:06d}",
                                    weights_only=False)  # the full training state
            print(f"{self.signal_name}: checkpoint of step {step} written; stopping",
                  file=sys.stderr)

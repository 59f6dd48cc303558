"""SIGTERM (a cluster preempting the job): finish the step, write its checkpoint, stop, and
exit with the "preempted, resumable" code 7 (``blocklab.train.run.Preempted``).

Lightning's signal connector records SIGTERM and raises at the end of the current batch; this
callback runs just before that, in ``on_train_batch_end``, and saves the checkpoint of the
finished step (on every rank: saving is collective under DDP).

Fault-injection hook for tests: with ``BLOCKLAB_FAULT_SIGTERM_AT_STEP=N`` in the environment the
process sends itself SIGTERM as optimizer step N starts, so a test preempts at a known step
instead of racing a signal against a running process."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning as L

FAULT_ENV = "BLOCKLAB_FAULT_SIGTERM_AT_STEP"


class Preemption(L.Callback):
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.saved = False
        fault = os.environ.get(FAULT_ENV)
        self.fault_step = int(fault) if fault else None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.fault_step is not None and trainer.global_step == self.fault_step:
            self.fault_step = None
            os.kill(os.getpid(), signal.SIGTERM)  # delivered before this step runs

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if getattr(trainer, "received_sigterm", False) and not self.saved:
            self.saved = True
            step = trainer.global_step
            trainer.save_checkpoint(self.run_dir / "checkpoints" / f"step-{step:06d}",
                                    weights_only=False)  # the full training state
            print(f"SIGTERM: checkpoint of step {step} written; stopping", file=sys.stderr)

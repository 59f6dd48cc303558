"""Probes around a training run: the checkpoint probes' callback (eval/callback.py) and the
full probe grid on the final model — the same code as ``blocklab-eval``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from blocklab.config import TrainConfig


def probe_callbacks(tc: TrainConfig, meta: dict[str, Any], run_dir: Path, *,
                    all_ranks: bool) -> list:
    """The checkpoint probes' callback, if enabled (``all_ranks``: a sharded strategy, where
    every rank takes part in every forward)."""
    if not tc.checkpoint_probes.enabled:
        return []
    from blocklab.eval.callback import ProbeCallback

    return [ProbeCallback(tc.checkpoint_probes, tc, meta, run_dir,
                          all_ranks=all_ranks, validation=run_validation_text(tc))]


def run_validation_text(tc: TrainConfig):
    """The run's own validation text for the probes' perplexity (read when first asked: the
    prepared corpus is the run's, cached), or None for synthetic data."""
    from blocklab.config import DataName

    if tc.data.name is not DataName.text:
        return None

    def read():
        from blocklab.data.streams import build_streams
        from blocklab.eval.evaluate import validation_text

        streams = build_streams(tc.data, tc.tokenizer, bptt=tc.trainer.bptt)
        return validation_text(streams, streams.specials)()

    return read


def final_probes(tc: TrainConfig, meta: dict[str, Any], lit, run_dir: Path, step: int, *,
                 write: bool = True, loggers: list | None = None):
    """The full probe grid on the final model (the same code as ``blocklab-eval``), with every
    core: the batches are large, unlike the tiny training steps. Under a sharded strategy every
    rank runs it (each forward gathers the parameters from all ranks); only rank 0 ``write``s."""
    if not tc.probes.enabled:
        return None
    import torch

    from blocklab.eval.evaluate import probe_dir, probe_model

    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, min(os.cpu_count() or 1, 8)))
    name = f"step-{step:06d}"
    try:
        result = probe_model(lit.model, tc, meta, tc.probes, step=step, checkpoint=name,
                             out_dir=probe_dir(run_dir, name, tc.probes) if write else None,
                             validation=run_validation_text(tc))
    except Exception as e:  # the trained model and its checkpoint are already safe
        if write:
            print(f"warning: final probes failed ({type(e).__name__}: {e}); rerun them with "
                  f"blocklab-eval ckpt={run_dir / 'checkpoints' / name}", file=sys.stderr)
        return None
    finally:
        torch.set_num_threads(threads)
    if write and loggers and result is not None:
        from blocklab.eval.callback import headline, log_probe_result

        scalars = {f"final_{k}": v for k, v in headline(result.summary).items()}
        for logger in loggers:  # the headline numbers, so a sweep sorts by them
            logger.log_metrics(scalars, step=step)
        log_probe_result(loggers, result, step)
    return result

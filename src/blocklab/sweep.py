"""Sweeps on Hydra's own machinery (multirun, its launchers and sweepers): what blocklab adds is
per-job isolation and a summary.

- Each job trains into ``<sweep dir>/<job number>/`` and writes ``status.json`` there (``ok``,
  ``failed`` with the one-line error, the job's overrides). A job that fails — an invalid
  config, a data error, a crash — records its error and returns normally, so the launcher goes
  on with the other jobs.
- Under DDP, Lightning re-executes ``sys.argv`` in each child process; in a multirun that would
  rerun the whole sweep in the child. :func:`job_argv` narrows ``sys.argv`` to the current
  job's overrides for the duration of the job, and :func:`clear_distributed_env` removes the
  rendezvous variables afterwards so the next job starts its own process group.
- A job whose process dies — killed by a signal (the OOM killer sends SIGKILL), a crash of the
  interpreter — cannot record anything itself. Under ``hydra/launcher=parallel`` and
  ``local``/``slurm`` (blocklab's thin subclasses of Hydra's joblib and submitit launchers,
  ``src/hydra_plugins/blocklab_launchers``) every job has a process of its own, and the
  launching process records such a death in the job's ``status.json`` (:func:`job_died`); the
  other jobs run on. Hydra's basic launcher runs the jobs one after another in the sweep's own
  process: there a SIGKILL ends the sweep itself (the jobs before it keep their results; the
  killed one stays ``running``) -- use one of the others where jobs may be killed.
- :class:`SweepSummary` (a Hydra callback, ``hydra.callbacks`` in ``configs/train.yaml``) prints
  and writes the comparison table of the finished sweep (``blocklab-compare`` on the sweep dir).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from blocklab.errors import StorageError
from blocklab.faults import JOB_ENV
from blocklab.files import write_text_atomic

DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK",
            "LOCAL_WORLD_SIZE", "RANK", "BLOCKLAB_RUN_DIR")


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def job_info() -> dict[str, Any]:
    """The current Hydra job: number, overrides, output directory."""
    from hydra.core.hydra_config import HydraConfig

    h = HydraConfig.get()
    return {"job": h.job.num, "overrides": list(h.overrides.task),
            "run_dir": h.runtime.output_dir}


def write_status(run_dir: str | Path, status: str, *, error: str | None = None,
                 info: dict[str, Any] | None = None) -> None:
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    body = {"status": status, "error": error, **(info or {})}
    write_text_atomic(path / "status.json", json.dumps(body, indent=2))


@contextlib.contextmanager
def job_env(job: int) -> Iterator[None]:
    """Name the running job in ``$BLOCKLAB_SWEEP_JOB`` (``BLOCKLAB_FAULT=...#job=N``)."""
    saved = os.environ.get(JOB_ENV)
    os.environ[JOB_ENV] = str(job)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(JOB_ENV, None)
        else:
            os.environ[JOB_ENV] = saved


@contextlib.contextmanager
def job_argv(overrides: list[str]) -> Iterator[None]:
    """Make ``sys.argv`` name only this job (for Lightning's DDP child processes)."""
    saved = sys.argv[:]
    sys.argv = [saved[0], *(o for o in overrides if not o.startswith("hydra."))]
    try:
        yield
    finally:
        sys.argv = saved


def clear_distributed_env() -> None:
    """Forget the last job's process group so the next job can start its own."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # pragma: no cover - best effort between jobs
        pass
    for key in DIST_ENV:
        os.environ.pop(key, None)


def run_job(fn, cfg: DictConfig, known: tuple[type[BaseException], ...]) -> float:
    """One multirun job: train, record the outcome in ``status.json``, never raise (the
    launcher goes on with the other jobs; the summary lists the failure). Returns the job's
    objective value (NaN for a failed job: Optuna marks that trial failed)."""
    info = job_info()
    write_status(info["run_dir"], "running", info=info)
    value = math.nan
    try:
        with job_argv(info["overrides"]), job_env(info["job"]):
            value = fn(cfg)
    except known as e:
        message = str(e.args[-1] if isinstance(e, OSError) and e.args else e).splitlines()[0]
        print(f"job {info['job']} failed: {message}", file=sys.stderr)
        write_status(info["run_dir"], "failed", error=message, info=info)
    except Exception as e:  # a crash in one job must not take the sweep down
        print(f"job {info['job']} crashed: {type(e).__name__}: {e}", file=sys.stderr)
        write_status(info["run_dir"], "failed", error=f"{type(e).__name__}: {e}\n"
                     + traceback.format_exc(), info=info)
    else:
        write_status(info["run_dir"], "ok", info={**info, "objective": value})
    finally:
        clear_distributed_env()
    return value


def exit_reason(code: int | None) -> str:
    """How a job's process ended, from its exit status (negative: the signal that killed it)."""
    if code is None:
        return "its process died before the job finished"
    if code < 0:
        try:
            name = f"{signal.Signals(-code).name} (signal {-code})"
        except ValueError:
            name = f"signal {-code}"
        return f"its process was killed by {name} before the job finished"
    return f"its process exited with code {code} before the job finished"


_HYDRA_CONFIG = threading.Lock()  # joblib's threads resolve job directories one at a time


def job_dir(hydra_context: Any, config: DictConfig, job: int, overrides: list[str]) -> Path:
    """Job ``job``'s output directory, as Hydra's ``run_job`` names it in the job's process
    (``hydra.sweep.dir``/``hydra.sweep.subdir``), resolved in the launching one: the subdir's
    ``${hydra:job.num}`` reads HydraConfig, set to the job's config for that moment only."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    sweep = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep):
        sweep.hydra.job.num = job
    with _HYDRA_CONFIG:
        hc = HydraConfig.instance()
        saved = hc.cfg
        try:
            hc.set_config(sweep)
            return Path(str(sweep.hydra.sweep.dir)) / str(sweep.hydra.sweep.subdir)
        finally:
            hc.cfg = saved


def job_died(hydra_context: Any, config: DictConfig, job: int, overrides: list[str],
             reason: str) -> Any:
    """The launching process's record of a job whose process died before the job recorded
    its outcome: ``failed`` with ``reason`` (a clause: :func:`exit_reason`) in its
    ``status.json`` (a job that finished and died afterwards keeps its own), and the Hydra
    ``JobReturn`` a failed job returns (NaN: Optuna marks the trial failed)."""
    from hydra.core.utils import JobReturn, JobStatus

    run_dir = job_dir(hydra_context, config, job, overrides)
    path = run_dir / "status.json"
    status = json.loads(path.read_text()) if path.is_file() else {}
    if status.get("status") in ("ok", "failed"):
        value = status.get("objective", math.nan)
    else:
        from blocklab.checkpoint import list_checkpoints

        value = math.nan
        hint = (f"; resume it with: blocklab-train resume={run_dir}"
                if list_checkpoints(run_dir) else "")
        oom = "; SIGKILL is what the OOM killer sends" if "SIGKILL" in reason else ""
        message = f"{reason}{oom}{hint}"
        print(f"job {job} died: {message}", file=sys.stderr)
        kept = {k: v for k, v in status.items() if k not in ("status", "error")}
        write_status(run_dir, "failed", error=message, info={
            "job": job, "overrides": list(overrides), "run_dir": str(run_dir), **kept})
    return JobReturn(overrides=list(overrides), working_dir=str(run_dir),
                     status=JobStatus.COMPLETED, _return_value=value)


class SweepSummary(Callback):
    """Hydra callback: before a multirun, check that its sweep directory can be written; after
    it, print and write the comparison of its jobs."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from blocklab.runlock import writable_dir

        try:  # else Hydra's own mkdir fails later, with a traceback (an exception here too)
            writable_dir(str(config.hydra.sweep.dir), "sweep directory")
        except StorageError as e:
            print(e.args[-1], file=sys.stderr)
            sys.exit(e.exit_code)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        statuses = sorted(sweep_dir.glob("*/status.json"))
        failed = [json.loads(p.read_text()) for p in statuses]
        failed = [s for s in failed if s.get("status") != "ok"]
        print(f"\nsweep {sweep_dir}: {len(statuses)} jobs, {len(failed)} failed", file=sys.stderr)
        for s in failed:
            err = (s.get("error") or "").splitlines()[0] if s.get("error") else s.get("status")
            print(f"  job {s.get('job')} ({' '.join(s.get('overrides', []))}): {err}",
                  file=sys.stderr)
        if not statuses:
            return
        try:
            from blocklab import compare

            compare.main([str(sweep_dir)])
        except Exception as e:  # the sweep's results are on disk either way
            print(f"sweep summary: blocklab-compare failed: {e}", file=sys.stderr)

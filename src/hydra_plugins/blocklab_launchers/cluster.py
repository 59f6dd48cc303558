"""``hydra/launcher=local`` and ``slurm``: Hydra's submitit launchers, each job's outcome
collected on its own.

Submitit already runs every job in a process (a SLURM job) of its own, but Hydra's launcher
gathers the results with ``[job.results()[0] for job in jobs]``: the first job that died (no
result: killed, out of memory, a node failure) raises there, the sweep ends in a traceback
while later jobs are still running, and no summary is written. :meth:`launch` below is Hydra's
(hydra-submitit-launcher 1.2, ``BaseSubmititLauncher.launch``) up to the submission; then each
job's death is recorded (``blocklab.sweep.job_died``) and the others are waited for.

No ``from __future__ import annotations`` here: Hydra's plugin scan executes this module before
it is in ``sys.modules``, where dataclasses cannot resolve string annotations.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn

try:
    from hydra_plugins.hydra_submitit_launcher.config import (
        BaseQueueConf,
        LocalQueueConf,
        SlurmQueueConf,
    )
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import (
        LocalLauncher,
        SlurmLauncher,
    )
except ImportError:  # pragma: no cover - the sweep extra is not installed: no such launchers
    LocalLauncher = SlurmLauncher = None

LAUNCHERS: list[type] = []  # what this module defines (none without hydra-submitit-launcher)

log = logging.getLogger(__name__)


def _launch(launcher: Any, job_overrides: Sequence[Sequence[str]],
            initial_job_idx: int) -> list[JobReturn]:
    import submitit
    from hydra.core.singleton import Singleton
    from hydra.core.utils import filter_overrides
    from omegaconf import OmegaConf

    assert launcher.config is not None and len(job_overrides) > 0
    params = launcher.params
    init_params = {"folder": params["submitit_folder"]}
    specific_init_keys = {"max_num_timeout"}
    init_params.update(**{f"{launcher._EXECUTOR}_{x}": y for x, y in params.items()
                          if x in specific_init_keys})
    init_keys = specific_init_keys | {"submitit_folder"}
    executor = submitit.AutoExecutor(cluster=launcher._EXECUTOR, **init_params)
    baseparams = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{x if x in baseparams else f"{launcher._EXECUTOR}_{x}": y
                                  for x, y in params.items() if x not in init_keys})
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    log.info(f"Submitit '{launcher._EXECUTOR}' sweep output dir : {sweep_dir}")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if "mode" in launcher.config.hydra.sweep:
        sweep_dir.chmod(int(str(launcher.config.hydra.sweep.mode), 8))
    job_params: list[Any] = []
    for idx, overrides in enumerate(job_overrides):
        idx = initial_job_idx + idx
        log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        job_params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}",
                           Singleton.get_state()))
    jobs = executor.map_array(launcher, *zip(*job_params))
    return [_outcome(launcher, job, p[2], p[0]) for job, p in zip(jobs, job_params)]


def _outcome(launcher: Any, job: Any, idx: int, overrides: list[str]) -> JobReturn:
    """The job's own result, or -- when it produced none -- its death, recorded. Submitit does
    not say how the process ended (the local executor's controller drops the exit status); a
    SLURM job's state does (OUT_OF_MEMORY, NODE_FAIL, CANCELLED, ...)."""
    from submitit.core.utils import UncompletedJobError

    from blocklab.sweep import job_died

    try:
        return job.results()[0]
    except UncompletedJobError:  # FailedJobError too: the job's process died
        reason = (f"its process ended without a result (submitit job {job.job_id}, state "
                  f"{job.state}; its log: {job.paths.stderr})")
        return job_died(launcher.hydra_context, launcher.config, idx, overrides, reason)


if LocalLauncher is not None:

    class IsolatedLocalLauncher(LocalLauncher):
        """submitit's local executor; a job that dies fails alone."""

        def launch(self, job_overrides: Sequence[Sequence[str]],
                   initial_job_idx: int) -> Sequence[JobReturn]:
            return _launch(self, job_overrides, initial_job_idx)

    class IsolatedSlurmLauncher(SlurmLauncher):
        """SLURM through submitit; a job that dies (out of memory, node failure, cancelled)
        fails alone."""

        def launch(self, job_overrides: Sequence[Sequence[str]],
                   initial_job_idx: int) -> Sequence[JobReturn]:
            return _launch(self, job_overrides, initial_job_idx)

    @dataclass
    class IsolatedLocalConf(LocalQueueConf):
        _target_: str = "hydra_plugins.blocklab_launchers.cluster.IsolatedLocalLauncher"

    @dataclass
    class IsolatedSlurmConf(SlurmQueueConf):
        _target_: str = "hydra_plugins.blocklab_launchers.cluster.IsolatedSlurmLauncher"

    ConfigStore.instance().store(group="hydra/launcher", name="blocklab_submitit_local",
                                 node=IsolatedLocalConf(), provider="blocklab")
    ConfigStore.instance().store(group="hydra/launcher", name="blocklab_submitit_slurm",
                                 node=IsolatedSlurmConf(), provider="blocklab")
    LAUNCHERS += [IsolatedLocalLauncher, IsolatedSlurmLauncher]

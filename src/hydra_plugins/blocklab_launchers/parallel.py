"""``hydra/launcher=parallel``: Hydra's joblib launcher, each job in a loky process of its own.

Hydra's launcher runs every job in one ``joblib.Parallel`` call on loky's shared executor; when
one worker dies, loky marks the executor broken and kills the other workers, and the call
raises ``TerminatedWorkerError``: the job beside the dead one dies too, the jobs not started
never start, and the sweep ends in a traceback without its summary. Here joblib's threads
schedule the jobs (``n_jobs`` at a time, as before), and each job runs through Hydra's own
``execute_job`` in a single-worker loky executor of its own, so a death breaks only that
job's executor. The other joblib options (``timeout``, ``batch_size``, ...) do not apply: one
job is one task.

No ``from __future__ import annotations`` here: Hydra's plugin scan executes this module before
it is in ``sys.modules``, where dataclasses cannot resolve string annotations.
"""

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn

try:
    from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
except ImportError:  # pragma: no cover - the sweep extra is not installed: no such launcher
    JoblibLauncher = None

LAUNCHERS: list[type] = []  # what this module defines (none without hydra-joblib-launcher)

log = logging.getLogger(__name__)
_EXIT_CODE = re.compile(r"\((-?\d+)\)\}")  # loky: "The exit codes of the workers are {SIGKILL(-9)}"

if JoblibLauncher is not None:

    class IsolatedJoblibLauncher(JoblibLauncher):
        """The joblib launcher in which one job's death fails only that job."""

        def launch(self, job_overrides: Sequence[Sequence[str]],
                   initial_job_idx: int) -> Sequence[JobReturn]:
            from hydra.core.singleton import Singleton
            from hydra.core.utils import configure_log, filter_overrides, setup_globals
            from joblib import Parallel, delayed

            setup_globals()
            assert self.config is not None and self.hydra_context is not None
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
            sweep_dir = Path(str(self.config.hydra.sweep.dir))
            sweep_dir.mkdir(parents=True, exist_ok=True)
            n_jobs = self.joblib.get("n_jobs", -1)
            log.info(f"Launching {len(job_overrides)} jobs, {n_jobs} at a time, each in a "
                     f"process of its own; sweep output dir: {sweep_dir}")
            for idx, overrides in enumerate(job_overrides):
                log.info(f"\t#{initial_job_idx + idx} : {' '.join(filter_overrides(overrides))}")
            state = Singleton.get_state()
            return Parallel(n_jobs=n_jobs, backend="threading")(
                delayed(self._alone)(initial_job_idx + idx, list(overrides), state)
                for idx, overrides in enumerate(job_overrides))

        def _alone(self, idx: int, overrides: list[str], state: dict[Any, Any]) -> JobReturn:
            """One job in a fresh single-worker loky executor (a thread of the sweep waits)."""
            from hydra_plugins.hydra_joblib_launcher._core import execute_job
            from joblib.externals.loky import BrokenProcessPool, ProcessPoolExecutor

            from blocklab.sweep import exit_reason, job_died

            executor = ProcessPoolExecutor(max_workers=1)
            try:
                return executor.submit(execute_job, idx, overrides, self.hydra_context,
                                       self.config, self.task_function, state).result()
            except BrokenProcessPool as e:  # the worker died: TerminatedWorkerError
                code = _EXIT_CODE.search(str(e))
                reason = exit_reason(int(code.group(1)) if code else None)
                return job_died(self.hydra_context, self.config, idx, overrides, reason)
            finally:
                executor.shutdown(wait=True)

    @dataclass
    class IsolatedJoblibLauncherConf(JobLibLauncherConf):
        _target_: str = (
            "hydra_plugins.blocklab_launchers.parallel.IsolatedJoblibLauncher")

    ConfigStore.instance().store(group="hydra/launcher", name="blocklab_joblib",
                                 node=IsolatedJoblibLauncherConf, provider="blocklab")
    LAUNCHERS.append(IsolatedJoblibLauncher)

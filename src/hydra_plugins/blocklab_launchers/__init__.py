"""blocklab's Hydra launchers (``configs/hydra/launcher/``): thin subclasses of Hydra's joblib and
submitit launchers in which a job whose process dies — a signal, the OOM killer — fails alone:
the launching process records it in the job's ``status.json`` (``blocklab.sweep.job_died``),
the other jobs run on, and the sweep ends with its summary. Hydra finds launchers only inside
the ``hydra_plugins`` namespace package, hence this folder outside ``blocklab``."""

from __future__ import annotations


def register() -> None:
    """Make the launchers known to Hydra: their config nodes (``blocklab_joblib``,
    ``blocklab_submitit_local``, ``blocklab_submitit_slurm``: ConfigStore, stored when their
    modules are imported) and their classes (Hydra's plugin registry). Hydra's own scan of
    ``hydra_plugins`` does both for an installed wheel but does not see this folder through an
    editable install's import hook, so the command line calls this before composing."""
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()  # the scan first: it may (re)import these modules itself
    from hydra_plugins.blocklab_launchers import cluster, parallel

    for launcher in (*parallel.LAUNCHERS, *cluster.LAUNCHERS):
        plugins.register(launcher)

"""Experiment loggers by name, and what every run gives them. All write under the run
directory; wandb stays offline unless ``logger.mode=online`` is asked for (online with no
network blocks for ~100 s, then fails). The CSV log, which ``blocklab-compare`` reads, is kept
beside any other logger (all but ``logger=none``) and flushed at every row (train/metrics.py).

A logger component is ``fn(cfg: LoggerConfig, run_dir) -> list of Lightning loggers``;
``logger=many`` builds each of ``logger.loggers``. Attributes the validator asks
(``validate_logger``): ``check(cfg, key)``, the logger's own rules; ``combines`` (it builds
``logger.loggers``: ``many``) and ``standalone`` (never one of several: ``many``, ``none``). Every logger receives the resolved config as
hyperparameters (flattened dotted keys, so runs group and filter by ``model.position.name``);
TensorBoard also gets it as text. A run's name is ``logger.run_name`` (a sweep job: its varied
keys, set by the command line) or the run directory's name, its group ``logger.group`` (a
sweep job: the sweep), its tags ``logger.tags`` (wandb's run tags; a sweep job adds one per
varied key).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blocklab.config import LoggerConfig
from blocklab.config.checks import require
from blocklab.config.schema import WANDB_MODES


def csv(cfg: LoggerConfig, run_dir: Path) -> list:
    from lightning.pytorch.loggers import CSVLogger

    return [CSVLogger(save_dir=run_dir, name="logs", flush_logs_every_n_steps=1)]


def tensorboard(cfg: LoggerConfig, run_dir: Path) -> list:
    """TensorBoard under ``<run dir>/tensorboard/`` (config.validate_logger checks the package
    is installed); a named run (a sweep job) writes ``tensorboard/<run name>/``, so
    ``tensorboard --logdir <sweep dir>`` lists the jobs by their varied keys."""
    from lightning.pytorch.loggers import TensorBoardLogger

    version = cfg.run_name.replace("/", "_") if cfg.run_name else None
    return [TensorBoardLogger(save_dir=run_dir, name="tensorboard", version=version,
                              default_hp_metric=False)]


def wandb(cfg: LoggerConfig, run_dir: Path) -> list:
    """wandb, writing its run into ``<run dir>/wandb/`` (offline unless ``logger.mode``); the
    places it will write are checked first (:func:`check_wandb_dirs`)."""
    from lightning.pytorch.loggers import WandbLogger

    check_wandb_dirs(cfg, run_dir)

    class BlocklabWandb(WandbLogger):
        """Checkpoints as artifacts when ``logger.log_checkpoints`` (blocklab's checkpoints are
        directories; Lightning's own ``log_model`` expects single files)."""

        def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
            path = getattr(checkpoint_callback, "_last_checkpoint_saved", None)
            if cfg.log_checkpoints and path:
                self.log_checkpoint(Path(path))

        def log_checkpoint(self, path: Path) -> None:
            import wandb as wb

            if not cfg.log_checkpoints or not path.is_dir():
                return
            art = wb.Artifact(f"checkpoint-{self.experiment.id}", type="model",
                              metadata={"step": int(path.name.rsplit("-", 1)[-1])})
            art.add_dir(str(path))
            self.experiment.log_artifact(art, aliases=[path.name, "latest"])

    return [BlocklabWandb(project=cfg.project, save_dir=str(run_dir), mode=cfg.mode,
                          name=cfg.run_name or run_dir.name, group=cfg.group,
                          tags=list(cfg.tags) or None)]


def check_wandb_dirs(cfg: LoggerConfig, run_dir: Path) -> None:
    """Refuse, before the first step, a directory wandb would fail to write in mid-run: its
    run's ``<run dir>/wandb`` (a file there: wandb's own traceback at start-up), and with
    ``logger.log_checkpoints`` the folders it copies every checkpoint through — the staging
    folder under ``WANDB_DATA_DIR`` (``~/.local/share/wandb``: a read-only home stopped the
    run at its first checkpoint) and the artifact cache under ``WANDB_CACHE_DIR``. One line
    each, naming the path and what moves it (exit 6). ``logger.mode=disabled`` writes
    nothing."""
    if cfg.mode == "disabled":
        return
    from wandb import env

    from blocklab.errors import StorageError
    from blocklab.runlock import writable_dir

    places = [(run_dir / "wandb", "logger=wandb: wandb's directory",
               "it is always <run dir>/wandb: choose another run_dir=")]
    if cfg.log_checkpoints:
        places += [
            (Path(env.get_data_dir()) / "artifacts" / "staging",
             "logger.log_checkpoints=true: wandb stages checkpoints in",
             "set WANDB_DATA_DIR to a writable directory, or logger.log_checkpoints=false"),
            (Path(env.get_cache_dir()) / "artifacts",
             "logger.log_checkpoints=true: wandb caches checkpoints in",
             "set WANDB_CACHE_DIR to a writable directory, or logger.log_checkpoints=false")]
    for path, what, hint in places:
        try:
            writable_dir(path.expanduser(), what)
        except StorageError as e:
            raise StorageError(e.errno, f"{e.args[-1]}; {hint}") from None


def many(cfg: LoggerConfig, run_dir: Path) -> list:
    """Every logger named in ``logger.loggers`` at once (lightning-hydra-template's
    many_loggers, by name)."""
    from blocklab.registry import lookup

    return [lg for name in cfg.loggers for lg in lookup("logger", name, "logger.loggers")(cfg, run_dir)]


def none(cfg: LoggerConfig, run_dir: Path) -> list:
    return []


def build_loggers(cfg: LoggerConfig, run_dir: Path) -> list:
    """The run's loggers: the CSV log first (unless ``logger=none``), then the chosen ones
    (a CSV logger of the run's own ``logs/`` they return is the same log, not added twice)."""
    from lightning.pytorch.loggers import CSVLogger

    from blocklab.registry import lookup

    chosen = lookup("logger", cfg.name)(cfg, run_dir)
    if cfg.name == "none":
        return chosen
    own = [lg for lg in chosen if isinstance(lg, CSVLogger) and Path(lg.save_dir) == run_dir
           and lg.name == "logs"]
    return [*(own[:1] or csv(cfg, run_dir)), *(lg for lg in chosen if lg not in own)]


def flat_config(plain: dict[str, Any]) -> dict[str, Any]:
    """The resolved config as flat dotted keys (lists as their text): what every logger takes
    as hyperparameters."""
    from blocklab.provenance import flatten

    return {k: v if v is None or isinstance(v, bool | int | float | str) else str(v)
            for k, v in flatten(plain).items()}


def log_config(loggers: list, plain: dict[str, Any], config_yaml: str) -> None:
    """The resolved config to every logger (hyperparameters; TensorBoard also as text)."""
    flat = flat_config(plain)
    for logger in loggers:
        logger.log_hyperparams(flat)
        if type(logger).__name__ == "TensorBoardLogger":
            _tensorboard_hparams(logger, flat, ["train/loss", "val/loss", plain.get("objective")])
            logger.experiment.add_text("config", f"```yaml\n{config_yaml}```", 0)
        logger.save()


def _tensorboard_hparams(logger: Any, flat: dict[str, Any], metrics: list[str | None]) -> None:
    """The HPARAMS dashboard's record: Lightning writes it only together with a metric value
    (``hp_metric``, a made-up -1 at step 0); here the dashboard's columns are named metrics the
    run logs anyway, and no value is invented."""
    from torch.utils.tensorboard.summary import hparams

    params = {k: "null" if v is None else v for k, v in flat.items()}
    names = {m: 0.0 for m in metrics if m}
    writer = logger.experiment._get_file_writer()  # SummaryWriter.add_hparams' own route
    for summary in hparams(params, names):
        writer.add_summary(summary)


def log_final_checkpoint(loggers: list, path: Path) -> None:
    """The final checkpoint (written outside the checkpoint callback) to loggers that keep
    checkpoints (wandb with ``logger.log_checkpoints``)."""
    for logger in loggers:
        if hasattr(logger, "log_checkpoint"):
            logger.log_checkpoint(path)


def close_loggers(loggers: list) -> None:
    """Finish what needs finishing while the process is whole: the wandb run (its offline
    record complete, and a next run in this process gets a run of its own), TensorBoard's
    writer."""
    for logger in loggers:
        if type(logger).__name__ == "BlocklabWandb" and getattr(logger, "_experiment", None):
            _finish_wandb(logger)
        elif type(logger).__name__ == "TensorBoardLogger":
            logger.experiment.flush()


def _finish_wandb(logger: Any) -> None:
    """``run.finish()`` only hands the run's close to wandb's service process and returns: the
    service writes the last records (the config among them) to the offline ``run-*.wandb`` file
    when it closes the run's stream, some time later. ``wandb.teardown()`` waits until the
    service has closed every stream and exited, so the record is whole when this returns; it
    is called only when no other run of this process is still open (a next run starts a
    service of its own)."""
    import wandb as wb

    logger.experiment.finish()
    logger._experiment = None
    if wb.run is None:
        wb.teardown()


def _tensorboard_rules(cfg: LoggerConfig, key: str) -> None:
    import importlib.util

    require(bool(importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX")),
            f"{key}.name", "tensorboard", "the tensorboard package is not installed",
            "pip install 'blocklab[tensorboard]'")


def _wandb_rules(cfg: LoggerConfig, key: str) -> None:
    require(cfg.mode in WANDB_MODES, f"{key}.mode", cfg.mode, f"one of {', '.join(WANDB_MODES)}")


# what the validator asks of a logger (the module docstring); functions carry them as attributes
tensorboard.check = _tensorboard_rules  # type: ignore[attr-defined]
wandb.check = _wandb_rules  # type: ignore[attr-defined]
many.combines = many.standalone = True  # type: ignore[attr-defined]
none.standalone = True  # type: ignore[attr-defined]

LOGGERS = {
    "csv": csv,
    "tensorboard": tensorboard,
    "wandb": wandb,
    "many": many,
    "none": none,
}


def sweep_job_names(sweep_dir: Path, job_overrides: list[str], job: int) -> tuple[str, str]:
    """A sweep job's ``(run name, group)``: the values of the keys the sweep varies
    (``model/position=alibi,optim.lr=0.01``; read from Hydra's ``<sweep dir>/multirun.yaml``:
    the command line's sweep overrides, and a sweeper's ``params``), else ``job N``; the group
    is the sweep directory's name, so a tracker lists the jobs of one sweep together."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    varied: set[str] = set()
    saved = sweep_dir / "multirun.yaml"
    if saved.is_file():
        hydra = OmegaConf.load(saved).get("hydra", {})
        parsed = OverridesParser.create().parse_overrides(list(hydra.get("overrides", {})
                                                               .get("task", [])))
        varied |= {o.key_or_group for o in parsed if o.is_sweep_override()}
        varied |= set((hydra.get("sweeper", {}) or {}).get("params", {}) or {})
    picked = [o.lstrip("+~") for o in job_overrides if o.lstrip("+~").split("=", 1)[0] in varied]
    return (",".join(picked) or f"job {job}"), sweep_dir.name


def name_sweep_job(logger: Any, sweep_dir: str | Path, job_overrides: list[str], job: int) -> None:
    """Set ``logger.run_name`` and ``logger.group`` of a sweep job where the user left them
    null (:func:`sweep_job_names`)."""
    from omegaconf import open_dict

    name, group = sweep_job_names(Path(sweep_dir), job_overrides, job)
    varied = [] if name.startswith("job ") else name.split(",")
    with open_dict(logger):
        logger.run_name = logger.run_name or name
        logger.group = logger.group or group
        logger.tags = list(dict.fromkeys([*(logger.get("tags") or []),
                                          *(t[:64] for t in varied)]))

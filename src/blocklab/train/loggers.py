"""Experiment loggers by name. All write under the run directory; wandb stays offline unless
``logger.mode=online`` is asked for (online with no network blocks for ~100 s, then fails)."""

from __future__ import annotations

from pathlib import Path

from blocklab.config import LoggerConfig


def csv(cfg: LoggerConfig, run_dir: Path) -> list:
    from lightning.pytorch.loggers import CSVLogger

    return [CSVLogger(save_dir=run_dir, name="logs")]


def tensorboard(cfg: LoggerConfig, run_dir: Path) -> list:
    import importlib.util

    from lightning.pytorch.loggers import TensorBoardLogger

    from blocklab.config import ConfigError

    if not (importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX")):
        raise ConfigError("config error: logger=tensorboard: the tensorboard package is not "
                          "installed; pip install 'blocklab[tensorboard]'")

    return [*csv(cfg, run_dir), TensorBoardLogger(save_dir=run_dir, name="tensorboard")]


def wandb(cfg: LoggerConfig, run_dir: Path) -> list:
    from lightning.pytorch.loggers import WandbLogger

    return [*csv(cfg, run_dir), WandbLogger(project=cfg.project, save_dir=str(run_dir),
                                            mode=cfg.mode, name=run_dir.name)]


def none(cfg: LoggerConfig, run_dir: Path) -> list:
    return []


LOGGERS = {
    "csv": csv,
    "tensorboard": tensorboard,
    "wandb": wandb,
    "none": none,
}

"""Experiment loggers by name. All write under the run directory; wandb stays offline unless
``logger.mode=online`` is asked for (online with no network blocks for ~100 s, then fails).
The CSV log, which ``blocklab-compare`` reads, is always kept and flushed at every row
(train/metrics.py)."""

from __future__ import annotations

from pathlib import Path

from blocklab.config import LoggerConfig


def csv(cfg: LoggerConfig, run_dir: Path) -> list:
    from lightning.pytorch.loggers import CSVLogger

    return [CSVLogger(save_dir=run_dir, name="logs", flush_logs_every_n_steps=1)]


def tensorboard(cfg: LoggerConfig, run_dir: Path) -> list:
    """CSV plus TensorBoard (config.validate_logger checks the package is installed)."""
    from lightning.pytorch.loggers import TensorBoardLogger

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

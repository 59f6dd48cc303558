"""Thin entry points. Heavy imports (torch) happen inside the commands, so ``--help`` and
``--cfg job`` stay fast. Configs live in the repository's ``configs/`` folder."""

from __future__ import annotations

import sys
import warnings

import hydra
from omegaconf import DictConfig

from blocklab.config import ConfigError, config_dir, register_configs

CONFIG_DIR = config_dir()
warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # lightning 2.6 + torch 2.13 noise

register_configs()


_STARTED = False


def _console(main) -> None:
    """Console-script wrapper: Hydra exits 1 on a composition error (unknown group option,
    typo'd key, wrong type); report those with the config-error exit code like ours."""
    try:
        main()
    except SystemExit as e:
        if e.code == 1 and not _STARTED:
            sys.exit(ConfigError.exit_code)
        raise


def train_cli() -> None:
    _console(train)


def eval_cli() -> None:
    _console(evaluate)


def estimate_cli() -> None:
    _console(estimate)


def _run(fn, cfg: DictConfig):
    """Errors users can cause end in one line and a per-class exit code, no traceback."""
    global _STARTED
    _STARTED = True
    from omegaconf.errors import OmegaConfBaseException

    from blocklab.checkpoint import CheckpointError, StorageError
    from blocklab.data.text import DataError
    from blocklab.sweep import in_multirun, run_job
    from blocklab.train.run import Preempted

    if in_multirun():  # a failing job records its error; the sweep goes on
        return run_job(fn, cfg, (OmegaConfBaseException, ConfigError, CheckpointError,
                                 StorageError, DataError, FloatingPointError, Preempted))
    try:
        return fn(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        print(f"config error: {key}: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(ConfigError.exit_code)
    except (ConfigError, CheckpointError, StorageError, DataError, Preempted) as e:
        print(str(e.args[-1] if isinstance(e, OSError) else e), file=sys.stderr)
        sys.exit(e.exit_code)
    except FloatingPointError as e:
        print(str(e), file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 5))


def _train(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from blocklab.sweep import in_multirun, job_info
    from blocklab.train.run import train as run_train

    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    if in_multirun() and not cfg.resume:  # each job trains into <sweep dir>/<job number>
        with open_dict(cfg):
            cfg.run_dir = job_info()["run_dir"]
    run_dir = run_train(cfg, overrides)
    return objective_value(run_dir, cfg.objective)


def objective_value(run_dir, name: str) -> float:
    """The run's final ``name`` metric (what Hydra sweepers such as Optuna optimize)."""
    import json
    import math
    from pathlib import Path

    summary = Path(run_dir) / "summary.json"
    if not summary.exists():  # a DDP child process: rank 0 writes the summary
        return math.nan
    value = json.loads(summary.read_text())["metrics"].get(name)
    if value is None:  # e.g. val/loss in a run too short to validate: the run itself is fine
        print(f"warning: objective={name!r} is not a logged metric of this run; a sweeper "
              "sees NaN", file=sys.stderr)
        return math.nan
    return float(value)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def train(cfg: DictConfig) -> float | None:
    """Train a model: ``blocklab-train model/position=alibi model.n_layers=6``;
    continue one exactly with ``resume=<run dir or checkpoint>``; sweep with ``-m``."""
    return _run(_train, cfg)


def _eval(cfg: DictConfig) -> None:
    from omegaconf import OmegaConf

    from blocklab.eval import evaluate as ev

    spec = OmegaConf.to_object(cfg.probes)
    if (cfg.ckpt is None) == (cfg.hf_model is None):
        raise ConfigError(f"config error: ckpt={cfg.ckpt!r}, hf_model={cfg.hf_model!r}: give "
                          "exactly one (a blocklab run/checkpoint, or a Hugging Face model dir)")
    if cfg.hf_model is not None:
        r = ev.probe_hf(cfg.hf_model, spec, gguf_file=cfg.hf_gguf, out=cfg.out)
        print(f"probe results   {r.out_dir}")
        return
    r = ev.validation_loss(cfg.ckpt, batches=cfg.val_batches, batch_size=cfg.batch_size)
    print(f"checkpoint {r['checkpoint']} (step {r['step']}): val/loss {r['val_loss']:.4f} "
          f"over {r['val_targets']} targets")
    if spec.enabled:
        p = ev.probe_checkpoint(r["checkpoint"], spec, out=cfg.out)
        print(f"probe results   {p.out_dir}")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="eval")
def evaluate(cfg: DictConfig) -> None:
    """Evaluate a checkpoint on its own: ``blocklab-eval ckpt=<run dir or checkpoint>
    probes=full`` (validation loss + probes), or a Hugging Face causal LM:
    ``blocklab-eval hf_model=<dir> hf_gguf=<file> probes=text``."""
    _run(_eval, cfg)


def _estimate(cfg: DictConfig) -> None:
    from blocklab.config import model_config
    from blocklab.model.estimate import estimate, table

    m = model_config(cfg.model)
    seq_len = cfg.seq_len or m.max_seq_len
    e = estimate(m, batch=cfg.batch_size, seq_len=seq_len, bytes_per_value=cfg.bytes_per_value)
    print(table(m, e, batch=cfg.batch_size, seq_len=seq_len, bytes_per_value=cfg.bytes_per_value))


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="estimate")
def estimate(cfg: DictConfig) -> None:
    """Print parameters, FLOPs/token, activation and KV-cache memory for a model config:
    ``blocklab-estimate model=llama_tiny model.n_layers=32 seq_len=8192``."""
    _run(_estimate, cfg)


def _demo(cfg: DictConfig) -> None:
    import time

    import torch

    from blocklab.config import model_config
    from blocklab.model import build_model
    from blocklab.model.estimate import estimate as est
    from blocklab.model.generate import generate

    torch.manual_seed(0)
    m = model_config(cfg.model)
    model = build_model(m)
    print(f"built {m.family.name.value} model: {est(m).params:,} parameters")
    if m.family.name.value == "encoder":
        print("encoder-only: no generation demo")
        return
    prompt = torch.randint(0, m.vocab_size, (2, 16))
    extra = {"source_ids": prompt} if m.family.name.value == "encoder_decoder" else {}
    start = prompt[:, :1] if extra else prompt
    t0 = time.perf_counter()
    cached = generate(model, start, max_new_tokens=64, **extra)
    t1 = time.perf_counter()
    full = generate(model, start, max_new_tokens=64, use_cache=False, **extra)
    t2 = time.perf_counter()
    same = bool((cached == full).all())
    print(f"greedy generation, 2 x 64 new tokens: cached {t1 - t0:.2f}s, recompute {t2 - t1:.2f}s,"
          f" identical tokens: {same}")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="estimate")
def demo(cfg: DictConfig) -> None:
    """Build a model from config and generate from random weights, cached vs uncached."""
    _run(_demo, cfg)

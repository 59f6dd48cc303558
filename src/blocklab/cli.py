"""Thin entry points. Heavy imports (torch) happen inside the commands, so ``--help`` and
``--cfg job`` stay fast. Configs live in the repository's ``configs/`` folder."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from blocklab.config import ConfigError, config_dir, register_configs

CONFIG_DIR = config_dir()

register_configs()


def _run(fn, cfg: DictConfig) -> None:
    try:
        fn(cfg)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        sys.exit(e.exit_code)


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

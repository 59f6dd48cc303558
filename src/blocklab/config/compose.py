"""Composing configs as the command line does (blocklab's packaged configs plus user config
directories), and turning plain model configs (a checkpoint's) back into checked dataclasses."""

from __future__ import annotations

import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from blocklab.config.schema import (
    EstimateConfig,
    EvalConfig,
    ExportConfig,
    GenerateConfig,
    ImportConfig,
    ModelConfig,
    ProbeSpec,
    TrainConfig,
)
from blocklab.config.validate import validate_model
from blocklab.errors import ConfigError

CONFIG_MODULE = "blocklab.configs"  # the configs/ folder, shipped as package data
# The schema of each command's primary config (configs/<name>.yaml): the keys it may hold.
SCHEMAS: dict[str, type] = {"train": TrainConfig, "prepare": TrainConfig, "eval": EvalConfig,
                            "estimate": EstimateConfig, "import": ImportConfig,
                            "export": ExportConfig, "generate": GenerateConfig}


def config_dir() -> str:
    """Where blocklab's own configs are on disk (``configs/`` of a clone, or the installed
    package's copy)."""
    import importlib.resources

    return str(importlib.resources.files(CONFIG_MODULE))


def compose(config_name: str = "estimate", overrides: list[str] | tuple[str, ...] = (), *,
            config_dirs: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose a config exactly as the command line would, for Python use::

        cfg = compose("estimate", ["model=llama_tiny", "model/position=alibi"])
        model = blocklab.model.build_model(cfg.model)

    ``config_dirs`` are user config directories searched first (like ``--config-dir`` on the
    command line); user plugins are imported first (registry.load_plugins). Every error is a
    one-line :class:`ConfigError`, as on the command line: an unknown group option, a key the
    schema lacks (``+`` added ones too: config/strict.py), a wrong type.

    blocklab's Hydra launchers (``hydra/launcher=parallel|local|slurm``, e.g. chosen by
    ``experiment=position_extrapolation``) belong to the sweep layer above this one: the
    command line registers them; from Python, call ``hydra_plugins.blocklab_launchers.register()``
    before composing a config that selects one (docs/python-api.md)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    from blocklab.config.hydra_errors import composition_error
    from blocklab.config.strict import check_keys
    from blocklab.registry import load_plugins

    load_plugins()
    register_configs()
    extra = [f"hydra.searchpath=[{','.join('file://' + str(d) for d in config_dirs)}]"
             ] if config_dirs else []
    try:
        with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
            cfg = hydra_compose(config_name, overrides=[*overrides, *extra])
    except Exception as e:
        err = composition_error(e, overrides, SCHEMAS.get(config_name))
        if err is None:
            raise
        if re.search(r"hydra/launcher[/=]blocklab_", str(err)):  # the sweep layer's, unregistered
            err = ConfigError(f"{err} (blocklab's launchers are registered by the command line; "
                              "from Python call hydra_plugins.blocklab_launchers.register() "
                              "before compose)")
        raise err from None
    check_keys(cfg)
    return cfg


_STORED = False  # the schemas are in Hydra's ConfigStore (a process-wide singleton)


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore, and the resolver ``--help`` lists the
    config groups with (idempotent; the schemas are stored once per process: storing them
    again cost a third of every :func:`compose`)."""
    global _STORED
    from hydra.core.config_store import ConfigStore

    from blocklab.config.usage import register_help_resolver

    register_help_resolver()
    if _STORED:
        return
    cs = ConfigStore.instance()
    cs.store(name="estimate_schema", node=EstimateConfig)
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="eval_schema", node=EvalConfig)
    cs.store(name="import_schema", node=ImportConfig)
    cs.store(name="export_schema", node=ExportConfig)
    cs.store(name="generate_schema", node=GenerateConfig)
    cs.store(group="model", name="schema", node=ModelConfig)
    cs.store(group="probes", name="schema", node=ProbeSpec)
    _STORED = True


def model_config(cfg: DictConfig | ModelConfig | dict) -> ModelConfig:
    """Turn a composed ``cfg.model`` (DictConfig, plain dict or dataclass) into a checked
    :class:`ModelConfig`. Plain dicts (e.g. from a checkpoint) are merged onto the schema, so
    unknown keys and wrong types are rejected the same way as at compose time."""
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(cfg, ModelConfig):
        return validate_model(cfg)
    if isinstance(cfg, dict) and "_target_" in str(cfg):
        raise ConfigError("config error: model: '_target_' is not allowed in a model config")
    try:
        if isinstance(cfg, dict) or OmegaConf.get_type(cfg) is not ModelConfig:
            cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg)
        m = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        where = getattr(e, "full_key", None) or "?"
        first = str(e).splitlines()[0]
        raise ConfigError(f"config error: model.{where}: {first}") from None
    return validate_model(m)


def model_to_dict(m: ModelConfig) -> dict[str, Any]:
    """Plain, YAML-safe dict of a model config (enums as strings)."""
    return OmegaConf.to_container(OmegaConf.structured(m), enum_to_str=True)

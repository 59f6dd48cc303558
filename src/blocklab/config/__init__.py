"""Config schema (structured dataclasses) and the checks that run on a *composed* config.

Hydra composes YAML from ``configs/`` on top of these dataclasses, which catches unknown keys
and wrong types at compose time. The validators then check every value and the cross-field
rules of the *whole* composed config, after command-line overrides (``__post_init__`` would not
re-run after overrides) and before anything is built or written: :func:`validate_train` (a
training run: model, data, tokenizer, optimizer, schedule, trainer, logger and both probe
specs), :func:`validate_eval` (``blocklab-eval``), :func:`validate_model` (a model on its own)
and :func:`validate_probe_spec`. Every error is a :class:`ConfigError` whose one-line message
names the dotted key, the value and the rule: ``config error: <key>=<value!r>: <rule>[; <hint>]``.

This package must stay import-light (no torch): ``--cfg job`` and ``--help`` use it. Its
parts: ``schema`` (the dataclasses), ``validate`` and ``probes`` (the rules),
``checks`` (their one-line errors), ``compose`` (Hydra composition, user config directories,
plain model configs from checkpoints). Import from ``blocklab.config``.
"""

from blocklab.config.compose import (
    CONFIG_MODULE,
    compose,
    config_dir,
    model_config,
    model_to_dict,
    register_configs,
)
from blocklab.config.probes import validate_probe_spec
from blocklab.config.schema import (
    FILLERS,
    AttentionConfig,
    BlockConfig,
    DataConfig,
    DataName,
    EstimateConfig,
    EvalConfig,
    ExportConfig,
    FamilyConfig,
    FFNConfig,
    ImportConfig,
    LitmProbeConfig,
    LoggerConfig,
    ModelConfig,
    NeedleProbeConfig,
    NormConfig,
    OptimConfig,
    PerplexityProbeConfig,
    PositionConfig,
    ProbeSpec,
    RopeScaling,
    ScheduleConfig,
    TaskWeights,
    TextProbeConfig,
    TokenizerConfig,
    TokenizerName,
    TrainConfig,
    TrainerConfig,
    distinct_pairs,
    needle_min_length,
    resolve_kv_heads,
)
from blocklab.config.validate import (
    MODEL_AXES,
    validate_data,
    validate_eval,
    validate_logger,
    validate_mixture,
    validate_model,
    validate_optim,
    validate_run_probe_spec,
    validate_schedule,
    validate_train,
    validate_trainer,
)
from blocklab.errors import ConfigError

__all__ = [
    "CONFIG_MODULE", "FILLERS", "MODEL_AXES", "AttentionConfig", "BlockConfig", "ConfigError",
    "DataConfig", "DataName", "EstimateConfig", "EvalConfig", "ExportConfig", "FFNConfig",
    "FamilyConfig", "ImportConfig",
    "LitmProbeConfig", "LoggerConfig", "ModelConfig", "NeedleProbeConfig", "NormConfig",
    "OptimConfig", "PerplexityProbeConfig", "PositionConfig", "ProbeSpec", "RopeScaling",
    "ScheduleConfig", "TaskWeights", "TextProbeConfig", "TokenizerConfig", "TokenizerName",
    "TrainConfig", "TrainerConfig", "compose", "config_dir", "distinct_pairs", "model_config",
    "model_to_dict", "needle_min_length", "register_configs", "resolve_kv_heads",
    "validate_data", "validate_eval", "validate_logger", "validate_mixture", "validate_model",
    "validate_optim", "validate_probe_spec", "validate_run_probe_spec", "validate_schedule",
    "validate_train", "validate_trainer",
]

"""One validator per composed config, in sections by config group: every value and every
cross-field rule of the schema is checked before anything is built or written. The model's
rules are in validate_model.py (each component's own rules beside the component), the data's
in validate_data.py, a segment mode's in validate_segments.py, a probe spec's in probes.py; all
are re-exported here."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from blocklab.config.checks import _check, _each, _finite, _name, _one_of, finite_everywhere
from blocklab.config.probes import validate_probe_spec
from blocklab.config.schema import (
    ACCELERATORS,
    BEST_MODES,
    DATA_FORMATS,
    GRAD_NORMS,
    PRECISIONS,
    PROFILERS,
    ROW_METRICS,
    STRATEGIES,
    UTF8_ERRORS,
    WEIGHT_DECAY_MODES,
    DataName,
    EvalConfig,
    GenerateConfig,
    LoggerConfig,
    MonitorConfig,
    OptimConfig,
    ProbeSpec,
    ScheduleConfig,
    TokenizerName,
    TrainConfig,
    TrainerConfig,
)
from blocklab.config.validate_data import (  # noqa: F401  (re-exported)
    VAL_SPLITS,
    has_sources,
    validate_data,
    validate_mixture,
    validate_text_sources,
)
from blocklab.config.validate_model import (  # noqa: F401  (re-exported)
    MODEL_AXES,
    validate_model,
    validate_model_options,
)
from blocklab.config.validate_segments import validate_segment_run
from blocklab.errors import ConfigError


def validate_optim(o: OptimConfig, key: str = "optim") -> OptimConfig:
    """Every optimizer key, whichever optimizer uses it (the defaults are valid for all)."""
    from blocklab import registry

    optimizer = registry.lookup("optim", o.name, f"{key}.name")
    _check(_finite(o.lr) and o.lr > 0, f"{key}.lr", o.lr, "must be > 0")
    _check(len(o.betas) == 2, f"{key}.betas", o.betas, "needs two values [beta1, beta2]")
    _check(all(_finite(b) and 0 <= b < 1 for b in o.betas), f"{key}.betas", o.betas,
           "each beta must be in [0, 1)")
    _check(_finite(o.eps) and o.eps > 0, f"{key}.eps", o.eps, "must be > 0")
    _check(_finite(o.weight_decay) and o.weight_decay >= 0, f"{key}.weight_decay",
           o.weight_decay, "must be >= 0")
    _one_of(f"{key}.weight_decay_mode", o.weight_decay_mode, WEIGHT_DECAY_MODES)
    _check(_finite(o.z_loss) and o.z_loss >= 0, f"{key}.z_loss", o.z_loss,
           "must be >= 0 (0 = off; PaLM and OLMo use 1e-4)")
    _check(_finite(o.grad_clip) and o.grad_clip >= 0, f"{key}.grad_clip", o.grad_clip,
           "must be >= 0 (0 = off)")
    _check(_finite(o.momentum) and 0 <= o.momentum < 1, f"{key}.momentum", o.momentum,
           "must be in [0, 1)")
    rule = getattr(optimizer, "check", None)  # its own rules (train/optim.py: SGD's)
    if rule is not None:
        rule(o, key)
    return o


def validate_schedule(s: ScheduleConfig, key: str = "schedule") -> ScheduleConfig:
    from blocklab import registry

    registry.lookup("schedule", s.name, f"{key}.name")
    steps, ratio = f"{key}.warmup_steps", f"{key}.warmup_ratio"
    _check(s.warmup_steps is None or s.warmup_ratio is None, ratio, s.warmup_ratio,
           f"set one of {steps} and {ratio}, not both ({steps}={s.warmup_steps})",
           f"for a fraction of trainer.max_steps also pass {steps}=null")
    _check(s.warmup_steps is not None or s.warmup_ratio is not None, steps, s.warmup_steps,
           f"set one of {steps} and {ratio} (0 = no warmup)")
    _check(s.warmup_steps is None or s.warmup_steps >= 0, steps, s.warmup_steps, "must be >= 0")
    _check(s.warmup_ratio is None or (_finite(s.warmup_ratio) and 0 <= s.warmup_ratio < 1),
           ratio, s.warmup_ratio, "must be in [0, 1) (a fraction of trainer.max_steps)")
    _check(_finite(s.min_lr_ratio) and 0 <= s.min_lr_ratio <= 1, f"{key}.min_lr_ratio",
           s.min_lr_ratio, "must be in [0, 1] (a fraction of optim.lr)")
    return s


def validate_trainer(t: TrainerConfig, key: str = "trainer") -> TrainerConfig:
    """Lightning's names and the run's cadences; a GPU accelerator only where there is one
    (torch is imported only then)."""
    _one_of(f"{key}.accelerator", t.accelerator, ACCELERATORS)
    _one_of(f"{key}.precision", t.precision, PRECISIONS)
    _one_of(f"{key}.strategy", t.strategy, STRATEGIES)
    for name in ("devices", "num_nodes", "max_steps", "accumulate", "val_every_steps",
                 "ckpt_every_steps", "log_every_steps"):
        _check(getattr(t, name) >= 1, f"{key}.{name}", getattr(t, name), "must be >= 1")
    _check(t.keep_checkpoints >= 0, f"{key}.keep_checkpoints", t.keep_checkpoints,
           "must be >= 0 (0 = keep all)")
    _check(t.best_monitor is None or t.best_monitor in ROW_METRICS, f"{key}.best_monitor",
           t.best_monitor, f"must be null (early stopping's monitor, else val/loss) or one of "
           f"{', '.join(ROW_METRICS)}")
    _check(t.bptt >= 0, f"{key}.bptt", t.bptt,
           "must be >= 0 (segments per backward; 0 = the whole document, split mode)")
    _check(t.skip_nonfinite >= 0, f"{key}.skip_nonfinite", t.skip_nonfinite,
           "must be >= 0 (0 = stop at the first non-finite step)")
    _check(t.threads is None or t.threads >= 1, f"{key}.threads", t.threads,
           "must be null (leave as is) or >= 1")
    _check(t.peak_flops is None or (_finite(t.peak_flops) and t.peak_flops > 0),
           f"{key}.peak_flops", t.peak_flops, "must be null (measured on CPU) or > 0")
    _validate_trainer_options(t, key)
    if t.accelerator == "cpu":
        _check(t.strategy != "fsdp", f"{key}.strategy", t.strategy,
               "Lightning's FSDP needs GPUs", "use trainer=model_parallel (FSDP2) on CPU")
        _check(not t.precision.startswith("transformer-engine"), f"{key}.precision",
               t.precision, "Transformer Engine needs a GPU")
        _check(t.precision not in ("16-mixed", "16"), f"{key}.precision", t.precision,
               "float16 autocast with loss scaling is CUDA's: on CPU Lightning runs bf16-mixed "
               "instead", "use trainer.precision=bf16-mixed")
    if t.accelerator in ("gpu", "cuda"):
        import torch

        _check(torch.cuda.is_available(), f"{key}.accelerator", t.accelerator,
               "no CUDA GPU is available here (torch.cuda.is_available() is False)",
               "use trainer=cpu")
        have = torch.cuda.device_count()
        _check(t.devices <= have, f"{key}.devices", t.devices,
               f"more than the {have} CUDA GPU(s) of this machine")
    if t.accelerator == "mps":
        import torch

        _check(torch.backends.mps.is_available(), f"{key}.accelerator", t.accelerator,
               "no Apple MPS device is available here", "use trainer=cpu")
    return t


#: Lightning's max_time format (its Timer callback's string form).
MAX_TIME = r"(\d+):(\d\d):(\d\d):(\d\d)"


def _validate_trainer_options(t: TrainerConfig, key: str) -> None:
    """The Lightning options reachable from the trainer group (train/callbacks.py)."""
    import re

    _check(t.max_time is None or (isinstance(t.max_time, str)
                                  and re.fullmatch(MAX_TIME, t.max_time.strip()) is not None),
           f"{key}.max_time", t.max_time, "must be null or DD:HH:MM:SS (e.g. 00:12:00:00)",
           "quote it on the command line: trainer.max_time='00:00:30:00'")
    _check(t.profiler is None or t.profiler in PROFILERS, f"{key}.profiler", t.profiler,
           f"must be null (off) or one of {', '.join(PROFILERS)}")
    _one_of(f"{key}.log_grad_norm", t.log_grad_norm, GRAD_NORMS,
            "none: off; global: one norm over every parameter; layer: also one per block")


def validate_logger(lg: LoggerConfig, key: str = "logger") -> LoggerConfig:
    """The logger by name; one that ``combines`` others (``many``) names at least one, none of
    them ``standalone`` (``many``, ``none``); each chosen logger's own rules (``check``: wandb's
    mode, tensorboard's package; train/loggers.py)."""
    from blocklab import registry

    logger = registry.lookup("logger", lg.name, f"{key}.name")
    combines = getattr(logger, "combines", False)
    chosen = list(lg.loggers) if combines else [lg.name]
    _check(bool(chosen), f"{key}.loggers", list(lg.loggers),
           f"logger={lg.name} needs at least one logger", "e.g. logger.loggers=[tensorboard,wandb]")
    components = []
    for name in chosen:
        component = registry.lookup("logger", name, f"{key}.loggers")
        _check(not (combines and getattr(component, "standalone", False)), f"{key}.loggers",
               list(lg.loggers), f"{name!r} cannot be one of several loggers")
        components.append(component)
    for component in components:
        rule = getattr(component, "check", None)
        if rule is not None:
            rule(lg, key)
    _each(f"{key}.tags", lg.tags, lambda t: isinstance(t, str) and 0 < len(t.strip()) <= 64,
          "each tag must be a non-empty string of at most 64 characters (wandb's limit)",
          required=False)
    return lg


def validate_callbacks(callbacks: dict[str, Any], key: str = "callbacks") -> dict[str, Any]:
    """Each callback by its registered name, its options a mapping; a callback with a
    ``check(options, key)`` states its own rules (train/callbacks.py)."""
    from blocklab import registry

    for name, options in callbacks.items():
        component = registry.lookup("callback", name, f"{key}.{name}")
        _check(options is None or isinstance(options, dict), f"{key}.{name}", options,
               "must be a mapping of that callback's options (or {})")
        check = getattr(component, "check", None)
        if check is not None:
            check(dict(options or {}), f"{key}.{name}")
    return callbacks


def watched(callbacks: dict[str, Any]) -> tuple[str, str, str] | None:
    """(metric, mode, key) of the first configured callback that watches a metric of the
    logged rows — a component with ``watches(options, key)``: early stopping, its monitor and
    mode —; None without one."""
    from blocklab import registry

    for name, options in callbacks.items():
        watches = getattr(registry.lookup("callback", name, f"callbacks.{name}"), "watches", None)
        if watches is not None:
            metric, mode = watches(dict(options or {}), f"callbacks.{name}")
            return metric, mode, f"callbacks.{name}.monitor"
    return None


def best_rule(tc: TrainConfig) -> tuple[str, str] | None:
    """(metric, mode) that decides the best checkpoint: ``trainer.best_monitor``, else what
    early stopping watches, else val/loss (min); None with ``trainer.keep_best=false``.
    Refused in one line: a ``best_monitor`` other than early stopping's (one "best" a run)."""
    t = tc.trainer
    if not t.keep_best:
        return None
    stops = watched(tc.callbacks)
    if stops is not None:
        _check(t.best_monitor in (None, stops[0]), "trainer.best_monitor", t.best_monitor,
               f"early stopping watches {stops[0]} ({stops[2]}), and the best checkpoint is "
               "the one it calls best", "leave trainer.best_monitor null or make them the same")
        return stops[0], stops[1]
    metric = t.best_monitor or "val/loss"
    return metric, BEST_MODES[metric]


def validate_train(tc: TrainConfig) -> TrainConfig:
    """Every key of a composed training config, before any data is read, any model built or
    any file written; returns it unchanged. ``model.vocab_size`` may still be null here (the
    tokenizer decides; training checks it against the tokenizer once that is built)."""
    finite_everywhere(tc, "")  # no NaN or inf reaches any rule below
    validate_model(dataclasses.replace(
        tc.model, vocab_size=1 if tc.model.vocab_size is None else tc.model.vocab_size))
    validate_data(tc.data, tc.tokenizer)
    validate_model_options(tc.model, tc.data)
    if tc.data.packing:  # the family's objective says whether it packs rows
        from blocklab import registry

        objective = registry.lookup("objective", tc.model.family.name, "model.family.name")
        _check(getattr(objective, "packs", False), "data.packing", True,
               f"the {tc.model.family.name} objective does not pack documents into rows",
               "packing is for decoders (causal LM)")
    validate_optim(tc.optim)
    validate_schedule(tc.schedule)
    validate_trainer(tc.trainer)
    validate_segment_run(tc)
    validate_logger(tc.logger)
    validate_callbacks(tc.callbacks)
    validate_monitors(tc.monitors)
    best_rule(tc)
    for key in ("probes", "checkpoint_probes"):  # each as it runs for this tokenizer
        setattr(tc, key, validate_run_probe_spec(getattr(tc, key), tc, key))
    return tc


def validate_monitors(mc: MonitorConfig, key: str = "monitors") -> MonitorConfig:
    """The stability monitors' cadence and ranges (train/monitors.py)."""
    _check(mc.every >= 0, f"{key}.every", mc.every, "must be >= 0 (0 = off)")
    _check(mc.batch_size >= 1, f"{key}.batch_size", mc.batch_size, "must be >= 1")
    _check(mc.loss_window >= 1, f"{key}.loss_window", mc.loss_window,
           "must be >= 1 (1 = the raw step loss)")
    for f in dataclasses.fields(mc):
        value = getattr(mc, f.name)
        if isinstance(value, float):
            _check(_finite(value) and value > 0, f"{key}.{f.name}", value, "must be > 0")
    return mc


def validate_run_probe_spec(spec: ProbeSpec, tc: TrainConfig, key: str = "probes") -> ProbeSpec:
    """A probe spec for the model of training run ``tc`` (its config when training, the stored
    one for a checkpoint): the run's tokenizer decides the builder, a synthetic run's data how
    many distinct keys and values the probes may draw."""
    synthetic = _name(tc.tokenizer.name) == TokenizerName.synthetic.value
    data = tc.data if _name(tc.data.name) == DataName.synthetic.value else None
    return validate_probe_spec(spec, key, synthetic=synthetic, data=data)


#: blocklab-eval's run_data: which data the validation loss is computed on (eval/rundata.py).
RUN_DATA = ("auto", "true", "false")


def validate_eval(cfg: EvalConfig) -> EvalConfig:
    """``blocklab-eval``'s own keys and its probe spec (checked again, against the run's
    vocabulary, once the checkpoint is known: :func:`validate_probe_spec` with ``data``)."""
    finite_everywhere(cfg, "")
    if (cfg.ckpt is None) == (cfg.hf_model is None):
        raise ConfigError(f"config error: ckpt={cfg.ckpt!r}, hf_model={cfg.hf_model!r}: give "
                          "exactly one (a blocklab run/checkpoint, or a Hugging Face model dir)")
    _check(cfg.hf_gguf is None or cfg.hf_model is not None, "hf_gguf", cfg.hf_gguf,
           "a GGUF file inside hf_model; only with hf_model")
    for name in ("val_batches", "batch_size"):
        value = getattr(cfg, name)
        _check(value is None or value >= 1, name, value,
               "must be null (the run's data." + name + ") or >= 1")
    cfg.run_data = str(cfg.run_data).lower()  # true / false arrive as "True" / "False"
    _one_of("run_data", cfg.run_data, RUN_DATA, "auto: the run's data where that opens no "
            "file (synthetic); true: read the run's recorded text sources; false: no loss")
    if has_sources(cfg.data):
        _check(cfg.hf_model is None, "data", _name(cfg.data.name),
               "the loss on another corpus is for blocklab checkpoints (ckpt=), not hf_model")
        _check(_name(cfg.data.name) == DataName.text.value, "data.name", _name(cfg.data.name),
               "blocklab-eval data= evaluates on text (data=text_files and data.files / "
               "data.val_files)", "a synthetic run's own data is its validation loss (run_data)")
        validate_text_sources(cfg.data, evaluation=True)
        _one_of("data.format", cfg.data.format, DATA_FORMATS)
        _one_of("data.utf8_errors", cfg.data.utf8_errors, UTF8_ERRORS)
    cfg.probes = validate_probe_spec(cfg.probes, "probes",
                                     synthetic=False if cfg.hf_model else None)
    _validate_harness(cfg)
    return cfg


def _validate_harness(cfg: EvalConfig) -> None:
    """``harness=[tasks]`` and its options (eval/harness_tasks.py), before anything loads."""
    import importlib.util
    from pathlib import Path

    tasks = list(cfg.harness or [])
    for key in ("harness_fewshot", "harness_limit", "harness_include"):
        _check(tasks or getattr(cfg, key) is None, key, getattr(cfg, key),
               "applies to harness=[task,...] tasks, and none is named")
    if not tasks:
        return
    _check(all(isinstance(t, str) and t.strip() for t in tasks), "harness", tasks,
           "lm-evaluation-harness task names")
    _check(cfg.hf_model is None, "harness", tasks, "for blocklab checkpoints (ckpt=); a "
           "Hugging Face model runs in lm-eval itself (lm_eval --model hf)")
    _check(importlib.util.find_spec("lm_eval") is not None, "harness", tasks,
           "needs lm-evaluation-harness: pip install 'blocklab[harness]'")
    _check(cfg.harness_fewshot is None or cfg.harness_fewshot >= 0, "harness_fewshot",
           cfg.harness_fewshot, "null (each task's own) or >= 0")
    limit = cfg.harness_limit
    _check(limit is None or (limit > 0 and (limit < 1 or float(limit).is_integer())),
           "harness_limit", limit, "null (every example), a count >= 1, or a share in (0, 1)")
    _check(cfg.harness_include is None or Path(cfg.harness_include).is_dir(), "harness_include",
           cfg.harness_include, "a directory of lm-eval task YAML files")


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def validate_generate(cfg: GenerateConfig) -> GenerateConfig:
    """``blocklab-generate``'s keys, before the checkpoint is read: one source of prompts,
    sampling knobs in range (``temperature=0`` is greedy; ``top_k`` 0 / null and ``top_p`` 1 /
    null are off), a device torch can name."""
    finite_everywhere(cfg, "")
    _check(bool(cfg.ckpt), "ckpt", cfg.ckpt, "required (a run directory, a checkpoint "
           "directory or a blocklab-import output)")
    _check(cfg.prompt is None or cfg.prompt_file is None, "prompt_file", cfg.prompt_file,
           "give prompt or prompt_file, not both")
    for key in ("prompt", "prompt_file"):
        _check(not cfg.interactive or getattr(cfg, key) is None, key, getattr(cfg, key),
               f"interactive=true reads the prompts from stdin, one a line; drop {key}")
    _check(isinstance(cfg.max_new_tokens, int) and cfg.max_new_tokens >= 1, "max_new_tokens",
           cfg.max_new_tokens, "must be an int >= 1")
    _check(_finite(cfg.temperature) and cfg.temperature >= 0, "temperature", cfg.temperature,
           "must be a finite number >= 0 (0 = greedy)")
    _check(cfg.top_k is None or cfg.top_k >= 0, "top_k", cfg.top_k, "must be null or >= 0 "
           "(0 or null = off)")
    _check(cfg.top_p is None or (_finite(cfg.top_p) and 0 < cfg.top_p <= 1), "top_p", cfg.top_p,
           "must be null or in (0, 1] (1 or null = off)")
    _check(cfg.seed is None or 0 <= cfg.seed < 2**63, "seed", cfg.seed,
           "must be null (a fresh random seed) or an int >= 0")
    _check(cfg.num_samples >= 1, "num_samples", cfg.num_samples, "must be >= 1")
    _check(_DEVICE.fullmatch(str(cfg.device)) is not None, "device", cfg.device,
           "one of auto, cpu, cuda, cuda:N, mps")
    _check(cfg.threads is None or cfg.threads >= 1, "threads", cfg.threads,
           "must be null (torch's default) or >= 1")
    return cfg

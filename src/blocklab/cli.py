"""Thin entry points. Heavy imports (torch) happen inside the commands, so ``--help`` and
``--cfg job`` stay fast. blocklab's configs ship inside the package (``pkg://blocklab.configs``);
a user config directory adds presets and experiments with Hydra's ``--config-dir DIR`` (or
``hydra.searchpath=[file://DIR]``), and user components are imported before composing
(``registry.load_plugins``)."""

from __future__ import annotations

import os
import re
import sys
import warnings

import hydra
from omegaconf import DictConfig

from blocklab.config import CONFIG_MODULE, ConfigError, register_configs
from blocklab.errors import standard_output

CONFIG_PATH = f"pkg://{CONFIG_MODULE}"
warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # lightning 2.6 + torch 2.13 noise

register_configs()


_STARTED = False


def _console(main, config_name: str) -> None:
    """Console-script wrapper. Hydra's composition errors (unknown group option, typo'd key,
    wrong type, an override it cannot parse) end in one line and the config-error exit code
    like ours: Hydra is asked to raise them (``HYDRA_FULL_ERROR=1``) and they are reworded
    here (config/hydra_errors.py). Set HYDRA_FULL_ERROR=1 yourself for Hydra's own report.
    Standard output is written through ``errors.standard_output``: a full disk is one line
    (exit 6), a reader that went away (``| head``) a quiet exit 141."""
    with standard_output():
        _console_command(main, config_name)


def _console_command(main, config_name: str) -> None:
    from blocklab.config import SCHEMAS
    from blocklab.registry import load_plugins
    from hydra_plugins.blocklab_launchers import register as register_launchers

    register_launchers()  # hydra/launcher=parallel, local, slurm (configs/hydra/launcher/)
    try:
        load_plugins()
    except ConfigError as e:
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)
    users_own = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except SystemExit as e:
        if e.code == 1 and not _STARTED:
            sys.exit(ConfigError.exit_code)
        raise
    except Exception as e:
        err = None if users_own == "1" else _before_start(e, sys.argv[1:],
                                                          SCHEMAS.get(config_name))
        if err is None:
            raise
        print(err, file=sys.stderr)
        sys.exit(err.exit_code)
    finally:
        if users_own is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = users_own


def _before_start(e: Exception, argv: list[str], schema: type | None) -> ConfigError | None:
    """A composition error as a one-line ConfigError; None for anything else (a bug: its
    traceback is shown). Hydra's own errors are the user's at any time (a sweeper composes
    later batches after jobs ran); OmegaConf's and Hydra's argument checks only before the
    command started (``_run`` reports those of a running command itself)."""
    from hydra.errors import HydraException

    from blocklab.config import composition_error

    if isinstance(e, HydraException | ConfigError) or not _STARTED:
        err = composition_error(e, [a for a in argv if not a.startswith("-")], schema)
        if err is not None:
            return err
    if not _STARTED and type(e) is ValueError and _raised_in(e, "hydra."):
        return ConfigError(f"config error: {str(e).splitlines()[0]}")
    return None


def _raised_in(e: BaseException, package: str) -> bool:
    """Whether the innermost frame of ``e``'s traceback is in ``package``."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith(package)


def train_cli() -> None:
    _console(train, "train")


def eval_cli() -> None:
    _console(evaluate, "eval")


def estimate_cli() -> None:
    _console(estimate, "estimate")


def prepare_cli() -> None:
    _console(prepare, "prepare")


def import_cli() -> None:
    _console(import_hf, "import")


def export_cli() -> None:
    _console(export_hf, "export")


def generate_cli() -> None:
    sys.argv = [sys.argv[0], *verbatim(sys.argv[1:], VERBATIM["generate"])]
    _console(generate, "generate")


#: Keys whose command-line value is text, taken as typed (after the shell's quoting): Hydra's
#: override grammar would read ``prompt=def main(`` as a broken function call, a comma as a
#: sweep, ``=``, quotes, brackets and ``${...}`` as syntax.
VERBATIM = {"generate": ("prompt",)}


def verbatim(argv: list[str], keys: tuple[str, ...]) -> list[str]:
    """``argv`` with each ``key=<text>`` (``++key=`` too) of ``keys`` rewritten as the Hydra
    override that sets ``key`` to exactly ``<text>``: a single-quoted Hydra string in which
    OmegaConf sees no interpolation. Every other argument is left to Hydra as it is."""
    out = []
    for arg in argv:
        m = re.fullmatch(r"(\+\+)?([\w.]+)=(.*)", arg, re.DOTALL)
        if m is None or m.group(2) not in keys:
            out.append(arg)
            continue
        # OmegaConf: "${" escaped, a run of backslashes before it doubled
        text = re.sub(r"(\\*)\$\{", lambda g: g.group(1) * 2 + "\\${", m.group(3))
        # Hydra's quoted string: quotes escaped, a run of backslashes before a quote or the
        # closing quote doubled
        text = re.sub(r"(\\*)('|\Z)", lambda g: g.group(1) * 2 + ("\\'" if g.group(2) else ""),
                      text)
        out.append(f"{m.group(1) or ''}{m.group(2)}='{text}'")
    return out


def _run(fn, cfg: DictConfig):
    """Errors users can cause end in one line and a per-class exit code, no traceback. The
    composed config first holds only keys its schema declares (``+`` adds any key)."""
    global _STARTED
    _STARTED = True
    from omegaconf.errors import OmegaConfBaseException

    from blocklab.checkpoint import CheckpointError
    from blocklab.config import check_keys
    from blocklab.errors import DataError, StorageError
    from blocklab.sweep import in_multirun, run_job

    def checked(c: DictConfig):
        check_keys(c)
        return fn(c)

    def users(e: BaseException) -> bool:
        """An error users cause (numerical ones included: exit 5). ``Preempted`` is
        training's (train/run.py, which imports Lightning: seconds that import, export,
        generate and eval do not spend): only a command that imported it can raise it."""
        run = sys.modules.get("blocklab.train.run")
        return isinstance(e, (ConfigError, CheckpointError, StorageError, DataError,
                              FloatingPointError)) or (
            run is not None and isinstance(e, run.Preempted))

    if in_multirun():  # a failing job records its error; the sweep goes on
        from blocklab.train.run import Preempted

        return run_job(checked, cfg, (OmegaConfBaseException, ConfigError, CheckpointError,
                                      StorageError, DataError, FloatingPointError, Preempted))
    try:
        return checked(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        print(f"config error: {key}: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(ConfigError.exit_code)
    except Exception as e:
        if not users(e):
            raise
        print(str(e.args[-1] if isinstance(e, OSError) else e), file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 5))  # a FloatingPointError without one: numerical


def _train(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from blocklab.sweep import in_multirun, job_info
    from blocklab.train.run import train as run_train

    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    if in_multirun() and not cfg.resume:  # each job trains into <sweep dir>/<job number>
        with open_dict(cfg):
            cfg.run_dir = job_info()["run_dir"]
        from blocklab.train.loggers import name_sweep_job  # named by its varied keys

        name_sweep_job(cfg.logger, HydraConfig.get().sweep.dir, overrides, job_info()["job"])
    run_dir = run_train(cfg, overrides)
    # what a sweeper (Optuna) optimizes; a single run has no one to return it to
    return objective_value(run_dir, cfg.objective) if in_multirun() else None


def objective_value(run_dir, name: str) -> float:
    """The run's final ``name`` metric (what Hydra sweepers such as Optuna optimize)."""
    import json
    import math
    from pathlib import Path

    summary = Path(run_dir) / "summary.json"
    if not summary.exists():  # a DDP child process: rank 0 writes the summary
        return math.nan
    value = json.loads(summary.read_text())["metrics"].get(name)
    if value is None:  # e.g. a metric this run never logs (a typo): the run itself is fine
        print(f"warning: objective={name!r} is not a logged metric of this run; a sweeper "
              "sees NaN", file=sys.stderr)
        return math.nan
    return float(value)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="train")
def train(cfg: DictConfig) -> float | None:
    """Train a model: ``blocklab-train model/position=alibi model.n_layers=6``;
    continue one exactly with ``resume=<run dir or checkpoint>``; sweep with ``-m``."""
    return _run(_train, cfg)


def _eval(cfg: DictConfig) -> None:
    from omegaconf import OmegaConf

    from blocklab.config import validate_eval
    from blocklab.eval import evaluate as ev

    ec = validate_eval(OmegaConf.to_object(cfg))  # every key, before anything is loaded
    spec = ec.probes
    if ec.hf_model is not None:
        if ec.out is not None:
            from blocklab.runlock import writable_dir

            writable_dir(ec.out, "out=")  # before the model is loaded
        r = ev.probe_hf(ec.hf_model, spec, gguf_file=ec.hf_gguf, out=ev.probe_out(ec.out, spec))
        print(f"probe results   {r.out_dir}")
        return
    r, p = ev.evaluate_checkpoint(ec.ckpt, spec, val_batches=ec.val_batches,
                                  batch_size=ec.batch_size, out=ec.out, run_data=ec.run_data,
                                  data=ec.data,
                                  harness={"tasks": ec.harness, "fewshot": ec.harness_fewshot,
                                           "limit": ec.harness_limit,
                                           "include": ec.harness_include})
    for line in ev.result_lines(r):
        print(line)
    if p is not None:
        print(f"probe results   {p.out_dir}")


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="eval")
def evaluate(cfg: DictConfig) -> None:
    """Evaluate a checkpoint on its own: ``blocklab-eval ckpt=<run dir or checkpoint>
    probes=full`` (validation loss + probes; a text run's loss on its own sources with
    ``run_data=true``), or a Hugging Face causal LM:
    ``blocklab-eval hf_model=<dir> hf_gguf=<file> probes=text``."""
    _run(_eval, cfg)


def _estimate(cfg: DictConfig) -> None:
    from blocklab.config import model_config
    from blocklab.model.estimate import estimate, table

    m = model_config(cfg.model)
    seq_len = m.max_seq_len if cfg.seq_len is None else cfg.seq_len  # 0 is refused, not null
    e = estimate(m, batch=cfg.batch_size, seq_len=seq_len, bytes_per_value=cfg.bytes_per_value)
    print(table(m, e, batch=cfg.batch_size, seq_len=seq_len, bytes_per_value=cfg.bytes_per_value))


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="estimate")
def estimate(cfg: DictConfig) -> None:
    """Print parameters, FLOPs/token, activation and KV-cache memory for a model config:
    ``blocklab-estimate model=llama_tiny model.n_layers=32 seq_len=8192``."""
    _run(_estimate, cfg)


def _prepare(cfg: DictConfig) -> None:
    from omegaconf import OmegaConf

    from blocklab.config import DataName, TrainConfig, validate_data
    from blocklab.data.prepare import prepare as prepare_corpus

    tc: TrainConfig = OmegaConf.to_object(cfg)
    validate_data(tc.data, tc.tokenizer)
    if tc.data.name is not DataName.text:
        raise ConfigError(f"config error: data.name={tc.data.name.value!r}: only text data is "
                          "prepared (synthetic data is generated on the fly)")
    p = prepare_corpus(tc.data, tc.tokenizer)
    m = p.meta
    print(f"prepared corpus {p.path}: {m['documents']:,} documents, {m['tokens']:,} tokens "
          f"({m['dtype']}, {m['shards']} shards) from {m['bytes'] / 1e6:.1f} MB; fingerprint "
          f"{p.fingerprint}")


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="prepare")
def prepare(cfg: DictConfig) -> None:
    """Tokenize a text corpus once into memory-mapped token shards, reused by every later run
    with the same sources, tokenizer and reading settings (training does it on first use too):
    ``blocklab-prepare data=text_files 'data.files=[corpus/]' tokenizer=bpe``."""
    _run(_prepare, cfg)


def _import(cfg: DictConfig) -> None:
    from omegaconf import OmegaConf

    from blocklab.convert import import_model

    ic = OmegaConf.to_object(cfg)
    if not ic.from_hf:
        raise ConfigError("config error: from_hf=None: required (a Hugging Face model directory "
                          "or hub id)")
    target = import_model(ic.from_hf, ic.out, gguf=ic.gguf, ignore_fields=tuple(ic.ignore_fields),
                          overwrite=ic.overwrite)
    print(f"imported checkpoint {target}\n"
          f"  evaluate:   blocklab-eval ckpt={target.parent.parent} probes=text\n"
          f"  fine-tune:  blocklab-train init_from={target.parent.parent} data=... tokenizer=file "
          f"tokenizer.path=...")


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="import")
def import_hf(cfg: DictConfig) -> None:
    """Import a pretrained Hugging Face model as a blocklab checkpoint:
    ``blocklab-import from_hf=<dir or org/name> [gguf=<file>] [out=<dir>] [overwrite=true]``."""
    _run(_import, cfg)


def _export(cfg: DictConfig) -> None:
    from omegaconf import OmegaConf

    from blocklab.convert import export_model

    ec = OmegaConf.to_object(cfg)
    for key in ("ckpt", "out"):
        if not getattr(ec, key):
            raise ConfigError(f"config error: {key}=None: required")
    export_model(ec.ckpt, ec.out, arch=ec.arch, overwrite=ec.overwrite)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="export")
def export_hf(cfg: DictConfig) -> None:
    """Export a checkpoint as a Hugging Face model directory:
    ``blocklab-export ckpt=<run dir or checkpoint> out=<dir> [arch=<name>]
    [overwrite=true]``; ``arch`` one of ``blocklab.convert.ARCHITECTURES`` (llama, mistral,
    qwen2, qwen3, olmo2, llama4, gemma2, gemma3, gpt2, bert, t5), chosen from the model when
    left out."""
    _run(_export, cfg)


def _generate(cfg: DictConfig) -> None:
    from omegaconf import OmegaConf

    from blocklab.config.validate import validate_generate
    from blocklab.sample import run

    run(validate_generate(OmegaConf.to_object(cfg)))  # every key, before anything is loaded


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="generate")
def generate(cfg: DictConfig) -> None:
    """Sample from a run, a checkpoint or an import, streaming tokens as they come:
    ``blocklab-generate ckpt=<run dir or checkpoint> prompt="..." [temperature=0]
    [max_new_tokens=N] [seed=S] [num_samples=K]``; ``prompt_file=<file>``;
    ``interactive=true`` (one prompt a line on stdin); ``chat=true`` (the tokenizer's chat
    template, imported models)."""
    _run(_generate, cfg)

"""One training run, from a composed config to a versioned run directory.

Order matters: validate the whole config, check the output directory, resolve and check a
resume target — all before any data or model work — then build, fit, and print where
everything is.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from blocklab import checkpoint as ckpt
from blocklab.config import ConfigError, TrainConfig, model_to_dict, validate_train
from blocklab.config.migrate import legacy_config, legacy_layout
from blocklab.eval.rundata import listing, record, sources_changed
from blocklab.provenance import arch_hash, config_hash, git_info, text_hash, versions
from blocklab.runlock import run_lock, writable_dir
from blocklab.train.best import cadence_warning, say
from blocklab.train.flops import (  # noqa: F401  (re-exported: train.run.GPU_PEAK_FLOPS ...)
    GPU_PEAK_FLOPS,
    device_peak_flops,
    measure_peak_flops,
    peak_flops_for,
)
from blocklab.train.optim import warmup_warning
from blocklab.train.probing import final_probes, probe_callbacks
from blocklab.train.result import RunDir
from blocklab.train.resume import (
    changes,
    check_resume,
    open_target,
    recorded_changes,
    refuse_before_data,
    refuse_data_change,
    resumed_config,
)
from blocklab.train.runfiles import write_run_files


def to_train_config(cfg: DictConfig) -> TrainConfig:
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(f"config error: {getattr(e, 'full_key', '?')}: "
                          f"{str(e).splitlines()[0]}") from None


def plain_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain data (enums as strings, no OmegaConf objects)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def new_run_dir(cfg: TrainConfig) -> Path:
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    return Path(cfg.out_root) / cfg.experiment_name / f"{stamp}-{secrets.token_hex(3)}"


def refuse_fresh_run_over_checkpoints(path: Path) -> None:
    """A new run never writes into a directory that holds another run's checkpoints."""
    if ckpt.list_checkpoints(path):
        raise ConfigError(f"config error: run_dir={str(path)!r}: already holds checkpoints; "
                          f"pass resume={path} to continue that run, or use a new directory")


def _loggers(tc: TrainConfig, run_dir: Path, meta: dict[str, Any]) -> list:
    """The run's loggers, each given the resolved config as hyperparameters (rank 0)."""
    from blocklab.train.loggers import build_loggers, log_config

    loggers = build_loggers(tc.logger, run_dir)
    if not ddp_child():
        log_config(loggers, meta["config"], meta["config_yaml"])
    return loggers


def train(cfg: DictConfig, overrides: list[str] | None = None) -> RunDir:
    """Run a training job from a composed ``train`` config; return the run directory (a
    ``Path`` that also reads the run's summary and finds its checkpoint). A resume
    trains with the run's own stored config, the command line's changes on top
    (train/resume.py)."""
    with contextlib.ExitStack() as owner:
        loaded = init = None
        if cfg.get("resume"):  # owns the run directory, then reads the checkpoint's config
            loaded = open_target(str(cfg.resume), owner, child=ddp_child())
            cfg, overrides = resumed_config(cfg, overrides, loaded)
            # what the configs alone refuse, before the config is validated or data is read
            refuse_before_data(_stored(loaded), plain_config(cfg), target=str(cfg.resume),
                               allow_data_change=bool(cfg.get("allow_data_change")))
        elif cfg.get("init_from"):  # the architecture (and tokenizer) come from the source
            from blocklab.train.init import apply_init_from

            init = apply_init_from(cfg, overrides or [])
        tc = validate_train(to_train_config(cfg))  # every key, before anything is written
        resume_from, old, run_dir = _target(tc, loaded)
        if not ddp_child():
            for line in (warmup_warning(tc.schedule, tc.trainer.max_steps, tc.optim.lr),
                         cadence_warning(tc)):
                say(line)
        from blocklab.data.streams import build_streams

        streams = build_streams(tc.data, tc.tokenizer, bptt=tc.trainer.bptt)  # validates data
        if streams.description:
            print(f"data: {streams.description}", file=sys.stderr)
        if init is not None:
            from blocklab.train.init import check_tokenizer

            check_tokenizer(init, streams.tokenizer, streams.specials.to_dict())
        sources = record(tc.data)  # text: which files (to name those that change later)
        changed = None
        if old is not None:  # other data refused before the model is sized to its tokenizer
            changed = sources_changed(old.get("data_sources"), sources or listing(tc.data))
            refuse_data_change(old, changes(old, plain_config(cfg)), changed=changed,
                               allow_data_change=tc.allow_data_change,
                               fingerprints=_fingerprints(streams))
        size_vocabulary(tc, cfg, streams.vocab_size)
        if resume_from is None and not ddp_child():
            writable_dir(run_dir, "run directory")  # the first write, once all above is valid
            owner.enter_context(run_lock(run_dir, "train"))
            refuse_fresh_run_over_checkpoints(run_dir)
        return RunDir(_launch(cfg, tc, run_dir, streams, resume_from, old, overrides, init,
                              sources=sources, changed=changed))


def _stored(loaded: ckpt.Loaded) -> dict[str, Any]:
    """A checkpoint's metadata, its config as read through the schema (plain data)."""
    return {**loaded.meta, "config": plain_config(OmegaConf.structured(loaded.config))}


def _fingerprints(streams) -> dict[str, str]:
    return {"data_fingerprint": streams.fingerprint, "tokenizer_hash": text_hash(streams.tokenizer)}


#: model.vocab_size this far above the tokenizer's size is said (a factor, and at least so many
#: more ids: a vocabulary padded to a round size for speed is not)
VOCAB_SLACK = (2.0, 64)


def size_vocabulary(tc: TrainConfig, cfg: DictConfig, vocab: int) -> None:
    """``model.vocab_size``: null (what every text tokenizer's config option sets over a model
    preset's number) is the tokenizer's size, stored resolved in the run's config; a size set
    on the command line or in an experiment is kept — refused below the tokenizer's size (an id
    without an embedding row), said when far above it (rows no token uses)."""
    n = tc.model.vocab_size
    if n is None:
        tc.model.vocab_size = vocab
        with open_dict(cfg):
            cfg.model.vocab_size = vocab
        return
    if n < vocab:
        raise ConfigError(f"config error: model.vocab_size={n}: smaller than the tokenizer's "
                          f"vocabulary ({vocab}); model.vocab_size=null sizes the model from "
                          "the tokenizer")
    if n > VOCAB_SLACK[0] * vocab and n - vocab > VOCAB_SLACK[1]:
        print(f"warning: model.vocab_size={n} is {n / vocab:.1f}x the tokenizer's {vocab:,} ids: "
              f"{n - vocab:,} embedding rows no token uses; model.vocab_size=null sizes the "
              "model from the tokenizer", file=sys.stderr)


def _target(tc: TrainConfig, loaded: ckpt.Loaded | None
            ) -> tuple[ckpt.Loaded | None, dict[str, Any] | None, Path]:
    """(checkpoint to resume from, as read, its metadata — its config as read through the
    schema —, run directory)."""
    if loaded is not None:
        return loaded, _stored(loaded), ckpt.run_dir_of(tc.resume)
    if ddp_child():  # a DDP process Lightning started: rank 0 chose the directory
        return None, None, Path(os.environ["BLOCKLAB_RUN_DIR"])
    return None, None, Path(tc.run_dir) if tc.run_dir else new_run_dir(tc)


def _launch(cfg: DictConfig, tc: TrainConfig, run_dir: Path, streams,
            resume_from: ckpt.Loaded | None, old: dict[str, Any] | None,
            overrides: list[str] | None, init=None, *, sources: list | None = None,
            changed: str | None = None) -> Path:
    """Check a resume against its checkpoint, write the run's files (rank 0), and fit."""
    from blocklab.model.estimate import count_params

    os.environ["BLOCKLAB_RUN_DIR"] = str(run_dir)  # inherited by DDP child processes
    plain = plain_config(cfg)
    tok_hash = text_hash(streams.tokenizer)
    if old is not None:
        allowed, warned = check_resume(old, plain, allow_data_change=tc.allow_data_change,
                                       changed=changed, fingerprints=_fingerprints(streams))
        for note in [*allowed, *(f"warning: {w}" for w in warned)]:
            print(note, file=sys.stderr)
    meta = {
        "format_version": ckpt.FORMAT_VERSION, "config": plain,
        "config_yaml": OmegaConf.to_yaml(OmegaConf.create(plain)), "overrides": overrides or [],
        # hashed in the layout earlier versions hashed: an unchanged model keeps its hashes
        "arch_hash": arch_hash(legacy_layout(model_to_dict(tc.model))),
        "tokenizer": streams.tokenizer,
        "tokenizer_hash": tok_hash, "data_fingerprint": streams.fingerprint,
        "specials": streams.specials.to_dict(),
        "versions": versions(), "git": git_info(), "run_dir": str(run_dir),
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "params": count_params(tc.model), "config_hash": config_hash(legacy_config(plain)),
        # where the run's relative paths are read from (a resume elsewhere keeps the first)
        "cwd": (old or {}).get("cwd") or os.getcwd(),
        # each key a resume changed, and the first step it applied to (every resume's)
        "resume_changes": recorded_changes(old, plain) if old is not None else [],
    }
    if sources is not None:
        meta["data_sources"] = sources
    if init is not None:
        meta["init_from"] = init.info
    elif old is not None and "init_from" in old:  # a resumed init_from run stays one
        meta["init_from"] = old["init_from"]
    if not ddp_child():
        write_run_files(run_dir, meta, old)
    from blocklab.train.quiet import lightning_quiet

    try:
        with lightning_quiet(tc.trainer.quiet):
            return _fit(tc, run_dir, meta, streams, resume_from,
                        init.state if init is not None and resume_from is None else None,
                        start_batch=int(old["batches_seen"]) if old is not None else 0)
    finally:
        os.environ.pop("BLOCKLAB_RUN_DIR", None)
        _close_process_group()


def _close_process_group() -> None:
    """Destroy a process group the strategy left open, while the interpreter is still whole:
    left to interpreter shutdown, gloo's worker threads can abort the process
    ("terminate called without an active exception") after a successful run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def ddp_child() -> bool:
    """True in a process Lightning's DDP launcher started (local rank > 0)."""
    return os.environ.get("LOCAL_RANK", "0") != "0" and "BLOCKLAB_RUN_DIR" in os.environ


def _fit(tc: TrainConfig, run_dir: Path, meta: dict[str, Any], streams,
         resume_from: ckpt.Loaded | None, init_state: dict[str, Any] | None = None, *,
         start_batch: int = 0) -> Path:
    import lightning as L
    import torch

    from blocklab.data.datamodule import BlocklabData
    from blocklab.model.estimate import estimate
    from blocklab.train.callbacks import stop_reason
    from blocklab.train.loggers import close_loggers, log_final_checkpoint
    from blocklab.train.module import LitModel
    from blocklab.train.summary import write_summary

    t = tc.trainer
    if t.threads:
        torch.set_num_threads(t.threads)
    L.seed_everything(tc.seed, workers=True, verbose=False)
    flops = estimate(tc.model, seq_len=tc.data.seq_len).train_flops_per_token
    lit = LitModel(tc, meta=meta, flops_per_token=flops, peak_flops=peak_flops_for(t),
                   resumed_optim=resume_from.config.optim if resume_from is not None else None)
    if init_state is not None:  # pretrained weights; the optimizer starts fresh
        lit.model.load_state_dict(init_state, strict=True)
    if t.compile:
        # in place: state_dict keys stay those of the eager model
        lit.model.compile(dynamic=t.compile_dynamic)
    data = BlocklabData(streams.train, streams.val, lit.objective.collate,
                        batch_size=tc.data.batch_size, val_batches=tc.data.val_batches,
                        accumulate=t.accumulate, num_workers=tc.data.num_workers)
    data.start_batch = start_batch  # batches the resumed checkpoint consumed (0: a new run)
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    trainer, preemption, io = _trainer(tc, run_dir, meta, resume_from)
    try:
        trainer.fit(lit, datamodule=data,
                    ckpt_path=str(resume_from.path) if resume_from is not None else None)
    except SIGTERMException:
        how = "interrupted" if preemption.signal_name == "SIGINT" else "preempted"
        raise Preempted(f"{how} ({preemption.signal_name}) after step {trainer.global_step}: "
                        f"checkpoint {run_dir / 'checkpoints' / f'step-{trainer.global_step:06d}'}"
                        f" written; resume exactly with: blocklab-train resume={run_dir}"
                        ) from None
    final = run_dir / "checkpoints" / f"step-{trainer.global_step:06d}"
    if _final_missing(final, io):
        trainer.save_checkpoint(final, weights_only=False)  # full training state
        if trainer.is_global_zero:
            log_final_checkpoint(trainer.loggers, final)
    why = stop_reason(trainer, t.max_steps)
    if why and trainer.is_global_zero:
        print(f"{why}; checkpoint {final} written; continue with: blocklab-train "
              f"resume={run_dir}", file=sys.stderr)
    probes = None
    if trainer.is_global_zero or sharded(t):  # a sharded model's forward needs every rank
        probes = final_probes(tc, meta, lit, run_dir, trainer.global_step,
                               write=trainer.is_global_zero, loggers=trainer.loggers)
    if trainer.is_global_zero:
        write_summary(run_dir, trainer.global_step, lit, probes)
        close_loggers(trainer.loggers)
    return run_dir


def _final_missing(final: Path, io) -> bool:
    """Whether the run's final state still needs saving: not if this launch wrote that
    checkpoint, or resumed from it (verified when read, the run locked since) — neither is
    hashed again; otherwise (missing, or left by an earlier launch and perhaps corrupt) unless
    it verifies. (A DDP rank other than 0 wrote nothing: it verifies what rank 0 wrote.)"""
    if final in io.written or (io.resumed is not None and final == io.resumed.path):
        return False
    return not ckpt.is_valid(final)


def _trainer(tc: TrainConfig, run_dir: Path, meta: dict[str, Any], resumed: ckpt.Loaded | None):
    """Lightning's Trainer for the run, its preemption handler and its checkpoint I/O (which
    restores a resume from the state ``resumed`` holds — unless the restore happens elsewhere:
    the sharded strategies read ``state.pt`` themselves, ``ddp_spawn`` in processes of its own,
    so the state is not kept, nor pickled for them)."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from blocklab.train.callbacks import lightning_options, profiler, user_callbacks
    from blocklab.train.checkpoint_io import BlocklabCheckpointIO
    from blocklab.train.metrics import DurableMetrics, StepRow
    from blocklab.train.monitors import monitor_callbacks
    from blocklab.train.preemption import Preemption

    t = tc.trainer
    if resumed is not None and (sharded(t) or t.strategy == "ddp_spawn"):
        resumed.take_state()
    io = BlocklabCheckpointIO(keep=t.keep_checkpoints, resumed=resumed)
    # Every periodic checkpoint is written (retention is BlocklabCheckpointIO's, over the whole
    # run directory); the same step saved again replaces its checkpoint, never "-v1".
    saver = ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="step-{step:06d}",
                            auto_insert_metric_name=False, every_n_train_steps=t.ckpt_every_steps,
                            save_top_k=-1, save_on_train_epoch_end=False,
                            enable_version_counter=False)
    saver.FILE_EXTENSION = ""
    preemption = Preemption(run_dir)
    trainer = L.Trainer(
        accelerator=t.accelerator, devices=t.devices, strategy=_strategy(t),
        num_nodes=t.num_nodes, precision=t.precision, max_steps=t.max_steps, max_epochs=-1,
        accumulate_grad_batches=t.accumulate,
        gradient_clip_val=tc.optim.grad_clip or None,
        limit_val_batches=0,  # validation runs in StepRow / DurableMetrics (train/metrics.py)
        log_every_n_steps=t.log_every_steps,
        # StepRow first makes a step's row (the monitors add theirs; early stopping reads it);
        # DurableMetrics, after what may stop the run, validates its last step and writes the
        # row before any checkpoint of that step.
        callbacks=[StepRow(log_every=t.log_every_steps, val_every=t.val_every_steps,
                           accumulate=t.accumulate, max_steps=t.max_steps),
                   *monitor_callbacks(tc, run_dir), *user_callbacks(tc.callbacks),
                   *lightning_options(t, run_dir),
                   DurableMetrics(max_steps=t.max_steps),
                   preemption, saver, *probe_callbacks(tc, meta, run_dir, all_ranks=sharded(t)),
                   *_progress(t.progress_bar)],
        logger=_loggers(tc, run_dir, meta),
        enable_progress_bar=t.progress_bar, num_sanity_val_steps=0,
        plugins=[io], default_root_dir=run_dir,
        deterministic=t.deterministic, enable_model_summary=False,
        profiler=profiler(t.profiler, run_dir), detect_anomaly=t.detect_anomaly,
        use_distributed_sampler=False,  # ResumableBatches shards by rank itself
    )
    return trainer, preemption, io


def sharded(t) -> bool:
    """Whether the strategy shards parameters: every rank then takes part in every forward
    (probes included), not rank 0 alone."""
    return t.strategy in ("fsdp", "model_parallel")


class Preempted(RuntimeError):
    """SIGTERM (e.g. a cluster preempting the job) or a first Ctrl-C: the step finished, a
    checkpoint was written, and the run can be resumed exactly (exit code 7)."""

    exit_code = 7


def _strategy(t):
    """Lightning strategy by name; the sharded ones get blocklab's checkpoint format and the
    transformer block as the unit of sharding."""
    if t.strategy == "fsdp":
        from blocklab.train.strategies import fsdp

        return fsdp()
    if t.strategy == "model_parallel":
        from blocklab.train.strategies import model_parallel

        return model_parallel(t.devices * t.num_nodes)
    return t.strategy


def _progress(enabled: bool) -> list:
    from blocklab.train.callbacks import progress_bar

    return progress_bar(enabled)

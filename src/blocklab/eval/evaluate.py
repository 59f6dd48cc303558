"""Evaluate a checkpoint on its own: rebuild model and tokenizer from the checkpoint (read,
verified and loaded once; its stored config plain data, never resolved or instantiated) and
report validation loss and probes. The data streams (data/streams.py) and the objective
(objectives.py) are built by the same functions training uses, so the validation loss equals the
one the run logged; which data it is computed on, and which files that opens, is
eval/rundata.py's (``run_data``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from blocklab import checkpoint as ckpt
from blocklab.config import (
    ConfigError,
    DataConfig,
    TrainConfig,
    validate_probe_spec,
    validate_run_probe_spec,
)
from blocklab.config.stored import stored_config
from blocklab.provenance import config_hash, digest


def stored_train_config(meta: dict[str, Any]) -> TrainConfig:
    """A checkpoint's training config, checked as data (``config/stored.py``)."""
    return stored_config(meta.get("config"), "checkpoint metadata")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


@torch.no_grad()
def validation_loss(target: str | Path | ckpt.Loaded, *, batches: int | None = None,
                    batch_size: int | None = None, out_dir: str | Path | None = None,
                    run_data: str = "auto", model: torch.nn.Module | None = None,
                    dest: str | Path | None = None) -> dict[str, Any]:
    """The checkpoint's validation loss on its run's validation stream, written to
    ``out_dir/val.json`` (default ``<run dir>/eval/<checkpoint>/val.json``); ``val_loss`` is
    None, with the reason in ``skipped``, where ``run_data`` (eval/rundata.py) says not to.
    ``target`` may be a checkpoint read already (and ``model`` its model); ``dest`` is where a
    prepared corpus may be cached (default: ``out_dir``'s, else ``<run dir>/eval``)."""
    from blocklab.data.datamodule import ResumableBatches
    from blocklab.eval.rundata import run_streams
    from blocklab.objectives import build_objective

    loaded = target if isinstance(target, ckpt.Loaded) else ckpt.read(target)
    meta, tc = loaded.meta, loaded.config
    result = {"checkpoint": str(loaded.path), "step": meta["step"], "val_loss": None,
              "val_targets": 0, "arch_hash": meta["arch_hash"]}
    dest = Path(dest or out_dir or loaded.run_dir / "eval")
    streams, skipped = run_streams(loaded, run_data, dest, log=_stderr)
    if streams is None:
        return {**result, "skipped": skipped}
    if model is None:
        model, _ = ckpt.model_of(loaded)
    objective = build_objective(tc.model.family.name, tc.data, streams.specials)
    summed = summed_loss(model, objective, streams.val, ResumableBatches(
        batch_size or tc.data.batch_size, stop=batches or tc.data.val_batches))
    result.update(val_loss=summed.loss, val_targets=summed.count)
    if summed.accuracy is not None:
        result["val_accuracy"] = summed.accuracy
    out_dir = Path(out_dir) if out_dir is not None else loaded.run_dir / "eval" / loaded.name
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "val.json").write_text(json.dumps(result, indent=2))
    return result


@dataclasses.dataclass
class Summed:
    """Loss summed over ``count`` targets, and how many of them the argmax predicts (None
    where the objective does not count them)."""

    total: float = 0.0
    count: int = 0
    correct: int | None = 0

    @property
    def loss(self) -> float:
        return self.total / max(self.count, 1)

    @property
    def accuracy(self) -> float | None:
        return None if self.correct is None else self.correct / max(self.count, 1)


def summed_loss(model: torch.nn.Module, objective: Any, make: Callable[..., Any],
                batches: Iterable[Sequence[tuple[int, int | None]]]) -> Summed:
    """Summed loss, targets and correct targets of ``model`` over the examples
    ``make(index, step)`` of each batch of ``(index, step)`` keys, collated and scored by the
    family's ``objective`` (as validation in training does)."""
    s = Summed()
    for keys in batches:
        out = objective.loss(model, objective.collate([make(*k) for k in keys]))
        s.total, s.count = s.total + float(out.total), s.count + int(out.count)
        s.correct = None if s.correct is None or out.correct is None else (
            s.correct + int(out.correct))
    return s


@torch.no_grad()
def corpus_loss(loaded: ckpt.Loaded, data: DataConfig, *, model: torch.nn.Module,
                batches: int | None = None, batch_size: int | None = None,
                out_dir: str | Path | None = None) -> dict[str, Any]:
    """``blocklab-eval ckpt=... data=...``: the loss and perplexity of the checkpoint's model on
    every sequence of another corpus (the first ``batches`` batches when given), tokenized
    with the checkpoint's tokenizer (eval/rundata.py ``corpus_streams``); written to
    ``out_dir/data-<fingerprint>.json`` (default ``<run dir>/eval/<checkpoint>/``), the
    corpus's fingerprint in the name, so results on different corpora never overwrite
    each other."""
    import math

    from blocklab.data.splits import validation_source
    from blocklab.eval.rundata import corpus_streams, describe
    from blocklab.objectives import build_objective

    out = Path(out_dir) if out_dir is not None else loaded.run_dir / "eval" / loaded.name
    streams, data = corpus_streams(loaded, data, Path(out_dir or loaded.run_dir / "eval"))
    size = batch_size or loaded.config.data.batch_size
    n = streams.val_examples if not batches else min(streams.val_examples, batches * size)
    objective = build_objective(loaded.config.model.family.name, data, streams.specials)
    summed = summed_loss(model, objective, streams.val,
                         ([(i, None) for i in range(a, min(a + size, n))]
                          for a in range(0, n, size)))
    loss, count = summed.loss, summed.count
    source, what = validation_source(data)  # what was read: its validation source, if named
    file = out / (f"data-{streams.fingerprint}"
                  + (f"-{n}" if n < streams.val_examples else "") + ".json")
    result = {"checkpoint": str(loaded.path), "step": loaded.meta["step"],
              "data": what if source is not None else describe(data), "fingerprint": streams.fingerprint, "loss": loss,
              "perplexity": math.exp(min(loss, 700.0)), "tokens": count, "sequences": n,
              "of_sequences": streams.val_examples, "description": streams.description,
              "arch_hash": loaded.meta["arch_hash"], "file": str(file)}
    out.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(result, indent=2))
    return result


def result_lines(r: dict[str, Any]) -> list[str]:
    """What ``blocklab-eval ckpt=...`` prints of a result of :func:`evaluate_checkpoint`."""
    lines = []
    if r.get("val_loss") is not None:
        lines.append(f"checkpoint {r['checkpoint']} (step {r['step']}): val/loss "
                     f"{r['val_loss']:.4f} over {r['val_targets']} targets"
                     + (f" (val/accuracy {r['val_accuracy']:.4f})" if "val_accuracy" in r
                        else ""))
    elif r.get("skipped"):
        lines.append(f"checkpoint {r['checkpoint']}: {r['skipped']}")
    c = r.get("corpus")
    if c:
        part = ("" if c["sequences"] == c["of_sequences"] else
                f", the first {c['sequences']:,} of {c['of_sequences']:,} sequences")
        lines.append(f"checkpoint {c['checkpoint']} (step {c['step']}) on {c['data']}: loss "
                     f"{c['loss']:.4f}, perplexity {c['perplexity']:.2f} over {c['tokens']:,} "
                     f"tokens{part} -> {c['file']}")
    return lines


def evaluate_checkpoint(target: str | Path, spec, *, val_batches: int | None = None,
                        batch_size: int | None = None, out: str | Path | None = None,
                        run_data: str = "auto", data: DataConfig | None = None
                        ) -> tuple[dict[str, Any], Any]:
    """``blocklab-eval ckpt=...``: validation loss — with ``data`` (a data config naming text),
    the loss and perplexity on that corpus instead (and the run's own too with
    ``run_data=true``: :func:`corpus_loss`) — then the probes (when ``spec`` is enabled).
    With ``out`` every output goes there (``val.json``, and the probe files in
    ``<spec>-<spec hash>/``) and the run directory is only read; without it they
    go under the run directory, which is then held like a training process holds it (one
    owner at a time). The checkpoint is resolved, verified and loaded once — of a run still
    training, its newest complete checkpoint — and everything is checked (the destination
    writable, the run free, the probe grid against the run's vocabulary) before the first
    file is written."""
    from blocklab.config import has_sources
    from blocklab.runlock import run_lock, writable_dir

    data = data if has_sources(data) else None  # a data config naming no text: no corpus
    if out is not None:
        owner = contextlib.nullcontext(writable_dir(out, "out="))
    else:
        run_dir = ckpt.run_dir_of(target)
        owner = run_lock(writable_dir(run_dir, "run directory"), "eval")
    with owner:
        loaded = ckpt.read(target)
        if spec.enabled:
            validate_run_probe_spec(spec, loaded.config)
        model, _ = ckpt.model_of(loaded)
        loaded = dataclasses.replace(loaded, weights={})  # the model holds them now
        own = data is None or run_data != "auto"  # with data=, the run's loss only if asked
        if loaded.meta.get("imported") or not own:  # imported: no training data to validate on
            result = {"checkpoint": str(loaded.path), "step": loaded.meta["step"],
                      "val_loss": None, "val_targets": 0, "arch_hash": loaded.meta["arch_hash"],
                      "skipped": "imported (no training data: validation loss skipped)"
                      if own else None}
        else:
            result = validation_loss(loaded, batches=val_batches, batch_size=batch_size,
                                     out_dir=out, run_data=run_data, model=model)
        if data is not None:
            result["corpus"] = corpus_loss(loaded, data, model=model, batches=val_batches,
                                           batch_size=batch_size, out_dir=out)
        probes = (probe_checkpoint(loaded, spec, out=probe_out(out, spec), model=model)
                  if spec.enabled else None)
    return result, probes


def probe_out(out: str | Path | None, spec) -> Path | None:
    """Where ``blocklab-eval out=DIR`` puts a spec's probe files: ``DIR/<spec>-<spec hash>``
    (beside ``DIR/val.json``); None without ``out``."""
    from blocklab.eval.items import spec_hash

    return None if out is None else Path(out) / f"{spec.name}-{spec_hash(spec)}"


# ------------------------------------------------------------------------------------ probes

def probe_keys(meta: dict[str, Any], spec, *, step: int, checkpoint: str | None) -> dict[str, Any]:
    """The keys every probe row and summary carries, so results across checkpoints and runs
    line up: checkpoint step, config hash, tokenizer hash, probe-spec hash."""
    from blocklab.eval.items import spec_hash

    return {"step": step, "checkpoint": checkpoint, "config_hash": config_hash(meta["config"]),
            "arch_hash": meta.get("arch_hash"), "tokenizer_hash": meta.get("tokenizer_hash"),
            "spec_hash": spec_hash(spec)}


def probe_builder(spec, tc: TrainConfig, tokenizer_json: str, specials=None, *,
                  add_bos: bool = True):
    """(builder, decode) for a blocklab run: token space for the synthetic vocabulary, text
    space for a real tokenizer (``spec.space`` may force either; the text builder begins
    every prompt with the tokenizer's own BOS)."""
    from blocklab.data.tokenizer import BLOCKLAB_SPECIALS, tokenizer_from_json
    from blocklab.eval.items import TokenBuilder
    from blocklab.eval.textspace import TextBuilder, TextTokenizer

    tok = tokenizer_from_json(tokenizer_json)
    synthetic = json.loads(tokenizer_json).get("kind") == "synthetic"
    space = spec.space if spec.space != "auto" else ("token" if synthetic else "text")
    if space == "token":
        if not synthetic:
            raise ConfigError(f"config error: probes.space={spec.space!r}: the token-space "
                              "builder needs the synthetic vocabulary; use probes.space=text")
        return TokenBuilder(tok, tc.data.seed, language_model=tc.data.tasks.markov_lm > 0), None
    if space != "text":
        raise ConfigError(f"config error: probes.space={spec.space!r}: one of auto, token, text")
    if synthetic:
        raise ConfigError("config error: probes.space='text': this run's tokenizer is the "
                          "synthetic vocabulary; use probes.space=token (or auto)")
    # an imported tokenizer that never starts plain text with BOS gets none (as in HF)
    bos = (specials or BLOCKLAB_SPECIALS).bos if add_bos else None
    text_tok = TextTokenizer.from_tokenizers(tok, bos=bos, name=tc.tokenizer.name.value)
    return TextBuilder(text_tok, spec), text_tok.decode


def probe_model(model: torch.nn.Module, tc: TrainConfig, meta: dict[str, Any], spec, *,
                step: int, checkpoint: str | None, out_dir: Path | None, log=None, plots=True):
    """Run ``spec`` on an in-memory blocklab model (the callback and blocklab-eval share it)."""
    from blocklab.data.tokenizer import Specials
    from blocklab.eval.backends import BlocklabBackend
    from blocklab.eval.probes import run_spec
    from blocklab.objectives import build_objective

    specials = Specials.from_dict(meta.get("specials"))
    builder, decode = probe_builder(spec, tc, meta["tokenizer"], specials,
                                    add_bos=meta.get("text_bos", True))
    # Probe items are scored one per row (never packed), in the run's own batch format.
    objective = build_objective(tc.model.family.name,
                                dataclasses.replace(tc.data, packing=False), specials)
    keys = probe_keys(meta, spec, step=step, checkpoint=checkpoint)
    was_training = model.training
    model.eval()
    try:
        return run_spec(BlocklabBackend(model, objective), spec, builder=builder,
                        train_length=spec.train_length or train_length(meta, tc), keys=keys,
                        out_dir=out_dir, decode=decode, log=log, plots=plots)
    finally:
        model.train(was_training)


#: The reference length probe lengths are multiples of for a model trained elsewhere.
HF_TRAIN_LENGTH = 512


def train_length(meta: dict[str, Any], tc: TrainConfig) -> int:
    """The length probe lengths are multiples of: the run's training length; for an imported
    model (trained elsewhere) 512, as for a Hugging Face model probed directly."""
    return HF_TRAIN_LENGTH if meta.get("imported") else tc.data.seq_len



def probe_dir(run_dir: Path, checkpoint_name: str, spec) -> Path:
    """``<run dir>/probes/<checkpoint>/<spec name>-<spec hash>``: next to the checkpoints,
    outside them (pruning old checkpoints never deletes their probe results)."""
    from blocklab.eval.items import spec_hash

    return Path(run_dir) / "probes" / checkpoint_name / f"{spec.name}-{spec_hash(spec)}"


def probe_checkpoint(target: str | Path | ckpt.Loaded, spec, *, out: str | Path | None = None,
                     log=print, model: torch.nn.Module | None = None):
    """``blocklab-eval ckpt=<path> probes=<spec>``: probe a checkpoint on its own (``target``
    may be one read already, and ``model`` its model)."""
    loaded = target if isinstance(target, ckpt.Loaded) else ckpt.read(target)
    if model is None:
        model, _ = ckpt.model_of(loaded)
    tc = loaded.config
    validate_run_probe_spec(spec, tc)  # against the run's vocabulary (enough distinct keys)
    out_dir = Path(out) if out else probe_dir(loaded.run_dir, loaded.name, spec)
    return probe_model(model, tc, loaded.meta, spec, step=int(loaded.meta["step"]),
                       checkpoint=str(loaded.path), out_dir=out_dir, log=log)


def probe_hf(model_dir: str, spec, *, gguf_file: str | None = None,
             out: str | Path | None = None, log=print):
    """``blocklab-eval hf_model=<dir> [hf_gguf=<file>] probes=text``: the same text-space
    probes on a Hugging Face causal LM, through :class:`blocklab.eval.hf.HFCausalLM`."""
    from blocklab.eval.hf import HFCausalLM, check_hf_model, load_hf_causal_lm
    from blocklab.eval.items import spec_hash
    from blocklab.eval.probes import run_spec
    from blocklab.eval.textspace import TextBuilder, TextTokenizer

    validate_probe_spec(spec, "probes", synthetic=False)  # a real tokenizer: text space
    check_hf_model(model_dir, gguf_file=gguf_file)  # one line, before anything is loaded
    if not spec.train_length:  # the reference length lengths are multiples of (on a copy:
        spec = dataclasses.replace(spec, train_length=HF_TRAIN_LENGTH)  # the caller's stays)
    model, hf_tok = load_hf_causal_lm(model_dir, gguf_file=gguf_file)
    name = Path(gguf_file or model_dir).stem
    text_tok = TextTokenizer.from_hf(hf_tok, name=name)
    chat = None
    if spec.text.chat_template:
        def chat(user: str, prefix: str) -> str:
            return hf_tok.apply_chat_template([{"role": "user", "content": user}],
                                              tokenize=False, add_generation_prompt=True) + prefix
    builder = TextBuilder(text_tok, spec, chat=chat)
    config = model.config.to_dict()
    keys = {"step": None, "checkpoint": f"hf:{model_dir}" + (f"/{gguf_file}" if gguf_file else ""),
            "config_hash": digest(config),
            "arch_hash": None,
            "tokenizer_hash": digest(sorted(hf_tok.get_vocab().items())),
            "spec_hash": spec_hash(spec)}
    out_dir = Path(out) if out else Path("outputs") / "eval" / name / f"{spec.name}-{spec_hash(spec)}"
    return run_spec(HFCausalLM(model, hf_tok, name=f"hf:{name}",
                               batch_size=spec.batch_size), spec,
                    builder=builder, train_length=spec.train_length, keys=keys,
                    out_dir=out_dir, decode=text_tok.decode, log=log)

"""Evaluate a checkpoint on its own: rebuild model, tokenizer and data stream from the
checkpoint's stored config (plain data, never instantiated) and report validation loss and
probes. The data streams (data/streams.py) and the objective (objectives.py) are built by the
same functions training uses, so the validation loss equals the one the run logged."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from blocklab import checkpoint as ckpt
from blocklab.config import ConfigError, TrainConfig, validate_probe_spec, validate_run_probe_spec
from blocklab.provenance import config_hash, digest


def stored_train_config(meta: dict[str, Any]) -> TrainConfig:
    """The checkpoint's training config, checked against today's schema."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), meta["config"]))


@torch.no_grad()
def validation_loss(path: str | Path, *, batches: int | None = None,
                    batch_size: int | None = None, out_dir: str | Path | None = None
                    ) -> dict[str, Any]:
    """The checkpoint's validation loss on its run's validation stream, written to
    ``out_dir/val.json`` (default ``<run dir>/eval/<checkpoint>/val.json``)."""
    from blocklab.data.datamodule import ExampleSource, ResumableBatches
    from blocklab.data.streams import build_streams
    from blocklab.objectives import build_objective

    path = ckpt.resolve(path)
    model, _, meta = ckpt.load_model(path)
    tc = stored_train_config(meta)
    streams = build_streams(tc.data, tc.tokenizer)
    objective = build_objective(tc.model.family.name, tc.data, streams.specials)
    source = ExampleSource(streams.val)
    total, count = 0.0, 0
    for batch_keys in ResumableBatches(batch_size or tc.data.batch_size,
                                       stop=batches or tc.data.val_batches):
        out = objective.loss(model, objective.collate([source[k] for k in batch_keys]))
        total, count = total + float(out.total), count + int(out.count)
    result = {"checkpoint": str(path), "step": meta["step"], "val_loss": total / max(count, 1),
              "val_targets": count, "arch_hash": meta["arch_hash"]}
    out_dir = Path(out_dir) if out_dir is not None else path.parent.parent / "eval" / path.name
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "val.json").write_text(json.dumps(result, indent=2))
    return result


def evaluate_checkpoint(target: str | Path, spec, *, val_batches: int | None = None,
                        batch_size: int | None = None, out: str | Path | None = None):
    """``blocklab-eval ckpt=...``: validation loss, then the probes (when ``spec`` is enabled).
    With ``out`` every output goes there (``val.json``, and the probe files in
    ``<spec>-<spec hash>/``) and the run directory is only read; without it they
    go under the run directory, which is then held like a training process holds it (one
    owner at a time). Everything is checked — probe grid against the run's vocabulary, the
    destination writable, the run free — before the first file is written."""
    import contextlib

    from blocklab.config import validate_run_probe_spec
    from blocklab.runlock import run_lock, writable_dir

    path = ckpt.resolve(target)
    stored = path / ckpt.META  # the metadata without unpickling the state
    meta = json.loads(stored.read_text()) if stored.is_file() else ckpt.metadata(path)
    if spec.enabled:
        validate_run_probe_spec(spec, stored_train_config(meta))
    run_dir = path.parent.parent
    if out is not None:
        owner = contextlib.nullcontext(writable_dir(out, "out="))
    else:
        owner = run_lock(writable_dir(run_dir, "run directory"), "eval")
    with owner:
        if meta.get("imported"):  # a pretrained model: no training data to validate on
            result = {"checkpoint": str(path), "step": meta["step"], "val_loss": None,
                      "val_targets": 0, "arch_hash": meta["arch_hash"]}
        else:
            result = validation_loss(path, batches=val_batches, batch_size=batch_size,
                                     out_dir=out)
        probes = (probe_checkpoint(path, spec, out=probe_out(out, spec)) if spec.enabled
                  else None)
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


def probe_checkpoint(path: str | Path, spec, *, out: str | Path | None = None, log=print):
    """``blocklab-eval ckpt=<path> probes=<spec>``: probe a checkpoint on its own."""
    path = ckpt.resolve(path)
    model, _, meta = ckpt.load_model(path)
    tc = stored_train_config(meta)
    validate_run_probe_spec(spec, tc)  # against the run's vocabulary (enough distinct keys)
    out_dir = Path(out) if out else probe_dir(path.parent.parent, path.name, spec)
    return probe_model(model, tc, meta, spec, step=int(meta["step"]), checkpoint=str(path),
                       out_dir=out_dir, log=log)


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
    if not spec.train_length:  # the reference length that lengths are multiples of
        spec.train_length = HF_TRAIN_LENGTH
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

"""Probes on a model: a blocklab model in memory (the training callback, the final grid) or from
a checkpoint (``blocklab-eval ckpt=``), and a Hugging Face causal LM (``blocklab-eval
hf_model=``). What the grid is rendered with (the token or text builder), the lengths it is
sized by (the run's training length, or an imported model's own context), the text the
perplexity probe reads (the run's validation text by default), the plots' title and the keys
every result row carries are decided here; running the grid is eval/probes.py's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from blocklab import checkpoint as ckpt
from blocklab.config import ConfigError, TrainConfig, validate_probe_spec, validate_run_probe_spec
from blocklab.provenance import config_hash, digest


def probe_keys(meta: dict[str, Any], spec, *, step: int, checkpoint: str | None) -> dict[str, Any]:
    """The keys every probe row and summary carries, so results across checkpoints and runs
    line up: checkpoint step, config hash, tokenizer hash, probe-spec hash."""
    from blocklab.eval.items import spec_hash

    return {"step": step, "checkpoint": checkpoint, "config_hash": config_hash(meta["config"]),
            "arch_hash": meta.get("arch_hash"), "tokenizer_hash": meta.get("tokenizer_hash"),
            "spec_hash": spec_hash(spec)}


def probe_builder(spec, tc: TrainConfig, tokenizer_json: str, specials=None, *,
                  add_bos: bool = True, validation=None):
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
    corpus = tc.data.corpus if _name(tc.data.name) == "text" else None
    return (TextBuilder(text_tok, spec, validation=validation, trained_on=corpus),
            text_tok.decode)


def probe_model(model: torch.nn.Module, tc: TrainConfig, meta: dict[str, Any], spec, *,
                step: int, checkpoint: str | None, out_dir: Path | None, log=None, plots=True,
                validation=None):
    """Run ``spec`` on an in-memory blocklab model (the callback and blocklab-eval share it).
    ``validation()``: the run's own validation text (:func:`validation_text`), which the
    perplexity probe reads by default."""
    from blocklab.data.tokenizer import Specials
    from blocklab.eval.backends import BlocklabBackend
    from blocklab.eval.kinds import kinds
    from blocklab.eval.probes import run_spec
    from blocklab.objectives import build_objective

    for kind in kinds():  # settings left to the checkpoint (e.g. stories as trained)
        spec = kind.adapt(spec, tc)
    specials = Specials.from_dict(meta.get("specials"))
    builder, decode = probe_builder(spec, tc, meta["tokenizer"], specials,
                                    add_bos=meta.get("text_bos", True), validation=validation)
    # Probe items are scored one per row (never packed), in the run's own batch format.
    objective = build_objective(tc.model.family.name,
                                dataclasses.replace(tc.data, packing=False), specials)
    keys = probe_keys(meta, spec, step=step, checkpoint=checkpoint)
    unit, context = train_length(meta, tc)
    was_training = model.training
    model.eval()
    try:
        return run_spec(BlocklabBackend(model, objective), spec, builder=builder,
                        train_length=spec.train_length or unit, context=context, keys=keys,
                        out_dir=out_dir, decode=decode, log=log, plots=plots,
                        title=run_title(meta, tc))
    finally:
        model.train(was_training)


#: The length probe lengths are multiples of for a model trained elsewhere (a CPU-sized
#: reference: an import's own context — SmolLM2's 8,192 — would make every cell minutes long).
HF_TRAIN_LENGTH = 512


def train_length(meta: dict[str, Any], tc: TrainConfig) -> tuple[int, int]:
    """(the length probe lengths are multiples of, the length the model was trained at): a
    run's ``data.seq_len`` for both; an imported model's own context (``model.max_seq_len``,
    from its source's config) as the training length and 512 as the unit (as for a Hugging
    Face model probed directly; ``probes.train_length`` sets another)."""
    if meta.get("imported"):
        return HF_TRAIN_LENGTH, int(tc.model.max_seq_len)
    return tc.data.seq_len, tc.data.seq_len


def run_title(meta: dict[str, Any], tc: TrainConfig) -> str:
    """What every probe plot of a run is titled with: the run (its name: a sweep job's varied
    keys, else its directory) and the model (family, size, position scheme, mixers)."""
    m = tc.model
    run = tc.logger.run_name or Path(str(meta.get("run_dir") or "run")).name
    what = meta.get("imported") or f"{tc.experiment_name}/{run}"
    mixers = "+".join(dict.fromkeys(m.mixer.pattern)) if m.mixer.pattern else m.mixer.name
    params = meta.get("params")
    size = f", {params / 1e6:.1f}M params" if isinstance(params, int | float) else ""
    return (f"{what} · {_name(m.family)} {m.n_layers}×{m.d_model}, {_name(m.position)}, "
            f"{mixers}{size}")


def _name(x: Any) -> str:
    name = getattr(x, "name", x)
    return str(getattr(name, "value", name))


def validation_text(streams, specials) -> Any:
    """A provider of the run's validation text for the perplexity probe — (description,
    documents without BOS / EOS) — or None where the streams have none (synthetic data)."""
    if streams is None or streams.val_documents is None:
        return None

    def read() -> tuple[str, list[list[int]]]:
        docs = []
        for d in streams.val_documents():
            ids = d.tolist()
            if ids and ids[0] == specials.bos:
                ids = ids[1:]
            if ids and ids[-1] == specials.eos:
                ids = ids[:-1]
            if ids:
                docs.append(ids)
        n = sum(len(d) for d in docs)
        return f"{len(docs)} document{'s' * (len(docs) != 1)}, {n:,} tokens", docs

    return read


def probe_dir(run_dir: Path, checkpoint_name: str, spec) -> Path:
    """``<run dir>/probes/<checkpoint>/<spec name>-<spec hash>``: next to the checkpoints,
    outside them (pruning old checkpoints never deletes their probe results)."""
    from blocklab.eval.items import spec_hash

    return Path(run_dir) / "probes" / checkpoint_name / f"{spec.name}-{spec_hash(spec)}"


def probe_checkpoint(target: str | Path | ckpt.Loaded, spec, *, out: str | Path | None = None,
                     log=print, model: torch.nn.Module | None = None, validation=None):
    """``blocklab-eval ckpt=<path> probes=<spec>``: probe a checkpoint on its own (``target``
    may be one read already, and ``model`` its model; ``validation``: its run's validation
    text, :func:`validation_text`)."""
    loaded = target if isinstance(target, ckpt.Loaded) else ckpt.read(target)
    if model is None:
        model, _ = ckpt.model_of(loaded)
    tc = loaded.config
    # against the run's vocabulary (enough distinct keys), as the grid that fits its tokenizer
    spec = validate_run_probe_spec(spec, tc)
    out_dir = Path(out) if out else probe_dir(loaded.run_dir, loaded.name, spec)
    return probe_model(model, tc, loaded.meta, spec, step=int(loaded.meta["step"]),
                       checkpoint=str(loaded.path), out_dir=out_dir, log=log,
                       validation=validation)


def probe_hf(model_dir: str, spec, *, gguf_file: str | None = None,
             out: str | Path | None = None, log=print):
    """``blocklab-eval hf_model=<dir> [hf_gguf=<file>] probes=text``: the same text-space
    probes on a Hugging Face causal LM, through :class:`blocklab.eval.hf.HFCausalLM`."""
    from blocklab.eval.hf import HFCausalLM, check_hf_model, load_hf_causal_lm
    from blocklab.eval.items import spec_hash
    from blocklab.eval.probes import run_spec
    from blocklab.eval.textspace import TextBuilder, TextTokenizer

    spec = validate_probe_spec(spec, "probes", synthetic=False)  # a real tokenizer: text space
    check_hf_model(model_dir, gguf_file=gguf_file)  # one line, before anything is loaded
    if not spec.train_length:  # the reference length lengths are multiples of (on a copy:
        spec = dataclasses.replace(spec, train_length=HF_TRAIN_LENGTH)  # the caller's stays)
    model, hf_tok = load_hf_causal_lm(model_dir, gguf_file=gguf_file)
    # the length it was trained at (its position table: SmolLM2's 8,192), not the grid's unit
    context = getattr(model.config, "max_position_embeddings", None) or spec.train_length
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
                    out_dir=out_dir, decode=text_tok.decode, log=log, context=int(context),
                    title=f"hf:{name}" + _params(model))


def _params(model: Any) -> str:
    """`` · 135M params`` of a torch model (empty for anything else)."""
    params = getattr(model, "parameters", None)
    return f" · {sum(p.numel() for p in params()) / 1e6:.0f}M params" if callable(params) else ""

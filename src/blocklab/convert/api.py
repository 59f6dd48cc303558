"""Import (Hugging Face / GGUF -> blocklab checkpoint) and the pretrained source of
``init_from``; export (blocklab checkpoint -> Hugging Face directory) is in export.py."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from blocklab import checkpoint as ckpt
from blocklab.config import ModelConfig, TrainConfig, model_config, model_to_dict
from blocklab.config.migrate import legacy_config, legacy_layout
from blocklab.convert.fields import Fields
from blocklab.convert.gguf_file import read_gguf
from blocklab.convert.sources import Source, confined, read_hf_dir, resolve_source
from blocklab.convert.table import arch_for_model_type
from blocklab.convert.weights import Weights
from blocklab.errors import ConfigError
from blocklab.files import check_destination, write_dir_atomic, write_file
from blocklab.progress import Progress, quiet
from blocklab.provenance import arch_hash, config_hash, git_info, text_hash, versions

CONVERTER_VERSION = 1


@dataclass
class Pretrained:
    """A pretrained model mapped onto blocklab: model config, state dict (blocklab names),
    tokenizer JSON, its special ids, whether it starts text with BOS, and provenance."""

    model: ModelConfig
    state: dict[str, Tensor]
    tokenizer: str
    specials: dict[str, int | None]
    text_bos: bool
    source: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    chat_template: str | None = None  # the tokenizer's chat template (Jinja), if it has one


def read_pretrained(source: str, *, gguf: str | None = None,
                    ignore_fields: tuple[str, ...] = (),
                    progress: Progress | None = None) -> Pretrained:
    """Read and map a Hugging Face directory (or hub id, or ``gguf`` file in that directory).
    Every config field is mapped, checked or refused; every tensor is placed or refused, and
    must have the shape the config describes. ``progress`` reports each stage (quiet when
    None)."""
    say = progress or quiet()
    directory = resolve_source(source)
    src = read_gguf(directory, gguf, say) if gguf else read_hf_dir(directory, say)
    arch = arch_for_model_type(src.config.get("model_type"), src.where)
    say(f"mapping {len(src.tensors)} tensors onto blocklab's {arch.name} ({src.kind})")
    fields = Fields(src.config, src.where, ignore=tuple(ignore_fields))
    m = _model_config(arch, fields, src)
    notes = fields.finish()
    weights = Weights(src.tensors, src.weights_where or src.where)
    state = arch.weights_in(weights, m)
    _check_shapes(state, m, weights)
    notes += weights.finish(droppable=("bert.pooler.", "cls.seq_relationship.", "pooler."))
    tokenizer, specials, text_bos, tok_notes = source_tokenizer(src, m.vocab_size, say)
    info = {"kind": src.kind, "path": str(Path(source).resolve()) if Path(source).exists()
            else source, "gguf": gguf, "files": src.files, "architecture": arch.name,
            "model_type": src.config.get("model_type"), "converter_version": CONVERTER_VERSION,
            "ignored_fields": list(ignore_fields)}
    return Pretrained(m, state, tokenizer, specials, text_bos, info,
                      notes + src.notes + tok_notes, chat_template=src.chat_template)


def _model_config(arch, fields: Fields, src: Source) -> ModelConfig:
    """The blocklab model config ``arch`` maps the source's config to; a field of the wrong
    type or a missing size is refused in one line, like a value blocklab cannot express."""
    try:
        plain = arch.config_in(fields, src.tensors)
    except ConfigError:
        raise
    except (TypeError, KeyError, ValueError, AttributeError, ZeroDivisionError) as e:
        raise ConfigError(f"hf config {src.where}: not a {arch.name} config blocklab can read "
                          f"(a size is missing or of the wrong type: {type(e).__name__}: "
                          f"{e})") from None
    try:
        return model_config(plain)
    except ConfigError as e:
        raise ConfigError(f"hf config {src.where}: maps to a model blocklab refuses: {e}") from None


def _check_shapes(state: dict[str, Tensor], m: ModelConfig, weights: Weights) -> None:
    """Every mapped tensor has the shape of the parameter it fills (the model built on the
    meta device: no memory, no initialization)."""
    import torch

    from blocklab.model import build_model

    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in build_model(m).state_dict().items()}
    for key, t in state.items():
        if key in want and tuple(t.shape) != want[key]:
            raise weights.shape_error(key, t, want[key])


def source_tokenizer(src: Source, vocab_size: int, progress: Progress | None = None
                     ) -> tuple[str, dict[str, int | None], bool, list[str]]:
    """The model's own tokenizer as a ``tokenizers`` JSON string, its special ids (pad falls
    back to eos, then 0 — padding is masked, so any real id serves), and whether it begins
    plain text with BOS. ``tokenizer.json`` is read directly; a GGUF's vocabulary or a
    directory with only slow-tokenizer files goes through ``transformers``."""
    from tokenizers import Tokenizer

    from blocklab.data.tokenizer import find_specials

    say = progress or quiet()
    notes: list[str] = []
    file = src.directory / "tokenizer.json"
    if src.gguf_file is None and file.is_file():
        confined(src.directory, file.name, f"hf model file {file}")
        say(f"tokenizer from {file}")
        try:
            tok = Tokenizer.from_file(str(file))
        except Exception as e:
            raise ConfigError(f"tokenizer {file}: unreadable ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})") from None
    else:
        say(f"tokenizer through transformers from {src.directory / (src.gguf_file or '')} "
            "(a GGUF file is read once more)")
        hf_tok = _hf_tokenizer(src)
        tok = Tokenizer.from_str(hf_tok.backend_tokenizer.to_str())
    found = find_specials(tok, src.directory if src.gguf_file is None else None)
    if src.gguf_file is not None:  # the GGUF names its specials by id
        found.update({k: v for k, v in _gguf_specials(hf_tok).items() if v is not None})
    if found["eos"] is None:
        raise ConfigError(f"tokenizer {src.directory}: names no end-of-sequence token")
    if found["pad"] is None:
        found["pad"] = found["eos"]
        notes.append(f"tokenizer: no pad token; padding uses the eos id {found['eos']} (padding "
                     "is masked out)")
    text_bos = False
    if found["bos"] is not None:
        ids = tok.encode("a", add_special_tokens=True).ids
        text_bos = ids[:1] == [found["bos"]]
    else:  # an encoder-decoder starts the decoder from pad (T5); others have no BOS to add
        found["bos"] = found["pad"]
    if tok.get_vocab_size() > vocab_size:
        raise ConfigError(f"tokenizer {src.directory}: {tok.get_vocab_size()} tokens, more than "
                          f"the model's vocab_size={vocab_size}")
    tok.encode_special_tokens = True
    return tok.to_str(), found, text_bos, notes


def _hf_tokenizer(src: Source):
    try:
        from transformers import AutoTokenizer

        kw = {"gguf_file": src.gguf_file} if src.gguf_file else {}
        return AutoTokenizer.from_pretrained(str(src.directory), **kw)
    except Exception as e:
        raise ConfigError(f"tokenizer {src.directory}: no tokenizer.json, and transformers "
                          f"could not build one ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None


def _gguf_specials(hf_tok) -> dict[str, int | None]:
    return {"bos": hf_tok.bos_token_id, "eos": hf_tok.eos_token_id, "pad": hf_tok.pad_token_id}


def _train_config(m: ModelConfig, tokenizer_path: str | None) -> dict[str, Any]:
    """A whole training config around an imported model (the defaults elsewhere): what
    ``init_from`` and ``blocklab-eval`` read back."""
    from omegaconf import OmegaConf

    tc = OmegaConf.structured(TrainConfig)
    tc.model = OmegaConf.merge(tc.model, model_to_dict(m))
    plain = OmegaConf.to_container(tc, resolve=True, enum_to_str=True)
    plain["tokenizer"]["name"] = "file"
    plain["tokenizer"]["path"] = tokenizer_path
    plain["experiment_name"] = "imported"
    return plain


def import_model(source: str, out: str | Path | None = None, *, gguf: str | None = None,
                 ignore_fields: tuple[str, ...] = (), overwrite: bool = False,
                 log=print) -> Path:
    """``blocklab-import from_hf=<dir | hub id> [gguf=<file>] out=<dir>``: write an ordinary
    blocklab checkpoint (``<out>/checkpoints/step-000000``) that ``blocklab-eval``, ``load_model``
    and ``init_from`` read; returns the checkpoint directory. ``out`` must be new or empty;
    ``overwrite=True`` replaces it whole (files.write_dir_atomic: the old content stays as it
    was until the new one is complete). Stages are reported on stderr."""
    from blocklab.model import build_model
    from blocklab.model.estimate import count_params

    t0 = time.monotonic()
    say = Progress("import")
    name = Path(gguf).stem if gguf else Path(source.rstrip("/")).name
    run_dir = Path(out) if out else Path("outputs") / "imported" / name
    reads = (Path(source),) if Path(source).exists() else ()
    check_destination(run_dir, "out", overwrite=overwrite, reads=reads)  # before any reading
    p = read_pretrained(source, gguf=gguf, ignore_fields=ignore_fields, progress=say)
    say(f"building the model ({count_params(p.model):,} parameters)")
    model = build_model(p.model)
    model.load_state_dict(p.state, strict=True)
    meta = _meta(p, model, run_dir)
    state = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
             "blocklab": meta}
    size = nbytes(state["state_dict"].values())
    say(f"writing {run_dir} (checkpoint {size / 1e6:,.1f} MB, tokenizer, config)")

    def fill(tmp: Path) -> None:
        ckpt.write_checkpoint(tmp / "checkpoints" / f"{ckpt.PREFIX}000000", state)
        write_file(tmp / "config.yaml", meta["config_yaml"])
        (tmp / "tokenizer").mkdir()  # tokenizer=file tokenizer.path=<run>/tokenizer
        write_file(tmp / "tokenizer" / "tokenizer.json", p.tokenizer)
        write_file(tmp / "tokenizer" / "blocklab_specials.json", json.dumps(p.specials))
        if p.chat_template is not None:  # as Hugging Face keeps it, beside the tokenizer
            write_file(tmp / "tokenizer" / "tokenizer_config.json",
                       json.dumps({"chat_template": p.chat_template}, indent=2))
        write_file(tmp / "run.json", json.dumps(
            {k: meta[k] for k in ("params", "arch_hash", "config_hash", "tokenizer_hash",
                                   "versions", "git", "created", "run_dir", "imported")},
            indent=2))

    intact = (f"{run_dir} is as it was" if run_dir.exists() else f"nothing was written to "
              f"{run_dir}")
    write_dir_atomic(run_dir, fill, what=f"storage error: import to {run_dir}",
                     full=f"the import needs about {size:,} bytes free; {intact}",
                     overwrite=overwrite, reads=reads)
    for note in p.notes:
        log(f"note: {note}")
    say(f"done in {time.monotonic() - t0:,.0f} s")
    return run_dir / "checkpoints" / f"{ckpt.PREFIX}000000"


def nbytes(tensors: Iterable[Tensor]) -> int:
    """Bytes the tensors occupy, a storage shared by several (a tied head) counted once: about
    what writing them takes."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors}.values())


def _meta(p: Pretrained, model, run_dir: Path) -> dict[str, Any]:
    """The checkpoint metadata of an import (what a training run's step 0 would record)."""
    from blocklab.model.estimate import count_params

    plain = _train_config(p.model, str(run_dir / "tokenizer"))
    return {
        "format_version": ckpt.FORMAT_VERSION, "config": plain,
        "config_yaml": _yaml(plain), "overrides": [],
        "arch_hash": arch_hash(legacy_layout(model_to_dict(p.model))),
        "tokenizer": p.tokenizer, "tokenizer_hash": text_hash(p.tokenizer),
        "data_fingerprint": None, "specials": p.specials, "text_bos": p.text_bos,
        "chat_template": p.chat_template,
        "versions": versions(), "git": git_info(), "run_dir": str(run_dir),
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "params": count_params(p.model), "config_hash": config_hash(legacy_config(plain)),
        "imported": p.source, "step": 0, "batches_seen": 0, "tokens_seen": 0,
    }


def _yaml(plain: dict[str, Any]) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(plain))

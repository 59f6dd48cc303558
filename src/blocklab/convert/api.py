"""Import (Hugging Face / GGUF -> blocklab checkpoint), export (blocklab checkpoint -> Hugging
Face directory) and the pretrained source of ``init_from``."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from blocklab import checkpoint as ckpt
from blocklab.config import ModelConfig, TrainConfig, model_config, model_to_dict
from blocklab.convert.archs import ARCHITECTURES, Arch, Weights, arch_for_model_type
from blocklab.convert.fields import Fields
from blocklab.convert.sources import Source, read_gguf, read_hf_dir, resolve_source
from blocklab.errors import ConfigError, StorageError
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


def read_pretrained(source: str, *, gguf: str | None = None,
                    ignore_fields: tuple[str, ...] = ()) -> Pretrained:
    """Read and map a Hugging Face directory (or hub id, or ``gguf`` file in that directory).
    Every config field is mapped, checked or refused; every tensor is placed or refused."""
    directory = resolve_source(source)
    src = read_gguf(directory, gguf) if gguf else read_hf_dir(directory)
    arch = arch_for_model_type(src.config.get("model_type"), src.where)
    fields = Fields(src.config, src.where, ignore=tuple(ignore_fields))
    plain = arch.config_in(fields, src.tensors)
    notes = fields.finish()
    try:
        m = model_config(plain)
    except ConfigError as e:
        raise ConfigError(f"hf config {src.where}: maps to a model blocklab refuses: {e}") from None
    weights = Weights(src.tensors, src.where)
    state = arch.weights_in(weights, m)
    notes += weights.finish(droppable=("bert.pooler.", "cls.seq_relationship.", "pooler."))
    tokenizer, specials, text_bos, tok_notes = source_tokenizer(src, m.vocab_size)
    info = {"kind": src.kind, "path": str(Path(source).resolve()) if Path(source).exists()
            else source, "gguf": gguf, "files": src.files, "architecture": arch.name,
            "model_type": src.config.get("model_type"), "converter_version": CONVERTER_VERSION,
            "ignored_fields": list(ignore_fields)}
    return Pretrained(m, state, tokenizer, specials, text_bos, info,
                      notes + src.notes + tok_notes)


def source_tokenizer(src: Source, vocab_size: int) -> tuple[str, dict[str, int | None], bool,
                                                               list[str]]:
    """The model's own tokenizer as a ``tokenizers`` JSON string, its special ids (pad falls
    back to eos, then 0 — padding is masked, so any real id serves), and whether it begins
    plain text with BOS. ``tokenizer.json`` is read directly; a GGUF's vocabulary or a
    directory with only slow-tokenizer files goes through ``transformers``."""
    from tokenizers import Tokenizer

    from blocklab.data.tokenizer import find_specials

    notes: list[str] = []
    file = src.directory / "tokenizer.json"
    if src.gguf_file is None and file.is_file():
        tok = Tokenizer.from_file(str(file))
    else:
        try:
            from transformers import AutoTokenizer

            kw = {"gguf_file": src.gguf_file} if src.gguf_file else {}
            hf_tok = AutoTokenizer.from_pretrained(str(src.directory), **kw)
            tok = Tokenizer.from_str(hf_tok.backend_tokenizer.to_str())
        except Exception as e:
            raise ConfigError(f"tokenizer {src.directory}: no tokenizer.json, and transformers "
                              f"could not build one ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})") from None
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
                 ignore_fields: tuple[str, ...] = (), log=print) -> Path:
    """``blocklab-import from_hf=<dir | hub id> [gguf=<file>] out=<dir>``: write an ordinary
    blocklab checkpoint (``<out>/checkpoints/step-000000``) that ``blocklab-eval``, ``load_model``
    and ``init_from`` read; returns the checkpoint directory."""
    from blocklab.model import build_model
    from blocklab.model.estimate import count_params

    name = Path(gguf).stem if gguf else Path(source.rstrip("/")).name
    run_dir = Path(out) if out else Path("outputs") / "imported" / name
    target = run_dir / "checkpoints" / f"{ckpt.PREFIX}000000"
    if ckpt.list_checkpoints(run_dir):
        raise ConfigError(f"config error: out={str(run_dir)!r}: already holds checkpoints; "
                          "choose a new directory (nothing is overwritten)")
    p = read_pretrained(source, gguf=gguf, ignore_fields=ignore_fields)
    model = build_model(p.model)
    model.load_state_dict(p.state, strict=True)
    plain = _train_config(p.model, str(run_dir / "tokenizer"))
    meta = {
        "format_version": ckpt.FORMAT_VERSION, "config": plain,
        "config_yaml": _yaml(plain), "overrides": [], "arch_hash": arch_hash(model_to_dict(p.model)),
        "tokenizer": p.tokenizer, "tokenizer_hash": text_hash(p.tokenizer),
        "data_fingerprint": None, "specials": p.specials, "text_bos": p.text_bos,
        "versions": versions(), "git": git_info(), "run_dir": str(run_dir),
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "params": count_params(p.model), "config_hash": config_hash(plain),
        "imported": p.source, "step": 0, "batches_seen": 0, "tokens_seen": 0,
    }
    state = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
             "blocklab": meta}
    ckpt.write_checkpoint(target, state)
    (run_dir / "config.yaml").write_text(meta["config_yaml"])
    tok_dir = run_dir / "tokenizer"  # tokenizer=file tokenizer.path=<run>/tokenizer
    tok_dir.mkdir(exist_ok=True)
    (tok_dir / "tokenizer.json").write_text(p.tokenizer)
    (tok_dir / "blocklab_specials.json").write_text(json.dumps(p.specials))
    (run_dir / "run.json").write_text(json.dumps(
        {k: meta[k] for k in ("params", "arch_hash", "config_hash", "tokenizer_hash",
                               "versions", "git", "created", "run_dir", "imported")}, indent=2))
    for note in p.notes:
        log(f"note: {note}")
    return target


def _yaml(plain: dict[str, Any]) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(plain))


# ----------------------------------------------------------------------------------- export


def _compare(arch: Arch, m: ModelConfig) -> tuple[bool, list[str]]:
    """(whether ``arch`` has a name for every component of ``m``, the model keys where ``m``
    differs from what ``arch`` can express — a round trip through its HF config)."""
    try:
        back = model_config(arch.config_in(Fields(arch.config_out(m), f"<{arch.name}>"), {}))
    except ConfigError as e:  # a component the architecture has no name for
        return False, [str(e).split(": ", 1)[-1]]
    want, got = _normal(m), _normal(back)
    skip = set(arch.unmapped)
    return True, [f"model.{k}={v!r} ({arch.name} has {got.get(k)!r})" for k, v in want.items()
                  if k not in skip and not _same(v, got.get(k))]


def _normal(m: ModelConfig) -> dict[str, Any]:
    """Flat model config with derived values made explicit (head size, K/V heads, encoder
    depth), so equal models compare equal however they were written."""
    d = _flat(model_to_dict(m))
    d["d_head"], d["attention.n_kv_heads"] = m.head_dim, m.kv_heads
    d["family.n_encoder_layers"] = m.encoder_layers if m.family.name == "encoder_decoder" else None
    return d


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def pick_arch(m: ModelConfig, name: str | None = None) -> Arch:
    """The architecture to export ``m`` as: ``name``, else the one of its family that expresses
    it; refused naming every axis that has no equivalent."""
    if name is not None:
        if name not in ARCHITECTURES:
            raise ConfigError(f"config error: arch={name!r}: one of {sorted(ARCHITECTURES)}")
        candidates = [ARCHITECTURES[name]]
    else:
        candidates = [a for a in ARCHITECTURES.values() if a.family == m.family.name]
    if not candidates:
        raise ConfigError(f"export refused: model.family.name={m.family.name!r} has no Hugging "
                          "Face equivalent blocklab exports")
    compared = {a.name: _compare(a, m) for a in candidates}
    best = min(candidates, key=lambda a: (not compared[a.name][0], len(compared[a.name][1])))
    diff = compared[best.name][1]
    if diff:
        raise ConfigError(f"export refused: no Hugging Face equivalent as {best.name}: "
                          + "; ".join(diff))
    check = getattr(best, "check_out", None)
    if check is not None:
        check(m)
    return best


def export_model(target: str | Path, out: str | Path, *, arch: str | None = None,
                 log=print) -> Path:
    """``blocklab-export ckpt=<run dir | checkpoint> out=<dir>``: a directory Hugging Face
    ``from_pretrained`` loads (config.json, model.safetensors, the tokenizer files)."""
    from safetensors.torch import save_file

    path = ckpt.resolve(target)
    model, _, meta = ckpt.load_model(path)
    m = model.config
    chosen = pick_arch(m, arch)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"config error: out={str(out)!r}: exists and is not empty (nothing is "
                          "overwritten)")
    state = {k: v.detach().contiguous() for k, v in chosen.weights_out(model.state_dict(),
                                                                        m).items()}
    config = chosen.config_out(m)
    specials = meta.get("specials") or {}
    config.update({k: v for k, v in (("bos_token_id", specials.get("bos")),
                                     ("eos_token_id", specials.get("eos")),
                                     ("pad_token_id", specials.get("pad"))) if v is not None})
    config["torch_dtype"] = "float32"
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        _write_tokenizer(tmp, meta, specials)
        (tmp / "blocklab_export.json").write_text(json.dumps({
            "checkpoint": str(path), "step": meta.get("step"), "arch_hash": meta.get("arch_hash"),
            "architecture": chosen.name, "converter_version": CONVERTER_VERSION,
            "versions": versions()}, indent=2))
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise StorageError(e.errno, f"storage error: export to {out}: {e.strerror or e}") from None
    if m.dropout and "dropout" in chosen.unmapped:
        log(f"note: model.dropout={m.dropout} is not carried: {chosen.hf_class} has no "
            "residual dropout (training only; the outputs are the same)")
    log(f"exported {path} as {chosen.hf_class} to {out}")
    return out


def _write_tokenizer(out: Path, meta: dict[str, Any], specials: dict[str, Any]) -> None:
    """tokenizer.json and the files naming its specials (a synthetic vocabulary has no HF
    form: only the ids go in config.json)."""
    text = meta.get("tokenizer") or ""
    if not text or json.loads(text).get("kind") == "synthetic":
        print("note: the synthetic task vocabulary has no Hugging Face tokenizer; only the "
              "model is exported", file=sys.stderr)
        return
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(text)
    (out / "tokenizer.json").write_text(text)
    names = {}
    for role in ("bos", "eos", "pad", "mask"):
        i = specials.get(role)
        if i is not None and tok.id_to_token(i) is not None:
            names[f"{role}_token"] = tok.id_to_token(i)
    (out / "special_tokens_map.json").write_text(json.dumps(names, indent=2))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {**names, "tokenizer_class": "PreTrainedTokenizerFast",
         "add_bos_token": bool(meta.get("text_bos", False))}, indent=2))

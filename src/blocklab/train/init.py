"""``init_from``: start a new run from pretrained weights — a blocklab checkpoint (imported or
trained), a Hugging Face model directory or hub id, or a GGUF file.

The architecture comes from the source. On top of it only changes that keep every weight
meaningful are allowed (dropout, rotary scaling for context extension, the rope base, the
context length where no weight is sized by it — shapes compared, not scheme names); any other
``model.*`` override is refused with every differing key listed, as resume does. The source's tokenizer is the run's tokenizer
unless the command line names one, which must then have the same vocabulary and special ids.
The optimizer starts fresh; the run directory is new; the source is recorded in the metadata.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from torch import Tensor

from blocklab import checkpoint as ckpt
from blocklab.config import ConfigError, ModelConfig, model_to_dict
from blocklab.config.stored import refuse_instructions
from blocklab.provenance import config_diff, digest

# model keys an init_from run may change on top of its source
COMPATIBLE = ("model.dropout", "model.mixer.dropout", "model.init_std", "model.init",
              "model.embed_init_std",
              "model.position.scaling", "model.position.factor",
              "model.position.original_max_seq_len", "model.position.yarn_beta_fast",
              "model.position.yarn_beta_slow", "model.position.low_freq_factor",
              "model.position.high_freq_factor", "model.position.base", "model.max_seq_len")


@dataclass
class InitSource:
    model: dict[str, Any]  # plain model config
    state: dict[str, Tensor]  # blocklab parameter names
    tokenizer: str  # tokenizer JSON
    specials: dict[str, int | None]
    info: dict[str, Any]  # provenance recorded in the new run's metadata
    notes: list[str] = field(default_factory=list)


def read_source(target: str) -> InitSource:
    """The pretrained weights, architecture and tokenizer behind ``init_from=target``; reading
    and mapping a Hugging Face directory or GGUF file (a GGUF is dequantized: tens of seconds)
    reports each stage on stderr (``init_from: reading ...``)."""
    from blocklab.convert import read_pretrained
    from blocklab.progress import Progress

    p, best = ckpt.split_target(target)  # <run>:best: that run's best checkpoint
    if not best and (p.suffix == ".gguf" or not p.exists() or (p / "config.json").is_file()):
        say = Progress("init_from")
        pre = (read_pretrained(str(p.parent), gguf=p.name, progress=say) if p.suffix == ".gguf"
               else read_pretrained(target, progress=say))
        return InitSource(model_to_dict(pre.model), pre.state, pre.tokenizer, pre.specials,
                          {**pre.source, "format": pre.source["kind"], "kind": "hf"}, pre.notes)
    loaded = ckpt.read(target)  # verified; its stored config checked as data
    meta = loaded.meta
    info = {"kind": "blocklab", "checkpoint": str(loaded.path), "step": meta.get("step"),
            "arch_hash": meta.get("arch_hash"), "config_hash": meta.get("config_hash")}
    if meta.get("imported"):
        info["imported"] = meta["imported"]
    return InitSource(model_to_dict(loaded.config.model), loaded.weights, meta["tokenizer"],
                      meta.get("specials") or {}, info)


def _user_keys(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(model keys / groups the command line set, tokenizer keys it set)."""
    model, tok = [], []
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0].replace("/", ".")
        if key == "model":
            raise ConfigError(f"config error: {o}: init_from takes the architecture from its "
                              "source; drop the model preset (compatible model.* changes may "
                              "go on top)")
        if key.startswith("model."):
            model.append(key)
        elif key == "tokenizer" or key.startswith("tokenizer."):
            tok.append(key)
    return model, tok


def apply_init_from(cfg: DictConfig, overrides: list[str]) -> InitSource:
    """Put the source's architecture (plus the command line's compatible ``model.*`` changes)
    and, unless the command line names one, its tokenizer into ``cfg``; return the source."""
    source = read_source(cfg.init_from)
    refuse_instructions(source.model, f"init_from={cfg.init_from}", "model")  # never resolved
    for note in source.notes:
        print(f"init_from: {note}")
    model_keys, tok_keys = _user_keys(overrides)
    new = OmegaConf.create(source.model)
    for key in model_keys:
        OmegaConf.update(new, key.removeprefix("model."), OmegaConf.select(cfg, key), merge=False)
    plain_new = OmegaConf.to_container(new, enum_to_str=True)
    diff = config_diff({"model": source.model}, {"model": plain_new})
    bad = [d for d in diff if d[0] not in COMPATIBLE]
    if bad:
        lines = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in bad)
        raise ConfigError(f"init_from refused: incompatible with the source's architecture "
                          f"({len(bad)} keys): {lines} (allowed on top: dropout, rope scaling "
                          "and base, a max_seq_len that sizes no weight)")
    with open_dict(cfg):
        cfg.model = OmegaConf.merge(OmegaConf.structured(ModelConfig), new)
        if not tok_keys:
            cfg.tokenizer = OmegaConf.merge(cfg.tokenizer, _tokenizer_config(source, cfg))
    if diff:  # allowed keys changed: they must leave every weight's shape as it is
        _refuse_reshaped(source, OmegaConf.to_object(cfg.model), diff)
    print(loaded_line(source), file=sys.stderr)
    return source


def _refuse_reshaped(source: InitSource, target: ModelConfig, diff: list) -> None:
    """Refuse, in one line naming the changed keys, a change that resizes a weight (a learned
    position table, a long convolution's filter, ... sized by ``model.max_seq_len``): the
    target is built on the meta device (no memory) and its parameter shapes are compared with
    the source's, whatever the component that owns them."""
    import torch

    from blocklab.model.transformer import build_model

    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in build_model(target).state_dict().items()}
    moved = [(k, tuple(t.shape), shapes[k]) for k, t in source.state.items()
             if k in shapes and tuple(t.shape) != shapes[k]]
    if moved:
        keys = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diff)
        name, was, now = moved[0]
        more = f" and {len(moved) - 1} more" if len(moved) > 1 else ""
        raise ConfigError(f"init_from refused: {keys} changes the shape of {name} "
                          f"({list(was)} in the source, {list(now)} here){more}; keep the "
                          "source's value (the weights cannot be loaded into other shapes)")


def loaded_line(source: InitSource) -> str:
    """The one line saying which pretrained weights the run starts from: where, how many
    tensors and parameters (a storage shared by tied tensors counted once)."""
    info = source.info
    if info["kind"] == "blocklab":
        where = f"blocklab checkpoint {info['checkpoint']} (step {info.get('step')})"
    else:
        path = Path(str(info.get("path"))) / info["gguf"] if info.get("gguf") else info.get("path")
        where = f"{path} ({info.get('architecture')}, {info.get('format')})"
    params = sum({(t.data_ptr(), t.numel()): t.numel() for t in source.state.values()}.values())
    return (f"init_from: pretrained weights loaded from {where}: {len(source.state)} tensors, "
            f"{params:,} parameters (the model starts from them; the optimizer starts fresh)")


def _tokenizer_config(source: InitSource, cfg: DictConfig) -> dict[str, Any]:
    """The source's tokenizer as a tokenizer config: synthetic stays synthetic; a text
    tokenizer is written once (by content) under the data cache with its special ids."""
    if json.loads(source.tokenizer).get("kind") == "synthetic":
        return {"name": "synthetic"}
    from blocklab.data.prepare import cache_root

    root = cache_root(OmegaConf.to_object(cfg.data)) / "tokenizers" / \
        f"init-{digest([source.tokenizer, source.specials])}"
    if not (root / "blocklab_specials.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        (root / "tokenizer.json").write_text(source.tokenizer)
        (root / "blocklab_specials.json").write_text(json.dumps(source.specials))
    return {"name": "file", "path": str(root)}


def check_tokenizer(source: InitSource, tokenizer_json: str, specials: dict[str, Any]) -> None:
    """The run's tokenizer must give every token the id the source's weights were trained
    with, and the same special ids."""
    same_vocab = _vocab(tokenizer_json) == _vocab(source.tokenizer)
    src_specials = {k: v for k, v in source.specials.items() if v is not None}
    run_specials = {k: specials.get(k) for k in src_specials}
    if not same_vocab or run_specials != src_specials:
        what = "vocabulary" if not same_vocab else f"special ids ({run_specials} vs {src_specials})"
        raise ConfigError(f"init_from refused: the run's tokenizer differs from the source's "
                          f"({what}); leave tokenizer unset to use the source's own")


def _vocab(tokenizer_json: str) -> Any:
    data = json.loads(tokenizer_json)
    if data.get("kind") == "synthetic":
        return data
    from tokenizers import Tokenizer

    return sorted(Tokenizer.from_str(tokenizer_json).get_vocab(with_added_tokens=True).items())

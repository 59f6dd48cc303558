"""Export: a blocklab checkpoint written as a directory Hugging Face ``from_pretrained`` loads,
as the architecture that expresses the model exactly (refused, naming every differing axis,
where none does). The directory is written whole or not at all (files.write_dir_atomic)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from blocklab import checkpoint as ckpt
from blocklab.config import ModelConfig, model_config, model_to_dict
from blocklab.convert.api import CONVERTER_VERSION, nbytes
from blocklab.convert.archs import Arch
from blocklab.convert.fields import Fields
from blocklab.convert.table import ARCHITECTURES
from blocklab.errors import ConfigError
from blocklab.files import check_destination, write_dir_atomic, write_file
from blocklab.model.masks import layer_window
from blocklab.model.softmax_options import softmax_options
from blocklab.progress import Progress
from blocklab.provenance import versions

#: model keys that only say how a model is initialized: never part of what an export must keep
INIT_ONLY = ("init_std", "init", "embed_init_std")


def _compare(arch: Arch, m: ModelConfig) -> tuple[bool, list[str]]:
    """(whether ``arch`` has a name for every component of ``m``, the model keys where ``m``
    differs from what ``arch`` can express — a round trip through its HF config)."""
    try:
        back = model_config(arch.config_in(Fields(arch.config_out(m), f"<{arch.name}>"), {}))
    except ConfigError as e:  # a component the architecture has no name for
        return False, [str(e).split(": ", 1)[-1]]
    want, got = _normal(m), _normal(back)
    skip = set(arch.unmapped) | set(INIT_ONLY)
    if _layer_windows(m) == _layer_windows(back):  # one pattern, written either way
        skip |= {"mixer.global_every", "mixer.layers"}
    if _layer_mixers(m) == _layer_mixers(back):  # [softmax] is softmax on every layer
        skip |= {"mixer.name", "mixer.pattern", "mixer.encoder"}
    return True, [f"model.{k}={v!r} ({arch.name} has {got.get(k)!r})" for k, v in want.items()
                  if k not in skip and not _same(v, got.get(k))]


def _normal(m: ModelConfig) -> dict[str, Any]:
    """Flat model config with derived values made explicit (head size, K/V heads, encoder
    depth), so equal models compare equal however they were written."""
    d = _flat(model_to_dict(m))
    d["d_head"], d["attention.n_kv_heads"] = m.head_dim, m.kv_heads
    d["family.n_encoder_layers"] = m.encoder_layers if m.family.name == "encoder_decoder" else None
    return d


def _layer_windows(m: ModelConfig) -> list[int | None]:
    """Each layer's window (masks.layer_window) over the deepest stack: ``global_every: 2``
    and ``layers: [local, global]`` are the same model."""
    opts = softmax_options(m)
    return [layer_window(opts, i) for i in range(max(m.n_layers, m.encoder_layers))]


def _layer_mixers(m: ModelConfig) -> list[list[str]]:
    """Each layer's mixer, stack by stack (the family's stacks): ``mixer.pattern: [softmax]``
    (a sweep's value) and the default ``mixer.name: softmax`` are the same model."""
    from blocklab.model.estimate import stacks_of

    return [[m.layer_mixer(i, causal) for i in range(n)] for n, _, causal in stacks_of(m)]


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
                 overwrite: bool = False, log=print) -> Path:
    """``blocklab-export ckpt=<run dir | checkpoint> out=<dir>``: a directory Hugging Face
    ``from_pretrained`` loads (config.json, model.safetensors, the tokenizer files). ``out``
    must be new or empty; ``overwrite=True`` replaces it whole (the old content stays as it
    was until the new one is complete). Stages are reported on stderr."""
    say = Progress("export")
    out = Path(out)
    reads = (Path(target),) if Path(target).exists() else ()
    check_destination(out, "out", overwrite=overwrite, reads=reads)  # before loading anything
    say(f"loading {target}")
    loaded = ckpt.read(target)  # resolved, verified and loaded once
    path, meta = loaded.path, loaded.meta
    model, _ = ckpt.model_of(loaded)
    m = model.config
    chosen = pick_arch(m, arch)
    state = {k: v.detach().contiguous() for k, v in chosen.weights_out(model.state_dict(),
                                                                        m).items()}
    say(f"converting to {chosen.hf_class} ({len(state)} tensors)")
    config = chosen.config_out(m)
    specials = meta.get("specials") or {}
    config.update({k: v for k, v in (("bos_token_id", specials.get("bos")),
                                     ("eos_token_id", specials.get("eos")),
                                     ("pad_token_id", specials.get("pad"))) if v is not None})
    config["torch_dtype"] = "float32"
    size = nbytes(state.values())
    say(f"writing {out} (config.json, model.safetensors {size / 1e6:,.1f} MB, tokenizer)")

    def fill(tmp: Path) -> None:
        write_file(tmp / "config.json", json.dumps(config, indent=2, sort_keys=True))
        save_safetensors(state, tmp / "model.safetensors")
        _write_tokenizer(tmp, meta, specials, say)
        write_file(tmp / "blocklab_export.json", json.dumps({
            "checkpoint": str(path), "step": meta.get("step"), "arch_hash": meta.get("arch_hash"),
            "architecture": chosen.name, "converter_version": CONVERTER_VERSION,
            "versions": versions()}, indent=2))

    intact = f"{out} is as it was" if out.exists() else f"nothing was written to {out}"
    write_dir_atomic(out, fill, what=f"storage error: export to {out}",
                     full=f"the export needs about {size:,} bytes free; {intact}",
                     overwrite=overwrite, reads=reads)
    if m.dropout and "dropout" in chosen.unmapped:
        log(f"note: model.dropout={m.dropout} is not carried: {chosen.hf_class} has no "
            "residual dropout (training only; the outputs are the same)")
    log(f"exported {path} as {chosen.hf_class} to {out}")
    return out


def save_safetensors(state: dict[str, Any], path: Path) -> None:
    """``safetensors.torch.save_file``, its write errors (a full disk, ...) as the ``OSError``
    they are: safetensors writes in Rust and raises its own ``SafetensorError`` ("... No
    space left on device (os error 28) ..."), which the one-line storage errors of
    ``files.write_dir_atomic`` would not know."""
    import errno
    import os
    import re

    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(state, str(path), metadata={"format": "pt"})
    except SafetensorError as e:
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        n = int(code.group(1))
        raise OSError(n, os.strerror(n) if n in errno.errorcode else str(e), str(path)) from None


def _write_tokenizer(out: Path, meta: dict[str, Any], specials: dict[str, Any],
                     say: Progress) -> None:
    """tokenizer.json and the files naming its specials (a synthetic vocabulary has no HF
    form: only the ids go in config.json)."""
    text = meta.get("tokenizer") or ""
    if not text or json.loads(text).get("kind") == "synthetic":
        say("note: the synthetic task vocabulary has no Hugging Face tokenizer; only the "
            "model is exported")
        return
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(text)
    write_file(out / "tokenizer.json", text)
    names = {}
    for role in ("bos", "eos", "pad", "mask"):
        i = specials.get(role)
        if i is not None and tok.id_to_token(i) is not None:
            names[f"{role}_token"] = tok.id_to_token(i)
    write_file(out / "special_tokens_map.json", json.dumps(names, indent=2))
    write_file(out / "tokenizer_config.json", json.dumps(
        {**names, "tokenizer_class": "PreTrainedTokenizerFast",
         "add_bos_token": bool(meta.get("text_bos", False))}, indent=2))

"""Reading a pretrained model as Hugging Face names it: a model directory (``config.json`` plus
safetensors — one file or an index of shards — or ``pytorch_model.bin``), or a hub id where a
network exists (GGUF files: gguf_file.py). Tokenizers come from the model's own files.

Every file read from a model directory is confined to it: a shard index entry with ``..`` or
an absolute path, or a file that is a symlink out of the directory, is refused in one line —
an import never reads (and records as the model's provenance) weights from elsewhere."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from blocklab.errors import ConfigError
from blocklab.files import sha256_file
from blocklab.progress import Progress

INDEX = "model.safetensors.index.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# The files a model directory's readers open by name: blocklab's (config, weights, tokenizer
# and its specials) and those transformers builds a tokenizer from when there is no
# tokenizer.json.
TOKENIZER_FILES = ("tokenizer.json", "special_tokens_map.json", "tokenizer_config.json",
                   "added_tokens.json", "tokenizer.model", "spiece.model", "vocab.txt",
                   "vocab.json", "merges.txt", "chat_template.jinja")


@dataclass
class Source:
    """A pretrained model read into memory: HF config dict, HF-named fp32 tensors, the files
    read (names relative to the directory, with sha256), where its config and weights are,
    where its tokenizer is, and how it was stored."""

    config: dict[str, Any]
    tensors: dict[str, Tensor]
    files: dict[str, str]
    where: str
    kind: str  # "safetensors" | "pytorch" | "gguf"
    directory: Path
    gguf_file: str | None = None
    notes: list[str] = field(default_factory=list)
    weights_where: str = ""  # the weights file (or shard index) tensors are named after
    chat_template: str | None = None  # the tokenizer's chat template (Jinja), if it has one


def resolve_source(source: str) -> Path:
    """A local directory, or a hub id downloaded with ``huggingface_hub`` (network needed)."""
    p = Path(source)
    if p.exists():
        if not p.is_dir():
            raise ConfigError(f"config error: from_hf={source!r}: not a directory (a GGUF file "
                              "goes in gguf=<file name> with from_hf=<its directory>)")
        return p
    if source.count("/") != 1 or source.startswith((".", "/")):
        raise ConfigError(f"config error: from_hf={source!r}: no such directory (and not a "
                          "hub id such as org/name)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, allow_patterns=[
            "*.json", "*.safetensors", "*.model", "*.txt", "*.gguf"]))
    except Exception as e:  # offline, unknown repo, gated repo
        raise ConfigError(f"config error: from_hf={source!r}: not a local directory, and the "
                          f"hub download failed ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None


def model_roots(directory: Path) -> tuple[Path, ...]:
    """Where a model directory's files may resolve: inside the directory itself, and, for a
    snapshot of the Hugging Face hub cache (``models--org--name/snapshots/<revision>``, whose
    files are symlinks to ``../../blobs/<hash>``), inside that repository's ``blobs``."""
    root = directory.resolve()
    blobs = root.parent.parent / "blobs"
    if root.parent.name == "snapshots" and blobs.is_dir():
        return root, blobs.resolve()
    return (root,)


def confined(directory: Path, name: str, what: str) -> Path:
    """``directory / name``, refused when it resolves outside the model directory
    (:func:`model_roots`) through ``..``, an absolute name or a symlink; ``what`` begins the
    one-line error. A file that does not exist resolves inside: missing files are refused
    where they are needed."""
    path = directory / name
    resolved = path.resolve()
    if not any(resolved.is_relative_to(r) for r in model_roots(directory)):
        raise ConfigError(f"{what} resolves to {resolved}, outside the model directory "
                          f"{directory}; every file a model directory names must lie inside it "
                          "(copy the file in)")
    return path


def read_json_object(path: Path, label: str) -> dict[str, Any]:
    """A JSON file holding an object, refused in one line ``<label> <path>: ...`` otherwise."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{label} {path}: unreadable ({e.strerror or e})") from None
    except ValueError as e:
        raise ConfigError(f"{label} {path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{label} {path}: a JSON object expected, found a "
                          f"{type(data).__name__}")
    return data


def _shards(directory: Path) -> list[str]:
    """The shard files a ``model.safetensors.index.json`` names, each confined."""
    index = directory / INDEX
    weight_map = read_json_object(index, "hf weights index").get("weight_map")
    where = f"hf weights index {index}"
    if weight_map is None:
        raise ConfigError(f"{where}: no weight_map (the tensor name -> shard file map)")
    if not isinstance(weight_map, dict):
        raise ConfigError(f"{where}: weight_map: an object of tensor name -> file expected, "
                          f"found a {type(weight_map).__name__}")
    for key, name in weight_map.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: weight_map entry {key!r} -> {name!r}: a file name "
                              "expected")
        confined(directory, name, f"{where}: weight_map entry {key!r} -> {name!r}")
    return sorted(set(weight_map.values()))


def _weight_files(directory: Path) -> tuple[list[str], str, Path]:
    """(the weight files to read, relative names; their kind; the file tensors are named
    after in errors)."""
    if (directory / "model.safetensors").is_file():
        return ["model.safetensors"], "safetensors", directory / "model.safetensors"
    if (directory / INDEX).is_file():
        return _shards(directory), "safetensors", directory / INDEX
    if (directory / "pytorch_model.bin").is_file():
        return ["pytorch_model.bin"], "pytorch", directory / "pytorch_model.bin"
    raise ConfigError(f"config error: from_hf={str(directory)!r}: no model.safetensors, "
                      "model.safetensors.index.json or pytorch_model.bin there (a GGUF "
                      "file: pass gguf=<file name>)")


def _load(f: Path, kind: str) -> dict[str, Tensor]:
    if not f.is_file():
        raise ConfigError(f"hf weights {f}: missing (listed in the shard index)")
    try:
        if kind == "safetensors":
            from safetensors.torch import load_file

            return load_file(str(f))
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(f"hf weights {f}: unreadable ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None


def read_hf_dir(directory: Path, progress: Progress) -> Source:
    """A Hugging Face model directory read into memory, every file it names confined to it."""
    for name in ("config.json", INDEX, *WEIGHT_FILES, *TOKENIZER_FILES):
        confined(directory, name, f"hf model file {directory / name}")
    cfg_file = directory / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"config error: from_hf={str(directory)!r}: no config.json there")
    config = read_json_object(cfg_file, "hf config")
    names, kind, weights_where = _weight_files(directory)
    tensors: dict[str, Tensor] = {}
    for i, name in enumerate(names, 1):
        f = directory / name
        size = f.stat().st_size / 1e6 if f.is_file() else 0
        shard = f", shard {i}/{len(names)}" if len(names) > 1 else ""
        progress(f"reading {f} ({size:,.1f} MB{shard})")
        tensors.update(_load(f, kind))
    tensors = {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
    files = {name: sha256_file(directory / name) for name in ["config.json", *names]}
    return Source(config, tensors, files, str(cfg_file), kind, directory,
                  weights_where=str(weights_where), chat_template=hf_chat_template(directory))


def hf_chat_template(directory: Path) -> str | None:
    """The chat template a Hugging Face tokenizer directory declares: ``chat_template.jinja``
    (newer transformers), else ``tokenizer_config.json``'s ``chat_template`` (a string, or a
    list of named templates: the one named ``default``); None without one. Kept by the import
    so ``blocklab-generate chat=true`` can apply it."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    cfg = directory / "tokenizer_config.json"
    template = read_json_object(cfg, "hf tokenizer config").get("chat_template") \
        if cfg.is_file() else None
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        template = next((t.get("template") for t in template if isinstance(t, dict)
                         and t.get("name") == "default"), None)
    return template if isinstance(template, str) else None

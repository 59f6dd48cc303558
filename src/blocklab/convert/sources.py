"""Reading a pretrained model as Hugging Face names it: a model directory (``config.json`` plus
safetensors — one file or an index of shards — or ``pytorch_model.bin``), a GGUF file
(llama architecture, dequantized, llama.cpp's q/k row permutation undone), or a hub id where a
network exists. Tokenizers come from the model's own files."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from blocklab.errors import ConfigError
from blocklab.files import sha256_file


@dataclass
class Source:
    """A pretrained model read into memory: HF config dict, HF-named fp32 tensors, the files
    read (with sha256), where its tokenizer is, and how it was stored."""

    config: dict[str, Any]
    tensors: dict[str, Tensor]
    files: dict[str, str]
    where: str
    kind: str  # "safetensors" | "pytorch" | "gguf"
    directory: Path
    gguf_file: str | None = None
    notes: list[str] = field(default_factory=list)


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


def read_hf_dir(directory: Path) -> Source:
    cfg_file = directory / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"config error: from_hf={str(directory)!r}: no config.json there")
    try:
        config = json.loads(cfg_file.read_text())
    except ValueError as e:
        raise ConfigError(f"hf config {cfg_file}: not valid JSON ({e})") from None
    index = directory / "model.safetensors.index.json"
    if (directory / "model.safetensors").is_file():
        files, kind = [directory / "model.safetensors"], "safetensors"
    elif index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files, kind = [directory / s for s in shards], "safetensors"
    elif (directory / "pytorch_model.bin").is_file():
        files, kind = [directory / "pytorch_model.bin"], "pytorch"
    else:
        raise ConfigError(f"config error: from_hf={str(directory)!r}: no model.safetensors, "
                          "model.safetensors.index.json or pytorch_model.bin there (a GGUF "
                          "file: pass gguf=<file name>)")
    tensors: dict[str, Tensor] = {}
    for f in files:
        if not f.is_file():
            raise ConfigError(f"hf weights {f}: missing (listed in the shard index)")
        try:
            if kind == "safetensors":
                from safetensors.torch import load_file

                part = load_file(str(f))
            else:
                part = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ConfigError(f"hf weights {f}: unreadable ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})") from None
        tensors.update(part)
    tensors = {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
    return Source(config, tensors, {f.name: sha256_file(f) for f in [cfg_file, *files]},
                  str(cfg_file), kind, directory)


# ------------------------------------------------------------------------------------- GGUF

# GGUF metadata (llama.*) -> HF Llama config keys.
_GGUF_KEYS = {
    "block_count": "num_hidden_layers", "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads", "rope.freq_base": "rope_theta",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size",
    "attention.key_length": "head_dim",
}
_GGUF_SAME = ("rope.dimension_count", "attention.value_length")  # checked against head_dim
_GGUF_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def unpermute_rotary_rows(w: Tensor, n_heads: int) -> Tensor:
    """Undo llama.cpp's q/k row order: its converter interleaves each head's two rotary halves
    (rows ``[h, 2, d/2]`` stored as ``[h, d/2, 2]``) for its own rotary layout; blocklab, like
    Hugging Face, rotates half against half."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _field(reader, key: str) -> Any:
    f = reader.fields[key]
    return f.contents()


def read_gguf(directory: Path, name: str) -> Source:
    path = directory / name
    if not path.is_file():
        raise ConfigError(f"config error: gguf={name!r}: no such file in {directory}")
    try:
        from gguf import GGUFReader, dequantize
    except ImportError:
        raise ConfigError("config error: gguf: reading GGUF files needs the gguf package "
                          "(pip install gguf)") from None
    try:
        reader = GGUFReader(str(path))
    except Exception as e:
        raise ConfigError(f"gguf {path}: unreadable ({type(e).__name__}: {e})") from None
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ConfigError(f"gguf {path}: general.architecture={arch!r}: blocklab reads GGUF "
                          "files of the llama architecture (other architectures: import the "
                          "Hugging Face directory)")
    config: dict[str, Any] = {"model_type": "llama", "hidden_act": "silu"}
    head_dim_checks = {}
    for key in reader.fields:
        if not key.startswith("llama."):
            continue
        short = key.removeprefix("llama.")
        value = _field(reader, key)
        if short in _GGUF_KEYS:
            config[_GGUF_KEYS[short]] = value
        elif short in _GGUF_SAME:
            head_dim_checks[short] = value
        elif short == "rope.scaling.type":
            config.setdefault("rope_scaling", {})["rope_type"] = value
        elif short == "rope.scaling.factor":
            config.setdefault("rope_scaling", {})["factor"] = value
        elif short == "rope.scaling.original_context_length":
            config.setdefault("rope_scaling", {})["original_max_position_embeddings"] = value
        else:
            config[f"gguf:{key}"] = value  # refused by the config mapping, by name
    if config.get("rope_scaling", {}).get("rope_type") == "none":
        config.pop("rope_scaling")
    names = {t.name for t in reader.tensors}
    config["tie_word_embeddings"] = "output.weight" not in names
    h, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    kv = kv or h
    d_head = config.get("head_dim") or config["hidden_size"] // h
    for short, value in head_dim_checks.items():
        if value != d_head:
            raise ConfigError(f"gguf {path}: llama.{short}={value}: blocklab needs it equal to "
                              f"the head dimension ({d_head})")
    tensors: dict[str, Tensor] = {}
    for t in reader.tensors:
        w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).float()
        parts = t.name.split(".")
        if t.name == "token_embd.weight":
            key = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            key = "model.norm.weight"
        elif t.name == "output.weight":
            key = "lm_head.weight"
        elif parts[0] == "blk" and parts[2] in _GGUF_LAYER:
            key = f"model.layers.{parts[1]}.{_GGUF_LAYER[parts[2]]}.{parts[-1]}"
            if parts[2] == "attn_q":
                w = unpermute_rotary_rows(w, h)
            elif parts[2] == "attn_k":
                w = unpermute_rotary_rows(w, kv)
        else:
            key = f"gguf:{t.name}"  # refused by the weight mapping, by name
        tensors[key] = w
    config.setdefault("vocab_size", tensors["model.embed_tokens.weight"].shape[0])
    return Source(config, tensors, {name: sha256_file(path)}, str(path), "gguf", directory,
                  gguf_file=name)

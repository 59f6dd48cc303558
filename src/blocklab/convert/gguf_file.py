"""Reading a GGUF file (llama architecture) as a Hugging Face Llama: its ``llama.*`` metadata
as config keys, its tensors dequantized to fp32 under HF names, llama.cpp's q/k row
permutation undone. A file that does not say what it holds, lacks a size the model needs or
holds no tensors is refused in one line naming the file and the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from blocklab.convert.sources import Source, confined
from blocklab.errors import ConfigError
from blocklab.files import sha256_file
from blocklab.progress import Progress

# GGUF metadata (llama.*) -> HF Llama config keys.
_GGUF_KEYS = {
    "block_count": "num_hidden_layers", "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads", "rope.freq_base": "rope_theta",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size",
    "attention.key_length": "head_dim",
}
# The sizes a llama GGUF file must state (positive integers).
_GGUF_REQUIRED = ("block_count", "embedding_length", "feed_forward_length",
                  "attention.head_count")
_GGUF_ROPE = {"rope.scaling.type": "rope_type", "rope.scaling.factor": "factor",
              "rope.scaling.original_context_length": "original_max_position_embeddings"}
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


def read_gguf(directory: Path, name: str, progress: Progress) -> Source:
    path = confined(directory, name, f"config error: gguf={name!r} ({directory / name})")
    if not path.is_file():
        raise ConfigError(f"config error: gguf={name!r}: no such file in {directory}")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ConfigError("config error: gguf: reading GGUF files needs the gguf package "
                          "(pip install gguf)") from None
    progress(f"reading {path} ({path.stat().st_size / 1e6:,.1f} MB)")
    try:
        reader = GGUFReader(str(path))
    except Exception as e:
        raise ConfigError(f"gguf {path}: unreadable ({type(e).__name__}: {e})") from None
    config = _gguf_config(reader, path)
    tensors = _gguf_tensors(reader, path, config, progress)
    if "model.embed_tokens.weight" in tensors:
        config.setdefault("vocab_size", tensors["model.embed_tokens.weight"].shape[0])
    template = (_field(reader, "tokenizer.chat_template")
                if "tokenizer.chat_template" in reader.fields else None)
    return Source(config, tensors, {name: sha256_file(path)}, str(path), "gguf", directory,
                  gguf_file=name, weights_where=str(path),
                  chat_template=template if isinstance(template, str) else None)


def _gguf_config(reader, path: Path) -> dict[str, Any]:
    """The file's metadata as a Hugging Face Llama config (unknown keys kept as ``gguf:<key>``,
    refused by name by the config mapping)."""
    if "general.architecture" not in reader.fields:
        raise ConfigError(f"gguf {path}: no general.architecture (the file does not say which "
                          "model it holds; blocklab reads GGUF files of the llama architecture)")
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ConfigError(f"gguf {path}: general.architecture={arch!r}: blocklab reads GGUF "
                          "files of the llama architecture (other architectures: import the "
                          "Hugging Face directory)")
    if not reader.tensors:
        raise ConfigError(f"gguf {path}: no tensors (a model file holds its weights; this one "
                          "has metadata only)")
    for short in _GGUF_REQUIRED:
        value = _field(reader, f"llama.{short}") if f"llama.{short}" in reader.fields else None
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(f"gguf {path}: llama.{short}={value!r}: a llama GGUF file states "
                              "it as a positive integer")
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
        elif short in _GGUF_ROPE:
            config.setdefault("rope_scaling", {})[_GGUF_ROPE[short]] = value
        else:
            config[f"gguf:{key}"] = value  # refused by the config mapping, by name
    if config.get("rope_scaling", {}).get("rope_type") == "none":
        config.pop("rope_scaling")
    config["tie_word_embeddings"] = "output.weight" not in {t.name for t in reader.tensors}
    d_head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    for short, value in head_dim_checks.items():
        if value != d_head:
            raise ConfigError(f"gguf {path}: llama.{short}={value}: blocklab needs it equal to "
                              f"the head dimension ({d_head})")
    return config


def _gguf_name(name: str) -> str:
    """A GGUF tensor name -> its Hugging Face Llama name (``gguf:<name>`` when it has none,
    refused by name by the weight mapping)."""
    fixed = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    parts = name.split(".")
    if name in fixed:
        return fixed[name]
    if len(parts) >= 4 and parts[0] == "blk" and parts[2] in _GGUF_LAYER:
        return f"model.layers.{parts[1]}.{_GGUF_LAYER[parts[2]]}.{parts[-1]}"
    return f"gguf:{name}"


def _gguf_tensors(reader, path: Path, config: dict[str, Any],
                  progress: Progress) -> dict[str, Tensor]:
    from gguf import dequantize

    h = config["num_attention_heads"]
    heads = {"attn_q": h, "attn_k": config.get("num_key_value_heads") or h}
    tensors: dict[str, Tensor] = {}
    with progress.count("dequantizing tensors", len(reader.tensors)) as tick:
        for t in reader.tensors:
            try:
                w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).float()
            except Exception as e:
                raise ConfigError(f"gguf {path}: tensor {t.name!r} ({t.tensor_type.name}): "
                                  f"cannot be dequantized ({type(e).__name__}: {e})") from None
            parts = t.name.split(".")
            kind = parts[2] if len(parts) >= 4 and parts[0] == "blk" else ""
            if kind in heads:
                try:
                    w = unpermute_rotary_rows(w, heads[kind])
                except RuntimeError:
                    raise ConfigError(f"gguf {path}: tensor {t.name!r} of shape "
                                      f"{list(w.shape)} does not split into {heads[kind]} "
                                      "heads of two rotary halves") from None
            tensors[_gguf_name(t.name)] = w
            tick()
    return tensors

"""What every Hugging Face architecture of convert/ shares: the :class:`Arch` contract (four
maps: config in and out, weights in and out) and the field and weight helpers more than one
family uses (attention layout by head counts, FFN activations, the tied output projection).
The architectures themselves: archs.py (Llama, GPT-2), encoders.py (BERT, T5), windows.py
(Mistral, Qwen2)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from blocklab.config import ModelConfig
from blocklab.convert.fields import Fields
from blocklab.convert.weights import Weights
from blocklab.errors import ConfigError


def _attention_name(n_heads: int, kv: int) -> str:
    return "mha" if kv == n_heads else "mqa" if kv == 1 else "gqa"


def _gelu_ffn(act: str, f: Fields, key: str, *, gated: bool = False) -> dict[str, Any]:
    """An HF activation name -> blocklab ffn name + GELU form."""
    forms = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
    if act == "relu" and not gated:
        return {"name": "relu_mlp", "approximate": "none"}
    if act == "silu" and gated:
        return {"name": "swiglu", "approximate": "none"}
    if forms.get(act) is None:
        f.refuse(key, act, "blocklab's FFN activations are relu, silu (gated), exact gelu and "
                 "the tanh gelu (gelu_new / gelu_pytorch_tanh)")
    return {"name": "geglu" if gated else "gelu_mlp", "approximate": forms[act]}


def _hf_act(ffn: dict[str, Any]) -> str:
    if ffn["name"] == "relu_mlp":
        return "relu"
    if ffn["name"] == "swiglu":
        return "silu"
    return "gelu_new" if ffn["approximate"] == "tanh" else "gelu"


class Arch:
    name: str = ""
    model_types: tuple[str, ...] = ()
    hf_class: str = ""
    auto: str = ""
    family: str = ""
    #: blocklab model keys the HF config does not carry (not compared on export).
    unmapped: tuple[str, ...] = ("init_std",)

    def config_in(self, f: Fields, tensors: dict[str, Tensor]) -> dict[str, Any]:
        raise NotImplementedError

    def config_out(self, m: ModelConfig) -> dict[str, Any]:
        raise NotImplementedError

    def weights_in(self, w: Weights, m: ModelConfig) -> dict[str, Tensor]:
        raise NotImplementedError

    def weights_out(self, s: dict[str, Tensor], m: ModelConfig) -> dict[str, Tensor]:
        raise NotImplementedError


def _head_in(w: Weights, m: ModelConfig, out: dict[str, Tensor], key: str) -> None:
    """The output projection: its own tensor when untied; when tied, the embedding (a copy in
    the file, if any, must equal it)."""
    if m.tie_embeddings:
        if w.has(key):
            head = w.take(key)
            if not torch.equal(head, out["embed.weight"]):
                raise ConfigError(f"hf weights {w.where}: {key} differs from the token "
                                  "embedding although the config ties them "
                                  "(tie_word_embeddings=true)")
        out["head.proj.weight"] = out["embed.weight"]
    else:
        out["head.proj.weight"] = w.take(key)


def _ffn(m: ModelConfig) -> dict[str, Any]:
    return {"name": m.ffn.name, "approximate": m.ffn.approximate}


"""The Hugging Face architectures blocklab expresses exactly, each as four maps: its config to
blocklab's model config and back, its weights to blocklab's state dict and back.

An architecture is a class with ``name``, ``model_types`` (HF ``model_type`` values it reads),
``hf_class`` (what it exports as), ``auto`` (the ``transformers`` auto class that loads the
export), ``config_in(fields, tensors)``, ``config_out(m)``, ``weights_in(tensors, m)`` and
``weights_out(state, m)``. Weight maps are explicit per layer; blocklab's fused projections
(``attn.qkv`` = q|k|v rows, ``ffn.gate_up`` = gate|up rows, ``cross.kv`` = k|v rows) are
concatenated on the way in and split on the way out.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

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


# ------------------------------------------------------------------------------------ Llama


def _rope_in(f: Fields, max_positions: int) -> dict[str, Any]:
    """HF rope settings (v5 ``rope_parameters`` or v4 ``rope_theta`` + ``rope_scaling``) ->
    blocklab's position config."""
    params = dict(f.take("rope_scaling") or {})
    params.update(f.take("rope_parameters") or {})
    theta = params.pop("rope_theta", None) or f.take("rope_theta", 10000.0)
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    out: dict[str, Any] = {"name": "rope", "base": float(theta)}
    if f.take("partial_rotary_factor", 1.0) != 1.0:
        f.refuse("partial_rotary_factor", f.config["partial_rotary_factor"],
                 "blocklab rotates the whole head dimension")
    supported = {"default": (), "linear": ("factor",),
                 "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow"),
                 "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor",
                            "high_freq_factor")}
    if kind not in supported:
        f.refuse("rope_parameters.rope_type", kind,
                 f"blocklab's rope scalings are {sorted(supported)} (ntk is blocklab's static form)")
    for key, value in params.items():
        if key not in supported[kind] and not (key == "truncate" and value is True):
            f.refuse(f"rope_parameters.{key}", value, f"not an option of blocklab's {kind} rope "
                     "scaling")
    if kind == "default":
        return out
    out.update(scaling=kind, factor=float(params["factor"]))
    if kind in ("yarn", "llama3"):
        out["original_max_seq_len"] = int(params.get("original_max_position_embeddings")
                                          or max_positions)
    if kind == "yarn":
        out["yarn_beta_fast"] = float(params.get("beta_fast", 32.0))
        out["yarn_beta_slow"] = float(params.get("beta_slow", 1.0))
    if kind == "llama3":
        out["low_freq_factor"] = float(params.get("low_freq_factor", 1.0))
        out["high_freq_factor"] = float(params.get("high_freq_factor", 4.0))
    return out


def _rope_out(m: ModelConfig) -> dict[str, Any]:
    p = m.position
    params: dict[str, Any] = {"rope_type": "default" if p.scaling.value == "none"
                              else p.scaling.value, "rope_theta": p.base}
    if p.scaling.value != "none":
        params["factor"] = p.factor
    if p.scaling.value in ("yarn", "llama3"):
        params["original_max_position_embeddings"] = p.original_max_seq_len or m.max_seq_len
    if p.scaling.value == "yarn":
        params.update(beta_fast=p.yarn_beta_fast, beta_slow=p.yarn_beta_slow)
    if p.scaling.value == "llama3":
        params.update(low_freq_factor=p.low_freq_factor, high_freq_factor=p.high_freq_factor)
    return params


class Llama(Arch):
    """Llama 1/2/3 and its kin (SmolLM, TinyLlama): RMSNorm pre-norm, rotary (with linear /
    YaRN / Llama-3 scaling), SwiGLU, MHA / GQA / MQA, optional biases, tied or not. Mistral and
    Qwen2 (windows.py) are this layout with other config keys: ``core_in`` / ``core_out`` are
    the keys they share, ``attn_in`` / ``attn_out`` the attention projections' weights."""

    name, model_types, family = "llama", ("llama",), "decoder"
    hf_class, auto = "LlamaForCausalLM", "AutoModelForCausalLM"
    unmapped = ("init_std", "dropout")  # HF Llama has no residual dropout
    #: the HF config class's defaults for keys a config.json may leave out
    defaults: ClassVar[dict[str, Any]] = {"num_key_value_heads": None,
                                          "max_position_embeddings": 2048}

    def config_in(self, f: Fields, tensors: dict[str, Tensor]) -> dict[str, Any]:
        plain = self.core_in(f)
        f.take("pretraining_tp")  # slices the same matmuls: the same function
        plain["ffn"]["bias"] = bool(f.take("mlp_bias", False))
        plain["attention"]["bias"] = bool(f.take("attention_bias", False))
        return plain

    def core_in(self, f: Fields) -> dict[str, Any]:
        """The keys of every Llama-layout config (no biases, every layer global)."""
        d, h = f.take("hidden_size"), f.take("num_attention_heads")
        kv = f.take("num_key_value_heads", self.defaults["num_key_value_heads"])
        kv = h if kv is None else kv
        f.expect("hidden_act", ("silu",), "blocklab's swiglu gates with SiLU")
        max_pos = f.take("max_position_embeddings", self.defaults["max_position_embeddings"])
        return {
            "family": {"name": "decoder"}, "norm": {"name": "rmsnorm",
                                                    "eps": f.take("rms_norm_eps", 1e-6)},
            "block": {"name": "pre"}, "position": _rope_in(f, max_pos),
            "ffn": {"name": "swiglu", "bias": False},
            "attention": {"name": _attention_name(h, kv),
                          "n_kv_heads": kv if 1 < kv < h else None, "bias": False,
                          "dropout": float(f.take("attention_dropout", 0.0))},
            "vocab_size": f.take("vocab_size"), "d_model": d,
            "n_layers": f.take("num_hidden_layers"), "n_heads": h,
            "d_head": f.take("head_dim", d // h), "d_ff": f.take("intermediate_size"),
            "max_seq_len": max_pos, "dropout": 0.0,
            "tie_embeddings": bool(f.take("tie_word_embeddings", False)),
        }

    def config_out(self, m: ModelConfig) -> dict[str, Any]:
        return {**self.core_out(m), "attention_bias": m.attention.bias,
                "mlp_bias": m.ffn.bias, "pretraining_tp": 1}

    def core_out(self, m: ModelConfig) -> dict[str, Any]:
        return {
            "architectures": [self.hf_class], "model_type": self.model_types[0],
            "vocab_size": m.vocab_size, "hidden_size": m.d_model,
            "intermediate_size": m.d_ff, "num_hidden_layers": m.n_layers,
            "num_attention_heads": m.n_heads, "num_key_value_heads": m.kv_heads,
            "head_dim": m.head_dim, "hidden_act": "silu",
            "max_position_embeddings": m.max_seq_len, "rms_norm_eps": m.norm.eps,
            "rope_parameters": _rope_out(m), "attention_dropout": m.attention.dropout,
            "tie_word_embeddings": m.tie_embeddings,
        }

    def attn_in(self, w: Weights, m: ModelConfig, a: str, b: str, out: dict[str, Tensor]) -> None:
        """HF layer ``a``'s q/k/v/o projections -> blocklab block ``b``'s fused qkv and out."""
        for kind in (["weight", "bias"] if m.attention.bias else ["weight"]):
            out[b + f"attn.qkv.{kind}"] = w.cat(*(a + f"self_attn.{x}_proj.{kind}" for x in "qkv"))
            out[b + f"attn.out.{kind}"] = w.take(a + f"self_attn.o_proj.{kind}")

    def attn_out(self, s: dict[str, Tensor], m: ModelConfig, a: str, b: str,
                 out: dict[str, Tensor]) -> None:
        q, kv = m.n_heads * m.head_dim, m.kv_heads * m.head_dim
        for kind in (["weight", "bias"] if m.attention.bias else ["weight"]):
            for x, t in zip("qkv", s[b + f"attn.qkv.{kind}"].split([q, kv, kv])):
                out[a + f"self_attn.{x}_proj.{kind}"] = t
            out[a + f"self_attn.o_proj.{kind}"] = s[b + f"attn.out.{kind}"]

    def weights_in(self, w: Weights, m: ModelConfig) -> dict[str, Tensor]:
        p = "model." if w.has("model.embed_tokens.weight") else ""
        out = {"embed.weight": w.take(f"{p}embed_tokens.weight")}
        for i in range(m.n_layers):
            a, b = f"{p}layers.{i}.", f"decoder.blocks.{i}."
            out[b + "norms.0.weight"] = w.take(a + "input_layernorm.weight")
            out[b + "norms.1.weight"] = w.take(a + "post_attention_layernorm.weight")
            self.attn_in(w, m, a, b, out)
            for kind in (["weight", "bias"] if m.ffn.bias else ["weight"]):
                out[b + f"ffn.gate_up.{kind}"] = w.cat(a + f"mlp.gate_proj.{kind}",
                                                       a + f"mlp.up_proj.{kind}")
                out[b + f"ffn.down.{kind}"] = w.take(a + f"mlp.down_proj.{kind}")
        out["decoder.final_norm.weight"] = w.take(f"{p}norm.weight")
        _head_in(w, m, out, "lm_head.weight")
        return out

    def weights_out(self, s: dict[str, Tensor], m: ModelConfig) -> dict[str, Tensor]:
        out = {"model.embed_tokens.weight": s["embed.weight"]}
        for i in range(m.n_layers):
            a, b = f"model.layers.{i}.", f"decoder.blocks.{i}."
            out[a + "input_layernorm.weight"] = s[b + "norms.0.weight"]
            out[a + "post_attention_layernorm.weight"] = s[b + "norms.1.weight"]
            self.attn_out(s, m, a, b, out)
            for kind in (["weight", "bias"] if m.ffn.bias else ["weight"]):
                gate, up = s[b + f"ffn.gate_up.{kind}"].chunk(2, dim=0)
                out[a + f"mlp.gate_proj.{kind}"], out[a + f"mlp.up_proj.{kind}"] = gate, up
                out[a + f"mlp.down_proj.{kind}"] = s[b + f"ffn.down.{kind}"]
        out["model.norm.weight"] = s["decoder.final_norm.weight"]
        if not m.tie_embeddings:
            out["lm_head.weight"] = s["head.proj.weight"]
        return out


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


# ------------------------------------------------------------------------------------ GPT-2


class GPT2(Arch):
    """GPT-2: LayerNorm pre-norm, learned absolute positions, GELU (tanh form) MLP, fused
    biased QKV stored as Conv1D (weights transposed), tied head."""

    name, model_types, family = "gpt2", ("gpt2",), "decoder"
    hf_class, auto = "GPT2LMHeadModel", "AutoModelForCausalLM"

    def config_in(self, f: Fields, tensors: dict[str, Tensor]) -> dict[str, Any]:
        d = f.take("n_embd", None, "hidden_size")
        f.expect("scale_attn_weights", (True,), "blocklab always scales scores by 1/sqrt(d_head)")
        f.expect("scale_attn_by_inverse_layer_idx", (False,), "blocklab has no per-layer score "
                 "scaling")
        f.expect("add_cross_attention", (False,), "a GPT-2 with cross-attention is not a "
                 "decoder-only model")
        f.take("reorder_and_upcast_attn")  # fp32 softmax numerics only
        resid, embd = f.take("resid_pdrop", 0.1), f.take("embd_pdrop", 0.1)
        if resid != embd:
            f.notes.append(f"dropout: embd_pdrop={embd} and resid_pdrop={resid} differ; "
                           f"blocklab has one (model.dropout={resid})")
        return {
            "family": {"name": "decoder"},
            "norm": {"name": "layernorm", "eps": f.take("layer_norm_epsilon", 1e-5), "bias": True},
            "block": {"name": "pre"}, "position": {"name": "learned"},
            "ffn": {**_gelu_ffn(f.take("activation_function", "gelu_new"), f,
                                "activation_function"), "bias": True},
            "attention": {"name": "mha", "bias": True, "dropout": float(f.take("attn_pdrop", 0.1))},
            "vocab_size": f.take("vocab_size"), "d_model": d,
            "n_layers": f.take("n_layer", None, "num_hidden_layers"),
            "n_heads": f.take("n_head", None, "num_attention_heads"),
            "d_ff": f.take("n_inner") or 4 * d,
            "max_seq_len": f.take("n_positions", None, "max_position_embeddings"),
            "dropout": float(resid), "tie_embeddings": bool(f.take("tie_word_embeddings", True)),
        }

    def config_out(self, m: ModelConfig) -> dict[str, Any]:
        return {
            "architectures": [self.hf_class], "model_type": "gpt2", "vocab_size": m.vocab_size,
            "n_embd": m.d_model, "n_layer": m.n_layers, "n_head": m.n_heads, "n_inner": m.d_ff,
            "n_positions": m.max_seq_len, "activation_function": _hf_act(_ffn(m)),
            "layer_norm_epsilon": m.norm.eps, "resid_pdrop": m.dropout, "embd_pdrop": m.dropout,
            "attn_pdrop": m.attention.dropout, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False,
            "tie_word_embeddings": m.tie_embeddings,
        }

    def weights_in(self, w: Weights, m: ModelConfig) -> dict[str, Tensor]:
        p = "transformer." if w.has("transformer.wte.weight") else ""
        out = {"embed.weight": w.take(p + "wte.weight"),
               "decoder.position.table.weight": w.take(p + "wpe.weight")}
        for i in range(m.n_layers):
            a, b = f"{p}h.{i}.", f"decoder.blocks.{i}."
            for src, dst in (("ln_1", "norms.0"), ("ln_2", "norms.1")):
                out[b + dst + ".weight"] = w.take(a + src + ".weight")
                out[b + dst + ".bias"] = w.take(a + src + ".bias")
            for src, dst in (("attn.c_attn", "attn.qkv"), ("attn.c_proj", "attn.out"),
                             ("mlp.c_fc", "ffn.up"), ("mlp.c_proj", "ffn.down")):
                out[b + dst + ".weight"] = w.take_t(a + src + ".weight")  # Conv1D
                out[b + dst + ".bias"] = w.take(a + src + ".bias")
        out["decoder.final_norm.weight"] = w.take(p + "ln_f.weight")
        out["decoder.final_norm.bias"] = w.take(p + "ln_f.bias")
        _head_in(w, m, out, "lm_head.weight")
        return out

    def weights_out(self, s: dict[str, Tensor], m: ModelConfig) -> dict[str, Tensor]:
        p = "transformer."
        out = {p + "wte.weight": s["embed.weight"],
               p + "wpe.weight": s["decoder.position.table.weight"]}
        for i in range(m.n_layers):
            a, b = f"{p}h.{i}.", f"decoder.blocks.{i}."
            for src, dst in (("ln_1", "norms.0"), ("ln_2", "norms.1")):
                out[a + src + ".weight"] = s[b + dst + ".weight"]
                out[a + src + ".bias"] = s[b + dst + ".bias"]
            for src, dst in (("attn.c_attn", "attn.qkv"), ("attn.c_proj", "attn.out"),
                             ("mlp.c_fc", "ffn.up"), ("mlp.c_proj", "ffn.down")):
                out[a + src + ".weight"] = s[b + dst + ".weight"].t().contiguous()
                out[a + src + ".bias"] = s[b + dst + ".bias"]
        out[p + "ln_f.weight"] = s["decoder.final_norm.weight"]
        out[p + "ln_f.bias"] = s["decoder.final_norm.bias"]
        if not m.tie_embeddings:
            out["lm_head.weight"] = s["head.proj.weight"]
        return out


def _ffn(m: ModelConfig) -> dict[str, Any]:
    return {"name": m.ffn.name, "approximate": m.ffn.approximate}


# ------------------------------------------------------------------------------------- BERT


class Bert(Arch):
    """BERT with its masked-LM head: post-norm LayerNorm, learned absolute positions plus
    token-type embeddings under an embedding LayerNorm, GELU MLP, tied decoder with a bias."""

    name, model_types, family = "bert", ("bert",), "encoder"
    hf_class, auto = "BertForMaskedLM", "AutoModelForMaskedLM"

    def config_in(self, f: Fields, tensors: dict[str, Tensor]) -> dict[str, Any]:
        act = f.take("hidden_act", "gelu")
        if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            f.refuse("hidden_act", act, "blocklab's masked-LM head applies a GELU (exact or tanh)")
        f.expect("position_embedding_type", ("absolute",), "blocklab imports BERT's absolute "
                 "positions only")
        f.expect("is_decoder", (False,), "a BERT decoder is not an encoder")
        f.expect("add_cross_attention", (False,), "an encoder has no cross-attention")
        return {
            "family": {"name": "encoder"},
            "norm": {"name": "layernorm", "eps": f.take("layer_norm_eps", 1e-12), "bias": True},
            "block": {"name": "post"}, "position": {"name": "learned"},
            "ffn": {**_gelu_ffn(act, f, "hidden_act"), "bias": True},
            "attention": {"name": "mha", "bias": True,
                          "dropout": float(f.take("attention_probs_dropout_prob", 0.1))},
            "vocab_size": f.take("vocab_size"), "d_model": f.take("hidden_size"),
            "n_layers": f.take("num_hidden_layers"), "n_heads": f.take("num_attention_heads"),
            "d_ff": f.take("intermediate_size"),
            "max_seq_len": f.take("max_position_embeddings", 512),
            "dropout": float(f.take("hidden_dropout_prob", 0.1)),
            "tie_embeddings": bool(f.take("tie_word_embeddings", True)),
            "embed_norm": True, "type_vocab_size": f.take("type_vocab_size", 2),
        }

    def config_out(self, m: ModelConfig) -> dict[str, Any]:
        return {
            "architectures": [self.hf_class], "model_type": "bert", "vocab_size": m.vocab_size,
            "hidden_size": m.d_model, "num_hidden_layers": m.n_layers,
            "num_attention_heads": m.n_heads, "intermediate_size": m.d_ff,
            "hidden_act": _hf_act(_ffn(m)), "hidden_dropout_prob": m.dropout,
            "attention_probs_dropout_prob": m.attention.dropout,
            "max_position_embeddings": m.max_seq_len, "type_vocab_size": m.type_vocab_size,
            "layer_norm_eps": m.norm.eps, "position_embedding_type": "absolute",
            "is_decoder": False, "add_cross_attention": False,
            "tie_word_embeddings": m.tie_embeddings,
        }

    _LAYER = (("attention.output.dense", "attn.out"),
              ("attention.output.LayerNorm", "norms.0"), ("intermediate.dense", "ffn.up"),
              ("output.dense", "ffn.down"), ("output.LayerNorm", "norms.1"))
    _HEAD = (("cls.predictions.transform.dense", "head.dense"),
             ("cls.predictions.transform.LayerNorm", "head.norm"))

    def weights_in(self, w: Weights, m: ModelConfig) -> dict[str, Tensor]:
        p = "bert." if w.has("bert.embeddings.word_embeddings.weight") else ""
        e = p + "embeddings."
        out = {"embed.weight": w.take(e + "word_embeddings.weight"),
               "encoder.position.table.weight": w.take(e + "position_embeddings.weight"),
               "encoder.embed_norm.weight": w.take(e + "LayerNorm.weight"),
               "encoder.embed_norm.bias": w.take(e + "LayerNorm.bias")}
        if m.type_vocab_size:
            out["token_type.weight"] = w.take(e + "token_type_embeddings.weight")
        for i in range(m.n_layers):
            a, b = f"{p}encoder.layer.{i}.", f"encoder.blocks.{i}."
            for kind in ("weight", "bias"):
                out[b + f"attn.qkv.{kind}"] = w.cat(*(a + f"attention.self.{x}.{kind}"
                                                      for x in ("query", "key", "value")))
                for src, dst in self._LAYER:
                    out[b + f"{dst}.{kind}"] = w.take(a + f"{src}.{kind}")
        for kind in ("weight", "bias"):
            for src, dst in self._HEAD:
                out[f"{dst}.{kind}"] = w.take(f"{src}.{kind}")
        out["head.bias"] = w.take("cls.predictions.bias")
        if w.has("cls.predictions.decoder.bias") and not torch.equal(
                w.take("cls.predictions.decoder.bias"), out["head.bias"]):
            raise ConfigError(f"hf weights {w.where}: cls.predictions.decoder.bias differs from "
                              "cls.predictions.bias (BERT ties them)")
        _head_in(w, m, out, "cls.predictions.decoder.weight")
        return out

    def weights_out(self, s: dict[str, Tensor], m: ModelConfig) -> dict[str, Tensor]:
        e = "bert.embeddings."
        out = {e + "word_embeddings.weight": s["embed.weight"],
               e + "position_embeddings.weight": s["encoder.position.table.weight"],
               e + "LayerNorm.weight": s["encoder.embed_norm.weight"],
               e + "LayerNorm.bias": s["encoder.embed_norm.bias"]}
        if m.type_vocab_size:
            out[e + "token_type_embeddings.weight"] = s["token_type.weight"]
        d = m.n_heads * m.head_dim
        for i in range(m.n_layers):
            a, b = f"bert.encoder.layer.{i}.", f"encoder.blocks.{i}."
            for kind in ("weight", "bias"):
                for x, t in zip(("query", "key", "value"), s[b + f"attn.qkv.{kind}"].split(d)):
                    out[a + f"attention.self.{x}.{kind}"] = t
                for src, dst in self._LAYER:
                    out[a + f"{src}.{kind}"] = s[b + f"{dst}.{kind}"]
        for kind in ("weight", "bias"):
            for src, dst in self._HEAD:
                out[f"{src}.{kind}"] = s[f"{dst}.{kind}"]
        out["cls.predictions.bias"] = s["head.bias"]
        if not m.tie_embeddings:
            out["cls.predictions.decoder.weight"] = s["head.proj.weight"]
        return out


# --------------------------------------------------------------------------------------- T5


class T5(Arch):
    """T5 v1.0 (ReLU MLP, tied head with the d_model^-0.5 output scale) and v1.1 (gated-GELU
    in the tanh form, no output scale): RMSNorm pre-norm, relative position buckets shared by
    the layers of a stack, unscaled attention scores, no biases."""

    name, model_types, family = "t5", ("t5",), "encoder_decoder"
    hf_class, auto = "T5ForConditionalGeneration", "T5ForConditionalGeneration"
    unmapped = ("init_std", "max_seq_len")

    def config_in(self, f: Fields, tensors: dict[str, Tensor]) -> dict[str, Any]:
        proj = f.take("feed_forward_proj", "relu")
        gated = proj.startswith("gated-")
        act = proj.removeprefix("gated-")
        act = "gelu_new" if proj == "gated-gelu" else act  # HF's own rule for gated-gelu
        ffn = _gelu_ffn(act, f, "feed_forward_proj", gated=gated)
        f.take("dense_act_fn")  # derived from feed_forward_proj
        f.take("is_gated_act")
        f.expect("is_encoder_decoder", (True,), "T5 is an encoder-decoder")
        f.expect("is_decoder", (False,), "blocklab imports the whole encoder-decoder")
        d = f.take("d_model", None, "hidden_size")
        tie_key = f.take("tie_word_embeddings", True)
        scale = f.take("scale_decoder_outputs", tie_key is not False)
        head = tensors.get("lm_head.weight")
        tied = head is None or torch.equal(head, tensors.get("shared.weight", head))
        rate = float(f.take("dropout_rate", 0.1))
        f.notes.append("dropout: T5's dropout inside the feed-forward (between wi and wo) has "
                       "no blocklab counterpart; the residual and attention dropouts are kept")
        n = f.take("num_layers", None, "num_hidden_layers")
        return {
            "family": {"name": "encoder_decoder", "n_encoder_layers": n},
            "norm": {"name": "rmsnorm", "eps": f.take("layer_norm_epsilon", 1e-6)},
            "block": {"name": "pre"},
            "position": {"name": "t5_bias",
                         "num_buckets": f.take("relative_attention_num_buckets", 32),
                         "max_distance": f.take("relative_attention_max_distance", 128)},
            "ffn": {**ffn, "bias": False},
            "attention": {"name": "mha", "bias": False, "dropout": rate, "scale": 1.0},
            "vocab_size": f.take("vocab_size"), "d_model": d,
            "n_layers": f.take("num_decoder_layers") or n,
            "n_heads": f.take("num_heads", None, "num_attention_heads"),
            "d_head": f.take("d_kv", None, "head_dim"), "d_ff": f.take("d_ff"),
            "max_seq_len": 512, "dropout": rate, "tie_embeddings": tied,
            "head_scale": d ** -0.5 if scale else 1.0,
        }

    def config_out(self, m: ModelConfig) -> dict[str, Any]:
        gated = m.ffn.name in ("geglu", "swiglu")
        act = {"relu_mlp": "relu", "swiglu": "silu", "geglu": "gelu",
               "gelu_mlp": "gelu"}.get(m.ffn.name, m.ffn.name)
        scaled = not math.isclose(m.head_scale, 1.0)
        return {
            "architectures": [self.hf_class], "model_type": "t5", "vocab_size": m.vocab_size,
            "d_model": m.d_model, "d_kv": m.head_dim, "d_ff": m.d_ff,
            "num_layers": m.encoder_layers, "num_decoder_layers": m.n_layers,
            "num_heads": m.n_heads,
            "relative_attention_num_buckets": m.position.num_buckets,
            "relative_attention_max_distance": m.position.max_distance,
            "dropout_rate": m.dropout, "layer_norm_epsilon": m.norm.eps,
            "feed_forward_proj": ("gated-" if gated else "") + act,
            "is_encoder_decoder": True, "tie_word_embeddings": m.tie_embeddings,
            "scale_decoder_outputs": scaled, "decoder_start_token_id": 0,
        }

    def check_out(self, m: ModelConfig) -> None:
        """What the generic round trip cannot see: the GELU form HF gives each feed_forward_proj,
        and the output scale, which HF only knows as on (d_model^-0.5) or off."""
        if m.ffn.name == "geglu" and m.ffn.approximate != "tanh":
            raise ConfigError("export refused: model.ffn.approximate='none': HF T5's gated-gelu "
                              "is the tanh form (gelu_new)")
        if m.ffn.name == "gelu_mlp" and m.ffn.approximate != "none":
            raise ConfigError("export refused: model.ffn.approximate='tanh': HF T5's gelu is "
                              "exact")
        if not m.tie_embeddings:
            raise ConfigError("export refused: model.tie_embeddings=false: Hugging Face's T5 "
                              "(transformers 5) always ties lm_head to the shared embedding")

    @staticmethod
    def _stack_in(w: Weights, m: ModelConfig, side: str, n: int, out: dict[str, Tensor]) -> None:
        cross = side == "decoder"
        for i in range(n):
            a, b = f"{side}.block.{i}.layer.", f"{side}.blocks.{i}."
            out[b + "attn.qkv.weight"] = w.cat(*(a + f"0.SelfAttention.{x}.weight" for x in "qkv"))
            out[b + "attn.out.weight"] = w.take(a + "0.SelfAttention.o.weight")
            out[b + "norms.0.weight"] = w.take(a + "0.layer_norm.weight")
            f = 1
            if cross:
                out[b + "cross.q.weight"] = w.take(a + "1.EncDecAttention.q.weight")
                out[b + "cross.kv.weight"] = w.cat(a + "1.EncDecAttention.k.weight",
                                                   a + "1.EncDecAttention.v.weight")
                out[b + "cross.out.weight"] = w.take(a + "1.EncDecAttention.o.weight")
                out[b + "norms.1.weight"] = w.take(a + "1.layer_norm.weight")
                f = 2
            ff = a + f"{f}.DenseReluDense."
            if m.ffn.name in ("geglu", "swiglu"):
                out[b + "ffn.gate_up.weight"] = w.cat(ff + "wi_0.weight", ff + "wi_1.weight")
            else:
                out[b + "ffn.up.weight"] = w.take(ff + "wi.weight")
            out[b + "ffn.down.weight"] = w.take(ff + "wo.weight")
            out[b + f"norms.{f}.weight"] = w.take(a + f"{f}.layer_norm.weight")
        out[f"{side}.position.bias.weight"] = w.take(
            f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
        out[f"{side}.final_norm.weight"] = w.take(f"{side}.final_layer_norm.weight")

    def weights_in(self, w: Weights, m: ModelConfig) -> dict[str, Tensor]:
        out = {"embed.weight": w.take("shared.weight")}
        for side in ("encoder", "decoder"):
            key = f"{side}.embed_tokens.weight"
            if w.has(key) and not torch.equal(w.take(key), out["embed.weight"]):
                raise ConfigError(f"hf weights {w.where}: {key} differs from shared.weight")
        self._stack_in(w, m, "encoder", m.encoder_layers, out)
        self._stack_in(w, m, "decoder", m.n_layers, out)
        _head_in(w, m, out, "lm_head.weight")
        return out

    def weights_out(self, s: dict[str, Tensor], m: ModelConfig) -> dict[str, Tensor]:
        out = {"shared.weight": s["embed.weight"]}
        q = m.n_heads * m.head_dim
        for side, n in (("encoder", m.encoder_layers), ("decoder", m.n_layers)):
            for i in range(n):
                a, b = f"{side}.block.{i}.layer.", f"{side}.blocks.{i}."
                for x, t in zip("qkv", s[b + "attn.qkv.weight"].split(q)):
                    out[a + f"0.SelfAttention.{x}.weight"] = t
                out[a + "0.SelfAttention.o.weight"] = s[b + "attn.out.weight"]
                out[a + "0.layer_norm.weight"] = s[b + "norms.0.weight"]
                f = 1
                if side == "decoder":
                    out[a + "1.EncDecAttention.q.weight"] = s[b + "cross.q.weight"]
                    k, v = s[b + "cross.kv.weight"].chunk(2, dim=0)
                    out[a + "1.EncDecAttention.k.weight"] = k
                    out[a + "1.EncDecAttention.v.weight"] = v
                    out[a + "1.EncDecAttention.o.weight"] = s[b + "cross.out.weight"]
                    out[a + "1.layer_norm.weight"] = s[b + "norms.1.weight"]
                    f = 2
                ff = a + f"{f}.DenseReluDense."
                if m.ffn.name in ("geglu", "swiglu"):
                    g, u = s[b + "ffn.gate_up.weight"].chunk(2, dim=0)
                    out[ff + "wi_0.weight"], out[ff + "wi_1.weight"] = g, u
                else:
                    out[ff + "wi.weight"] = s[b + "ffn.up.weight"]
                out[ff + "wo.weight"] = s[b + "ffn.down.weight"]
                out[a + f"{f}.layer_norm.weight"] = s[b + f"norms.{f}.weight"]
            out[f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = \
                s[f"{side}.position.bias.weight"]
            out[f"{side}.final_layer_norm.weight"] = s[f"{side}.final_norm.weight"]
        if not m.tie_embeddings:
            out["lm_head.weight"] = s["head.proj.weight"]
        return out

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

from typing import Any, ClassVar

from torch import Tensor

from blocklab.config import ModelConfig
from blocklab.convert.arch_base import Arch, _attention_name, _ffn, _gelu_ffn, _head_in, _hf_act
from blocklab.convert.encoders import T5, Bert
from blocklab.convert.fields import Fields
from blocklab.convert.weights import Weights
from blocklab.model.softmax_options import softmax_options

__all__ = ["GPT2", "T5", "Arch", "Bert", "Llama"]  # BERT and T5 live in encoders.py


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
    mlp: ClassVar[str] = "mlp"  # the HF name of a layer's feed-forward block
    #: HF's names of a layer's two norms -> blocklab's ``norms.0`` / ``norms.1``
    norm_names: ClassVar[tuple[str, str]] = ("input_layernorm", "post_attention_layernorm")

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
                          "n_kv_heads": kv if 1 < kv < h else None, "bias": False},
            "mixer": {"name": "softmax",
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
            "rope_parameters": _rope_out(m), "attention_dropout": softmax_options(m).dropout,
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
            for j, norm in enumerate(self.norm_names):
                out[b + f"norms.{j}.weight"] = w.take(a + f"{norm}.weight")
            self.attn_in(w, m, a, b, out)
            for kind in (["weight", "bias"] if m.ffn.bias else ["weight"]):
                f = a + self.mlp
                out[b + f"ffn.gate_up.{kind}"] = w.cat(f + f".gate_proj.{kind}",
                                                       f + f".up_proj.{kind}")
                out[b + f"ffn.down.{kind}"] = w.take(f + f".down_proj.{kind}")
        out["decoder.final_norm.weight"] = w.take(f"{p}norm.weight")
        _head_in(w, m, out, "lm_head.weight")
        return out

    def weights_out(self, s: dict[str, Tensor], m: ModelConfig) -> dict[str, Tensor]:
        out = {"model.embed_tokens.weight": s["embed.weight"]}
        for i in range(m.n_layers):
            a, b = f"model.layers.{i}.", f"decoder.blocks.{i}."
            for j, norm in enumerate(self.norm_names):
                out[a + f"{norm}.weight"] = s[b + f"norms.{j}.weight"]
            self.attn_out(s, m, a, b, out)
            for kind in (["weight", "bias"] if m.ffn.bias else ["weight"]):
                gate, up = s[b + f"ffn.gate_up.{kind}"].chunk(2, dim=0)
                f = a + self.mlp
                out[f + f".gate_proj.{kind}"], out[f + f".up_proj.{kind}"] = gate, up
                out[f + f".down_proj.{kind}"] = s[b + f"ffn.down.{kind}"]
        out["model.norm.weight"] = s["decoder.final_norm.weight"]
        if not m.tie_embeddings:
            out["lm_head.weight"] = s["head.proj.weight"]
        return out


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
            "attention": {"name": "mha", "bias": True},
            "mixer": {"name": "softmax", "dropout": float(f.take("attn_pdrop", 0.1))},
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
            "attn_pdrop": softmax_options(m).dropout, "scale_attn_weights": True,
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



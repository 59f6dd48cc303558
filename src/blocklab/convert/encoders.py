"""The Hugging Face architectures with an encoder: BERT (encoder only, masked LM) and T5
(encoder-decoder, relative position buckets); the :class:`Arch` contract: arch_base.py."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from blocklab.config import ModelConfig
from blocklab.convert.arch_base import Arch, _ffn, _gelu_ffn, _head_in, _hf_act
from blocklab.convert.fields import Fields
from blocklab.convert.weights import Weights
from blocklab.errors import ConfigError
from blocklab.model.softmax_options import softmax_options

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
            "attention": {"name": "mha", "bias": True},
            "mixer": {"name": "softmax",
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
            "attention_probs_dropout_prob": softmax_options(m).dropout,
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
            "attention": {"name": "mha", "bias": False},
            "mixer": {"name": "softmax", "dropout": rate, "scale": 1.0},  # T5: unscaled
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

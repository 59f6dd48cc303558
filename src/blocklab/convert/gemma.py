"""Gemma 2 (``Gemma2ForCausalLM``, ``model_type: gemma2``): sliding-window layers alternating
with global ones, sandwich norms, GeGLU, a query scale of its own — each a blocklab option
("Gemma 2", arXiv 2408.00118; transformers 5, ``modeling_gemma2.py``):

- the norms: ``input_layernorm`` / ``post_attention_layernorm`` around attention and
  ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm`` around the MLP, each added to
  the residual after its output norm: ``block: sandwich`` (``x ← x + N_out(F(N_in(x)))``).
  Gemma's RMSNorm multiplies by ``1 + w``: the import stores ``1 + w`` (the export ``w - 1``).
- the input embedding is multiplied by ``sqrt(hidden_size)``: the import folds the factor into
  the embedding and, when the head is tied to it, divides the final norm's weight by it (the
  logits ``N(h) · (1 + w) · Eᵀ`` = ``N(h) · (1 + w) / s · (s E)ᵀ``) — the same function, no
  model option; a note says so, and the export unfolds both.
- ``query_pre_attn_scalar = q`` scales scores by ``1 / sqrt(q)``: ``mixer.scale`` (null when
  ``q = head_dim``); ``sliding_window`` / ``layer_types``: the window pattern as Qwen2's
  (windows.py: Hugging Face's window counts the query, as blocklab's).
- ``hidden_activation`` (``gelu_pytorch_tanh``): ``ffn: geglu`` with the tanh GELU.

- ``attn_logit_softcapping = c`` (scores ``c · tanh(s / c)`` after the scale, before the
  mask; 50 in the released configs and absent = 50): ``mixer.softcap``;
  ``final_logit_softcapping`` (30): ``model.logit_softcap``. Null: no cap.

Refused in one line: ``use_bidirectional_attention``. tests/convert/test_hf_gemma.py checks
logits past the window, on a left-padded batch and by cached greedy decoding against
``transformers``; tests/convert/test_hf_stability.py the softcaps (50 / 30 and caps small
enough to bite). Gemma 3 text (:class:`Gemma3`): the same plus per-head QK-norm, imported when
its sliding layers rotate like its full ones (blocklab has one rotary setting per model).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from blocklab.config import ModelConfig
from blocklab.convert.arch_base import Arch, _attention_name, _gelu_ffn
from blocklab.convert.archs import Llama, _rope_in, _rope_out
from blocklab.convert.fields import Fields
from blocklab.convert.qknorm import qk_mixer, qk_norm_in, qk_norm_out
from blocklab.convert.weights import Weights
from blocklab.convert.windows import (
    FULL,
    SLIDING,
    layer_types_in,
    layer_types_out,
    pattern_in,
)
from blocklab.errors import ConfigError
from blocklab.model.softmax_options import softmax_options

#: blocklab's sandwich norms <- Gemma 2's four per layer, in order
NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
         "post_feedforward_layernorm")
SOFTCAPS = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}  # HF defaults


def _embed_scale(m: ModelConfig, like: Tensor) -> Tensor:
    """Gemma's input scale ``sqrt(hidden_size)``, as Hugging Face rounds it (a float32
    scalar cast to the weights' dtype)."""
    return torch.tensor(m.d_model ** 0.5).to(like.dtype)


class Gemma2(Arch):
    """Gemma 2 text (the module docstring); the attention projections are Llama's."""

    name, model_types, family = "gemma2", ("gemma2",), "decoder"
    hf_class, auto = "Gemma2ForCausalLM", "AutoModelForCausalLM"
    unmapped = ("init_std", "dropout")  # no residual dropout in Hugging Face's Gemma 2
    #: the softcap keys and their config class's defaults (a config.json may leave them out)
    softcaps: ClassVar[dict[str, float | None]] = SOFTCAPS
    defaults: ClassVar[dict[str, Any]] = {"vocab_size": 256000, "max_position_embeddings": 8192}
    qk: ClassVar[dict[str, Any]] = {}  # the QK-norm options (Gemma 3's)

    def sliding_every(self, f: Fields) -> int:
        """Without ``layer_types``: every n-th layer is global (Gemma 2 alternates)."""
        return 2

    def rope_in(self, f: Fields, max_pos: int, types: list[str]) -> dict[str, Any]:
        return _rope_in(f, max_pos)

    def rope_out(self, m: ModelConfig) -> dict[str, Any]:
        return _rope_out(m)

    def config_in(self, f: Fields, tensors: dict[str, Tensor]) -> dict[str, Any]:
        d, h = f.take("hidden_size", 2304), f.take("num_attention_heads", 8)
        kv = f.take("num_key_value_heads", 4)
        head_dim = f.take("head_dim", 256)
        attn_cap, final_cap = (f.take_nullable(k, v) for k, v in self.softcaps.items())
        f.expect("use_bidirectional_attention", (None, False), "blocklab's Gemma 2 import is "
                 "the causal language model")
        f.take("hidden_act")  # Gemma 1's key: Hugging Face's Gemma 2 reads hidden_activation
        f.take("cache_implementation")  # released configs' generation default ("hybrid")
        ffn = _gelu_ffn(f.take("hidden_activation", "gelu_pytorch_tanh"), f, "hidden_activation",
                        gated=True)
        n = f.take("num_hidden_layers", 26)
        window = f.take_nullable("sliding_window", 4096)
        every = self.sliding_every(f)
        types = layer_types_in(f, f.take("layer_types") or [SLIDING if (i + 1) % every else FULL
                                                             for i in range(n)], n, SLIDING)
        if SLIDING in types and window is None:
            f.refuse("layer_types", types, "names sliding layers, but sliding_window is null")
        q = f.take("query_pre_attn_scalar", 256)
        max_pos = f.take("max_position_embeddings", self.defaults["max_position_embeddings"])
        f.notes.append(f"embedding: Gemma's input scale sqrt(hidden_size={d}) is folded into the "
                       "token embedding (and, tied, divided out of the final norm): the same "
                       "function; fine-tuning sees the scaled parametrization")
        return {
            "family": {"name": "decoder"}, "block": {"name": "sandwich"},
            "norm": {"name": "rmsnorm", "eps": f.take("rms_norm_eps", 1e-6)},
            "position": self.rope_in(f, max_pos, types), "ffn": {**ffn, "bias": False},
            "attention": {"name": _attention_name(h, kv), "n_kv_heads": kv if 1 < kv < h else None,
                          "bias": bool(f.take("attention_bias", False))},
            "mixer": {"name": "softmax", "dropout": float(f.take("attention_dropout", 0.0)),
                      "scale": None if q == head_dim else float(q) ** -0.5,
                      "softcap": None if attn_cap is None else float(attn_cap), **self.qk,
                      **pattern_in(types, window)},
            "logit_softcap": None if final_cap is None else float(final_cap),
            "vocab_size": f.take("vocab_size", self.defaults["vocab_size"]), "d_model": d,
            "n_layers": n,
            "n_heads": h, "d_head": head_dim, "d_ff": f.take("intermediate_size", 9216),
            "max_seq_len": max_pos, "dropout": 0.0,
            "tie_embeddings": bool(f.take("tie_word_embeddings", True)),
        }

    def config_out(self, m: ModelConfig) -> dict[str, Any]:
        opts = softmax_options(m)
        types = layer_types_out(m)
        q = m.head_dim if opts.scale is None else opts.scale ** -2
        return {
            "architectures": [self.hf_class], "model_type": self.model_types[0],
            "vocab_size": m.vocab_size, "hidden_size": m.d_model, "intermediate_size": m.d_ff,
            "num_hidden_layers": m.n_layers, "num_attention_heads": m.n_heads,
            "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim,
            "hidden_activation": "gelu_pytorch_tanh" if m.ffn.approximate == "tanh" else "gelu",
            "max_position_embeddings": m.max_seq_len, "rms_norm_eps": m.norm.eps,
            "rope_parameters": self.rope_out(m), "attention_bias": m.attention.bias,
            "attention_dropout": opts.dropout,
            "query_pre_attn_scalar": round(q) if abs(q - round(q)) < 1e-6 else q,
            "sliding_window": opts.window if SLIDING in types else None, "layer_types": types,
            "attn_logit_softcapping": opts.softcap, "final_logit_softcapping": m.logit_softcap,
            "tie_word_embeddings": m.tie_embeddings,
        }

    def weights_in(self, w: Weights, m: ModelConfig) -> dict[str, Tensor]:
        p = "model." if w.has("model.embed_tokens.weight") else ""
        embed = w.take(f"{p}embed_tokens.weight")
        out = {"embed.weight": embed * _embed_scale(m, embed)}
        for i in range(m.n_layers):
            a, b = f"{p}layers.{i}.", f"decoder.blocks.{i}."
            for j, name in enumerate(NORMS):
                out[b + f"norms.{j}.weight"] = w.take(a + name + ".weight").float() + 1.0
            Llama.attn_in(self, w, m, a, b, out)  # type: ignore[arg-type]
            if self.qk:
                qk_norm_in(w, a, b, out, plus_one=True)
            out[b + "ffn.gate_up.weight"] = w.cat(a + "mlp.gate_proj.weight",
                                                  a + "mlp.up_proj.weight")
            out[b + "ffn.down.weight"] = w.take(a + "mlp.down_proj.weight")
        final = w.take(f"{p}norm.weight").float() + 1.0
        if m.tie_embeddings:
            if w.has("lm_head.weight") and not torch.equal(w.take("lm_head.weight"), embed):
                raise ConfigError(f"hf weights {w.where}: lm_head.weight differs from the token "
                                  "embedding although the config ties them "
                                  "(tie_word_embeddings=true)")
            final = final / _embed_scale(m, final)
            out["head.proj.weight"] = out["embed.weight"]
        else:
            out["head.proj.weight"] = w.take("lm_head.weight")
        out["decoder.final_norm.weight"] = final
        return out

    def weights_out(self, s: dict[str, Tensor], m: ModelConfig) -> dict[str, Tensor]:
        embed = s["embed.weight"]
        out = {"model.embed_tokens.weight": embed / _embed_scale(m, embed)}
        for i in range(m.n_layers):
            a, b = f"model.layers.{i}.", f"decoder.blocks.{i}."
            for j, name in enumerate(NORMS):
                out[a + name + ".weight"] = s[b + f"norms.{j}.weight"] - 1.0
            Llama.attn_out(self, s, m, a, b, out)  # type: ignore[arg-type]
            if self.qk:
                qk_norm_out(s, a, b, out, plus_one=True)
            gate, up = s[b + "ffn.gate_up.weight"].chunk(2, dim=0)
            out[a + "mlp.gate_proj.weight"], out[a + "mlp.up_proj.weight"] = gate, up
            out[a + "mlp.down_proj.weight"] = s[b + "ffn.down.weight"]
        final = s["decoder.final_norm.weight"]
        if m.tie_embeddings:
            final = final * _embed_scale(m, final)
        else:
            out["lm_head.weight"] = s["head.proj.weight"]
        out["model.norm.weight"] = final - 1.0
        return out


class Gemma3(Gemma2):
    """Gemma 3 text (``Gemma3ForCausalLM``, ``model_type: gemma3_text``): Gemma 2's layout with
    per-head QK-norm (``q_norm`` / ``k_norm`` of width ``head_dim``, Gemma's ``1 + w``), every
    6th layer global by default (``sliding_window_pattern``), softcaps null by default, and a
    rotary setting per layer type (``rope_parameters.full_attention`` /
    ``.sliding_attention``; older configs: ``rope_theta`` + ``rope_scaling`` and
    ``rope_local_base_freq``). blocklab rotates every layer alike: imported only when the
    sliding layers' rotary setting is the full layers' one (or no layer slides) — the released
    checkpoints (local base 10 000, global 1 000 000) are refused in one line. Hugging Face's
    Gemma 3 applies ``final_logit_softcapping`` but not ``attn_logit_softcapping`` (its
    attention passes no softcap): a non-null attention cap is refused, not guessed."""

    name, model_types = "gemma3", ("gemma3_text",)
    hf_class = "Gemma3ForCausalLM"
    softcaps: ClassVar[dict[str, float | None]] = dict.fromkeys(SOFTCAPS)
    defaults: ClassVar[dict[str, Any]] = {"vocab_size": 262208,
                                          "max_position_embeddings": 131072}
    qk: ClassVar[dict[str, Any]] = qk_mixer("head")

    def config_in(self, f: Fields, tensors: dict[str, Tensor]) -> dict[str, Any]:
        cap = f.config.get("attn_logit_softcapping")
        if cap is not None:
            f.refuse("attn_logit_softcapping", cap, "Hugging Face's Gemma 3 keeps the key but "
                     "never caps its attention scores (its attention passes no softcap); the "
                     "released configs set null")
        return super().config_in(f, tensors)

    def sliding_every(self, f: Fields) -> int:
        return int(f.take("sliding_window_pattern", 6, "_sliding_window_pattern"))

    def rope_in(self, f: Fields, max_pos: int, types: list[str]) -> dict[str, Any]:
        params = f.take("rope_parameters") or {}
        theta, local_theta = f.take("rope_theta"), f.take("rope_local_base_freq")
        scaling = f.take("rope_scaling") or {}  # Hugging Face applies it to the full layers
        if set(params) <= {FULL, SLIDING} and params:  # transformers 5: one setting per type
            full, local = dict(params.get(FULL) or {}), dict(params.get(SLIDING) or {})
        else:  # a flat setting
            full, local = dict(params), {}
        full.update(scaling)
        full.setdefault("rope_theta", theta or 1_000_000.0)
        local.setdefault("rope_theta", local_theta or 10_000.0)
        glob = _rope_in(Fields({"rope_parameters": full}, f.where), max_pos)
        if SLIDING in types and _rope_in(Fields({"rope_parameters": local}, f.where),
                                         max_pos) != glob:
            f.refuse("rope_parameters.sliding_attention", local, "blocklab rotates every layer "
                     "with one rotary setting; Gemma 3's sliding layers have their own "
                     f"(rope_local_base_freq) unlike its full layers' {full}: importable only "
                     "when the two are the same")
        return glob

    def rope_out(self, m: ModelConfig) -> dict[str, Any]:
        return {FULL: _rope_out(m), SLIDING: _rope_out(m)}

"""Decoders that normalize q and k (QK-norm, ``model.mixer.qk_norm``): Qwen3 and OLMo-2 — the
Llama layout plus an RMSNorm on the queries and keys before the rotary angles (transformers 5,
``modeling_qwen3.py`` / ``modeling_olmo2.py``).

- Qwen3 (``Qwen3ForCausalLM``, ``model_type: qwen3``): ``q_norm`` / ``k_norm`` of width
  ``head_dim``, one shared by every head (``qk_norm: rmsnorm``, ``qk_norm_scope: head``), with
  the model's ``rms_norm_eps``; ``attention_bias`` on q, k, v and o together (blocklab's
  ``attention.bias``); the sliding-window keys (``use_sliding_window``, ``sliding_window``,
  ``max_window_layers``, ``layer_types``) read by Qwen2's rule (windows.py).
- OLMo-2 (``Olmo2ForCausalLM``, ``model_type: olmo2``): ``q_norm`` over the whole q projection
  (``num_attention_heads · head_dim``) and ``k_norm`` over the whole k projection
  (``num_key_value_heads · head_dim``): ``qk_norm_scope: all``; no input norms — the norms sit
  on the sublayers' outputs, ``x ← x + N(F(x))`` (``post_attention_layernorm``,
  ``post_feedforward_layernorm``), with the final norm kept: ``block: reordered``.

Every config key is mapped, checked or refused (fields.py); tests/convert/test_hf_stability.py
checks logits (also left-padded), cached greedy decoding and the export round trip against
``transformers``, with the norms dropped as the negative control.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

from blocklab.config import ModelConfig
from blocklab.convert.archs import Llama
from blocklab.convert.fields import Fields
from blocklab.convert.weights import Weights
from blocklab.convert.windows import Qwen2

QK_NORMS = ("q_norm", "k_norm")  # HF's names of the two norms in self_attn; blocklab's in attn


def qk_norm_in(w: Weights, a: str, b: str, out: dict[str, Tensor], *, plus_one: bool = False
               ) -> None:
    """HF layer ``a``'s ``self_attn.q_norm`` / ``k_norm`` weights -> blocklab block ``b``'s
    ``attn.q_norm`` / ``attn.k_norm`` (Gemma's RMSNorm multiplies by ``1 + w``: stored as
    ``1 + w``)."""
    for name in QK_NORMS:
        t = w.take(a + f"self_attn.{name}.weight")
        out[b + f"attn.{name}.weight"] = t.float() + 1.0 if plus_one else t


def qk_norm_out(s: dict[str, Tensor], a: str, b: str, out: dict[str, Tensor], *,
                plus_one: bool = False) -> None:
    for name in QK_NORMS:
        t = s[b + f"attn.{name}.weight"]
        out[a + f"self_attn.{name}.weight"] = t - 1.0 if plus_one else t


def qk_mixer(scope: str) -> dict[str, Any]:
    """The softmax options of an RMSNorm on q and k of this scope."""
    return {"qk_norm": "rmsnorm", "qk_norm_scope": scope}


class QKNormed(Llama):
    """Llama's weight layout plus ``self_attn.q_norm`` / ``k_norm`` on every layer."""

    def attn_in(self, w: Weights, m: ModelConfig, a: str, b: str, out: dict[str, Tensor]) -> None:
        super().attn_in(w, m, a, b, out)
        qk_norm_in(w, a, b, out)

    def attn_out(self, s: dict[str, Tensor], m: ModelConfig, a: str, b: str,
                 out: dict[str, Tensor]) -> None:
        super().attn_out(s, m, a, b, out)
        qk_norm_out(s, a, b, out)


class Qwen3(QKNormed):
    """Qwen3 (dense): Llama's layout, per-head QK-norm, Qwen2's windows (module docstring)."""

    name, model_types = "qwen3", ("qwen3",)
    hf_class = "Qwen3ForCausalLM"
    defaults: ClassVar[dict[str, Any]] = {  # Qwen3Config's
        "num_key_value_heads": 32, "max_position_embeddings": 32768}

    def config_in(self, f: Fields, tensors: dict[str, Tensor]) -> dict[str, Any]:
        f.config.setdefault("head_dim", 128)  # Qwen3Config's default, not hidden / heads
        plain = self.core_in(f)
        plain["attention"]["bias"] = bool(f.take("attention_bias", False))
        plain["mixer"].update(Qwen2.windows_in(f, plain["n_layers"]))
        plain["mixer"].update(qk_mixer("head"))
        return plain

    def config_out(self, m: ModelConfig) -> dict[str, Any]:
        return {**self.core_out(m), **Qwen2.windows_out(m), "attention_bias": m.attention.bias}


class Olmo2(QKNormed):
    """OLMo-2: QK-norm over the whole projections and the reordered norm (module docstring):
    its two norms per layer sit on the sublayers' outputs."""

    name, model_types = "olmo2", ("olmo2",)
    hf_class = "Olmo2ForCausalLM"
    defaults: ClassVar[dict[str, Any]] = {  # Olmo2Config's
        "num_key_value_heads": None, "max_position_embeddings": 2048}
    norm_names = ("post_attention_layernorm", "post_feedforward_layernorm")

    def config_in(self, f: Fields, tensors: dict[str, Tensor]) -> dict[str, Any]:
        f.config.setdefault("rms_norm_eps", 1e-5)  # Olmo2Config's default
        plain = self.core_in(f)
        plain["attention"]["bias"] = bool(f.take("attention_bias", False))
        plain["block"] = {"name": "reordered"}
        plain["mixer"].update(qk_mixer("all"))
        return plain

    def config_out(self, m: ModelConfig) -> dict[str, Any]:
        return {**self.core_out(m), "attention_bias": m.attention.bias}

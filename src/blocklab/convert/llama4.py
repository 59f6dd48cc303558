"""Llama 4 text decoders (``Llama4ForCausalLM``, ``model_type: llama4_text``) with dense
layers: the Llama layout plus chunked attention on the rotary layers and no rotary angles on
the others ("iRoPE"), mapped onto the softmax mixer's ``attention_chunk``, the chunked /
global pattern (``global_every`` or ``layers``), ``global_rope: false`` and Llama 4's
attention temperature (``global_temperature`` / ``temperature_floor``).

What Hugging Face computes (transformers 5, ``modeling_llama4.py`` and
``masking_utils.chunked_overlay``), and how each piece maps:

- ``no_rope_layers[i] = 1`` rotates layer ``i`` (the name is inverted); its layer type is
  ``chunked_attention`` when ``attention_chunk_size`` is set: key ``j`` visible to query ``i``
  iff both fall in the same chunk of ``attention_chunk_size`` tokens counted from the row's
  first real token (``left_padding`` is subtracted) — blocklab's chunk rule on document
  order. The other layers attend globally without rotary angles: blocklab's global layers
  with ``global_rope: false``, so the import requires the NoPE layers to be exactly the
  full-attention layers.
- ``attn_temperature_tuning`` multiplies a NoPE layer's queries by ``1 + attn_scale ·
  log(⌊(p + 1) / floor_scale⌋ + 1)`` (position ``p`` 0-based, ``+ 1`` inside the floor):
  ``patterns.query_temperature`` with ``global_temperature = attn_scale`` and
  ``temperature_floor = floor_scale``. Hugging Face counts ``p`` over the buffer (padding
  included), blocklab over the row's real tokens, so on a left-padded row whose positions
  cross ``floor_scale - 1`` the two differ: blocklab's output does not depend on the padding.
- Rotary angles are applied in the complex (interleaved) form, pairing dimensions ``2k`` and
  ``2k + 1`` of each head; blocklab rotates half against half (``k`` with ``k + d/2``), so the
  import reorders each head's q and k rows (:func:`~blocklab.convert.gguf_file.
  unpermute_rotary_rows`, llama.cpp's order is the same) — scores are unchanged by a common
  permutation of q and k, on the NoPE layers too.

Refused in one line: MoE layers (``moe_layers``; the Llama 4 Scout / Maverick checkpoints are
MoE), ``use_qk_norm: true`` (a weightless RMSNorm on the rotary layers' q and k only, after
the rotation: blocklab's QK-norm has a weight and covers every layer), NoPE layers that are not
exactly the full-attention layers.
tests/convert/test_hf_llama4.py checks logits past the chunk, on a left-padded batch and by
cached greedy decoding against ``transformers``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from blocklab.config import ModelConfig
from blocklab.convert.archs import Llama
from blocklab.convert.fields import Fields
from blocklab.convert.gguf_file import unpermute_rotary_rows
from blocklab.convert.weights import Weights
from blocklab.convert.windows import FULL, SLIDING, layer_types_in, pattern_in
from blocklab.model.masks import local_layer
from blocklab.model.softmax_options import softmax_options

CHUNKED = "chunked_attention"  # HF's layer_types entry of a chunked layer


def permute_rotary_rows(w: Tensor, n_heads: int) -> Tensor:
    """blocklab's half-split q/k rows -> Llama 4's interleaved ones (the inverse of
    :func:`unpermute_rotary_rows`)."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, 2, half, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


class Llama4(Llama):
    """Llama 4 text with dense layers: RMSNorm pre-norm, SwiGLU (``intermediate_size_mlp``),
    GQA, interleaved rotary on the chunked layers, NoPE global layers with the attention
    temperature (the module docstring)."""

    name, model_types = "llama4", ("llama4_text",)
    hf_class = "Llama4ForCausalLM"
    mlp: ClassVar[str] = "feed_forward"  # Llama 4's name of a layer's feed-forward block
    defaults: ClassVar[dict[str, Any]] = {  # Llama4TextConfig's
        "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32}

    def config_in(self, f: Fields, tensors: dict[str, Tensor]) -> dict[str, Any]:
        c = f.config  # Llama4TextConfig's defaults where Llama's differ
        c.setdefault("head_dim", 128)
        c.setdefault("rms_norm_eps", 1e-5)
        if not c.get("rope_parameters") and c.get("rope_theta") is None:
            c["rope_theta"] = 500000.0
        plain = self.core_in(f)
        n = plain["n_layers"]
        plain["d_ff"] = f.take("intermediate_size_mlp", 16384)  # dense layers' width
        plain["attention"]["bias"] = bool(f.take("attention_bias", False))
        step = f.take("interleave_moe_layer_step", 1)
        moe = f.take("moe_layers")
        moe = list(range(step - 1, n, step)) if moe is None else list(moe)
        if moe:
            f.refuse("moe_layers", moe, "blocklab's Llama 4 import takes dense layers only "
                     "(mixture-of-experts FFNs are not a blocklab component)")
        for key in ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef",
                    "router_jitter_noise", "output_router_logits"):
            f.take(key)  # the experts' settings: no expert layer reads them
        if f.take("use_qk_norm", True):
            f.refuse("use_qk_norm", True, "Llama 4 puts a weightless RMSNorm on q and k of "
                     "its rotary layers only, after the rotation; blocklab's QK-norm "
                     "(model.mixer.qk_norm) has a weight and normalizes every layer")
        plain["mixer"].update(self._pattern_in(f, n))
        return plain

    def _pattern_in(self, f: Fields, n: int) -> dict[str, Any]:
        interval = f.take("no_rope_layer_interval", 4)
        rope = f.take("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
        if len(rope) < n or not set(rope[:n]) <= {0, 1}:
            f.refuse("no_rope_layers", rope, f"must hold at least {n} entries "
                     "(num_hidden_layers), each 1 (rotary) or 0 (no rotary)")
        rope = [bool(x) for x in rope[:n]]
        chunk = f.take_nullable("attention_chunk_size", 8192)
        types = f.take("layer_types") or [CHUNKED if r and chunk is not None else FULL
                                          for r in rope]
        types = layer_types_in(f, types, n, CHUNKED)
        if CHUNKED in types and chunk is None:
            f.refuse("layer_types", types, "names chunked layers, but attention_chunk_size is "
                     "null")
        nope = [not r for r in rope]
        tuning = bool(f.take("attn_temperature_tuning", True))
        scale, floor = f.take("attn_scale", 0.1), f.take("floor_scale", 8192)
        out = pattern_in([SLIDING if t == CHUNKED else FULL for t in types], chunk)
        out["attention_chunk"] = out.pop("window")
        if not any(nope):
            return out
        if nope != [t == FULL for t in types]:
            f.refuse("no_rope_layers", [int(r) for r in rope], "blocklab drops rotary angles "
                     "on exactly the global (non-chunked) layers of a chunked stack "
                     f"(layer_types={types})")
        out["global_rope"] = False
        if tuning and scale:
            out.update(global_temperature=float(scale), temperature_floor=int(floor))
        return out

    def config_out(self, m: ModelConfig) -> dict[str, Any]:
        opts = softmax_options(m)
        chunked = [local_layer(opts, i) for i in range(m.n_layers)]
        rope = [int(c or opts.global_rope) for c in chunked]
        return {**self.core_out(m), "intermediate_size_mlp": m.d_ff,
                "intermediate_size": m.d_ff, "moe_layers": [], "use_qk_norm": False,
                "attention_bias": m.attention.bias, "no_rope_layers": rope,
                "attention_chunk_size": opts.attention_chunk,
                "layer_types": [CHUNKED if c else FULL for c in chunked],
                "attn_temperature_tuning": bool(opts.global_temperature),
                "attn_scale": opts.global_temperature, "floor_scale": opts.temperature_floor}

    def attn_in(self, w: Weights, m: ModelConfig, a: str, b: str, out: dict[str, Tensor]) -> None:
        super().attn_in(w, m, a, b, out)
        q, kv = m.n_heads * m.head_dim, m.kv_heads * m.head_dim
        for kind in (["weight", "bias"] if m.attention.bias else ["weight"]):
            t = out[b + f"attn.qkv.{kind}"]
            if t.shape[0] == q + 2 * kv and m.head_dim % 2 == 0:  # else the shape check refuses
                wq, wk, wv = t.split([q, kv, kv])
                out[b + f"attn.qkv.{kind}"] = torch.cat([unpermute_rotary_rows(wq, m.n_heads),
                                                       unpermute_rotary_rows(wk, m.kv_heads), wv])

    def attn_out(self, s: dict[str, Tensor], m: ModelConfig, a: str, b: str,
                 out: dict[str, Tensor]) -> None:
        super().attn_out(s, m, a, b, out)
        for kind in (["weight", "bias"] if m.attention.bias else ["weight"]):
            for x, heads in (("q", m.n_heads), ("k", m.kv_heads)):
                key = a + f"self_attn.{x}_proj.{kind}"
                out[key] = permute_rotary_rows(out[key], heads)

"""Sliding-window decoders: Mistral (one window on every layer) and Qwen2 (a window on the
layers its ``layer_types`` name) — the Llama layout plus blocklab's local attention
(``model.mixer.window`` with ``global_every`` or an explicit ``layers`` pattern,
``masks.layer_window``).

The window convention is the same on both sides, so ``sliding_window = W`` maps to ``window =
W``: Hugging Face lets query ``i`` see key ``j`` iff ``i - W < j <= i``
(``transformers.masking_utils.sliding_window_overlay`` and the causal mask), W keys with the
query itself, and its sliding cache keeps the last ``W - 1`` tokens; blocklab's window counts
"keys per query, the query included" and its ring keeps ``window - 1``. Hugging Face counts
buffer indices, blocklab real tokens: they agree on every batch HF makes (padding on the left
or the right, never inside a row). tests/convert/test_hf_windows.py checks it by logits at a
length past the window, on a left-padded batch and by cached greedy decoding.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

from blocklab.config import ModelConfig
from blocklab.convert.archs import Llama
from blocklab.convert.fields import Fields
from blocklab.convert.weights import Weights
from blocklab.errors import ConfigError
from blocklab.model.masks import layer_window
from blocklab.model.softmax_options import softmax_options

FULL, SLIDING = "full_attention", "sliding_attention"  # HF's layer_types entries


def layer_types_in(f: Fields, types: object, n: int, local: str) -> list[str]:
    """HF's ``layer_types`` as a list, refused in one line unless it holds ``n`` entries
    (``num_hidden_layers``), each full attention or the architecture's ``local`` kind."""
    types = list(types)  # type: ignore[call-overload]
    if len(types) != n or not set(types) <= {FULL, local}:
        f.refuse("layer_types", types, f"must be {n} entries (num_hidden_layers), each "
                 f"{FULL!r} or {local!r}")
    return types


def pattern_in(types: list[str], window: int | None) -> dict[str, Any]:
    """HF's per-layer types -> blocklab's window keys, in the shortest form that says it:
    ``window: null`` (no sliding layer), every layer local, ``global_every: n`` (layers n, 2n,
    ... full: Gemma 2's alternation is n = 2), else the explicit ``layers`` list."""
    local = [t == SLIDING for t in types]
    if window is None or not any(local):
        return {"window": None}
    if all(local):
        return {"window": window}
    for n in range(2, len(local) + 1):
        if local == [(i + 1) % n != 0 for i in range(len(local))]:
            return {"window": window, "global_every": n}
    return {"window": window, "layers": ["local" if x else "global" for x in local]}


def layer_types_out(m: ModelConfig) -> list[str]:
    """blocklab's layer windows -> HF's ``layer_types``."""
    return [FULL if layer_window(softmax_options(m), i) is None else SLIDING for i in range(m.n_layers)]


class Mistral(Llama):
    """Mistral 7B v0.1-style: the Llama layout without biases, ``sliding_window`` on every
    layer (null: none — v0.2 and later)."""

    name, model_types = "mistral", ("mistral",)
    hf_class = "MistralForCausalLM"
    defaults: ClassVar[dict[str, Any]] = {  # MistralConfig's
        "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32}

    def config_in(self, f: Fields, tensors: dict[str, Tensor]) -> dict[str, Any]:
        plain = self.core_in(f)
        window = f.take_nullable("sliding_window", 4096)  # MistralConfig's default
        types = f.take("layer_types")
        every = [FULL if window is None else SLIDING] * plain["n_layers"]
        if types is not None and list(types) != every:
            f.refuse("layer_types", types, "Hugging Face's MistralForCausalLM ignores it: every "
                     f"layer attends with sliding_window={window!r} (a per-layer pattern is a "
                     "Ministral / Qwen2 model)")
        plain["mixer"]["window"] = window
        return plain

    def config_out(self, m: ModelConfig) -> dict[str, Any]:
        return {**self.core_out(m), "sliding_window": softmax_options(m).window}


class Qwen2(Llama):
    """Qwen2 / Qwen2.5: the Llama layout with biases on q, k and v (none on the output
    projection, none in the MLP), and a window on the layers ``layer_types`` names. Without
    ``layer_types``, the rule of ``Qwen2Config`` (transformers 5, read in its source): layer
    ``i`` (0-based) slides iff ``use_sliding_window`` and ``sliding_window`` is not null and
    ``i >= max_window_layers`` — the first ``max_window_layers`` layers are full attention,
    whatever the old docstring said ("the bottom layers use SWA"); transformers#35896 /
    #36162 are that disagreement, settled for this rule.

    blocklab's ``attention.bias`` covers q/k/v and the output projection together, so the
    import sets the output bias to zeros (the same function) and the export refuses a
    nonzero one by name (a fine-tuned output bias has no Qwen2 place)."""

    name, model_types = "qwen2", ("qwen2",)
    hf_class = "Qwen2ForCausalLM"
    defaults: ClassVar[dict[str, Any]] = {  # Qwen2Config's
        "num_key_value_heads": 32, "max_position_embeddings": 32768}

    def config_in(self, f: Fields, tensors: dict[str, Tensor]) -> dict[str, Any]:
        plain = self.core_in(f)
        plain["attention"]["bias"] = True
        plain["mixer"].update(self.windows_in(f, plain["n_layers"]))
        return plain

    @staticmethod
    def windows_in(f: Fields, n: int) -> dict[str, Any]:
        """Qwen2Config's window keys (Qwen3's too) -> blocklab's window pattern."""
        use = bool(f.take("use_sliding_window", False))
        window = f.take_nullable("sliding_window", 4096)  # Qwen2Config's default
        window = window if use else None  # Qwen2Config drops it without use_sliding_window
        first = f.take("max_window_layers", 28)
        types = f.take("layer_types")
        if types is None:  # Qwen2Config's rule: layers i >= max_window_layers slide
            types = [SLIDING if window is not None and i >= first else FULL for i in range(n)]
        types = layer_types_in(f, types, n, SLIDING)
        if SLIDING in types and window is None:
            f.refuse("layer_types", types, "names sliding layers, but there is no window "
                     f"(use_sliding_window={use}, sliding_window="
                     f"{f.config.get('sliding_window')!r}): Hugging Face's Qwen2 cannot run it")
        return pattern_in(types, window)

    def config_out(self, m: ModelConfig) -> dict[str, Any]:
        return {**self.core_out(m), **self.windows_out(m)}

    @staticmethod
    def windows_out(m: ModelConfig) -> dict[str, Any]:
        types = layer_types_out(m)
        window = softmax_options(m).window if SLIDING in types else None
        first = types.index(SLIDING) if window is not None else m.n_layers
        return {"use_sliding_window": window is not None, "sliding_window": window,
                "max_window_layers": first, "layer_types": types}

    def attn_in(self, w: Weights, m: ModelConfig, a: str, b: str, out: dict[str, Tensor]) -> None:
        for kind in ("weight", "bias"):
            out[b + f"attn.qkv.{kind}"] = w.cat(*(a + f"self_attn.{x}_proj.{kind}" for x in "qkv"))
        o = w.take(a + "self_attn.o_proj.weight")
        out[b + "attn.out.weight"] = o
        out[b + "attn.out.bias"] = o.new_zeros(o.shape[0])  # Qwen2's o_proj has no bias

    def attn_out(self, s: dict[str, Tensor], m: ModelConfig, a: str, b: str,
                 out: dict[str, Tensor]) -> None:
        bias = s[b + "attn.out.bias"]
        if bias.count_nonzero():
            raise ConfigError(f"export refused: {b}attn.out.bias is not zero (max |value| "
                              f"{bias.abs().max().item():.3g}): Hugging Face's Qwen2 has no "
                              "output-projection bias (o_proj); a Qwen2 import keeps it at "
                              "zero, training changed it")
        q, kv = m.n_heads * m.head_dim, m.kv_heads * m.head_dim
        for kind in ("weight", "bias"):
            for x, t in zip("qkv", s[b + f"attn.qkv.{kind}"].split([q, kv, kv])):
                out[a + f"self_attn.{x}_proj.{kind}"] = t
        out[a + "self_attn.o_proj.weight"] = s[b + "attn.out.weight"]

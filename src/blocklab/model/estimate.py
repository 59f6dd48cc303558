"""Closed-form sizes of a model config, without building it: parameters, FLOPs per token,
activation memory and KV-cache bytes. A test checks the parameter formula against counted
parameters and the KV-cache formula against the bytes a real cache holds, for every variant.

The estimator never asks which variant it is looking at: each component says its own size
(``param_count``), and each family its stacks and head (``Model.stacks`` and friends). A user
component without ``param_count`` is counted by building that one component on the ``meta``
device (no memory, no compute).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blocklab.config import ModelConfig
from blocklab.registry import lookup


def params_of(component: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Parameters of ``component(*args, **kwargs)``: its own closed form when it has one,
    else counted on a copy built on the meta device."""
    closed_form = getattr(component, "param_count", None)
    if closed_form is not None:
        return int(closed_form(*args, **kwargs))
    import torch

    with torch.device("meta"):
        module = component(*args, **kwargs)
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def _position(m: ModelConfig) -> int:
    return params_of(lookup("position", m.position.name), m.position, d_model=m.d_model,
                     d_head=m.head_dim, n_heads=m.n_heads, max_seq_len=m.max_seq_len)


def _stack(m: ModelConfig, n_layers: int, *, cross: bool) -> int:
    """Position scheme + blocks + the final norm of placements that have one."""
    block = lookup("block", m.block.name)
    norm = params_of(lookup("norm", m.norm.name), m.norm, m.d_model)
    final = norm if block.final_norm else 0
    embed_norm = norm if m.embed_norm else 0
    return _position(m) + embed_norm + n_layers * block.param_count(m, cross=cross) + final


def count_params(m: ModelConfig) -> int:
    """Exact parameter count (shared tensors counted once)."""
    family = lookup("family", m.family.name)
    stacks = sum(_stack(m, n, cross=cross) for n, cross in family.stacks(m))
    types = m.type_vocab_size * m.d_model
    return m.vocab_size * m.d_model + types + stacks + family.head_param_count(m)


def matmul_params(m: ModelConfig) -> int:
    """Parameters used per token in the FLOP count: everything except embedding lookups and
    position tables, with the output projection counted once even when tied."""
    family = lookup("family", m.family.name)
    n_stacks = len(family.stacks(m))
    embed_and_head = (m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
                      + m.type_vocab_size * m.d_model)
    return count_params(m) - embed_and_head - n_stacks * _position(m) + m.vocab_size * m.d_model


@dataclass(frozen=True)
class Estimate:
    params: int
    matmul_params: int
    train_flops_per_token: float
    forward_flops_per_token: float
    activation_bytes: float
    kv_cache_bytes: int


def cached_slots(m: ModelConfig, seq_len: int) -> tuple[int, int, int]:
    """``(global layers, local layers, ring slots)`` of the self-attention KV cache for
    ``seq_len`` tokens: global layers keep every token, local (sliding-window) layers a ring of
    ``min(window - 1, seq_len)`` slots (the keys a later query's window can still reach)."""
    from blocklab.model.masks import layer_window

    layers = lookup("family", m.family.name).cached_layers(m)
    a = m.attention
    local = sum(layer_window(a.window, a.global_every, i) is not None for i in range(layers))
    slots = min(a.window - 1, seq_len) if local else 0  # type: ignore[operator]
    return layers - local, local, slots


def kv_cache_bytes(m: ModelConfig, batch: int, seq_len: int, bytes_per_value: int) -> int:
    """Self-attention cache: 2 (K and V) · B · H_kv · d_head · bytes · (L_global · T +
    L_local · min(window - 1, T)); without a window, the dense 2 · B · L · T · H_kv · d_head ·
    bytes. (A forward also holds its own new tokens' K/V transiently, not counted.)"""
    n_global, n_local, slots = cached_slots(m, seq_len)
    tokens = n_global * seq_len + n_local * slots
    return 2 * batch * tokens * m.kv_heads * m.head_dim * bytes_per_value


def estimate(m: ModelConfig, *, batch: int = 1, seq_len: int | None = None,
             bytes_per_value: int = 2) -> Estimate:
    """FLOPs: 2·N_matmul per token forward plus attention scores and values, 4·L·T·d_attn
    per attention layer (full-context convention of "PaLM", arXiv 2204.02311; encoder–decoder
    cross-attention counted with source length = target length); training = 3× forward.
    Activations: ≈ s·b·d·(34 + 5·H·s/d) bytes per layer at 2-byte values, without recomputation
    and with materialized scores ("Reducing Activation Recomputation", arXiv 2205.05198).
    A local attention window does not lower FLOPs or activations here: the window is a dense
    mask over all T×T scores, so the work is the full-context work; it lowers the KV cache."""
    t = seq_len or m.max_seq_len
    # Attention layers: every block's self-attention, plus cross-attention where a stack has it
    # (source length = target length).
    stacks = lookup("family", m.family.name).stacks(m)
    layers = sum(n for n, _ in stacks)
    attn_layers = layers + sum(n for n, cross in stacks if cross)
    d_attn = m.n_heads * m.head_dim
    n_mm = matmul_params(m)
    forward = 2 * n_mm + 4 * attn_layers * t * d_attn
    per_layer = t * batch * m.d_model * (34 + 5 * m.n_heads * t / m.d_model) * bytes_per_value / 2
    return Estimate(
        params=count_params(m), matmul_params=n_mm, train_flops_per_token=3.0 * forward,
        forward_flops_per_token=float(forward), activation_bytes=layers * per_layer,
        kv_cache_bytes=kv_cache_bytes(m, batch, t, bytes_per_value),
    )


def human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {suffix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def table(m: ModelConfig, e: Estimate, *, batch: int, seq_len: int, bytes_per_value: int) -> str:
    gib = 2**30
    rows = [
        ("family / norm / block", f"{m.family.name} / {m.norm.name} / {m.block.name}"),
        ("position / ffn / attention",
         f"{m.position.name} / {m.ffn.name} / {m.attention.name} "
         f"({m.n_heads} heads, {m.kv_heads} kv heads, d_head {m.head_dim})"),
        ("parameters", f"{e.params:,} ({human(e.params)})"),
        ("matmul parameters", f"{e.matmul_params:,}"),
        ("train FLOPs / token", human(e.train_flops_per_token, "FLOP")),
        ("forward FLOPs / token", human(e.forward_flops_per_token, "FLOP")),
        (f"activations (B={batch}, T={seq_len}, {bytes_per_value} B/value)",
         f"{e.activation_bytes / gib:.3f} GiB"),
        (f"KV cache (B={batch}, T={seq_len}, {bytes_per_value} B/value)",
         f"{e.kv_cache_bytes:,} B ({e.kv_cache_bytes / gib:.3f} GiB)"),
    ]
    if m.attention.window is not None:
        n_global, n_local, slots = cached_slots(m, seq_len)
        g = m.attention.global_every
        pattern = "every layer local" if not g else f"layers {g}, {2 * g}, ... global"
        rows.insert(2, ("attention window", f"{m.attention.window} tokens ({pattern})"))
        rows.append(("KV cache layers", f"{n_global} global x {seq_len} tokens + {n_local} "
                                        f"local x {slots} ring slots (min(window - 1, T))"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

"""Closed-form sizes of a model config, without building it: parameters, FLOPs per token,
activation memory and KV-cache bytes. A test checks the parameter formula against counted
parameters and the KV-cache formula against the bytes a real cache holds, for every variant.

The estimator never asks which variant it is looking at: each component says its own size
(``param_count``), each layer's sequence mixer its FLOPs per token and its decode state
(model/mixer.py), and each family its stacks and head (``Model.stacks`` and friends). A user
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


def _stack(m: ModelConfig, n_layers: int, *, cross: bool, causal: bool) -> int:
    """Position scheme + blocks + the final norm of placements that have one."""
    block = lookup("block", m.block.name)
    norm = params_of(lookup("norm", m.norm.name), m.norm, m.d_model)
    final = norm if block.final_norm else 0
    embed_norm = norm if m.embed_norm else 0
    blocks = sum(block.param_count(m, i, cross=cross, causal=causal) for i in range(n_layers))
    return _position(m) + embed_norm + blocks + final


def count_params(m: ModelConfig) -> int:
    """Exact parameter count (shared tensors counted once)."""
    family = lookup("family", m.family.name)
    stacks = sum(_stack(m, n, cross=cross, causal=causal)
                 for n, cross, causal in family.stacks(m))
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
class LayerCost:
    """What one layer's sequence mixer says it costs (model/mixer.py)."""

    stack: int  # index into the family's stacks
    layer: int
    mixer: str
    params: int
    flops_per_token: float  # forward
    state_bytes: int  # decode state after seq_len tokens (causal stacks only)
    score_keys: int  # keys a query scores (softmax), for the activation estimate


@dataclass(frozen=True)
class Estimate:
    params: int
    matmul_params: int
    train_flops_per_token: float
    forward_flops_per_token: float
    activation_bytes: float
    state_bytes: int  # the decode cache: every layer's state (KV cache for softmax layers)
    layers: tuple[LayerCost, ...] = ()

    @property
    def kv_cache_bytes(self) -> int:
        """The decode state's bytes (the name from before mixers other than attention)."""
        return self.state_bytes


def layer_costs(m: ModelConfig, *, batch: int, seq_len: int,
                bytes_per_value: int) -> list[LayerCost]:
    """Every layer's mixer, asked once for its parameters, FLOPs and state."""
    from blocklab.model.mixer import mixer_class

    out = []
    for s, (n, _, causal) in enumerate(lookup("family", m.family.name).stacks(m)):
        for i in range(n):
            mixer = mixer_class(m, i, causal)
            state = mixer.state_bytes(m, i, batch=batch, seq_len=seq_len,
                                      bytes_per_value=bytes_per_value) if causal else 0
            out.append(LayerCost(s, i, m.layer_mixer(i, causal),
                                 mixer.param_count(m, i, causal=causal),
                                 mixer.flops_per_token(m, i, seq_len=seq_len, causal=causal),
                                 state, mixer.score_keys(m, i, seq_len=seq_len)))
    return out


def state_bytes(m: ModelConfig, batch: int, seq_len: int, bytes_per_value: int) -> int:
    """The decode cache after ``seq_len`` tokens: the sum of what each layer's mixer keeps
    (softmax: 2 · B · H_kv · d_head · bytes per token, ``min(window - 1, T)`` tokens in a local
    layer; recurrent mixers: their fixed state)."""
    return sum(c.state_bytes for c in layer_costs(m, batch=batch, seq_len=seq_len,
                                                  bytes_per_value=bytes_per_value))


def estimate(m: ModelConfig, *, batch: int = 1, seq_len: int | None = None,
             bytes_per_value: int = 2) -> Estimate:
    """FLOPs: 2·N_matmul per token for every parameter outside the mixers, plus what each
    layer's mixer says its forward costs (softmax: its projections plus ``4·T_k·d_attn`` for
    scores and values, ``T_k = T`` for global layers — the full-context convention of "PaLM",
    arXiv 2204.02311 — and ``min(window, T)`` for local ones; recurrent mixers: constant in
    T), plus ``4·T·d_attn`` per cross-attention layer (source length = target length);
    training = 3× forward. Activations: ≈ s·b·d·(34 + 5·H·k/d) bytes per layer at 2-byte
    values, ``k`` the keys a query scores (0 for mixers without scores), without
    recomputation ("Reducing Activation Recomputation", arXiv 2205.05198). Decode state: the
    sum of the layers' own state sizes."""
    t = seq_len or m.max_seq_len
    stacks = lookup("family", m.family.name).stacks(m)
    cross_layers = sum(n for n, cross, _ in stacks if cross)
    d_attn = m.n_heads * m.head_dim
    costs = layer_costs(m, batch=batch, seq_len=t, bytes_per_value=bytes_per_value)
    n_mm = matmul_params(m)
    mixer_params = sum(c.params for c in costs)
    forward = (2 * (n_mm - mixer_params) + sum(c.flops_per_token for c in costs)
               + 4 * cross_layers * t * d_attn)
    scale = bytes_per_value / 2
    activations = sum(t * batch * m.d_model * (34 + 5 * m.n_heads * c.score_keys / m.d_model)
                      * scale for c in costs)
    return Estimate(
        params=count_params(m), matmul_params=n_mm, train_flops_per_token=3.0 * forward,
        forward_flops_per_token=float(forward), activation_bytes=activations,
        state_bytes=sum(c.state_bytes for c in costs), layers=tuple(costs),
    )
def human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {suffix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _mixer_summary(m: ModelConfig, e: Estimate) -> str:
    """``2 x softmax (local, window 16), 2 x linear`` per stack."""
    stacks = lookup("family", m.family.name).stacks(m)
    parts = []
    for s in range(len(stacks)):
        kinds: dict[str, int] = {}
        for c in e.layers:
            if c.stack == s:
                label = c.mixer
                if c.mixer == "softmax":
                    from blocklab.model.masks import layer_window

                    w = layer_window(m.attention, c.layer)
                    label += " (global)" if w is None else f" (local, window {w})"
                kinds[label] = kinds.get(label, 0) + 1
        parts.append(", ".join(f"{n} x {k}" for k, n in kinds.items()))
    return " | ".join(parts)


def table(m: ModelConfig, e: Estimate, *, batch: int, seq_len: int, bytes_per_value: int) -> str:
    gib = 2**30
    rows = [
        ("family / norm / block", f"{m.family.name} / {m.norm.name} / {m.block.name}"),
        ("position / ffn / attention",
         f"{m.position.name} / {m.ffn.name} / {m.attention.name} "
         f"({m.n_heads} heads, {m.kv_heads} kv heads, d_head {m.head_dim})"),
        ("mixers", _mixer_summary(m, e)),
        ("parameters", f"{e.params:,} ({human(e.params)})"),
        ("matmul parameters", f"{e.matmul_params:,}"),
        ("train FLOPs / token", human(e.train_flops_per_token, "FLOP")),
        ("forward FLOPs / token", human(e.forward_flops_per_token, "FLOP")),
        (f"activations (B={batch}, T={seq_len}, {bytes_per_value} B/value)",
         f"{e.activation_bytes / gib:.3f} GiB"),
        (f"decode state (B={batch}, T={seq_len}, {bytes_per_value} B/value)",
         f"{e.state_bytes:,} B ({e.state_bytes / gib:.3f} GiB)"),
    ]
    if m.attention.window is not None:
        g, kinds = m.attention.global_every, m.attention.layers
        pattern = "every softmax layer local" if not g else f"layers {g}, {2 * g}, ... global"
        if kinds:  # an explicit pattern, repeated over the layers
            pattern = f"per layer: {', '.join(kinds)}"
        rows.insert(3, ("attention window", f"{m.attention.window} tokens ({pattern})"))
    per_layer = [c for c in e.layers if c.state_bytes or c.flops_per_token]
    distinct = {(c.mixer, c.state_bytes, c.flops_per_token) for c in per_layer}
    if len(distinct) > 1:  # layers differ: show each
        for c in per_layer:
            rows.append((f"  layer {c.layer} ({c.mixer})" if len(
                {x.stack for x in e.layers}) == 1 else f"  stack {c.stack} layer {c.layer} "
                f"({c.mixer})", f"state {c.state_bytes:,} B, forward "
                f"{human(c.flops_per_token, 'FLOP')}/token"))
    elif per_layer:
        c = per_layer[-1]
        rows.append((f"  per layer ({c.mixer})", f"state {c.state_bytes:,} B, forward "
                                                  f"{human(c.flops_per_token, 'FLOP')}/token"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

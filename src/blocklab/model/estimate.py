"""Closed-form sizes of a model config, without building it: parameters, FLOPs per token,
activation memory and KV-cache bytes. A test checks the parameter formula against counted
parameters and the KV-cache formula against the bytes a real cache holds, for every variant.

The estimator never asks which variant it is looking at: each component says its own size
(``param_count``), each layer's sequence mixer its FLOPs per token and its decode state
(model/mixer.py), and each family its stacks and head (``Model.stacks`` and friends). A user
component without ``param_count`` is counted by building that one component on the ``meta``
device (no memory, no compute).

Each question is asked once per estimate: inside :func:`one_run` (every public function here
opens one) an answer is kept and reused — the parameter count, the FLOPs and the activation
estimate all need a layer's mixer, and a family's stacks, but ask them once (tested).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from blocklab.config import ModelConfig
from blocklab.registry import lookup

_ANSWERS: ContextVar[dict[Any, Any] | None] = ContextVar("blocklab_estimate", default=None)


@contextmanager
def one_run() -> Iterator[None]:
    """One estimate: within it each component is asked each question once (its answer kept,
    keyed by the component, the question and the arguments). A nested run joins the outer
    one; the answers are dropped at the end, so a changed config is asked afresh."""
    if _ANSWERS.get() is not None:
        yield
        return
    token = _ANSWERS.set({})
    try:
        yield
    finally:
        _ANSWERS.reset(token)


def _key(x: Any) -> Any:
    """Arguments told apart by value (numbers, names, flags: with their type, so 1 and True
    differ) or by identity (a config object; the kept answer holds it, so within a run its
    identity is never reused)."""
    if isinstance(x, tuple):
        return tuple(_key(v) for v in x)
    if x is None or isinstance(x, int | float | str | enum.Enum):
        return (type(x), x)
    return ("id", id(x))


def ask(component: Any, question: str, *args: Any, **kwargs: Any) -> Any:
    """``component.<question>(*args, **kwargs)``, asked once per :func:`one_run` (outside
    one, asked every time)."""
    answers = _ANSWERS.get()
    if answers is None:
        return getattr(component, question)(*args, **kwargs)
    key = (component, question, _key(args), _key(tuple(sorted(kwargs.items()))))
    if key not in answers:
        answers[key] = (args, kwargs, getattr(component, question)(*args, **kwargs))
    return answers[key][2]


def params_of(component: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Parameters of ``component(*args, **kwargs)``: its own closed form when it has one,
    else counted on a copy built on the meta device (either once per :func:`one_run`)."""
    if getattr(component, "param_count", None) is not None:
        return int(ask(component, "param_count", *args, **kwargs))
    return ask(_OnMeta, "count", component, *args, **kwargs)


class _OnMeta:
    """The parameters of a component without ``param_count``, counted on the meta device."""

    @staticmethod
    def count(component: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
        import torch

        with torch.device("meta"):
            module = component(*args, **kwargs)
        return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def stacks_of(m: ModelConfig) -> list[tuple[int, bool, bool]]:
    """The family's stacks, ``(n_layers, cross, causal)`` each (asked once per run)."""
    return ask(lookup("family", m.family.name), "stacks", m)


def _position(m: ModelConfig) -> int:
    return params_of(lookup("position", m.position.name), m.position, d_model=m.d_model,
                     d_head=m.head_dim, n_heads=m.n_heads, max_seq_len=m.max_seq_len)


def _stack(m: ModelConfig, n_layers: int, *, cross: bool, causal: bool) -> int:
    """Position scheme + blocks + the final norm of placements that have one."""
    block = lookup("block", m.block.name)
    norm = params_of(lookup("norm", m.norm.name), m.norm, m.d_model)
    final = norm if block.final_norm else 0
    embed_norm = norm if m.embed_norm else 0
    blocks = sum(ask(block, "param_count", m, i, cross=cross, causal=causal)
                 for i in range(n_layers))
    return _position(m) + embed_norm + blocks + final


def count_params(m: ModelConfig) -> int:
    """Exact parameter count (shared tensors counted once)."""
    with one_run():
        stacks = sum(_stack(m, n, cross=cross, causal=causal) for n, cross, causal in stacks_of(m))
        types = m.type_vocab_size * m.d_model
        head = ask(lookup("family", m.family.name), "head_param_count", m)
        memory = m.memory_tokens * m.d_model  # RMT's initial memory (model/rmt.py)
        return m.vocab_size * m.d_model + types + stacks + head + memory


def matmul_params(m: ModelConfig) -> int:
    """Parameters used per token in the FLOP count: everything except embedding lookups and
    position tables, with the output projection counted once even when tied."""
    with one_run():
        embed_and_head = (m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
                          + m.type_vocab_size * m.d_model)
        return (count_params(m) - embed_and_head - len(stacks_of(m)) * _position(m)
                + m.vocab_size * m.d_model - m.memory_tokens * m.d_model)


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
    with one_run():
        for s, (n, _, causal) in enumerate(stacks_of(m)):
            for i in range(n):
                mixer = mixer_class(m, i, causal)
                state = ask(mixer, "state_bytes", m, i, batch=batch, seq_len=seq_len,
                            bytes_per_value=bytes_per_value) if causal else 0
                out.append(LayerCost(
                    s, i, m.layer_mixer(i, causal), ask(mixer, "param_count", m, i, causal=causal),
                    ask(mixer, "flops_per_token", m, i, seq_len=seq_len, causal=causal), state,
                    ask(mixer, "score_keys", m, i, seq_len=seq_len)))
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
    sum of the layers' own state sizes. RMT's ``model.memory_tokens = n`` (model/rmt.py): the
    stack runs ``T + 2n`` tokens per segment of ``T`` (its FLOPs and activations × (T+2n)/T,
    the head scores T), the state is the carried memory, ``B·n·d`` values. ``batch``, ``seq_len`` and ``bytes_per_value`` are
    checked (blocklab-estimate's ``batch_size``, ``seq_len``, ``bytes_per_value``), and the
    model as training checks it for that length (:func:`check_estimate`)."""
    t = m.max_seq_len if seq_len is None else seq_len  # 0 is checked, not taken as None
    check_estimate(m, batch=batch, seq_len=t, bytes_per_value=bytes_per_value)
    n_mem = m.memory_tokens  # RMT: each segment runs between 2n memory tokens, carries n
    run = t + 2 * n_mem
    with one_run():
        cross_layers = sum(n for n, cross, _ in stacks_of(m) if cross)
        costs = layer_costs(m, batch=batch, seq_len=run, bytes_per_value=bytes_per_value)
        params, n_mm = count_params(m), matmul_params(m)
    d_attn = m.n_heads * m.head_dim
    mixer_params = sum(c.params for c in costs)
    head = 2 * m.vocab_size * m.d_model  # scores the segment's T tokens only
    forward = (2 * (n_mm - mixer_params) - head + sum(c.flops_per_token for c in costs)
               + 4 * cross_layers * t * d_attn) * run / t + head
    scale = bytes_per_value / 2
    activations = sum(run * batch * m.d_model * (34 + 5 * m.n_heads * c.score_keys / m.d_model)
                      * scale for c in costs)
    if n_mem:  # the memory is the carried state; no layer keeps one
        costs = [replace(c, state_bytes=0) for c in costs]
    state = batch * n_mem * m.d_model * bytes_per_value + sum(c.state_bytes for c in costs)
    return Estimate(
        params=params, matmul_params=n_mm, train_flops_per_token=3.0 * forward,
        forward_flops_per_token=float(forward), activation_bytes=activations,
        state_bytes=state, layers=tuple(costs),
    )


def check_estimate(m: ModelConfig, *, batch: int, seq_len: int, bytes_per_value: int) -> None:
    """What an estimate is asked, refused in one line naming the key (exit code 2) where it
    means nothing — a batch, a length or a value size below 1 —, and the model's options
    against that length exactly as training checks them against ``data.seq_len``
    (config.validate_model_options: unread options, the position table's length)."""
    from blocklab.config.checks import require
    from blocklab.config.validate_model import validate_model_options

    for name, value in (("batch_size", batch), ("seq_len", seq_len),
                        ("bytes_per_value", bytes_per_value)):
        require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name,
                value, "must be an integer >= 1" + (" (2 = bf16/fp16, 4 = fp32)"
                                                    if name == "bytes_per_value" else ""))
    validate_model_options(m, None, seq_len=seq_len, seq_key="seq_len")


def human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {suffix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _mixer_summary(m: ModelConfig, e: Estimate) -> str:
    """``2 x softmax (local, window 16), 2 x linear`` per stack."""
    parts = []
    for s in sorted({c.stack for c in e.layers}):
        kinds: dict[str, int] = {}
        for c in e.layers:
            if c.stack == s:
                describe = getattr(lookup("mixer", c.mixer), "describe", None)  # the mixer says
                detail = describe(m, c.layer) if describe else ""
                label = f"{c.mixer} {detail}" if detail else c.mixer
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
    if m.memory_tokens:  # RMT (model/rmt.py)
        grow = (seq_len + 2 * m.memory_tokens) / seq_len
        rows.append(("memory tokens", f"{m.memory_tokens} read + written per segment of "
                     f"{seq_len} (stack FLOPs x {grow:.3f}); the carried state is the memory, "
                     "no layer state"))
    for name in dict.fromkeys(c.mixer for c in e.layers):  # each mixer in use, in order
        for row in getattr(lookup("mixer", name), "summary_rows", lambda _: [])(m):
            rows.insert(3, row)
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

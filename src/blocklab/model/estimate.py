"""Closed-form sizes of a model config, without building it: parameters, FLOPs per token,
activation memory and KV-cache bytes. A test checks the parameter formula against counted
parameters and the KV-cache formula against the bytes a real cache holds, for every variant."""

from __future__ import annotations

from dataclasses import dataclass

from blocklab.config import BlockName, FamilyName, FFNName, ModelConfig, NormName, PositionName


def _norm(m: ModelConfig) -> int:
    d = m.d_model
    return 2 * d if m.norm.name is NormName.layernorm and m.norm.bias else d


def _attention(m: ModelConfig) -> int:
    d, h, kv, dh, bias = m.d_model, m.n_heads, m.kv_heads, m.head_dim, m.attention.bias
    q, kv_out = h * dh, 2 * kv * dh
    weights = d * q + d * kv_out + q * d  # q, k+v, output projections (fused or not)
    return weights + (q + kv_out + d if bias else 0)


def _ffn(m: ModelConfig) -> int:
    d, f, bias = m.d_model, m.d_ff, m.ffn.bias
    if m.ffn.name in (FFNName.swiglu, FFNName.geglu):
        return 3 * d * f + (2 * f + d if bias else 0)
    return 2 * d * f + (f + d if bias else 0)


def _position(m: ModelConfig) -> int:
    p = m.position.name
    if p is PositionName.learned:
        return m.max_seq_len * m.d_model
    if p is PositionName.t5_bias:
        return m.position.num_buckets * m.n_heads
    return 0


def _stack(m: ModelConfig, n_layers: int, *, cross: bool) -> int:
    norms_per_sublayer = 2 if m.block.name is BlockName.sandwich else 1
    n_sub = 3 if cross else 2
    block = (_attention(m) * (2 if cross else 1) + _ffn(m)
             + n_sub * norms_per_sublayer * _norm(m))
    final = 0 if m.block.name is BlockName.post else _norm(m)
    return _position(m) + n_layers * block + final


def count_params(m: ModelConfig) -> int:
    """Exact parameter count (shared tensors counted once)."""
    d, v = m.d_model, m.vocab_size
    total = v * d  # token embedding
    fam = m.family.name
    if fam is FamilyName.encoder_decoder:
        total += _stack(m, m.encoder_layers, cross=False) + _stack(m, m.n_layers, cross=True)
    else:
        total += _stack(m, m.n_layers, cross=False)
    if fam is FamilyName.encoder:  # MLM head: dense + norm + output bias
        total += d * d + d + _norm(m) + v
    return total + (0 if m.tie_embeddings else v * d)


def matmul_params(m: ModelConfig) -> int:
    """Parameters used per token in the FLOP count: everything except embedding lookups and
    position tables, with the output projection counted once even when tied."""
    n_stacks = 2 if m.family.name is FamilyName.encoder_decoder else 1
    embed_and_head = m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
    return count_params(m) - embed_and_head - n_stacks * _position(m) + m.vocab_size * m.d_model


@dataclass(frozen=True)
class Estimate:
    params: int
    matmul_params: int
    train_flops_per_token: float
    forward_flops_per_token: float
    activation_bytes: float
    kv_cache_bytes: int


def kv_cache_bytes(m: ModelConfig, batch: int, seq_len: int, bytes_per_value: int) -> int:
    """Dense self-attention cache: 2 (K and V) · B · L · T · H_kv · d_head · bytes."""
    if m.family.name is FamilyName.encoder:
        return 0
    return 2 * batch * m.n_layers * seq_len * m.kv_heads * m.head_dim * bytes_per_value


def estimate(m: ModelConfig, *, batch: int = 1, seq_len: int | None = None,
             bytes_per_value: int = 2) -> Estimate:
    """FLOPs: 2·N_matmul per token forward plus attention scores and values, 4·L·T·d_attn
    per attention layer (full-context convention of "PaLM", arXiv 2204.02311; encoder–decoder
    cross-attention counted with source length = target length); training = 3× forward.
    Activations: ≈ s·b·d·(34 + 5·H·s/d) bytes per layer at 2-byte values, without recomputation
    and with materialized scores ("Reducing Activation Recomputation", arXiv 2205.05198)."""
    t = seq_len or m.max_seq_len
    # Attention layers: encoder self + decoder self + decoder cross (source length = target).
    enc_dec = m.family.name is FamilyName.encoder_decoder
    layers = m.n_layers + (m.encoder_layers if enc_dec else 0)
    attn_layers = layers + (m.n_layers if enc_dec else 0)
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
        ("family / norm / block", f"{m.family.name.value} / {m.norm.name.value} / {m.block.name.value}"),
        ("position / ffn / attention",
         f"{m.position.name.value} / {m.ffn.name.value} / {m.attention.name.value} "
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
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

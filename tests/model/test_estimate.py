"""Closed-form estimates against counted references: parameters of a built model, the bytes a
real KV cache holds, FLOPs counted by hand and by ``torch.utils.flop_counter`` on a forward."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from blocklab.config import (
    AttentionConfig,
    BlockConfig,
    FamilyConfig,
    FFNConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
)
from blocklab.model.estimate import count_params, estimate, matmul_params
from blocklab.model.estimate import state_bytes as kv_cache_bytes
from blocklab.model.transformer import build_model
from blocklab.registry import names

# Norm kinds, with LayerNorm's bias on and off; RMSNorm keeps the schema's bias=True, which it
# must ignore.
NORMS = {
    "layernorm": NormConfig(name="layernorm", bias=True),
    "layernorm_nobias": NormConfig(name="layernorm", bias=False),
    "rmsnorm": NormConfig(name="rmsnorm", bias=True),
}
KV_HEADS = {name: (2 if name == "gqa" else None) for name in names("attention")}


def tiny(family: str = "decoder", *, norm: str = "layernorm", block: str = "pre",
         position: str = "none", ffn: str = "gelu_mlp", attention: str = "mha",
         tie: bool = True, attn_bias: bool = True, ffn_bias: bool = True,
         d_head: int | None = None, **sizes) -> ModelConfig:
    """A tiny config with pairwise-distinct sizes, so that a formula mixing two of them up
    cannot pass by coincidence. Encoder–decoder gets a deeper encoder than decoder."""
    n = NORMS[norm]
    base = dict(vocab_size=37, d_model=16, n_layers=2, n_heads=4, d_head=d_head, d_ff=24,
                max_seq_len=20)
    base.update(sizes)
    return ModelConfig(
        family=FamilyConfig(name=family,
                            n_encoder_layers=3 if family == "encoder_decoder" else None),
        norm=NormConfig(name=n.name, bias=n.bias),
        block=BlockConfig(name=block),
        position=PositionConfig(name=position, **(  # T5's own options only where it reads them
            {"num_buckets": 10, "max_distance": 40} if position == "t5_bias" else {})),
        ffn=FFNConfig(name=ffn, bias=ffn_bias),
        attention=AttentionConfig(name=attention, n_kv_heads=KV_HEADS[attention],
                                  bias=attn_bias),
        tie_embeddings=tie,
        **base,
    )


def counted_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied tensors once


# ------------------------------------------------------------------------- parameter count

FAMILIES = names("family")
BLOCKS = names("block")
POSITIONS = names("position")
FFNS = names("ffn")
ATTENTIONS = names("attention")
# (tie_embeddings, attention bias, ffn bias, explicit d_head) — 16 combinations
FLAGS = list(itertools.product([True, False], [True, False], [True, False], [None, 6]))
OUTER = list(itertools.product(FAMILIES, NORMS, BLOCKS, POSITIONS))


@pytest.mark.parametrize(("family", "norm", "block", "position"), OUTER,
                         ids=["-".join(c) for c in OUTER])
def test_count_params_matches_built_model(family, norm, block, position):
    """Full product of family × norm × block × position; inside, every ffn × attention, with
    the boolean flags and d_head cycled so that every (outer, flags) and every
    (ffn, attention, flags) combination is built somewhere in the grid."""
    outer_index = OUTER.index((family, norm, block, position))
    mismatches = []
    for j, (ffn, attention) in enumerate(itertools.product(FFNS, ATTENTIONS)):
        tie, attn_bias, ffn_bias, d_head = FLAGS[(outer_index + j) % len(FLAGS)]
        cfg = tiny(family, norm=norm, block=block, position=position, ffn=ffn,
                   attention=attention, tie=tie, attn_bias=attn_bias, ffn_bias=ffn_bias,
                   d_head=d_head)
        got, want = count_params(cfg), counted_params(build_model(cfg))
        if got != want:
            mismatches.append(f"{ffn}/{attention}/tie={tie}/attn_bias={attn_bias}/"
                              f"ffn_bias={ffn_bias}/d_head={d_head}: formula {got}, model {want}")
    assert not mismatches, "\n".join(mismatches)


ZOO_OPTIONS = list(itertools.product(FAMILIES, NORMS, BLOCKS, [(True, 0), (False, 2), (True, 3)]))


@pytest.mark.parametrize(("family", "norm", "block", "options"), ZOO_OPTIONS,
                         ids=[f"{f}-{n}-{b}-embnorm{o[0]}-types{o[1]}" for f, n, b, o in ZOO_OPTIONS])
def test_count_params_with_embedding_norm_and_token_types(family, norm, block, options):
    """The options imported models need (embedding norm per stack, token-type table) are
    counted by the estimator as built."""
    embed_norm, types = options
    cfg = tiny(family, norm=norm, block=block, position="learned", embed_norm=embed_norm,
               type_vocab_size=types)
    assert count_params(cfg) == counted_params(build_model(cfg))


def test_count_params_flag_grid_is_covered():
    """The cycling above reaches all 16 flag combinations for every outer combination."""
    inner = len(FFNS) * len(ATTENTIONS)
    for i in range(len(OUTER)):
        seen = {(i + j) % len(FLAGS) for j in range(inner)}
        assert len(seen) == min(inner, len(FLAGS))
    for j in range(inner):
        assert {(i + j) % len(FLAGS) for i in range(len(OUTER))} == set(range(len(FLAGS)))


def test_count_params_by_hand():
    """A GPT-2-style decoder counted on paper: V=37, d=16, f=24, L=2, learned table of 20."""
    cfg = tiny("decoder", position="learned", tie=False)
    v, d, f, layers, t = 37, 16, 24, 2, 20
    attn = 4 * d * d + 4 * d  # q, k, v, o with biases
    mlp = 2 * d * f + f + d
    norms = 2 * 2 * d  # two LayerNorms with bias per block
    want = v * d + t * d + layers * (attn + mlp + norms) + 2 * d + v * d  # + final norm, head
    assert count_params(cfg) == want == counted_params(build_model(cfg))


# ---------------------------------------------------------------------------------- KV cache

DTYPES = [pytest.param(torch.float32, 4, id="fp32"), pytest.param(torch.bfloat16, 2, id="bf16")]


@pytest.mark.parametrize(("dtype", "nbytes"), DTYPES)
@pytest.mark.parametrize("d_head", [None, 6], ids=["d_head-default", "d_head6"])
@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
def test_kv_cache_bytes_match_real_cache(family, attention, d_head, dtype, nbytes):
    cfg = tiny(family, attention=attention, d_head=d_head, position="rope")
    model = build_model(cfg)
    batch, capacity = 3, 11
    cache = model.new_cache(batch, capacity, dtype=dtype)
    kv = {"mha": 4, "gqa": 2, "mqa": 1}[attention]
    head_dim = d_head or 16 // 4
    # the cache holds the decoder's self-attention K and V: (B, H_kv, C, D) each, per layer
    assert [tuple(s.k.shape) for s in cache.states] == [(batch, kv, capacity, head_dim)] * 2
    assert {s.k.dtype for s in cache.states} == {dtype}
    assert kv_cache_bytes(cfg, batch, capacity, nbytes) == cache.nbytes
    assert cache.nbytes == 2 * 2 * batch * kv * capacity * head_dim * nbytes
    est = estimate(cfg, batch=batch, seq_len=capacity, bytes_per_value=nbytes)
    assert est.kv_cache_bytes == cache.nbytes


def test_encoder_has_no_kv_cache():
    cfg = tiny("encoder")
    assert kv_cache_bytes(cfg, 2, 16, 2) == 0
    with pytest.raises(TypeError):
        build_model(cfg).new_cache(2, 16)


def test_kv_cache_worked_example_is_one_gib():
    """B=1, 32 layers, 8192 tokens, 8 KV heads of 128 dims, 2 bytes: 2·32·8192·8·128·2 = 2^30."""
    cfg = ModelConfig(vocab_size=64, d_model=4096, n_layers=32, n_heads=32, d_ff=64,
                      max_seq_len=8192,
                      attention=AttentionConfig(name="gqa", n_kv_heads=8, bias=False),
                      position=PositionConfig(name="rope"))
    assert cfg.head_dim == 128 and cfg.kv_heads == 8
    assert kv_cache_bytes(cfg, 1, 8192, 2) == 2**30
    assert estimate(cfg, batch=1, seq_len=8192, bytes_per_value=2).kv_cache_bytes == 2**30
    # the buffers a cache of that shape allocates (on the meta device: no memory)
    with torch.device("meta"):
        model = build_model(cfg)
    cache = model.new_cache(1, 8192, dtype=torch.bfloat16, device="meta")
    assert cache.nbytes == 2**30


# ------------------------------------------------------------------------------------- FLOPs


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_train_flops_are_three_forward(family, tie):
    cfg = tiny(family, tie=tie, attention="gqa", ffn="swiglu", position="learned")
    e = estimate(cfg, seq_len=16)
    assert e.train_flops_per_token == 3 * e.forward_flops_per_token
    assert e.forward_flops_per_token > 0


def test_forward_flops_by_hand_llama_style():
    """Decoder, RMSNorm, pre-norm, RoPE, SwiGLU, MHA, no biases, tied; d=64, f=256, L=2,
    V=256, T=128. N_matmul = L·(4d² + 3df + 2d) + d + Vd; forward = 2·N + 4·L·T·d."""
    cfg = tiny("decoder", norm="rmsnorm", position="rope", ffn="swiglu", attn_bias=False,
               ffn_bias=False, vocab_size=256, d_model=64, d_ff=256, max_seq_len=128)
    n = 2 * (4 * 64 * 64 + 3 * 64 * 256 + 2 * 64) + 64 + 256 * 64
    assert n == 147_776
    assert matmul_params(cfg) == n
    e = estimate(cfg)  # T = max_seq_len
    assert e.forward_flops_per_token == 2 * 147_776 + 4 * 2 * 128 * 64 == 361_088
    assert e.train_flops_per_token == 3 * 361_088


def test_forward_flops_by_hand_gpt2_style():
    """Decoder, LayerNorm with bias, post-norm, learned positions, GELU MLP, GQA (2 of 4 KV
    heads), biases, untied; d=64, f=256, L=2, V=256, T=128. The position table is a lookup
    and the untied input embedding too: only the head's V·d is a matmul."""
    cfg = tiny("decoder", norm="layernorm", block="post", position="learned", attention="gqa",
               tie=False, vocab_size=256, d_model=64, d_ff=256, max_seq_len=128)
    d, dh, kv = 64, 16, 2
    attn = d * d + d + d * 2 * kv * dh + 2 * kv * dh + d * d + d  # q, fused kv, out
    mlp = 2 * d * 256 + 256 + d
    norms = 2 * 2 * d  # post-norm: no final norm
    n = 2 * (attn + mlp + norms) + 256 * d
    assert n == 108_032
    assert matmul_params(cfg) == n
    assert estimate(cfg).forward_flops_per_token == 2 * n + 4 * 2 * 128 * 64 == 281_600
    # tying or not does not change the work per token
    tied = tiny("decoder", norm="layernorm", block="post", position="learned", attention="gqa",
                tie=True, vocab_size=256, d_model=64, d_ff=256, max_seq_len=128)
    assert estimate(tied).forward_flops_per_token == estimate(cfg).forward_flops_per_token


FLOP_CASES = [
    pytest.param("decoder", "mha", "rope", True, id="decoder-mha-rope-tied"),
    pytest.param("decoder", "gqa", "learned", False, id="decoder-gqa-learned-untied"),
    pytest.param("decoder", "mqa", "t5_bias", True, id="decoder-mqa-t5_bias"),
    pytest.param("encoder", "mha", "sinusoidal", True, id="encoder-mha-sinusoidal"),
    pytest.param("encoder", "gqa", "alibi", False, id="encoder-gqa-alibi-untied"),
    pytest.param("encoder_decoder", "mha", "t5_bias", True, id="encoder_decoder-mha-t5_bias"),
    pytest.param("encoder_decoder", "gqa", "rope", False, id="encoder_decoder-gqa-rope-untied"),
]


@pytest.mark.parametrize(("family", "attention", "position", "tie"), FLOP_CASES)
def test_forward_flops_match_flop_counter(family, attention, position, tie):
    """Count a real forward with torch's FlopCounterMode (matmuls, and attention as explicit
    bmm under the math SDPA backend, full T×T as in the full-context convention), then add
    2 FLOPs per norm/bias parameter, which the estimate's 2·N_matmul includes but a matmul
    counter does not see. Encoder–decoder: source and target both of length T, per target
    token."""
    t = 12
    cfg = tiny(family, attention=attention, position=position, tie=tie, max_seq_len=t)
    model = build_model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, t), generator=torch.Generator().manual_seed(0))
    args = (ids, ids) if family == "encoder_decoder" else (ids,)
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fc:
        model(*args)
    elementwise = sum(p.numel() for p in model.parameters() if p.dim() == 1)
    counted = fc.get_total_flops() / t + 2 * elementwise
    assert estimate(cfg, seq_len=t).forward_flops_per_token == counted


def _xl(mem_len: int, t: int) -> ModelConfig:
    cfg = tiny("decoder", position="rope", max_seq_len=t)
    cfg.mixer["mem_len"] = mem_len
    return cfg


@pytest.mark.parametrize("mem_len", [5, 12])
def test_xl_memory_state_and_flops_match_a_carry_cache(mem_len):
    """The XL memory (model/memory.py): the estimate's state bytes == a real carry cache's
    after 3 segments; its forward FLOPs per token == FlopCounterMode's count of the third
    segment (the memory full: [memory; segment] projected, T x (M + T) scores)."""
    from blocklab.model.carry import run_segments

    t = 8
    cfg = _xl(mem_len, t)
    model = build_model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 3 * t), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(2, None, carry=True)
    with torch.no_grad():
        run_segments(model, ids[:, :2 * t], seg_len=t, cache=cache)
        with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fc:
            run_segments(model, ids[:, 2 * t:], seg_len=t, cache=cache)
    est = estimate(cfg, batch=2, seq_len=t, bytes_per_value=4)
    assert est.state_bytes == cache.nbytes == 2 * 2 * mem_len * 16 * 4  # layers, B, M, d
    elementwise = sum(p.numel() for p in model.parameters() if p.dim() == 1)
    counted = fc.get_total_flops() / (2 * t) + 2 * elementwise
    assert estimate(cfg, seq_len=t).forward_flops_per_token == counted

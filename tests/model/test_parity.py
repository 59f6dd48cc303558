"""Parity with independent implementations after a weight copy: PyTorch's own
``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``, and HF ``transformers`` GPT-2
and Llama. Also: GQA/MQA equal MHA with each K/V head repeated for its query group."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from variants import VOCAB, tiny

from blocklab.config import (
    AttentionConfig,
    BlockConfig,
    FamilyConfig,
    FFNConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
)
from blocklab.model import build_model, masks
from blocklab.model.attention import _merge, _sdpa
from blocklab.model.blocks import BLOCKS, Context
from blocklab.model.mixer import Sequence
from blocklab.model.position import NoPosition

D, H, FF = 32, 4, 48


def _block_cfg(block: str, act: str) -> ModelConfig:
    return ModelConfig(norm=NormConfig(name="layernorm"), block=BlockConfig(name=block),
                       ffn=FFNConfig(name=f"{act}_mlp"), attention=AttentionConfig(),
                       d_model=D, n_heads=H, d_ff=FF, n_layers=1)


def _seq(b: int, t: int, *, causal: bool, valid=None) -> Sequence:
    """The facts of a (b, t) forward without positions, as a stack hands them to its blocks."""
    positions = torch.arange(t).expand(b, t)
    return Sequence(positions=positions, valid=valid, segments=None, causal=causal,
                    position=NoPosition(PositionConfig(), d_model=D, d_head=D // H, n_heads=H,
                                        max_seq_len=64, causal=causal))


def _copy_common(ours, ref) -> None:
    ours.attn.out.load_state_dict(ref.self_attn.out_proj.state_dict())
    ours.ffn.up.load_state_dict(ref.linear1.state_dict())
    ours.ffn.down.load_state_dict(ref.linear2.state_dict())
    for i, norm in enumerate(ours.norms):
        norm.load_state_dict(getattr(ref, f"norm{i + 1}").state_dict())


@pytest.mark.parametrize("act", ["gelu", "relu"])
@pytest.mark.parametrize("block", ["pre", "post"])
def test_encoder_block_equals_torch_transformer_encoder_layer(block, act):
    ref = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation=act, batch_first=True,
                                     norm_first=block == "pre").eval()
    ours = BLOCKS[block](_block_cfg(block, act), 0, cross=False, causal=False).eval()
    ours.attn.qkv.weight.data.copy_(ref.self_attn.in_proj_weight)
    ours.attn.qkv.bias.data.copy_(ref.self_attn.in_proj_bias)
    _copy_common(ours, ref)
    x = torch.randn(3, 11, D)
    valid = torch.ones(3, 11, dtype=torch.bool)
    valid[1, 7:] = False
    got = ours(x, Context(seq=_seq(3, 11, valid=valid, causal=False)))
    want = ref(x, src_key_padding_mask=~valid)  # torch's polarity: True = ignore
    torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block", ["pre", "post"])
def test_decoder_block_equals_torch_transformer_decoder_layer(block):
    ref = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, activation="gelu", batch_first=True,
                                     norm_first=block == "pre").eval()
    ours = BLOCKS[block](_block_cfg(block, "gelu"), 0, cross=True, causal=True).eval()
    ours.attn.qkv.weight.data.copy_(ref.self_attn.in_proj_weight)
    ours.attn.qkv.bias.data.copy_(ref.self_attn.in_proj_bias)
    ours.cross.q.weight.data.copy_(ref.multihead_attn.in_proj_weight[:D])
    ours.cross.q.bias.data.copy_(ref.multihead_attn.in_proj_bias[:D])
    ours.cross.kv.weight.data.copy_(ref.multihead_attn.in_proj_weight[D:])
    ours.cross.kv.bias.data.copy_(ref.multihead_attn.in_proj_bias[D:])
    ours.cross.out.load_state_dict(ref.multihead_attn.out_proj.state_dict())
    _copy_common(ours, ref)
    x, mem = torch.randn(2, 9, D), torch.randn(2, 6, D)
    mem_valid = torch.ones(2, 6, dtype=torch.bool)
    mem_valid[0, 4:] = False
    ctx = Context(seq=_seq(2, 9, causal=True), memory=mem,
                  cross_visibility=masks.cross_visibility(mem_valid))
    causal = nn.Transformer.generate_square_subsequent_mask(9)
    want = ref(x, mem, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=~mem_valid)
    torch.testing.assert_close(ours(x, ctx), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["gqa", "mqa"])
@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_grouped_kv_heads_equal_mha_with_repeated_kv(attention, position):
    """GQA/MQA == MHA whose K/V projections repeat each K/V head for its group of query
    heads: checks the head-to-group mapping, not just that it runs."""
    pos = PositionConfig(name=position)
    grouped = build_model(tiny(position=pos, attention=attention, n_heads=8, d_model=32)).eval()
    mha = build_model(tiny(position=pos, attention="mha", n_heads=8, d_model=32)).eval()
    sd = grouped.state_dict()
    g_cfg = grouped.config
    dh, h, kv = g_cfg.head_dim, g_cfg.n_heads, g_cfg.kv_heads
    for key, value in list(sd.items()):
        if key.endswith("attn.qkv.weight") or key.endswith("attn.qkv.bias"):
            q, k, v = value.split((h * dh, kv * dh, kv * dh))
            rep = lambda t: t.unflatten(0, (kv, dh)).repeat_interleave(h // kv, 0).flatten(0, 1)  # noqa: E731
            sd[key] = torch.cat((q, rep(k), rep(v)))
    mha.load_state_dict(sd)
    ids = torch.randint(0, VOCAB, (2, 13))
    torch.testing.assert_close(grouped(ids), mha(ids), atol=1e-5, rtol=0)


def test_gqa_with_as_many_kv_heads_as_query_heads_is_the_mha_path():
    m = tiny(attention="mha", n_heads=4)
    model = build_model(m).eval()
    attn = model.decoder.blocks[0].attn
    q, k, v = (torch.randn(2, 4, 7, 8) for _ in range(3))
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(
        attn.out(_merge(_sdpa(attn, q, k, v, masks.EVERYTHING))),
        attn.out(plain.transpose(1, 2).reshape(2, 7, 32)), atol=1e-6, rtol=0)


transformers = pytest.importorskip("transformers", reason="HF transformers not installed")


def test_gpt2_like_decoder_equals_hf_gpt2_after_weight_copy():
    cfg = ModelConfig(family=FamilyConfig(name="decoder"),
                      position=PositionConfig(name="learned"),
                      vocab_size=VOCAB, d_model=D, n_layers=2, n_heads=H, d_ff=4 * D,
                      max_seq_len=32)
    ours = build_model(cfg).eval()
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=D, n_layer=2, n_head=H,
        activation_function="gelu", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
        layer_norm_epsilon=1e-5)).eval()
    t = hf.transformer
    with torch.no_grad():
        ours.embed.weight.copy_(t.wte.weight)
        ours.decoder.position.table.weight.copy_(t.wpe.weight)
        for blk, h in zip(ours.decoder.blocks, t.h):
            blk.norms[0].load_state_dict(h.ln_1.state_dict())
            blk.norms[1].load_state_dict(h.ln_2.state_dict())
            blk.attn.qkv.weight.copy_(h.attn.c_attn.weight.T)  # HF Conv1D stores (in, out)
            blk.attn.qkv.bias.copy_(h.attn.c_attn.bias)
            blk.attn.out.weight.copy_(h.attn.c_proj.weight.T)
            blk.attn.out.bias.copy_(h.attn.c_proj.bias)
            blk.ffn.up.weight.copy_(h.mlp.c_fc.weight.T)
            blk.ffn.up.bias.copy_(h.mlp.c_fc.bias)
            blk.ffn.down.weight.copy_(h.mlp.c_proj.weight.T)
            blk.ffn.down.bias.copy_(h.mlp.c_proj.bias)
        ours.decoder.final_norm.load_state_dict(t.ln_f.state_dict())
    ids = torch.randint(0, VOCAB, (2, 20))
    torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_llama_like_decoder_equals_hf_llama_after_weight_copy(n_kv_heads):
    name = {4: "mha", 2: "gqa", 1: "mqa"}[n_kv_heads]
    cfg = ModelConfig(family=FamilyConfig(name="decoder"),
                      norm=NormConfig(name="rmsnorm", eps=1e-6),
                      position=PositionConfig(name="rope", base=10000.0),
                      ffn=FFNConfig(name="swiglu", bias=False),
                      attention=AttentionConfig(name=name,
                                                n_kv_heads=2 if name == "gqa" else None, bias=False),
                      vocab_size=VOCAB, d_model=D, n_layers=2, n_heads=4, d_ff=FF,
                      max_seq_len=64, tie_embeddings=False)
    ours = build_model(cfg).eval()
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=D, intermediate_size=FF, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=n_kv_heads, rms_norm_eps=1e-6,
        max_position_embeddings=64, tie_word_embeddings=False, attention_bias=False,
        rope_theta=10000.0)).eval()
    m = hf.model
    with torch.no_grad():
        ours.embed.weight.copy_(m.embed_tokens.weight)
        for blk, layer in zip(ours.decoder.blocks, m.layers):
            a = layer.self_attn
            blk.norms[0].weight.copy_(layer.input_layernorm.weight)
            blk.norms[1].weight.copy_(layer.post_attention_layernorm.weight)
            blk.attn.qkv.weight.copy_(torch.cat((a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)))
            blk.attn.out.weight.copy_(a.o_proj.weight)
            blk.ffn.gate_up.weight.copy_(torch.cat((layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight)))
            blk.ffn.down.weight.copy_(layer.mlp.down_proj.weight)
        ours.decoder.final_norm.weight.copy_(m.norm.weight)
        ours.head.proj.weight.copy_(hf.lm_head.weight)
    ids = torch.randint(0, VOCAB, (2, 40))
    torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)

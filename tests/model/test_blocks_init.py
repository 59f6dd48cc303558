"""The reordered and DeepNorm blocks against the equations of their papers, DeepNorm's constants
against DeepNet's formulas (arXiv 2203.00555), and every init scheme's measured weight stds on a
wide layer against the scheme's rule (model/init.py)."""

from __future__ import annotations

import math

import pytest
import torch

from blocklab.config import BlockConfig, ConfigError, FamilyConfig, ModelConfig
from blocklab.config.validate_model import validate_model
from blocklab.model.blocks import deepnorm_constants
from blocklab.model.transformer import build_model


def config(block: str = "pre", family: str = "decoder", *, n_layers: int = 2,
           encoder: int | None = None, **kw: object) -> ModelConfig:
    sizes = {"vocab_size": 61, "d_model": 32, "n_heads": 4, "d_ff": 40, "max_seq_len": 32, **kw}
    return ModelConfig(family=FamilyConfig(name=family, n_encoder_layers=encoder),
                       block=BlockConfig(name=block), n_layers=n_layers, **sizes)


# (family, encoder layers N, decoder layers M) -> {(cross, causal): (alpha, beta)}, DeepNet's
# Table 1 written out by hand: one stack of N layers (2N)^¼, (8N)^-¼; encoder–decoder:
# encoder 0.81 (N⁴M)^(1/16), 0.87 (N⁴M)^(-1/16), decoder (3M)^¼, (12M)^-¼
PAPER = [
    ("decoder", None, 6, {(False, True): (12 ** 0.25, 48 ** -0.25)}),
    ("encoder", None, 18, {(False, False): (36 ** 0.25, 144 ** -0.25)}),
    ("encoder_decoder", 12, 6, {(False, False): (0.81 * (12 ** 4 * 6) ** (1 / 16),
                                                 0.87 * (12 ** 4 * 6) ** (-1 / 16)),
                                (True, True): (18 ** 0.25, 72 ** -0.25)}),
]


@pytest.mark.parametrize(("family", "n", "m", "expected"), PAPER, ids=[p[0] for p in PAPER])
def test_deepnorm_constants_are_the_papers(family, n, m, expected):
    cfg = config("deepnorm", family, n_layers=m, encoder=n)
    for (cross, causal), (alpha, beta) in expected.items():
        assert deepnorm_constants(cfg, cross=cross, causal=causal) == pytest.approx((alpha, beta))
    model = build_model(cfg)  # every block carries its stack's α
    for name, module in model.named_modules():
        if hasattr(module, "alpha"):
            key = (module.cross is not None, module.causal)
            assert (module.alpha, module.beta) == pytest.approx(expected[key]), name
    # negative control: the encoder–decoder's encoder is not a lone stack of N layers
    if family == "encoder_decoder":
        lone = config("deepnorm", "encoder", n_layers=n)
        assert (deepnorm_constants(lone, cross=False, causal=False)
                != pytest.approx(expected[(False, False)]))


def _captured(model: torch.nn.Module, block: torch.nn.Module, ids: torch.Tensor) -> dict:
    """Inputs and outputs of ``block`` and of its mixer and FFN during one forward."""
    seen: dict[str, tuple] = {}

    def hook(name):
        def save(module, args, out):
            seen[name] = (args[0].detach(), out.detach())
        return save

    handles = [m.register_forward_hook(hook(n))
               for n, m in (("block", block), ("attn", block.attn), ("ffn", block.ffn))]
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    return seen


def _forward_check(block_name: str, equation) -> None:
    torch.manual_seed(0)
    model = build_model(config(block_name))
    ids = torch.randint(0, 61, (2, 9))
    block = model.decoder.blocks[1]
    seen = _captured(model, block, ids)
    x, out = seen["block"]
    attn_in, attn_out = seen["attn"]
    ffn_in, ffn_out = seen["ffn"]
    n0, n1 = block.norms
    with torch.no_grad():
        equation(block, x, out, attn_in, attn_out, ffn_in, ffn_out, n0, n1)


def _reordered(block, x, out, attn_in, attn_out, ffn_in, ffn_out, n0, n1):
    # x ← x + N(F(x)) per sublayer: each branch reads the raw stream
    torch.testing.assert_close(attn_in, x)
    h = x + n0(attn_out)
    torch.testing.assert_close(ffn_in, h)
    torch.testing.assert_close(out, h + n1(ffn_out))


def _deepnorm(block, x, out, attn_in, attn_out, ffn_in, ffn_out, n0, n1):
    # x ← N(α·x + F(x)) per sublayer
    torch.testing.assert_close(attn_in, x)
    h = n0(block.alpha * x + attn_out)
    torch.testing.assert_close(ffn_in, h)
    torch.testing.assert_close(out, n1(block.alpha * h + ffn_out))


def test_reordered_is_x_plus_norm_of_the_branch_with_a_final_norm():
    _forward_check("reordered", _reordered)
    assert isinstance(build_model(config("reordered")).decoder.final_norm, torch.nn.LayerNorm)


def test_deepnorm_is_the_norm_of_alpha_x_plus_the_branch_without_a_final_norm():
    _forward_check("deepnorm", _deepnorm)
    assert build_model(config("deepnorm")).decoder.blocks[0].alpha == pytest.approx(4 ** 0.25)
    assert isinstance(build_model(config("deepnorm")).decoder.final_norm, torch.nn.Identity)


@pytest.mark.parametrize(("block", "equation"), [("pre", _reordered), ("post", _deepnorm)])
def test_negative_controls_the_equations_catch_the_neighbouring_placement(block, equation):
    """Pre-norm normalises the branch input, post-norm has α = 1 (set 2 here to tell)."""
    def run(b, *args):
        b.alpha = 2.0
        equation(b, *args)
    with pytest.raises(AssertionError):
        _forward_check(block, run)


# -------------------------------------------------------------------------------- init schemes
WIDE = {"d_model": 512, "n_heads": 8, "d_ff": 2048, "vocab_size": 1000, "n_layers": 4}


def _wide(init: str | None, block: str = "pre", **kw: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(config(block, init=init, **{**WIDE, **kw}))


def _std(t: torch.Tensor) -> float:
    return float(t.detach().double().pow(2).mean().sqrt())  # about zero mean: the RMS


def _close(measured: float, expected: float) -> None:
    # the RMS of n ≥ 2^18 normal draws has a relative standard error 1/sqrt(2n) < 0.14 %
    assert measured == pytest.approx(expected, rel=0.02), (measured, expected)


def _weights(model) -> dict[str, torch.Tensor]:
    b = model.decoder.blocks[0]
    d = 512
    qkv = b.attn.qkv.weight
    return {"q": qkv[:d], "k": qkv[d:2 * d], "v": qkv[2 * d:], "out": b.attn.out.weight,
            "up": b.ffn.up.weight, "down": b.ffn.down.weight, "embed": model.embed.weight}


def _expected(scheme: str) -> dict[str, float]:
    d, f, layers, std = 512, 2048, 4, 0.02
    if scheme == "gpt2":
        r = std / math.sqrt(2 * layers)
        return {"q": std, "k": std, "v": std, "out": r, "up": std, "down": r, "embed": std}
    if scheme == "normal":
        return dict.fromkeys(("q", "k", "v", "out", "up", "down", "embed"), std)
    if scheme == "fan_in":
        return {"q": d ** -0.5, "k": d ** -0.5, "v": d ** -0.5, "out": d ** -0.5,
                "up": d ** -0.5, "down": f ** -0.5, "embed": std}
    beta = (8 * layers) ** -0.25  # decoder-only, N = 4
    square, ffn = math.sqrt(2 / (d + d)), math.sqrt(2 / (d + f))
    return {"q": square, "k": square, "v": beta * square, "out": beta * square,
            "up": beta * ffn, "down": beta * ffn, "embed": std}


@pytest.mark.parametrize("scheme", ["gpt2", "normal", "fan_in", "deepnorm"])
def test_each_scheme_gives_its_stds_on_a_wide_layer(scheme):
    model = _wide(scheme)
    measured, expected = _weights(model), _expected(scheme)
    for name, w in measured.items():
        _close(_std(w), expected[name])
    # norms 1, biases 0 in every scheme
    b = model.decoder.blocks[0]
    assert torch.equal(b.norms[0].weight, torch.ones(512))
    assert torch.equal(b.ffn.up.bias, torch.zeros(2048))


def test_negative_control_the_measurement_tells_the_schemes_apart():
    gpt2, deep = _weights(_wide("gpt2")), _expected("deepnorm")
    with pytest.raises(AssertionError):
        _close(_std(gpt2["down"]), _expected("normal")["down"])
    with pytest.raises(AssertionError):
        _close(_std(_weights(_wide("deepnorm"))["v"]), deep["q"])  # β on the values only


def test_embed_init_std_applies_in_every_scheme():
    for scheme in ("gpt2", "normal", "fan_in", "deepnorm"):
        model = _wide(scheme, embed_init_std=0.5, type_vocab_size=2)
        _close(_std(model.embed.weight), 0.5)
        assert _std(model.token_type.weight) == pytest.approx(0.5, rel=0.1)
        _close(_std(model.decoder.blocks[0].ffn.up.weight), _expected(scheme)["up"])


def test_null_init_is_the_blocks_own_and_gpt2_is_bit_identical_to_null():
    a, b = _wide(None), _wide("gpt2")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values()))
    _close(_std(_weights(_wide(None, block="deepnorm"))["v"]), _expected("deepnorm")["v"])
    _close(_std(_weights(_wide(None, block="post"))["down"]), _expected("gpt2")["down"])


def test_deepnorm_init_of_an_encoder_decoder_uses_each_stacks_beta():
    model = _wide("deepnorm", family="encoder_decoder", encoder=6, n_layers=3)
    d, enc_beta = 512, 0.87 * (6 ** 4 * 3) ** (-1 / 16)
    dec_beta = 36 ** -0.25
    square = math.sqrt(2 / (d + d))
    _close(_std(model.encoder.blocks[0].attn.out.weight), enc_beta * square)
    _close(_std(model.decoder.blocks[0].attn.out.weight), dec_beta * square)
    kv = model.decoder.blocks[0].cross.kv.weight  # cross-attention: k rows gain 1, v rows β
    _close(_std(kv[:d]), square)
    _close(_std(kv[d:]), dec_beta * square)


def test_an_unknown_init_is_one_line_naming_model_init():
    with pytest.raises(ConfigError) as err:
        validate_model(config(init="xavier"))
    assert str(err.value).startswith("config error: model.init='xavier': unknown choice")
    assert "\n" not in str(err.value)


def test_a_users_scheme_is_chosen_by_name_and_states_its_rules(monkeypatch):
    from blocklab.model.init import INITS, Init

    class Constant(Init):
        @classmethod
        def check(cls, m, key):
            if m.init_std > 1:
                raise ConfigError(f"config error: {key}.init_std={m.init_std}: too large")

        def fill(self, name, p):
            torch.nn.init.constant_(p, self.config.init_std)

    monkeypatch.setitem(INITS, "constant", Constant)
    model = build_model(config(init="constant", init_std=0.25))
    assert torch.all(model.decoder.blocks[0].ffn.up.weight == 0.25)
    assert not torch.any(model.embed.weight == 0.25)  # embeddings: the frame's N(0, init_std)
    with pytest.raises(ConfigError, match=r"model\.init_std=2\.0: too large"):
        validate_model(config(init="constant", init_std=2.0))

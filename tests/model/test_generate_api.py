"""The generation API cannot be misused silently: unknown keywords raise, padding on either side
gives what each prompt gives alone, a caller's own decode loop continues positions from the
cache, the cache refuses autograd in one clear line, "off" values of the sampling knobs are off,
zero new tokens is a no-op, an encoder says why it cannot generate, and the position limit is
checked before any work is done."""

from __future__ import annotations

import pytest
import torch
from variants import VOCAB, params, tiny

from blocklab.config import PositionConfig
from blocklab.model import build_model
from blocklab.model.generate import generate, sample_next

DEC, ENC, ED = "decoder", "encoder", "encoder_decoder"


def _prompts(*lengths: int) -> list[torch.Tensor]:
    return [torch.randint(0, VOCAB, (1, n)) for n in lengths]


def _padded(prompts: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows padded on ``side`` ("left", "right" or "middle": a hole of pads inside the row),
    pad slots filled with random tokens (they must not matter)."""
    width = max(p.shape[1] for p in prompts) + 2
    ids = torch.randint(0, VOCAB, (len(prompts), width))
    valid = torch.zeros_like(ids, dtype=torch.bool)
    for i, p in enumerate(prompts):
        n, gap = p.shape[1], width - p.shape[1]
        if side == "left":
            cols = list(range(gap, width))
        elif side == "right":
            cols = list(range(n))
        else:  # first token, the gap, then the rest
            cols = [0, *range(1 + gap, width)]
        ids[i, cols], valid[i, cols] = p[0], True
    return ids, valid


def test_unknown_keyword_arguments_raise_instead_of_being_ignored():
    model = build_model(tiny()).eval()
    ids = torch.randint(0, VOCAB, (1, 4))
    with pytest.raises(TypeError, match="prompt_valid"):
        generate(model, ids, max_new_tokens=2, prompt_valid=torch.ones_like(ids, dtype=torch.bool))
    with pytest.raises(TypeError, match="valdi"):
        generate(model, ids, max_new_tokens=2, valdi=None)
    ed = build_model(tiny(ED)).eval()
    with pytest.raises(TypeError, match="source_id"):
        ed.prepare(source_id=ids)
    with pytest.raises(TypeError, match="source_ids"):
        model.prepare(source_ids=ids)  # a decoder-only model has no source
    with pytest.raises(TypeError, match="source_ids"):
        generate(ed, ids[:, :1], max_new_tokens=2)  # and an encoder-decoder needs one


@params(DEC)
@pytest.mark.parametrize("side", ["right", "middle"])
def test_right_padded_and_holed_prompts_generate_what_each_prompt_generates_alone(cfg, side):
    model = build_model(cfg).eval()
    prompts = _prompts(3, 7, 5)
    ids, valid = _padded(prompts, side)
    batched = generate(model, ids, valid=valid, max_new_tokens=6)
    for i, p in enumerate(prompts):
        assert torch.equal(batched[i], generate(model, p, max_new_tokens=6)[0]), (side, i)


@params(DEC, ED)
def test_own_decode_loop_without_positions_continues_from_the_cache(cfg):
    """Prefill, then feed tokens one at a time with ``cache=`` and no ``positions=``: each step's
    logits equal the full sequence's (positions continue from the cache, per row, also for a
    left-padded row)."""
    model = build_model(cfg).eval()
    src = torch.randint(0, VOCAB, (2, 6)) if cfg.family.name == ED else None
    ids = torch.randint(0, VOCAB, (2, 9))
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[1, :3] = False  # row 1 is left-padded by 3
    head = (src,) if src is not None else ()
    with torch.no_grad():
        full = model(*head, ids, valid=valid)
        cache = model.new_cache(2, 9)
        extra = {"memory": model.encode(src)} if src is not None else {}
        out = [model(*(None,) * len(head), ids[:, :5], valid=valid[:, :5], cache=cache, **extra)]
        for t in range(5, 9):
            out.append(model(*(None,) * len(head), ids[:, t:t + 1], cache=cache, **extra))
    got = torch.cat(out, 1)
    torch.testing.assert_close(got[0], full[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1, 3:], full[1, 3:], atol=1e-5, rtol=0)


def test_the_cache_under_autograd_is_refused_in_one_clear_line():
    model = build_model(tiny()).train()
    cache = model.new_cache(1, 8)
    with pytest.raises(RuntimeError, match=r"needs gradients off.*torch\.no_grad"):
        model(torch.randint(0, VOCAB, (1, 4)), cache=cache)
    with torch.no_grad():  # the same call without autograd is fine
        model(torch.randint(0, VOCAB, (1, 4)), cache=model.new_cache(1, 8))


def test_top_k_zero_is_off_and_zero_new_tokens_returns_nothing_new():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).repeat(3000, 1)
    g = torch.Generator().manual_seed(0)
    off = sample_next(logits, temperature=1.0, top_k=0, generator=g)
    assert set(off.tolist()) == {0, 1, 2, 3, 4}  # every token can be drawn: no top-k cut
    model = build_model(tiny()).eval()
    ids = torch.randint(0, VOCAB, (2, 4))
    out = generate(model, ids, max_new_tokens=0)
    assert out.shape == (2, 0) and out.dtype == torch.long
    assert torch.equal(torch.cat((ids, out), 1), ids)
    sampled = generate(model, ids, max_new_tokens=3, temperature=1.0, top_k=0,
                       generator=torch.Generator().manual_seed(1))
    assert sampled.shape == (2, 3)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"max_new_tokens": -1}, "max_new_tokens=-1"),
    ({"max_new_tokens": 2, "temperature": -0.5}, "temperature=-0.5"),
    ({"max_new_tokens": 2, "top_k": -3}, "top_k=-3"),
    ({"max_new_tokens": 2, "top_p": 0.0}, "top_p=0.0"),
    ({"max_new_tokens": 2, "top_p": 1.5}, "top_p=1.5"),
    ({"max_new_tokens": 2, "valid": torch.tensor([[False, False, False, False]])},
     "rows [0] have no valid token"),
])
def test_bad_arguments_are_named(kwargs, words):
    model = build_model(tiny()).eval()
    with pytest.raises(ValueError, match=r".*".join(map(__import__("re").escape, words.split()))):
        generate(model, torch.randint(0, VOCAB, (1, 4)), **kwargs)


def test_generate_on_an_encoder_says_why_it_cannot():
    model = build_model(tiny(ENC)).eval()
    with pytest.raises(TypeError, match="bidirectional"):
        generate(model, torch.randint(0, VOCAB, (1, 4)), max_new_tokens=2)


@pytest.mark.parametrize("family", [DEC, ED])
def test_learned_positions_limit_is_checked_before_the_first_step(family):
    model = build_model(tiny(family, PositionConfig(name="learned"), max_seq_len=16)).eval()
    calls = []
    model.embed.register_forward_hook(lambda *a: calls.append(1))
    src = {"source_ids": torch.randint(0, VOCAB, (1, 5))} if family == ED else {}
    start = torch.randint(0, VOCAB, (1, 10 if family == DEC else 1))
    with pytest.raises(ValueError, match=r"model\.max_seq_len=16"):
        generate(model, start, max_new_tokens=16 - start.shape[1] + 2, **src)
    assert calls == []  # refused before any forward
    out = generate(model, start, max_new_tokens=16 - start.shape[1] + 1, **src)  # exactly fits
    assert out.shape[1] == 16 - start.shape[1] + 1
    if family == ED:
        with pytest.raises(ValueError, match="source_ids of 17 tokens"):
            generate(model, start, max_new_tokens=2, source_ids=torch.randint(0, VOCAB, (1, 17)))

"""KV cache and generation: incremental decoding equals full-prefix logits for every position
scheme and head layout; cached generation equals recompute; a left-padded batch generates what
each prompt generates alone; sampling knobs behave."""

from __future__ import annotations

import pytest
import torch
from variants import VOCAB, params, tiny

from blocklab.model import build_model
from blocklab.model.generate import generate, sample_next

DEC, ED = "decoder", "encoder_decoder"


def _full(model, ids, src):
    return model(src, ids) if src is not None else model(ids)


def _source(cfg, batch=1):
    return torch.randint(0, VOCAB, (batch, 9)) if cfg.family.name == ED else None


@params(DEC, ED)
def test_incremental_decoding_equals_full_prefix(cfg):
    """Prefill 7 tokens, then chunks of 1, 3, 1, 1 and 4: each chunk's logits equal the logits
    of the full sequence at those positions (chunks > 1 exercise the cache-offset mask)."""
    model = build_model(cfg).eval()
    src = _source(cfg)
    ids = torch.randint(0, VOCAB, (1, 17))
    full = _full(model, ids, src)
    cache = model.new_cache(1, 17)
    prepared = model.prepare(source_ids=src) if src is not None else {}
    start = 0
    with torch.no_grad():
        for size in (7, 1, 3, 1, 1, 4):
            chunk = ids[:, start:start + size]
            pos = torch.arange(start, start + size)[None]
            logits = model.decode(chunk, positions=pos, valid=None, cache=cache, **prepared)
            torch.testing.assert_close(logits, full[:, start:start + size], atol=1e-5, rtol=0)
            start += size
    assert cache.length == 17


@params(DEC, ED)
def test_cached_greedy_generation_equals_recompute(cfg):
    model = build_model(cfg).eval()
    src = _source(cfg, 2)
    prompt = torch.randint(0, VOCAB, (2, 1 if src is not None else 6))
    extra = {"source_ids": src} if src is not None else {}
    cached = generate(model, prompt, max_new_tokens=12, **extra)
    full = generate(model, prompt, max_new_tokens=12, use_cache=False, **extra)
    assert cached.shape == (2, 12)
    assert torch.equal(cached, full)


@params(DEC)
def test_left_padded_batch_generates_what_each_prompt_generates_alone(cfg):
    model = build_model(cfg).eval()
    prompts = [torch.randint(0, VOCAB, (1, n)) for n in (3, 8, 5)]
    width = max(p.shape[1] for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    valid = torch.zeros_like(ids, dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, width - p.shape[1]:] = p
        valid[i, width - p.shape[1]:] = True
        ids[i, : width - p.shape[1]] = torch.randint(0, VOCAB, (width - p.shape[1],))
    batched = generate(model, ids, valid=valid, max_new_tokens=10)
    for i, p in enumerate(prompts):
        assert torch.equal(batched[i], generate(model, p, max_new_tokens=10)[0]), f"prompt {i}"


def test_encoder_decoder_padded_sources_generate_what_each_generates_alone():
    cfg = tiny(ED, style=3)
    model = build_model(cfg).eval()
    sources = [torch.randint(0, VOCAB, (1, n)) for n in (4, 9)]
    ids = torch.zeros(2, 9, dtype=torch.long)
    valid = torch.zeros(2, 9, dtype=torch.bool)
    for i, s in enumerate(sources):
        ids[i, : s.shape[1]], valid[i, : s.shape[1]] = s, True
    start = torch.zeros(2, 1, dtype=torch.long)
    batched = generate(model, start, max_new_tokens=8, source_ids=ids, source_valid=valid)
    for i, s in enumerate(sources):
        alone = generate(model, start[:1], max_new_tokens=8, source_ids=s)
        assert torch.equal(batched[i], alone[0])


def test_cross_attention_kv_is_computed_once_per_generation():
    model = build_model(tiny(ED)).eval()
    calls = []
    for block in model.decoder.blocks:
        block.cross.kv.register_forward_hook(lambda *a: calls.append(1))
    generate(model, torch.zeros(1, 1, dtype=torch.long), max_new_tokens=6,
             source_ids=torch.randint(0, VOCAB, (1, 5)))
    assert len(calls) == len(model.decoder.blocks)


def test_eos_stops_rows_and_generation():
    model = build_model(tiny()).eval()
    prompt = torch.randint(0, VOCAB, (2, 4))
    free = generate(model, prompt, max_new_tokens=10)
    eos = int(free[0, 2])
    out = generate(model, prompt, max_new_tokens=10, eos_id=eos)
    first = (out[0] == eos).nonzero()[0, 0]
    assert (out[0, first:] == eos).all()
    assert torch.equal(out[0, :first], free[0, :first])


def test_sampling_respects_top_k_and_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).repeat(2000, 1)
    g = torch.Generator().manual_seed(0)
    assert sample_next(logits, temperature=0).eq(0).all()
    k2 = sample_next(logits, temperature=1.0, top_k=2, generator=g)
    assert set(k2.tolist()) == {0, 1}
    probs = logits[0].softmax(-1)  # 0.636, 0.234, 0.086, ...: top_p 0.8 keeps tokens 0 and 1
    assert probs[:1].sum() < 0.8 <= probs[:2].sum()
    p = sample_next(logits, temperature=1.0, top_p=0.8, generator=g)
    assert set(p.tolist()) == {0, 1}
    hot = sample_next(logits, temperature=100.0, generator=g)
    assert set(hot.tolist()) == {0, 1, 2, 3, 4}
    freq0 = (sample_next(logits, temperature=1.0, generator=g) == 0).float().mean()
    assert abs(freq0 - probs[0]) < 0.05


def test_sampled_generation_is_reproducible_with_a_generator():
    model = build_model(tiny()).eval()
    prompt = torch.randint(0, VOCAB, (2, 4))

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return generate(model, prompt, max_new_tokens=8, temperature=1.0, top_k=20, generator=g)

    assert torch.equal(run(1), run(1))
    assert not torch.equal(run(1), run(2))


def test_cache_overflow_is_an_error():
    model = build_model(tiny()).eval()
    cache = model.new_cache(1, 4)
    with pytest.raises(ValueError, match="capacity 4"):
        model(torch.zeros(1, 5, dtype=torch.long), positions=torch.arange(5)[None], cache=cache)


@pytest.mark.parametrize("options", [{}, {"window": 4, "sinks": 2}, {"attention_chunk": 4}],
                         ids=["dense", "sinks", "chunked"])
def test_a_cache_refuses_packed_documents(options):
    """A decode cache holds one document per row: a ring keeping a row's first tokens as sinks
    would keep the first packed document's, not the current one's, so a packed prefill is
    refused, not decoded wrongly; the same prefill unpacked is accepted."""
    from blocklab.config import MixerConfig

    model = build_model(tiny(mixer=MixerConfig(name="softmax", **options))).eval()
    ids = torch.randint(0, VOCAB, (1, 8))
    segments = torch.tensor([[1, 1, 1, 2, 2, 2, 2, 2]])
    with torch.no_grad(), pytest.raises(ValueError, match="one document per row"):
        model(ids, positions=torch.arange(8)[None], segments=segments, cache=model.new_cache(1, 9))
    with torch.no_grad():  # unpacked: decoded, and equal to the full forward
        out = model(ids, positions=torch.arange(8)[None], cache=model.new_cache(1, 9))
    torch.testing.assert_close(out, model(ids))

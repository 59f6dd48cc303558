"""The compiled path: the variants compile to one graph with no graph break, for the training
forward + backward and for one fixed-shape (static-cache) decode step, and the compiled model
computes what the eager one does.

On the variants in which every family meets every value of every axis (``family_cover``: 34
of the grid's 145, 24 of the 100 generating ones), dynamo captures the training forward and a
decode step (``backend="eager"`` runs the captured graph: that is where graph breaks and
guards are decided); on
variants covering every axis value, AOTAutograd's forward/backward split and the
functionalization of the cache's in-place writes run too (``backend="aot_eager"``). Inductor's
generated kernels are checked on reference shapes: training (fp32 outputs and gradients within
1e-5 of eager) on gpt-like, llama-like and T5-like models, compiled decoding (greedy tokens
identical) on the two decoders.

Recompiles are counted with dynamo's frame counter: a curriculum of K distinct batch lengths
compiles at most K graphs (torch's automatic dynamic shapes: 2), ``dynamic=True`` once, and the
fixed-shape mode (static shapes, batches padded to a multiple) once per padded length.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.testing import CompileCounterWithBackend
from variants import STYLES, VOCAB, grid, params, tiny

from blocklab.config import ModelConfig, PositionConfig
from blocklab.model import build_model
from blocklab.model.generate import _decode_step, generate
from blocklab.registry import names

DEC, ED = "decoder", "encoder_decoder"


def _position(cfg: ModelConfig) -> tuple[str, object]:
    return cfg.position.name, cfg.position.scaling if cfg.position.name == "rope" else None


def covering(variants: list[tuple[str, ModelConfig]]) -> list[tuple[str, ModelConfig]]:
    """A few variants of the grid in which every value of every axis (family, position scheme,
    head layout, norm, placement, FFN, window pattern) occurs at least once (greedy cover)."""
    todo = set().union(*(_values(c) for _, c in variants))
    chosen = []
    while todo:
        best = max(variants, key=lambda v: len(_values(v[1]) & todo))
        chosen.append(best)
        todo -= _values(best[1])
    return chosen


def _values(cfg: ModelConfig) -> set[tuple[str, object]]:
    """The axis values a variant has (family, position scheme, head layout, norm, placement,
    FFN, window pattern, mixers, hybrid pattern)."""
    return {("family", cfg.family.name), ("position", _position(cfg)),
            ("attention", cfg.attention.name), ("norm", cfg.norm.name),
            ("block", cfg.block.name), ("ffn", cfg.ffn.name),
            ("window", (cfg.mixer.get("window"), cfg.mixer.get("global_every", 0))),
            *(("mixer", n) for n in {*cfg.mixer.pattern, cfg.mixer.name}),
            ("hybrid", tuple(cfg.mixer.pattern)),
            ("pattern", tuple(sorted((k, str(v)) for k, v in cfg.mixer.items()
                                     if k in PATTERN_KEYS)))}


#: softmax's attention-pattern options (variants.py PATTERNS): each pattern is an axis value
PATTERN_KEYS = ("sinks", "learned_sink", "attention_chunk", "global_rope", "global_tokens",
                "random_blocks", "global_token_id")


COVER = covering(grid())


def family_cover(variants: list[tuple[str, ModelConfig]]) -> list[tuple[str, ModelConfig]]:
    """The variants of the grid in which every family meets every value of every axis it takes
    (greedy cover of the (family, value) pairs): a graph break comes from one component's code
    or from how a family wires it, so each component is captured in each family (capturing
    every variant of the grid was most of the model tests' time). The eager invariants still
    run over the whole grid."""
    def pairs(cfg: ModelConfig) -> set[tuple[str, object]]:
        return {(cfg.family.name, value) for value in _values(cfg)}

    todo = set().union(*(pairs(c) for _, c in variants))
    chosen = []
    while todo:
        best = max(variants, key=lambda v: len(pairs(v[1]) & todo))
        chosen.append(best)
        todo -= pairs(best[1])
    return chosen


FAMILY_COVER = family_cover(grid())


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    dynamo.reset()
    yield
    dynamo.reset()


def _train_inputs(cfg: ModelConfig) -> tuple[tuple, dict]:
    """A training batch as each family's objective feeds it: packed documents (decoder),
    padding (encoder), padded sources (encoder–decoder)."""
    ids = torch.randint(0, VOCAB, (2, 12))
    family = cfg.family.name
    if family == DEC:
        return (ids,), {"segments": torch.tensor([[0] * 5 + [1] * 7, [0] * 12])}
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, 9:] = False
    if family == ED:
        src = torch.randint(0, VOCAB, (2, 12))
        return (src, ids), {"source_valid": valid}
    return (ids,), {"valid": valid}


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def one_layer(cfg: ModelConfig) -> ModelConfig:
    """The variant with one layer per stack (tracing time grows with depth; a layer traces
    alike at any depth), unless a window pattern needs its local and global layers or a
    hybrid its layers of every mixer."""
    if cfg.mixer.get("global_every") or cfg.mixer.pattern:
        return cfg
    enc = 1 if cfg.family.name == ED else None
    return replace(cfg, n_layers=1, family=replace(cfg.family, n_encoder_layers=enc))


@pytest.mark.parametrize("cfg", [c for _, c in FAMILY_COVER], ids=[n for n, _ in FAMILY_COVER])
def test_training_forward_captures_one_graph_without_breaks_equal_to_eager(cfg):
    """Dynamo's capture of the training forward (packed / padded batches) on the variants in
    which every family meets every axis value: one graph, no break (fullgraph would raise),
    and running it gives the eager logits."""
    model = build_model(one_layer(cfg))
    args, kw = _train_inputs(cfg)
    eager = model(*args, **kw)
    counter = CompileCounterWithBackend("eager")
    out = torch.compile(model, backend=counter, fullgraph=True)(*args, **kw)
    assert counter.frame_count == 1
    torch.testing.assert_close(out, eager, atol=1e-6, rtol=0)


@pytest.mark.parametrize("cfg", [c for _, c in COVER], ids=[n for n, _ in COVER])
def test_training_forward_and_backward_compile_to_one_graph_equal_to_eager(cfg):
    """Forward + backward through AOTAutograd (the joint graph, functionalized and split) on
    variants covering every axis value: one graph, outputs and gradients equal to eager."""
    assert _train_step_matches_eager(build_model(cfg), cfg, "aot_eager", tol=1e-6) == 1


def _train_step_matches_eager(model, cfg: ModelConfig, backend: str, tol: float) -> int:
    """A compiled forward + backward (a break would raise): outputs and every gradient within
    ``tol`` of eager; returns the number of graphs compiled."""
    args, kw = _train_inputs(cfg)
    eager = model(*args, **kw)
    eager.square().mean().backward()
    eager_grads = _grads(model)
    model.zero_grad()
    counter = CompileCounterWithBackend(backend)
    out = torch.compile(model, backend=counter, fullgraph=True)(*args, **kw)
    out.square().mean().backward()
    torch.testing.assert_close(out, eager, atol=tol, rtol=tol)
    grads = _grads(model)
    assert len(grads) == len(eager_grads)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, atol=tol, rtol=tol)
    return counter.frame_count


def _prompt(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, dict]:
    ids = torch.randint(0, VOCAB, (3, 9))
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[0, :4] = False  # left padding
    valid[2, :1] = False
    src = {"source_ids": torch.randint(0, VOCAB, (3, 7))} if cfg.family.name == ED else {}
    return ids, valid, src


@params(DEC, ED)
def test_static_cache_decoding_equals_the_full_forward(cfg):
    """Prefill a left-padded batch, then chunks of 1, 3, 1, 1: each chunk's logits equal the
    full sequence's at those positions (the order-causal mask, window rule and slot writes of
    the fixed-shape cache), real rows only."""
    model = build_model(cfg).eval()
    ids, valid, src = _prompt(cfg)
    ids = torch.cat((ids, torch.randint(0, VOCAB, (3, 6))), 1)
    valid = torch.cat((valid, torch.ones(3, 6, dtype=torch.bool)), 1)
    source = src.get("source_ids")
    full = (model(source, ids, valid=valid) if source is not None else model(ids, valid=valid))
    cache = model.new_cache(3, 64, static=True)
    prepared = model.prepare(**src)
    positions = torch.where(valid, valid.long().cumsum(-1) - 1, 0)
    start = 0
    with torch.no_grad():
        for size in (9, 1, 3, 1, 1):
            sl = slice(start, start + size)
            logits = model.decode(ids[:, sl], positions=positions[:, sl], valid=valid[:, sl],
                                  cache=cache, **prepared)
            real = valid[:, sl]
            torch.testing.assert_close(logits[real], full[:, sl][real], atol=1e-5, rtol=0)
            start += size
    assert cache.length == 15


CAUSAL_COVER = covering(grid(DEC, ED))
CAUSAL_FAMILY_COVER = family_cover(grid(DEC, ED))


@pytest.mark.parametrize("cfg", [c for _, c in CAUSAL_FAMILY_COVER],
                         ids=[n for n, _ in CAUSAL_FAMILY_COVER])
def test_a_static_decode_step_captures_once_to_one_graph_equal_to_eager(cfg):
    """Dynamo's capture of a fixed-shape decode step, on the variants in which each generating
    family meets every axis value."""
    assert _decode_steps(one_layer(cfg), "eager") == 1


@pytest.mark.parametrize("cfg", [c for _, c in CAUSAL_COVER], ids=[n for n, _ in CAUSAL_COVER])
def test_a_static_decode_step_compiles_through_aot_equal_to_eager(cfg):
    """The cache's in-place slot writes functionalized by AOTAutograd, on the covering
    variants."""
    assert _decode_steps(cfg, "aot_eager") == 1


def _decode_steps(cfg: ModelConfig, backend: str) -> int:
    """Three decode steps through one compiled function, logits equal to the eager step;
    returns the graphs compiled (one: the write slot and positions are tensors, so no step
    recompiles)."""
    model = build_model(cfg).eval()
    ids, valid, src = _prompt(cfg)
    prepared = model.prepare(**src)
    positions = torch.where(valid, valid.long().cumsum(-1) - 1, 0)
    caches = [model.new_cache(3, 16, static=True) for _ in range(2)]
    counter = CompileCounterWithBackend(backend)
    step = torch.compile(_decode_step, backend=counter, fullgraph=True, dynamic=False)
    with torch.no_grad():
        for cache in caches:
            model.decode(ids, positions=positions, valid=valid, cache=cache, **prepared)
        token = torch.randint(0, VOCAB, (3, 1))
        for i in range(3):
            pos = valid.long().sum(-1, keepdim=True) + i
            eager = model.decode(token, positions=pos, valid=None, cache=caches[0], **prepared)
            out = step(model, token, positions=pos, valid=None, cache=caches[1], **prepared)
            torch.testing.assert_close(out, eager, atol=1e-6, rtol=0)
            token = eager[:, -1].argmax(-1, keepdim=True)
    return counter.frame_count


@params(DEC, ED)
def test_static_and_compiled_generation_equal_eager_generation(cfg):
    """generate(static_cache=True) on a left-padded batch gives the dynamic cache's tokens."""
    model = build_model(cfg).eval()
    ids, valid, src = _prompt(cfg)
    eager = generate(model, ids, valid=valid, max_new_tokens=10, **src)
    static = generate(model, ids, valid=valid, max_new_tokens=10, static_cache=True, **src)
    assert torch.equal(static, eager)


# ---- inductor on reference shapes -----------------------------------------------------------

REFERENCE = {  # (family, position, heads, (norm, placement, ffn), compiled decoding too)
    "gpt": (DEC, PositionConfig(name="learned"), "mha", ("layernorm", "pre", "gelu_mlp"), True),
    "llama": (DEC, PositionConfig(name="rope"), "gqa", ("rmsnorm", "pre", "swiglu"), True),
    "t5": (ED, PositionConfig(name="t5_bias"), "mha", ("rmsnorm", "pre", "relu_mlp"), False),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REFERENCE))
def test_inductor_training_and_compiled_decoding_equal_eager(name):
    family, position, heads, style, decode = REFERENCE[name]
    cfg = tiny(family, position, heads, style=STYLES.index(style), d_model=64, n_layers=1)
    model = build_model(cfg)
    assert _train_step_matches_eager(model, cfg, "inductor", tol=1e-5) == 1
    if not decode:
        return
    model.eval()
    ids, valid, src = _prompt(cfg)
    ref = generate(model, ids, valid=valid, max_new_tokens=12, **src)
    first = generate(model, ids, valid=valid, max_new_tokens=12, compile=True, **src)
    again = generate(model, ids[:, 2:], valid=valid[:, 2:], max_new_tokens=12, compile=True,
                     **src)  # another prompt length, same capacity bucket: the same graph
    assert torch.equal(first, ref)
    assert torch.equal(again, generate(model, ids[:, 2:], valid=valid[:, 2:], max_new_tokens=12,
                                       **src))


# ---- recompiles across a curriculum ---------------------------------------------------------

CURRICULUM = [9, 16, 23, 31, 9, 23, 40, 16]  # batch lengths as a length curriculum draws them


def _frames(model, lengths, **compile_kw) -> int:
    """Graphs compiled while training on batches of these lengths (dynamo's counter; an empty
    graph, which ``dynamic=True`` traces once for a wrapper frame, runs no op and is not
    counted)."""
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True, **compile_kw)
    for t in lengths:
        compiled(torch.randint(0, VOCAB, (2, t))).sum().backward()
    return sum(1 for g in counter.graphs if any(n.op != "placeholder" and n.op != "output"
                                                 for n in g.graph.nodes))


def test_recompiles_across_curriculum_lengths_stay_within_the_distinct_lengths():
    model = build_model(tiny(DEC, PositionConfig(name="rope"), "gqa"))
    distinct = len(set(CURRICULUM))
    assert _frames(model, CURRICULUM) <= distinct  # automatic dynamic: static, then symbolic
    dynamo.reset()
    assert _frames(model, CURRICULUM, dynamic=True) == 1


def test_fixed_shape_mode_compiles_once_per_padded_length():
    """Static shapes (dynamic=False) with every batch padded to a multiple of 16 tokens
    (data.pad_to_multiple): one graph per padded length, never one per raw length."""
    from blocklab.objectives import round_up

    model = build_model(tiny(DEC, PositionConfig(name="alibi"), "mha"))
    padded = [round_up(t, 16, cap=64) for t in CURRICULUM]
    assert sorted(set(padded)) == [16, 32, 48]
    assert _frames(model, padded, dynamic=False) == 3


def test_the_covering_subset_meets_every_axis_value_of_the_grid():
    assert len(COVER) <= 24
    assert {c.family.name for _, c in COVER} == {"encoder", "decoder", "encoder_decoder"}
    assert {_position(c) for _, c in COVER} == {_position(c) for _, c in grid()}
    assert len({_position(c) for _, c in COVER}) == 10
    assert {c.ffn.name for _, c in COVER} == {c.ffn.name for _, c in grid()}
    assert {c.block.name for _, c in COVER} == {c.block.name for _, c in grid()}
    assert {c.mixer.get("window") for _, c in COVER} == {3, 5, None}
    assert {n for _, c in COVER for n in {*c.mixer.pattern, c.mixer.name}} == set(names("mixer"))


# ---- probes and padded batches ---------------------------------------------------------------


def test_probes_under_compile_give_the_eager_answers():
    """The checkpoint probes of a trainer.compile=true run score through the compiled model
    (dynamo's graphs and guards, aot_eager here; inductor's numerics are the reference-shape
    test's): every cell's accuracy is the eager one, log-prob statistics within 1e-4."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))
    from test_probes import VOCAB as PROBE_VOCAB
    from test_probes import run, small_spec

    from blocklab.config import PerplexityProbeConfig
    from blocklab.eval.backends import BlocklabBackend

    model = build_model(ModelConfig(vocab_size=PROBE_VOCAB.size, max_seq_len=64, init_std=0.2,
                                    position=PositionConfig(name="rope"))).eval()
    spec = small_spec(perplexity=PerplexityProbeConfig(lengths=[1.0], tokens=256))
    eager = run(BlocklabBackend(model), spec).cells
    model.compile(backend="aot_eager")
    compiled = run(BlocklabBackend(model), spec).cells
    assert len(compiled) == len(eager) > 10
    logprobs = {round(e["logprob"], 3) for e in eager if e.get("logprob") is not None}
    assert len(logprobs) > 3  # the cells score distinct answers: a wrong graph would show
    for c, e in zip(compiled, eager):
        assert c.keys() == e.keys()
        for key, value in e.items():
            if isinstance(value, float):
                assert abs(c[key] - value) <= 1e-4, (key, c, e)
            else:
                assert c[key] == value, (key, c, e)


@pytest.mark.parametrize(("family", "packing"), [(DEC, False), (DEC, True), ("encoder", False),
                                                 (ED, False)])
def test_padding_batches_to_a_multiple_changes_no_loss(family, packing):
    """data.pad_to_multiple: every (B, T) tensor of a batch grows to a multiple of 16 (capped at
    seq_len), and the loss, the targets counted and every real position's logits stay the same."""
    from blocklab.config import DataConfig
    from blocklab.data.mixture import Mixture
    from blocklab.objectives import build_objective

    data = DataConfig(seq_len=40, min_len=20, batch_size=4, packing=packing, pad_to_multiple=16)
    plain_data = DataConfig(seq_len=40, min_len=20, batch_size=4, packing=packing)
    mixture = Mixture(plain_data)
    examples = [mixture(i) for i in range(4)]
    plain, padded = (build_objective(family, d).collate(examples) for d in (plain_data, data))
    model = build_model(tiny(family, PositionConfig(name="alibi"), vocab_size=512))
    grew = False
    for key, t in plain.items():
        width = padded[key].shape[1]
        assert width % 16 == 0 or width == 40, (key, width)
        assert torch.equal(padded[key][:, : t.shape[1]], t)
        grew |= width > t.shape[1]
    objective = build_objective(family, data)
    a, b = objective.loss(model, plain), objective.loss(model, padded)
    assert int(a.count) == int(b.count) > 0
    torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=0)
    assert grew != packing  # packed rows are already seq_len wide: nothing to pad

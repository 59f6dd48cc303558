"""Probes that fit the model they measure (issue: probes on a user's own small text model):
lengths a learned position table cannot index are N/A cells with their reason — never an
exception, the greedy continuation included —, text is never cycled (haystack and perplexity),
the default grid follows the tokenizer, lost-in-the-middle records are sized by length, cells
beyond the training length are flagged, and every N/A is explained in the report and on the
plots."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from blocklab.config import ModelConfig, PositionConfig, ProbeSpec, TokenizerConfig, TokenizerName
from blocklab.config.probes import grid_for, packaged_grid
from blocklab.data.synthetic import BOS
from blocklab.data.tokenizer import train_bpe
from blocklab.eval.backends import BlocklabBackend
from blocklab.eval.items import NotApplicable, ProbeItem
from blocklab.eval.probes import run_spec
from blocklab.eval.report import format_report
from blocklab.eval.scoring import generation_room
from blocklab.eval.texts import haystack_sentences, sentences_of
from blocklab.eval.textspace import ESSAY, TextBuilder, TextTokenizer
from blocklab.model import build_model

SHAKESPEARE_LINES = """\
Mother. In delivering my son from me, I bury a second husband.
Ros. And I in going, madam, weep over my father's death anew; but I must attend his
majesty's command, to whom I am now in ward, evermore in subjection.
Laf. You shall find of the King a husband, madam; you, sir, a father.
"""


@pytest.fixture(scope="module")
def tok():
    docs = [ESSAY] * 4 + [SHAKESPEARE_LINES] * 4 + [
        "The special magic number for Alice is 12345. What is the value of key \"a1b2\"?"] * 4
    raw = train_bpe(TokenizerConfig(name=TokenizerName.bpe, vocab_size=700), docs)
    return TextTokenizer.from_tokenizers(raw, bos=BOS, name="bpe")


def text_grid(**kw) -> ProbeSpec:
    """The packaged text grid, small n (the grid's shape, not its cost)."""
    spec = packaged_grid("text")
    return dataclasses.replace(
        spec, needle=dataclasses.replace(spec.needle, n=3),
        litm=dataclasses.replace(spec.litm, n=2),
        perplexity=dataclasses.replace(spec.perplexity, tokens=64), **kw)


def learned(max_seq_len: int, vocab: int):
    return build_model(ModelConfig(vocab_size=vocab, d_model=32, n_heads=2, n_layers=1, d_ff=64,
                                   max_seq_len=max_seq_len,
                                   position=PositionConfig(name="learned"))).eval()


# ------------------------------------------------------------------ learned positions: N/A


def test_text_probes_on_a_learned_position_table_are_na_cells_not_an_exception(tok, tmp_path):
    """The grid at L, 2L on a model whose table holds exactly L positions: the L cells fill
    their length, so the greedy continuation would index past the table (b861d22: IndexError
    "position 256 is beyond the table"); now it stops at the table's end, 2L is N/A with its
    reason, and the report and the plots say why."""
    spec = text_grid(text=dataclasses.replace(ProbeSpec().text, haystack="essay"))
    spec.needle.lengths = [1.0, 2.0]
    spec.needle.n_distractors = [1]
    length = 160
    model = learned(length, 700)
    r = run_spec(BlocklabBackend(model), spec, builder=TextBuilder(tok, spec), train_length=length,
                 keys={"step": 0}, decode=tok.decode, out_dir=tmp_path / "p")
    needle = [c for c in r.cells if c["probe"] == "needle"]
    at_l = [c for c in needle if c["length"] == length]
    assert at_l and all(c["n"] == 3 for c in at_l)
    longest = max(e["n_tokens"] for e in r.examples if e["probe"] == "needle")
    assert longest > length - 16  # the continuation would have run past the table
    cut = [e["new_tokens"] for e in r.examples if e["probe"] == "needle"]
    assert min(cut) < 16 <= max(cut)  # cut at the table's end where the prompt is that long
    beyond = [c for c in needle if c["length"] == 2 * length]
    assert beyond and all(c["n"] == 0 and "positions the model can index" in c["status"]
                          for c in beyond)
    report = format_report(r.summary, r.cells)
    assert "not applicable (N/A above):" in report
    assert f"{2 * length} > {length} positions the model can index" in report
    ppl = {(c["variant"], c["length"]): c for c in r.cells if c["probe"] == "perplexity"}
    assert ppl[("sliding", 4 * length)]["status"].startswith("n/a: length 640 > 160")


def test_generation_stops_at_the_last_position_the_model_can_index():
    class Backend:
        def max_length(self):
            return 100

    items = [ProbeItem({}, list(range(90)), [1, 2]), ProbeItem({}, list(range(60)), [1, 2])]
    assert generation_room(Backend(), items, 16) == 10  # the longest prompt leaves 10
    assert generation_room(Backend(), items[1:], 16) == 16
    items = [ProbeItem({}, list(range(99)), [1])]
    assert generation_room(Backend(), items, 16) == 1  # never fewer than the answer's tokens

    class Unbounded(Backend):
        def max_length(self):
            return None

    assert generation_room(Unbounded(), items, 16) == 16


# ----------------------------------------------------------------------- never cycled


def test_the_needle_haystack_never_repeats_and_a_longer_cell_is_na(tok):
    spec = text_grid(text=dataclasses.replace(ProbeSpec().text, haystack="essay"))
    b = TextBuilder(tok, spec)
    total = sum(b.sent_ntok(s) for s in b.sentences)
    import random

    for seed in range(40):
        hay = b.hay(random.Random(seed), total // 2)
        assert len(set(hay)) == len(hay)  # no sentence twice: the text is not wrapped round
        first = b.sentences.index(hay[0])
        assert hay == b.sentences[first:first + len(hay)]  # consecutive, in the text's order
    with pytest.raises(NotApplicable, match=f"holds {total:,} tokens.*never repeated"):
        b.hay(random.Random(0), total + 1)


def test_a_repeating_perplexity_text_is_refused_and_a_short_one_is_na(tok, tmp_path):
    """A haystack file holding the essay four times (what cycling produced) is refused: every
    perplexity row N/A saying it repeats; the essay itself is too short for 4,096 tokens at
    any length and is N/A — never read round again."""
    cycled = tmp_path / "cycled.txt"
    cycled.write_text(ESSAY * 4)
    model = learned(1024, 700)
    for text, reason in ((str(cycled), "repeats itself"), ("essay", "never cycled")):
        spec = dataclasses.replace(ProbeSpec(space="text"),
                                   perplexity=dataclasses.replace(
                                       ProbeSpec().perplexity, text=text, lengths=[0.5, 1.0]))
        spec.needle.enabled = spec.litm.enabled = False
        r = run_spec(BlocklabBackend(model), spec, builder=TextBuilder(tok, spec),
                     train_length=256, keys={"step": 0}, plots=False)
        rows = [c for c in r.cells if c["probe"] == "perplexity"]
        assert rows and all(c["ppl"] is None and reason in c["status"] for c in rows), rows


def test_perplexity_reads_the_runs_validation_text_and_names_it(tok, tmp_path):
    model = learned(512, 700)
    docs = [tok.encode(ESSAY)[0], tok.encode(SHAKESPEARE_LINES)[0]]
    spec = dataclasses.replace(ProbeSpec(space="text"), perplexity=dataclasses.replace(
        ProbeSpec().perplexity, tokens=200, lengths=[0.5, 1.0]))
    spec.needle.enabled = spec.litm.enabled = False
    b = TextBuilder(tok, spec, validation=lambda: ("2 documents", docs))
    r = run_spec(BlocklabBackend(model), spec, builder=b, train_length=128, keys={"step": 0},
                 out_dir=tmp_path / "p")
    assert r.summary["perplexity_text"]["name"] == "the run's validation text (2 documents)"
    rows = [c for c in r.cells if c["probe"] == "perplexity"]
    assert all(c["n"] >= 200 for c in rows)
    assert "on the run's validation text (2 documents)" in format_report(r.summary, r.cells)
    from matplotlib.image import imread

    assert imread(tmp_path / "p" / "perplexity.png").shape[0] > 100


def test_perplexity_windows_never_span_two_documents():
    from blocklab.eval.perplexity import document_plan

    docs = [list(range(100)), list(range(30)), list(range(250))]
    plan, scored = document_plan(docs, 64, "nonoverlapping", 0.5, 200)
    assert all(start + 64 <= len(docs[d]) for d, start, _ in plan)
    assert {d for d, _, _ in plan} == {0, 2} and scored >= 200  # the 30-token document: none


def test_repeated_share_sees_a_text_read_twice():
    from blocklab.eval.perplexity import repeated_share

    text = list(range(1000))
    assert repeated_share(text) == 0.0
    assert repeated_share(text + text) == pytest.approx(969 / 1969)  # all grams of copy two


def test_long_sentences_are_cut_at_line_breaks_and_keys_kept_out_of_the_haystack():
    verse = "My lord, I speak\nof things that were\nand things to come,\n" * 5 + "and so farewell."
    units = sentences_of(verse)
    assert len(units) > 10 and all(len(u) < 60 for u in units)
    hay = haystack_sentences("shakespeare", ESSAY, avoid=("Hector", "Rosa"), max_chars=400_000)
    import re

    assert not any(re.search(r"\b(Hector|Rosa)\b", s) for s in hay)


# ------------------------------------------------------------------ the grid for the model


def test_auto_is_the_full_grid_for_the_synthetic_vocabulary_and_the_text_grid_for_text():
    auto = packaged_grid("auto")
    token = grid_for(auto, synthetic=True)
    assert token.name == "full" and token.text_grid is None
    assert dataclasses.replace(token, name="full") == dataclasses.replace(ProbeSpec(),
                                                                         name="full")
    text = grid_for(auto, synthetic=False)
    assert text == dataclasses.replace(packaged_grid("text"), text_grid=None)
    # a key the user set applies on top of either grid
    mine = dataclasses.replace(auto, needle=dataclasses.replace(auto.needle, n=7), seed=5)
    assert grid_for(mine, synthetic=False).needle.n == 7
    assert grid_for(mine, synthetic=False).needle.lengths == packaged_grid("text").needle.lengths
    assert grid_for(mine, synthetic=False).seed == 5
    assert grid_for(mine, synthetic=True).needle.n == 7


def test_a_text_run_without_probes_gets_the_text_grid():
    from omegaconf import OmegaConf

    from blocklab.config import compose, validate_train

    def train_config(*overrides: str):
        return validate_train(OmegaConf.to_object(compose("train", list(overrides))))

    text = train_config("data=shakespeare", "tokenizer=bpe", "model=gpt2_tiny",
                        "probes.needle.n=9")
    assert text.probes.name == "text" and text.probes.needle.n == 9
    assert text.probes.litm.lengths == [0.5, 1.0] and text.probes.text.haystack == "shakespeare"
    token = train_config()
    assert token.probes.name == "full" and token.probes.needle.n == 64
    assert token.probes.needle.lengths == ProbeSpec().needle.lengths


def test_litm_records_sized_by_length_fill_it(tok):
    from blocklab.data import synthetic as syn
    from blocklab.eval.items import TokenBuilder
    from blocklab.eval.kinds.litm import Litm

    spec = ProbeSpec()
    spec.litm = dataclasses.replace(spec.litm, n_records=[], lengths=[0.5, 1.0], n=4)
    vocab = syn.Vocab(n_keys=64, n_values=64)
    cells = [c for c in Litm.token_cells(spec, TokenBuilder(vocab, 0), 128, None)
             if c.key["variant"] == "query_aware"]
    assert {c.key["n_records"] for c in cells} == {(64 - 6) // 3, (128 - 6) // 3}
    assert all(c.key["length"] <= 128 for c in cells)
    tspec = dataclasses.replace(spec, space="text")
    b = TextBuilder(tok, tspec)
    cells = Litm.text_cells(tspec, b, 256, None)
    by_m = {}
    for c in cells:
        if c.key["variant"] in ("kv_records", "query_aware"):
            by_m.setdefault(c.key["n_records"], []).append(c.key["length"])
    (m_half, m_full) = sorted(by_m)
    assert 1 <= m_half < m_full
    assert max(by_m[m_full]) <= 256 + 8  # fits its length but for a token or two of an item
    spec1 = dataclasses.replace(tspec, litm=dataclasses.replace(tspec.litm, lengths=[],
                                                                n_records=[m_full + 1]))
    more = Litm.text_cells(spec1, TextBuilder(tok, spec1), 256, None)
    assert max(c.key["length"] for c in more if c.key["variant"] == "query_aware") > 256


def test_litm_with_both_counts_and_lengths_is_refused():
    from blocklab.config import ConfigError, validate_probe_spec

    spec = ProbeSpec()
    spec.litm.lengths = [1.0]
    with pytest.raises(ConfigError, match=r"probes\.litm\.lengths=\[1\.0\]: set either"):
        validate_probe_spec(spec)


# ---------------------------------------------- beyond the training length, N/A explained


def test_cells_beyond_the_training_length_are_flagged_and_na_cells_explained(tmp_path):
    from blocklab.config import NeedleProbeConfig
    from blocklab.data import synthetic as syn
    from blocklab.eval.items import TokenBuilder
    from blocklab.eval.plots import cells_note

    vocab = syn.Vocab()
    spec = ProbeSpec(needle=NeedleProbeConfig(lengths=[0.05, 1.0, 2.0], depths=[0.5], n=4),
                     batch_size=8)
    spec.litm.enabled = spec.perplexity.enabled = False
    model = build_model(ModelConfig(vocab_size=vocab.size, d_model=32, n_heads=2, n_layers=1,
                                    d_ff=64, position=PositionConfig(name="rope")))
    r = run_spec(BlocklabBackend(model), spec, builder=TokenBuilder(vocab, 1), train_length=64,
                 keys={"step": 0}, out_dir=tmp_path / "p")
    flags = {c["length"]: c["beyond_train_length"] for c in r.cells}
    assert flags == {3: False, 64: False, 128: True}
    report = format_report(r.summary, r.cells)
    assert "beyond the training length 64 (prompts longer than the model trained on): " \
           "needle at 128" in report
    short = next(c for c in r.cells if c["length"] == 3)
    assert short["status"].startswith("n/a: length 3 <")
    assert short["status"].removeprefix("n/a: ") in report
    note = cells_note(r.cells)
    assert "n = 4 items per cell" in note and "N/A at 3: length 3 <" in note


def test_an_imported_model_is_probed_at_its_own_context():
    from blocklab.config import TrainConfig
    from blocklab.eval.evaluate import train_length
    from blocklab.eval.kinds.needle import Needle

    tc = TrainConfig()
    tc.model.max_seq_len = 8192
    assert train_length({"imported": "SmolLM2"}, tc) == (512, 8192)
    assert train_length({}, tc) == (tc.data.seq_len, tc.data.seq_len)
    cells = [{"probe": "needle", "variant": "2 distractors", "length": n, "depth": 0.5,
              "accuracy": 0.5, "n": 4, "status": "ok"} for n in (256, 512, 1024)]
    fig = Needle.figures(cells, train_length=8192, title="")["niah"]
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert not any("train L" in x for x in labels)  # no column is the training length
    assert "train L=8,192 > all columns" in fig.axes[0].get_xlabel()


def test_the_probe_run_says_its_plan_and_reads_perplexity_with_progress(tok):
    import io

    from blocklab.progress import Progress

    log = io.StringIO()
    spec = dataclasses.replace(ProbeSpec(space="text"), perplexity=dataclasses.replace(
        ProbeSpec().perplexity, text="shakespeare", tokens=100, lengths=[0.5]))
    spec.needle = dataclasses.replace(spec.needle, lengths=[2.0], depths=[0.5], n=2)
    spec.litm.enabled = False
    run_spec(BlocklabBackend(learned(256, 700)), spec, builder=TextBuilder(tok, spec),
             train_length=128, keys={"step": 0}, plots=False, decode=tok.decode,
             progress=Progress("probes", stream=log, clock=lambda: 0.0))
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("probes: full: 2 items (needle 2) holding ")
    assert "perplexity at 1 lengths (64-64) over 100 tokens each" in lines[0]
    assert any(x.startswith("probes: perplexity at 1 lengths: batches 0/") for x in lines)


def test_progress_lines_say_how_long_is_left():
    import io

    from blocklab.progress import Progress, duration

    now = [0.0]
    log = io.StringIO()
    with Progress("x", stream=log, every=10, clock=lambda: now[0]).count("work", 4) as tick:
        for t in (30.0, 60.0, 90.0, 120.0):
            now[0] = t
            tick()
    assert log.getvalue().splitlines()[1] == "x: work 1/4 (25%, about 1 min 30 s left)"
    assert duration(3725) == "1 h 2 min" and duration(59.6) == "1 min 0 s"


def test_torch_default_generator_is_untouched_by_text_probes(tok):
    """Probes draw from their own generators: the training order never changes."""
    model = learned(256, 700)
    state = torch.random.get_rng_state()
    spec = text_grid(text=dataclasses.replace(ProbeSpec().text, haystack="essay"))
    spec.needle.lengths = [1.0]
    spec.perplexity.enabled = False
    run_spec(BlocklabBackend(model), spec, builder=TextBuilder(tok, spec),
             train_length=200, keys={"step": 0}, plots=False, decode=tok.decode)
    assert torch.equal(state, torch.random.get_rng_state())

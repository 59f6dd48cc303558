"""The batches of the segment modes (data/segment_collate.py): labels against a brute-force
shift of each long row, the existing packed CausalLM collate as a second reference, split
mode's right padding to whole segments, and the synthetic mixture capped at ``data.doc_len``."""

from __future__ import annotations

import random

import pytest
import torch

from blocklab.config import DataConfig
from blocklab.data.mixture import Mixture
from blocklab.data.segment_collate import IGNORE, SegmentCollate
from blocklab.data.synthetic import Example
from blocklab.objectives import IGNORE as OBJECTIVE_IGNORE
from blocklab.objectives import CausalLM

T = 4


def stream_rows(n_rows: int = 3, k: int = 3, seed: int = 0) -> list[Example]:
    """Rows of k·T+1 tokens with monotone document ids, a boundary at a segment start, one
    inside a segment and one at the row's last token."""
    rng = random.Random(seed)
    rows = []
    for r in range(n_rows):
        ids = [10 * r] * T + [10 * r + 1] * (T + 2) + [10 * r + 2] * (k * T + 1 - 2 * T - 3)
        ids += [10 * r + 3]
        tokens = [rng.randrange(7, 50) for _ in ids]
        rows.append(Example(tokens, [False] + [True] * (len(ids) - 1), {"task": "text"}, ids))
    return rows


def brute_labels(e: Example, width: int) -> list[int]:
    """Label of input u: token u+1 when it is a target of input u's document, else IGNORE."""
    out = []
    for u in range(width):
        ok = (u + 1 < len(e.tokens) and e.targets[u + 1]
              and (e.segments is None or e.segments[u + 1] == e.segments[u]))
        out.append(e.tokens[u + 1] if ok else IGNORE)
    return out


def per_segment_labels(e: Example, width: int) -> list[int]:
    """A deliberately broken collate (the negative control): each segment shifted on its own,
    so a segment's last input has no target."""
    full = brute_labels(e, width)
    return [IGNORE if (u + 1) % T == 0 else lab for u, lab in enumerate(full)]


def test_ignore_is_the_objectives_ignore():
    assert IGNORE == OBJECTIVE_IGNORE


def test_stream_labels_are_the_long_rows_shift():
    rows = stream_rows()
    batch = SegmentCollate("stream", T)(rows)
    width = 3 * T
    assert batch["input_ids"].shape == batch["labels"].shape == (3, width)
    assert batch["segments"].dtype == torch.int64 and bool(batch["valid"].all())
    for i, e in enumerate(rows):
        assert batch["input_ids"][i].tolist() == e.tokens[:-1]
        assert batch["segments"][i].tolist() == e.segments[:-1]
        assert batch["labels"][i].tolist() == brute_labels(e, width)
        # a segment's last input is supervised by the next segment's first token (same doc)
        assert batch["labels"][i, 2 * T - 1] == e.tokens[2 * T]
        assert batch["labels"][i, T - 1] == IGNORE  # the document changes at a segment start
        assert batch["labels"][i, -1] == IGNORE  # ... and at the row's last token
        # negative control: the per-segment shift misses the target across a boundary
        assert batch["labels"][i].tolist() != per_segment_labels(e, width)


def test_stream_labels_are_the_packed_causal_lm_collates():
    rows = stream_rows(seed=1)
    mine = SegmentCollate("stream", T)(rows)
    for i, e in enumerate(rows):
        ref = CausalLM(pack_to=3 * T).collate([e])
        assert torch.equal(mine["labels"][i], ref["labels"][0])
        assert torch.equal(mine["input_ids"][i], ref["input_ids"][0])


def test_split_rows_are_right_padded_to_whole_segments():
    rng = random.Random(2)
    docs = []
    for n in (6, 13, 2 * T + 1):  # inputs: 5, 12, 8
        toks = [rng.randrange(7, 50) for _ in range(n)]
        docs.append(Example(toks, [False] * (n // 2) + [True] * (n - n // 2), {"task": "x"}))
    batch = SegmentCollate("split", T, pad=0)(docs)
    width = 12  # the longest row's 12 inputs: 3 segments
    assert batch["input_ids"].shape == (3, width)
    assert batch["valid"].tolist() == [[u < n - 1 for u in range(width)] for n in (6, 13, 9)]
    assert batch["segments"].tolist() == [[i] * width for i in range(3)]  # one id per row
    for i, e in enumerate(docs):
        assert batch["labels"][i].tolist() == brute_labels(e, width)
        assert batch["input_ids"][i, len(e.tokens) - 1:].eq(0).all()
    narrow = SegmentCollate("split", T)(docs[:1])  # 5 inputs: 2 segments
    assert narrow["input_ids"].shape == (1, 2 * T)


def test_a_stream_row_without_document_ids_is_refused():
    with pytest.raises(ValueError, match="document ids"):
        SegmentCollate("stream", T)([Example([1, 2, 3], [False, True, True])])
    with pytest.raises(ValueError, match="split or stream"):
        SegmentCollate("none", T)
    assert SegmentCollate.from_config(DataConfig()) is None
    made = SegmentCollate.from_config(DataConfig(seq_len=16, segment_mode="split"), pad=3)
    assert (made.mode, made.seq_len, made.pad) == ("split", 16, 3)


def test_the_synthetic_mixture_is_capped_at_doc_len_and_the_curriculum_grows_it():
    base = dict(seq_len=24, min_len=20, batch_size=4, curriculum=[[0, 48], [10, 96]])
    plain = Mixture(DataConfig(**base))
    split = Mixture(DataConfig(**base, segment_mode="split", doc_len=96))
    assert max(len(plain(i, 20).tokens) for i in range(40)) <= 24  # capped at seq_len
    early = [len(split(i, 0).tokens) for i in range(40)]
    late = [len(split(i, 20).tokens) for i in range(40)]
    assert max(early) <= 48 < max(late) <= 96
    assert max(len(split(i).tokens) for i in range(40)) > 48  # no step: up to doc_len
    assert split.fingerprint() != plain.fingerprint()
    assert Mixture(DataConfig(**base)).fingerprint() == plain.fingerprint()


def test_mqar_segments_layout_puts_records_first_and_queries_last():
    from blocklab.config import ConfigError
    from blocklab.config.validate_data import validate_mixture
    from blocklab.data.synthetic import SEP

    cfg = DataConfig(seq_len=16, min_len=32, batch_size=4, segment_mode="split", doc_len=64,
                     tasks={"needle": 0.0, "mqar": 1.0}, mqar_pairs=3, mqar_layout="segments")
    mix = Mixture(cfg)
    seen = set()
    for i in range(24):
        e = mix(i, None)
        n = len(e.tokens)
        assert n % 16 == 0 and 32 <= n <= 64 and e.meta["segments_back"] == n // 16 - 1
        seen.add(n)
        first, last = e.tokens[:16], e.tokens[n - 16:]
        answers = [u for u, t in enumerate(e.targets) if t]
        assert len(answers) == 3 and all(u >= n - 16 for u in answers)
        records = {first[u]: first[u + 1] for u in range(1, 15) if first[u] in mix.vocab.keys}
        assert len(records) == 3
        for u in answers:  # SEP k v: v is the value the first segment recorded for k
            assert e.tokens[u - 2] == SEP and records[e.tokens[u - 1]] == e.tokens[u]
            # control: the last segment alone never holds the key before its query
            assert e.tokens[u - 1] not in last[:u - 2 - (n - 16)]
    assert len(seen) > 1  # lengths (segments) vary
    bad = DataConfig(seq_len=16, min_len=16, tasks={"needle": 0.0, "mqar": 1.0}, mqar_pairs=3,
                     mqar_layout="segments")
    with pytest.raises(ConfigError, match=r"data\.mqar_layout='segments': records in the first "
                                          r"segment, queries in the last: needs "
                                          r"data\.segment_mode=split"):
        validate_mixture(bad)


def test_a_document_of_one_segment_holds_its_records_then_its_queries():
    """The first stage of a curriculum over the number of segments (RMT's): one segment, its
    records in the first half and its queries in the second; split-mode lengths are whole
    segments, so stages of 1 and 2 segments mix at the second stage."""
    from blocklab.config import ConfigError
    from blocklab.config.validate_data import validate_mixture
    from blocklab.data.synthetic import SEP

    cfg = DataConfig(seq_len=16, min_len=16, batch_size=4, segment_mode="split", doc_len=32,
                     tasks={"needle": 0.0, "mqar": 1.0}, mqar_pairs=1, mqar_layout="segments",
                     curriculum=[[0, 16], [10, 32]])
    mix = Mixture(cfg)
    early = [mix(i, 0) for i in range(16)]
    assert all(len(e.tokens) == 16 and e.meta["segments_back"] == 0 for e in early)
    for e in early:
        (u,) = [u for u, t in enumerate(e.targets) if t]
        assert u >= 8 and e.tokens[u - 2] == SEP  # the query in the second half
        k = e.tokens[u - 1]
        assert k in e.tokens[1:7] and e.tokens[e.tokens.index(k, 1) + 1] == e.tokens[u]
    later = {len(mix(i, 10).tokens) for i in range(0, 64, 4)}  # one length per batch of 4
    assert later == {16, 32}  # whole segments only: one or two
    with pytest.raises(ConfigError, match=r"data\.mqar_pairs=3: a document of one segment"):
        validate_mixture(DataConfig(seq_len=16, min_len=16, segment_mode="split", doc_len=32,
                                    tasks={"needle": 0.0, "mqar": 1.0}, mqar_pairs=3,
                                    mqar_layout="segments"))

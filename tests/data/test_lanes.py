"""``data.segment_mode=stream`` (data/lanes.py): a text corpus read as ``data.batch_size`` lanes,
checked against the training stream built independently (the spans laid end to end, as
``Windows.train_rows`` cuts them), and ``split``: one document per example."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from blocklab.config import DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.data.datamodule import BlocklabData
from blocklab.data.lanes import Lanes
from blocklab.data.segment_collate import SegmentCollate
from blocklab.data.shards import TokenCorpus, Windows
from blocklab.data.splits import held_out
from blocklab.data.streams import build_streams

BYTE = TokenizerConfig(name=TokenizerName.byte)
WORDS = ["the", "king", "queen", "crown", "river", "night", "storm", "love", "war", "peace"]
T, K, L = 8, 2, 3  # seq_len, trainer.bptt, lanes (data.batch_size)


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> DataConfig:
    d = tmp_path_factory.mktemp("lanes")
    rng = random.Random(0)
    files = []
    for i in range(12):  # documents of unequal lengths: some shorter than a row, some longer
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
        (d / f"doc{i:02d}.txt").write_text(words + ".\n")
        files.append(str(d / f"doc{i:02d}.txt"))
    return DataConfig(name=DataName.text, files=files, seq_len=T, batch_size=L, num_proc=1,
                      cache_dir=str(d / "cache"), val_fraction=0.2, segment_mode="stream")


def parts(data: DataConfig):
    from blocklab.data.prepare import prepare

    corpus = TokenCorpus(prepare(data, BYTE).path)
    return corpus, held_out(corpus, data)


def flat_stream(spans) -> tuple[np.ndarray, np.ndarray]:
    """The oracle: every span's tokens laid end to end, and each token's span index."""
    toks = [spans.corpus.doc(int(d))[int(a):int(b)] for d, a, b in
            zip(spans.doc, spans.start, spans.stop)]
    return np.concatenate(toks), np.repeat(np.arange(len(toks)), [len(t) for t in toks])


def test_lanes_concatenated_are_the_training_windows_flattened(text):
    corpus, split = parts(text)
    lanes = Lanes(corpus, text, split, bptt=K)
    flat, span = flat_stream(split.train)
    windows = Windows(corpus, dataclasses.replace(text, packing=True, segment_mode="none"), split)
    rows = windows.train_rows().ravel()
    assert np.array_equal(rows, flat[:len(rows)])  # the oracle is the stream Windows reads
    whole = [t for j in range(L) for t in lanes.train.lane(j)[0]]
    n = min(len(whole), len(rows))
    assert n > 3 * K * T and whole[:n] == rows[:n].tolist()
    ln, rows_per_lane = lanes.train.lane_len, lanes.train.rows
    assert ln == len(flat) // L and rows_per_lane == (ln - 1) // (K * T) >= 2
    for i in range(2 * L * rows_per_lane + L):  # two epochs and a row of the third
        ex = lanes.train_example(i)
        j, s = i % L, i // L
        e, r = divmod(s, rows_per_lane)
        a = j * ln + r * K * T
        assert ex.tokens == flat[a:a + K * T + 1].tolist()
        assert ex.segments == (e * len(split.train) + span[a:a + K * T + 1]).tolist()


def test_examples_are_a_pure_function_of_their_index(text):
    corpus, split = parts(text)
    a, b = Lanes(corpus, text, split, bptt=K), Lanes(corpus, text, split, bptt=K)
    order = [7, 0, 31, 3, 7]
    assert [b.train_example(i) for i in order] == [a.train_example(i) for i in order]
    assert [b.val_example(i) for i in order] == [a.val_example(i) for i in order]


def batches(data: DataConfig, *, workers: int = 0, start: int = 0, n: int = 4) -> list[dict]:
    streams = build_streams(data, BYTE, bptt=K)
    dm = BlocklabData(streams.train, streams.val, SegmentCollate("stream", T), batch_size=L,
                      val_batches=2, num_workers=workers)
    dm.start_batch = start
    out, it = [], iter(dm.train_dataloader())
    for _ in range(n):
        out.append(next(it))
    return out


def same(x: list[dict], y: list[dict]) -> bool:
    return all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
               for a, b in zip(x, y, strict=True))


def test_workers_and_resume_give_the_same_batches(text):
    plain = batches(text, n=7)
    assert same(batches(text, workers=2, n=7), plain)
    assert same(batches(text, start=5, n=2), plain[5:7])
    assert not same(plain[1:3], plain[0:2])  # control: the batches differ from step to step
    # consecutive batches continue each lane: row b's last token is row b+1's first input
    for b in range(6):
        last_target = plain[b]["labels"][:, -1]
        same_doc = plain[b]["segments"][:, -1] == plain[b + 1]["segments"][:, 0]
        assert torch.equal(last_target[same_doc], plain[b + 1]["input_ids"][same_doc, 0])


def test_ids_are_monotone_per_lane_and_an_epoch_wrap_changes_them(text):
    corpus, split = parts(text)
    lanes = Lanes(corpus, text, split, bptt=K)
    rows = lanes.train.rows
    for j in range(L):
        ids = [s for r in range(2 * rows + 1) for s in lanes.train_example(r * L + j).segments]
        assert ids == sorted(ids)
        end, wrap = lanes.train_example((rows - 1) * L + j), lanes.train_example(rows * L + j)
        first = lanes.train_example(j)
        assert wrap.tokens == first.tokens  # the lane starts again ...
        assert wrap.segments[0] > end.segments[-1]  # ... as another document (the carry resets)
        assert wrap.segments[0] == first.segments[0] + len(split.train)
    # control: without the epoch term the wrap would continue the lane's last document
    last_span = lanes.train_example((rows - 1) * L).segments[-1]
    assert lanes.train_example(0).segments[0] <= last_span


def test_validation_is_read_as_lanes_too(text):
    corpus, split = parts(text)
    lanes = Lanes(corpus, text, split, bptt=K)
    flat, _ = flat_stream(split.val)
    ln = len(flat) // L
    for i in range(lanes.val.rows * L):
        j, r = i % L, i // L
        assert lanes.val_example(i).tokens == flat[j * ln + r * K * T:][:K * T + 1].tolist()


def test_too_little_text_for_one_row_is_a_data_error(text):
    from blocklab.errors import DataError

    corpus, split = parts(text)
    with pytest.raises(DataError, match=r"no row of trainer.bptt x data.seq_len \+ 1"):
        Lanes(corpus, text, split, bptt=400)


def test_the_fingerprint_changes_only_with_a_segment_option(text):
    none = dataclasses.replace(text, segment_mode="none")
    base = build_streams(none, BYTE).fingerprint
    assert build_streams(none, BYTE, bptt=3).fingerprint == base  # bptt reads no text then
    stream = build_streams(text, BYTE, bptt=1).fingerprint
    assert stream != base and build_streams(text, BYTE, bptt=2).fingerprint != stream
    split = dataclasses.replace(text, segment_mode="split", doc_len=4 * T)
    assert build_streams(split, BYTE).fingerprint not in (base, stream)


def test_split_text_is_one_document_of_at_most_doc_len_tokens_an_example(text):
    split = dataclasses.replace(text, segment_mode="split", doc_len=4 * T)
    streams = build_streams(split, BYTE)
    examples = [streams.train(i, 0) for i in range(12)]
    assert all(len(e.tokens) <= 4 * T + 1 for e in examples)
    assert any(len(e.tokens) > T + 1 for e in examples)  # longer than one segment
    batch = SegmentCollate("split", T)(examples[:4])
    assert batch["input_ids"].shape[1] % T == 0
    assert batch["valid"].sum(1).tolist() == [len(e.tokens) - 1 for e in examples[:4]]

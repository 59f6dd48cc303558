"""Side by side: sampling speed with one CPU thread vs torch's default thread count.

What ``blocklab-generate``'s ``threads`` default is chosen by (docs/generation.md). One process
builds a small model (a preset, composed as the CLI composes it; random weights: speed does not
depend on them) and times cached sampling (``blocklab.model.generate.generate``, temperature
0.8, top-k 200 as ``blocklab-generate`` samples) at each batch size with ``torch.set_num_threads(1)``
and with the default, interleaved (1, default, 1, default, ...) after a warm-up round, so both
see the same machine load; each round gives a ratio, reported as min / median / max.

Usage::

    .venv/bin/python scripts/bench_threads.py                      # gpt2_tiny, batch 1 and 8
    .venv/bin/python scripts/bench_threads.py --model llama_tiny --batches 1 16 --reps 7
    .venv/bin/python scripts/bench_threads.py --model llama_tiny --set model.n_layers=30 \\
        model.d_model=576 model.n_heads=9 model.d_ff=1536 --batches 1   # SmolLM2-135M's shape
    .venv/bin/python scripts/bench_threads.py --quick              # tiny, a smoke (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2_tiny", help="a model preset (configs/model/)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="model overrides on top of the preset, e.g. model.n_layers=30")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    p.add_argument("--new", type=int, default=64, help="new tokens per sample")
    p.add_argument("--reps", type=int, default=5, help="timed interleaved rounds")
    p.add_argument("--threads", type=int, default=None,
                   help="the many-thread arm (default: torch's default in this process)")
    p.add_argument("--quick", action="store_true", help="a 1-layer model, few tokens: a smoke")
    p.add_argument("--json", type=Path, default=None, help="write the raw times here")
    return p.parse_args(argv)


def build(preset: str, quick: bool, extra: list[str]):
    from blocklab.config import compose, model_config
    from blocklab.model import build_model

    over = [f"model={preset}", *extra]
    if quick:
        over += ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
                 "model.vocab_size=64"]
    m = model_config(compose("train", over).model)
    return build_model(m).eval(), m


def main(argv: list[str] | None = None) -> int:
    import torch

    from blocklab.model.generate import generate

    a = parse_args(argv)
    if a.quick:
        a.reps, a.new, a.prompt = 2, 4, 4
    default = a.threads or torch.get_num_threads()
    torch.manual_seed(0)
    model, m = build(a.model, a.quick, a.set)
    arms = {"1 thread": 1, f"{default} threads (default)": default}
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"model {a.model} {' '.join(a.set)} ({sum(p.numel() for p in model.parameters()):,} parameters), "
          f"prompt {a.prompt} + {a.new} new tokens, {a.reps} rounds, os.cpu_count()="
          f"{os.cpu_count()}, torch default threads {torch.get_num_threads()}, load average "
          f"{load}", flush=True)
    gen = torch.Generator().manual_seed(0)
    times: dict[str, dict[str, list[float]]] = {}
    for batch in a.batches:
        prompt = torch.randint(4, m.vocab_size, (batch, a.prompt), generator=gen)

        def run(n: int, prompt=prompt) -> float:
            torch.set_num_threads(n)
            g = torch.Generator().manual_seed(1)
            t0 = time.perf_counter()
            with torch.no_grad():
                generate(model, prompt, max_new_tokens=a.new, temperature=0.8, top_k=200,
                         generator=g)
            return time.perf_counter() - t0

        for n in arms.values():  # warm-up, untimed
            run(n)
        rows = times.setdefault(f"batch {batch}", {k: [] for k in arms})
        for _ in range(a.reps):
            for name, n in arms.items():
                rows[name].append(run(n))
    torch.set_num_threads(default)
    print(f"\n{'case':10} {'arm':24} {'tokens/s median':>16}   1 thread vs default "
          "(min / median / max over rounds)")
    for case, rows in times.items():
        batch = int(case.split()[1])
        one, many = rows["1 thread"], rows[list(arms)[1]]
        ratios = sorted(b / s for s, b in zip(one, many, strict=True))
        for name, secs in rows.items():
            tps = statistics.median(batch * a.new / s for s in secs)
            tail = (f"{ratios[0]:.2f} / {statistics.median(ratios):.2f} / {ratios[-1]:.2f}x"
                    if name == "1 thread" else "")
            print(f"{case:10} {name:24} {tps:>16,.0f}   {tail}")
    if a.json:
        a.json.write_text(json.dumps({"model": a.model, "load": load, "times": times}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What reading a row segment by segment with the state carried costs against reading it whole
(data.segment_mode; docs/memory.md, "Cost"), per mixer, on CPU (fp32).

One training step's forward + backward of a small decoder (2 layers, d_model 64, 4 heads) on a
batch of 4 rows of 256 tokens: the plain forward over the whole row against the same row read
as 4 segments of 64 through a carry cache (``blocklab.model.carry.run_segments``, autograd on,
no detach: the gradients are the plain forward's; checked before timing, the largest
difference printed). The two cases run interleaved (A B A B ...)
after a warm-up round; the ratio carried / plain is taken per round and reported as
min / median / max; absolute times are context only.

    .venv/bin/python scripts/bench_carry.py --threads 1 --cpu-time
    .venv/bin/python scripts/bench_carry.py --quick --reps 1        # tiny (smoke)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mixers import model_config, parse_args, spread, timed_rounds

# label -> (mixer, options); the full-history softmax carry keeps every key (mem_len null, split
# mode; the default mem_len 0 reads each segment alone, which is not the plain forward)
MIXERS = {
    "softmax, full history": ("softmax", {"mem_len": None}),
    "softmax, window 32": ("softmax", {"window": 32}),
    "linear attention": ("linear", {"chunk": 16}),
    "ssm": ("ssm", {"chunk": 16}),
    "gated_conv": ("gated_conv", {}),
}


def _steps(cfg, batch: int, t: int, seg: int
           ) -> tuple[torch.nn.Module, dict[str, Callable[[], None]]]:
    from blocklab.model import build_model
    from blocklab.model.carry import run_segments

    torch.manual_seed(0)
    model = build_model(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch, t))

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

    def plain() -> None:
        model.zero_grad(set_to_none=True)
        loss(model(ids)).backward()

    def carried() -> None:
        model.zero_grad(set_to_none=True)
        cache = model.new_cache(batch, t, carry=True)
        loss(run_segments(model, ids, seg_len=seg, cache=cache)).backward()

    return model, {"plain": plain, "carried": carried}


def grad_difference(model: torch.nn.Module, steps: dict[str, Callable[[], None]]) -> float:
    """The largest |difference| between the two cases' parameter gradients."""
    grads = {}
    for name, step in steps.items():
        step()
        grads[name] = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return max(float((a - b).abs().max()) for a, b in zip(*grads.values(), strict=True))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__, {"carry": None}, argv, threads=2)
    batch, t, seg = (2, 64, 16) if args.quick else (4, 256, 64)
    out = {}
    for label, (mixer, options) in MIXERS.items():
        cfg = model_config(mixer, d_model=64, max_seq_len=t, **options)
        model, steps = _steps(cfg, batch, t, seg)
        diff = grad_difference(model, steps)
        if diff > 1e-3:
            raise SystemExit(f"{label}: carried gradients differ from the plain ones by {diff}")
        times = timed_rounds(steps, args.reps, cpu_time=args.cpu_time)
        ratios = [c / p for c, p in zip(times["carried"], times["plain"], strict=True)]
        out[label] = {"grad_difference": diff, "plain_ms": [1e3 * x for x in times["plain"]],
                      "carried_ms": [1e3 * x for x in times["carried"]], "ratio": ratios}
        print(f"{label:24s} carried / plain {spread(ratios)}   (plain median "
              f"{1e3 * sorted(times['plain'])[len(ratios) // 2]:.0f} ms; gradients equal to "
              f"{diff:.1e})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

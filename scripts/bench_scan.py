"""The SSM's two training scans side by side: a forward and backward of one ``recall_state``
arm's model (``model.mixer.scan`` chunked against sequential), the two interleaved in one
process after a warm-up, on one CPU thread; prints each one's median and the ratio.

Usage::

    .venv/bin/python scripts/bench_scan.py                          # ssm s8 128/8, 5 rounds
    .venv/bin/python scripts/bench_scan.py --arm "ssm s4 64/4" --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from blocklab.config import compose
from blocklab.model import build_model
from blocklab.repro import experiments as ex
from blocklab.train.run import to_train_config

SCANS = ("chunked", "sequential")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", default="ssm s8 128/8", help="a recall_state full arm with an ssm")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    size = ex.experiment("recall_state", "full").sizes["full"]
    arm = next((a for a in size.arms if a.name == args.arm), None)
    if arm is None:
        raise SystemExit(f"--arm {args.arm!r}: not a recall_state full arm "
                         f"({', '.join(a.name for a in size.arms if 'ssm' in a.name)})")
    models, shape = {}, None
    for scan in SCANS:
        cfg = to_train_config(compose("train", [*arm.overrides, f"model.mixer.scan={scan}",
                                                "model.vocab_size=64"]))
        torch.manual_seed(0)
        models[scan] = build_model(cfg.model)
        shape = (cfg.data.batch_size, cfg.data.seq_len)
    ids = torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {k: [] for k in SCANS}
    losses: dict[str, float] = {}
    for rep in range(args.reps + 1):  # round 0 warms up
        for scan, model in models.items():
            start = time.perf_counter()
            out = model(ids)
            loss = (out.logits if hasattr(out, "logits") else out).float().square().mean()
            loss.backward()
            if rep:
                times[scan].append(time.perf_counter() - start)
            losses.setdefault(scan, loss.item())
    a, b = losses.values()  # the same weights and tokens: the same computation
    if abs(a - b) > 1e-4 * abs(a):
        raise SystemExit(f"the two scans disagree: {losses}")
    print(f"same outputs: the two models' losses {a:.6f} / {b:.6f}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for scan in SCANS:
        print(f"{scan:>10}: median {med[scan] * 1e3:,.0f} ms "
              f"({', '.join(f'{t * 1e3:.0f}' for t in times[scan])})")
    print(f"{arm.name}, batch {shape[0]} x {shape[1]} tokens: sequential is "
          f"{med['chunked'] / med['sequential']:.2f}x the chunked scan's speed")


if __name__ == "__main__":
    main()

"""blocklab's shakespeare_char training step against a plain nanoGPT-style PyTorch loop, on CPU.

Both train the model of ``experiment=shakespeare_char`` (4 layers, 4 heads, d_model 128,
context 64, batch 12, no biases, tied embeddings; nanoGPT's CPU recipe) on the same tokens
(the training part of the prepared corpus), in the same process, interleaved (A B A B ... after
a warm-up), so a machine loaded by other work slows both alike; ratios are taken per round and
given as min / median / max.

- ``blocklab``: what a blocklab training step runs — the model from ``build_model``, batches of
  the run's training stream collated and scored by the decoder objective, AdamW with blocklab's
  parameter groups, the cosine schedule, gradient clipping at 1.0.
- ``nanogpt``: a plain loop written here as nanoGPT's train.py / model.py do it — separate
  c_attn / c_proj Linears, SDPA ``is_causal``, ``get_batch`` at random offsets of a flat token
  array, AdamW (decay on every 2-D parameter), the same schedule and clipping.

Reported per case: tokens per second (wall), CPU seconds per 1,000 tokens, and peak memory of
a training loop measured in a fresh process per case (the high-water mark ``VmHWM``, reset just
before the loop, minus the resident set at that moment). Targets (issue 23): blocklab >= 1.0x
the loop's tokens/s and <= 1.1x its memory. Pin threads (``--threads 1``) on a loaded machine.

Usage::

    .venv/bin/python scripts/bench_shakespeare.py --threads 1 --reps 7
    .venv/bin/python scripts/bench_shakespeare.py --quick --corpus input.txt   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]


def overrides(a: argparse.Namespace) -> list[str]:
    out = ["experiment=shakespeare_char", "probes=none", "probes@checkpoint_probes=none"]
    if a.corpus:
        out += ["data=text_files", f"data.files=[{a.corpus}]", "data.val_split=last",
                "data.val_fraction=0.1", "data.packing=true", "data.seq_len=64",
                "data.batch_size=12", "data.val_batches=20"]
    if a.quick:
        out += ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.d_ff=64"]
    if a.cache:
        out.append(f"data.cache_dir={a.cache}")
    return out


def compose_config(a: argparse.Namespace):
    from blocklab.config import compose, validate_train
    from blocklab.train.run import to_train_config

    return validate_train(to_train_config(compose("train", overrides(a))))


# ------------------------------------------------------------------------- nanoGPT-style loop


class NanoBlock(nn.Module):
    def __init__(self, d: int, heads: int, d_ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)
        self.c_fc = nn.Linear(d, d_ff, bias=False)
        self.mlp_proj = nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.c_attn(self.ln_1(x)).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    """nanoGPT's GPT at the recipe's size: learned positions, tied head, GPT-2 init."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, d_ff: int, ctx: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(NanoBlock(d, heads, d_ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=False)
        for name, p in self.named_parameters():
            std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
            nn.init.normal_(p, std=std) if p.dim() == 2 else nn.init.ones_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def lr_at(it: int, tc) -> float:
    """nanoGPT's get_lr (warmup, cosine to min_lr at lr_decay_iters = max_iters)."""
    s, lr = tc.schedule, tc.optim.lr
    if it < s.warmup_steps:
        return lr * (it + 1) / (s.warmup_steps + 1)
    ratio = min((it - s.warmup_steps) / max(tc.trainer.max_steps - s.warmup_steps, 1), 1.0)
    return lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * ratio)))


def nanogpt_case(tc, streams, tokens: np.ndarray):
    m = tc.model
    torch.manual_seed(0)
    model = NanoGPT(streams.vocab_size, m.d_model, m.n_layers, m.n_heads, m.d_ff, m.max_seq_len)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.optim.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=tc.optim.lr,
                            betas=tuple(tc.optim.betas), eps=tc.optim.eps)
    bs, ctx = tc.data.batch_size, tc.data.seq_len
    rng = np.random.default_rng(0)
    state = {"it": 0}

    def step() -> None:
        ix = rng.integers(0, len(tokens) - ctx - 1, bs)
        x = torch.from_numpy(np.stack([tokens[i:i + ctx] for i in ix]).astype(np.int64))
        y = torch.from_numpy(np.stack([tokens[i + 1:i + 1 + ctx] for i in ix]).astype(np.int64))
        for g in opt.param_groups:
            g["lr"] = lr_at(state["it"], tc)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["it"] += 1

    return model, step


def blocklab_case(tc, streams):
    import functools

    from blocklab.model import build_model
    from blocklab.objectives import build_objective
    from blocklab.registry import lookup
    from blocklab.train.optim import build_optimizer

    torch.manual_seed(0)
    model = build_model(tc.model).train()
    objective = build_objective(tc.model.family.name, tc.data, streams.specials)
    opt = build_optimizer(model, tc.optim)
    fn = lookup("schedule", tc.schedule.name)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(
        fn, cfg=tc.schedule, max_steps=tc.trainer.max_steps))
    bs = tc.data.batch_size
    state = {"i": 0}

    def step() -> None:
        i = state["i"]
        batch = objective.collate([streams.train(i + j, None) for j in range(bs)])
        state["i"] = i + bs
        out = objective.loss(model, batch)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()

    return model, step


def setup(a: argparse.Namespace):
    """(train config, streams, the training tokens as one flat array, cases)."""
    from blocklab.data.streams import build_streams

    tc = compose_config(a)
    streams = build_streams(tc.data, tc.tokenizer)
    tc.model.vocab_size = streams.vocab_size
    tokens = np.concatenate([np.asarray(streams.train(i).tokens, dtype=np.uint16)
                             for i in range(streams.train_examples)])
    cases = {"blocklab": blocklab_case(tc, streams), "nanogpt": nanogpt_case(tc, streams, tokens)}
    return tc, streams, tokens, cases


# ------------------------------------------------------------------------------- measuring

PEAK = """
import json, sys
sys.path.insert(0, {root!r} + "/scripts")
import torch
import bench_shakespeare as b
torch.set_num_threads({threads})
a = b.parse_args({argv!r})
_, _, _, cases = b.setup(a)
_, step = cases[{case!r}]
def status(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))
open("/proc/self/clear_refs", "w").write("5")  # the high-water mark from here (Linux)
rss = status("VmRSS")
for _ in range({steps}):
    step()
print(json.dumps({{"peak_mb": (status("VmHWM") - rss) / 1024}}))
"""


def peak_mb(case: str, argv: list[str], threads: int, steps: int) -> float:
    code = PEAK.format(root=str(ROOT), argv=argv, case=case, threads=threads, steps=steps)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=1800)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])["peak_mb"]


def timed(cases: dict, a: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Per case and round: wall and CPU seconds of ``a.steps`` steps, interleaved."""
    for _, step in cases.values():
        for _ in range(a.warmup_steps):
            step()
    out = {k: {"wall": [], "cpu": []} for k in cases}
    for r in range(a.reps):
        for k, (_, step) in cases.items():
            w, c = time.perf_counter(), time.process_time()
            for _ in range(a.steps):
                step()
            out[k]["wall"].append(time.perf_counter() - w)
            out[k]["cpu"].append(time.process_time() - c)
        print(f"  round {r + 1}/{a.reps} done", file=sys.stderr, flush=True)
    return out


def mmm(xs: list[float]) -> str:
    return f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"


def report(tc, times: dict, peaks: dict[str, float], a: argparse.Namespace, params: dict) -> dict:
    tokens = a.steps * tc.data.batch_size * tc.data.seq_len
    tps = {k: [tokens / w for w in v["wall"]] for k, v in times.items()}
    cpu_k = {k: [1000 * c / tokens for c in v["cpu"]] for k, v in times.items()}
    speed = [b / n for b, n in zip(tps["blocklab"], tps["nanogpt"])]
    cpu = [b / n for b, n in zip(cpu_k["blocklab"], cpu_k["nanogpt"])]
    mem = peaks["blocklab"] / peaks["nanogpt"] if peaks else float("nan")
    load = os.getloadavg()
    print(f"\n== shakespeare_char train step, fp32, batch {tc.data.batch_size} x "
          f"{tc.data.seq_len}, {a.steps} steps per case per round, {a.reps} rounds, "
          f"{a.threads} thread(s); load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'impl':9} {'params':>9} {'tok/s med':>10} {'CPU-s / 1k tok med':>19} "
          f"{'peak MB':>8}")
    for k in times:
        print(f"{k:9} {params[k]:>9,} {statistics.median(tps[k]):>10,.0f} "
              f"{statistics.median(cpu_k[k]):>19.4f} {peaks.get(k, float('nan')):>8.1f}")
    print(f"blocklab / nanogpt tokens/s min/med/max: {mmm(speed)} (target >= 1.0: "
          f"{'met' if statistics.median(speed) >= 1.0 else 'MISSED'})")
    print(f"blocklab / nanogpt CPU seconds per token min/med/max: {mmm(cpu)}")
    print(f"blocklab / nanogpt peak memory: {mem:.3f} (target <= 1.1: "
          f"{'met' if mem <= 1.1 else 'MISSED'})")
    return {"times": times, "tokens_per_s": tps, "cpu_s_per_1k_tokens": cpu_k,
            "ratio_tokens_per_s": speed, "ratio_cpu": cpu, "peak_mb": peaks,
            "ratio_peak_memory": mem, "params": params, "load_average": load,
            "config": {"batch": tc.data.batch_size, "seq": tc.data.seq_len, "steps": a.steps,
                       "reps": a.reps, "threads": a.threads, "overrides": overrides(a)}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny model: a smoke run")
    p.add_argument("--corpus", default=None, help="a text file instead of the Shakespeare plays")
    p.add_argument("--cache", default=None, help="data.cache_dir for the prepared corpus")
    p.add_argument("--reps", type=int, default=5, help="timed interleaved rounds (default 5)")
    p.add_argument("--steps", type=int, default=20, help="steps per case per round (default 20)")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--peak-steps", type=int, default=10,
                   help="steps of the peak-memory loop in a fresh process (0: skip)")
    p.add_argument("--json", type=Path, default=None, help="write all results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    tc, streams, tokens, cases = setup(a)
    params = {k: sum(p.numel() for p in m.parameters()) for k, (m, _) in cases.items()}
    if params["blocklab"] != params["nanogpt"]:
        raise SystemExit(f"the two models differ in size: {params}")
    print(f"{len(tokens):,} training tokens, vocabulary {streams.vocab_size}; "
          f"{params['blocklab']:,} parameters each", flush=True)
    times = timed(cases, a)
    peaks = ({k: peak_mb(k, argv, a.threads, a.peak_steps) for k in cases}
             if a.peak_steps else {})
    res = report(tc, times, peaks, a, params)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

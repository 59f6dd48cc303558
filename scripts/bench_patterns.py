"""Attention patterns side by side on CPU (fp32): what the blocked computation saves against
the dense mask of the same pattern, in time, memory and decoding (issue 44, item 7).

Every speed figure is a ratio measured in one run: the cases of a section run interleaved
(A B A B ...) after a warm-up round, a ratio is taken per round, and the report gives
min / median / max over the rounds; absolute times are context only. ``--cpu-time`` times
with the process's CPU time (stabler on a loaded machine, with ``--threads 1``).

1. ``train``: one softmax layer's training step (forward + backward of the mixer alone, batch
   1, d_model 128, 4 heads, no position scheme) at T = 4096 for each pattern, blocked (blocks
   of queries over their band, sink, global and random keys: bands.py) against the dense-mask
   path of the same layer (``attention.MIN_BLOCK`` raised past T, so the layer takes
   ``Sequence.visibility``, masks.self_visibility's T×T mask of the same pattern, as the
   dense reference of tests/model/test_attention_patterns.py does). Before timing, the two
   outputs are checked equal (max |difference| printed). Per pattern: the fraction of the
   T² pairs the pattern keeps (counted on that dense mask) and the fraction each path
   scores (query × key pairs handed to SDPA, counted in an untimed pass). Target (issue 44):
   ≥ 3× faster where the pattern keeps ≤ 1/8 of the pairs.
2. ``memory``: peak memory of the same step, blocked and dense, at T = 1k / 2k / 4k. Each
   case runs in a child process forked from this one before it has computed anything (a
   fresh address space: nothing freed by an earlier case can be reused), which resets the
   Linux high-water mark (``VmHWM``, "5" to ``/proc/self/clear_refs``) after building the
   layer and its input, runs one step, and reports ``VmHWM`` minus the resident set before
   the step. This is the resident memory the step added (torch's CPU tensors included,
   which tracemalloc does not see), not an allocator count. The blocked path should grow
   with the kept pairs (×2 per doubling of T at a fixed window), the dense one with T² (×4).
3. ``decode``: a tiny decoder (2 layers, d_model 128, 4 heads, RoPE), batch 1, per-token time
   of cached greedy decoding after 1k / 4k / 16k tokens of context, for every layer with
   sinks + window (a bounded ring), every layer chunked (the cache empties at each chunk
   boundary) and every layer global (the reference: its cost grows with the context). Each
   arm decodes ``chunk`` tokens per measurement (one whole chunk cycle, so the chunked arm's
   mean does not depend on where in its chunk the context ends), from a copy of one prefilled
   cache per context. Ratio to the shortest context per round; flat = ≈ 1.

Usage::

    .venv/bin/python scripts/bench_patterns.py --threads 1 --cpu-time      # everything
    .venv/bin/python scripts/bench_patterns.py --only train --reps 5
    .venv/bin/python scripts/bench_patterns.py --quick --reps 1            # tiny (smoke)
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mixers import model_config, parse_args, spread, timed_rounds


@dataclasses.dataclass(frozen=True)
class Case:
    """A softmax layer's pattern: its label, whether it is causal, its mixer options."""

    label: str
    causal: bool
    options: dict


def patterns(quick: bool) -> list[Case]:
    """The patterns timed; ``quick``: the same kinds at a sixteenth of the sizes."""
    s = 16 if quick else 1
    w1, w2, c, bs = 256 // s, 512 // s, 512 // s, 64 // s
    return [
        Case(f"window {w1}", True, {"window": w1}),
        Case(f"window {w2}", True, {"window": w2}),
        Case(f"window {w1} + 4 sinks", True, {"window": w1, "sinks": 4}),
        Case(f"chunk {c}", True, {"attention_chunk": c}),
        Case(f"window {w2 - 1} + 2 global tokens (encoder)", False,
             {"window": w2 - 1, "global_tokens": 2}),
        Case(f"window {w1} + 3 random blocks of {bs}", True,
             {"window": w1, "random_blocks": 3, "block_size": bs}),
        Case(f"window {w1 - 1} + 2 global + 3 random blocks of {bs} (encoder, BigBird)", False,
             {"window": w1 - 1, "global_tokens": 2, "random_blocks": 3, "block_size": bs}),
    ]


D_MODEL, HEADS = 128, 4


def layer(case: Case, t: int):
    """The softmax layer of ``case`` (seeded) for rows of ``t`` tokens."""
    from blocklab.config import PositionConfig, validate_model
    from blocklab.model.attention import SoftmaxAttention

    cfg = model_config("softmax", d_model=D_MODEL, n_layers=1, max_seq_len=t, **case.options)
    cfg = validate_model(dataclasses.replace(cfg, position=PositionConfig(name="none")))
    torch.manual_seed(0)
    return SoftmaxAttention(cfg, 0, causal=case.causal)


def sequence(case: Case, t: int):
    """A fresh Sequence of one row of ``t`` real tokens (no padding, one document): a new
    one per forward, as a model builds one per forward (the dense mask is built in it)."""
    from blocklab.model.mixer import Sequence
    from blocklab.model.position import NoPosition

    pos = NoPosition(None, d_model=D_MODEL, d_head=D_MODEL // HEADS, n_heads=HEADS,
                     max_seq_len=t, causal=case.causal)
    return Sequence(positions=torch.arange(t).expand(1, t), valid=None, segments=None,
                    causal=case.causal, position=pos)


_MIN_BLOCK: list[int] = []  # attention.MIN_BLOCK as blocklab sets it


def set_dense(dense: bool) -> None:
    """The dense-mask path (every local layer takes the T×T mask) or the blocked one."""
    from blocklab.model import attention

    if not _MIN_BLOCK:
        _MIN_BLOCK.append(attention.MIN_BLOCK)
    attention.MIN_BLOCK = 1 << 30 if dense else _MIN_BLOCK[0]


def step_fn(case: Case, t: int, dense: bool) -> Callable[[], None]:
    """One training step of the layer (forward + backward) on the blocked or dense path."""
    attn = layer(case, t)
    x = torch.randn(1, t, D_MODEL, generator=torch.Generator().manual_seed(1),
                    requires_grad=True)

    def step() -> None:
        set_dense(dense)
        try:
            attn(x, sequence(case, t), None).square().mean().backward()
        finally:
            set_dense(False)
        attn.zero_grad(set_to_none=True)
        x.grad = None

    return step


# ----------------------------------------------------------------------------- 1. train


@torch.no_grad()
def pairs(case: Case, t: int) -> dict:
    """The fraction of the T² (query, key) pairs the pattern keeps (on the dense path's own
    mask), of the causal pairs (decoders), and the fraction each path scores (query × key
    slots handed to SDPA, padding slots of the last block included); and the largest
    difference between the two paths' outputs."""
    from blocklab.model import attention

    attn = layer(case, t)
    x = torch.randn(1, t, D_MODEL, generator=torch.Generator().manual_seed(2))
    allowed = sequence(case, t).visibility(attn.window).allowed
    kept = int(allowed.sum())
    scored = {}
    real_sdpa = attention._sdpa
    outs = {}
    for path in ("blocked", "dense"):
        count = [0]

        def counting(lay, q, k, v, vis, count=count):
            count[0] += q.shape[0] * q.shape[2] * k.shape[2]
            return real_sdpa(lay, q, k, v, vis)

        attention._sdpa = counting
        set_dense(path == "dense")
        try:
            outs[path] = attn(x, sequence(case, t), None)
        finally:
            attention._sdpa = real_sdpa
            set_dense(False)
        scored[path] = count[0] / t ** 2
    causal_pairs = t * (t + 1) // 2 if case.causal else t * t
    return {"kept_of_t2": kept / t ** 2, "kept_of_causal": kept / causal_pairs,
            "scored_of_t2": scored,
            "max_abs_diff": float((outs["blocked"] - outs["dense"]).abs().max())}


def bench_train(args) -> list[dict]:
    t = 256 if args.quick else 4096
    cases = patterns(args.quick)
    w = max(len(c.label) for c in cases)
    rows = []
    print(f"\n1. one softmax layer's training step (forward + backward), T={t}, batch 1, "
          f"d_model {D_MODEL}, {HEADS} heads: dense mask / blocked, min / median / max over "
          f"{args.reps} rounds")
    print(f"   {'pattern':<{w}} {'kept':>6} {'causal':>6} {'scored':>6} {'|diff|':>8}  "
          f"{'blocked s':>9} {'dense s':>8}  {'speed-up':<22} target")
    for case in cases:
        info = pairs(case, t)
        times = timed_rounds({"blocked": step_fn(case, t, False),
                              "dense": step_fn(case, t, True)}, args.reps,
                             cpu_time=args.cpu_time)
        ratios = [d / b for b, d in zip(times["blocked"], times["dense"])]
        target = "-" if info["kept_of_t2"] > 1 / 8 else (
            "met" if statistics.median(ratios) >= 3 else "MISSED")
        rows.append({"pattern": case.label, "causal": case.causal, "T": t, **info,
                     "times": times, "speedup": ratios, "target_3x": target})
        print(f"   {case.label:<{w}} {info['kept_of_t2']:6.3f} {info['kept_of_causal']:6.3f} "
              f"{info['scored_of_t2']['blocked']:6.3f} {info['max_abs_diff']:8.1e}  "
              f"{statistics.median(times['blocked']):9.3f} "
              f"{statistics.median(times['dense']):8.3f}  {spread(ratios) + 'x':<22} {target}")
    print("   kept: pairs the pattern keeps / T² (the dense path scores all T²); causal: kept / "
          "T(T+1)/2 for a decoder; scored: pairs the blocked path scores / T²; target: >= 3x "
          "(median) where kept <= 1/8")
    return rows


# ----------------------------------------------------------------------------- 2. memory


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))


def _peak_child(case: Case, t: int, dense: bool, out: int) -> None:
    """In the forked child: a warm-up step of a tiny layer on the same path (the libraries'
    code and first buffers are touched there, not counted), then build, reset the
    high-water mark, one step, report, exit."""
    code = 1
    try:
        step_fn(Case("warm-up", case.causal, {"window": 15}), 128, dense)()
        step = step_fn(case, t, dense)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS, so the peak is this step's, not the build's
        rss = _status("VmRSS")
        step()
        os.write(out, json.dumps({"peak_mb": (_status("VmHWM") - rss) / 1024}).encode())
        code = 0
    finally:
        os._exit(code)


def peak_mb(case: Case, t: int, dense: bool) -> float:
    """The step's peak resident memory in a forked child (the module docstring)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _peak_child(case, t, dense, write)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    if status or not text:
        raise RuntimeError(f"peak memory of {case.label}, T={t}: the child failed ({status})")
    return json.loads(text)["peak_mb"]


def bench_memory(args) -> list[dict]:
    # imported once here (the registry imports torch's compiler: seconds), not in every child
    for name in ("blocklab.model", "blocklab.model.mixers", "blocklab.model.ffn",
                 "blocklab.model.norm", "blocklab.model.head_layouts"):
        importlib.import_module(name)
    lengths = (64, 128, 256) if args.quick else (1024, 2048, 4096)
    rows, w = [], max(len(c.label) for c in patterns(args.quick))
    print(f"\n2. peak memory of that step (MB added to the resident set, a forked child per "
          f"case), T = {' / '.join(map(str, lengths))}; growth per doubling of T")
    for case in patterns(args.quick):
        mb = {path: [peak_mb(case, t, path == "dense") for t in lengths]
              for path in ("blocked", "dense")}
        rows.append({"pattern": case.label, "T": list(lengths), "peak_mb": mb})
        for path, xs in mb.items():
            growth = " ".join(f"x{b / a:.2f}" if a > 0 else "x-" for a, b in itertools.pairwise(xs))
            print(f"   {case.label if path == 'blocked' else '':<{w}} {path:<7} "
                  f"{' / '.join(f'{x:7.1f}' for x in xs)}   {growth}")
    return rows


# ----------------------------------------------------------------------------- 3. decode


def decoders(quick: bool) -> dict[str, dict]:
    s = 16 if quick else 1
    return {f"sinks 4 + window {256 // s}": {"window": 256 // s, "sinks": 4},
            f"chunk {256 // s}": {"attention_chunk": 256 // s},
            "global": {}}


@torch.inference_mode()
def prefilled(options: dict, context: int, steps: int):
    """A tiny decoder and its cache after ``context`` tokens (prefilled in chunks of 1024)."""
    from blocklab.model import build_model

    cfg = model_config("softmax", max_seq_len=context + steps + 2, **options)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, context),
                        generator=torch.Generator().manual_seed(3))
    cache = model.new_cache(1, context + steps + 1)
    for s in range(0, context, 1024):
        model(ids[:, s:s + 1024], cache=cache)
    return model, cache, ids[:, -1:]


def decode_rounds(cases: dict[str, tuple], steps: int, reps: int,
                  cpu_time: bool) -> dict[str, list[float]]:
    """Seconds per decoded token of every case, interleaved after a warm-up round; each
    measurement decodes ``steps`` greedy tokens from a fresh copy of the case's prefilled
    cache (the copy is not timed), so every round starts from the same context."""
    clock = time.process_time if cpu_time else time.perf_counter
    out: dict[str, list[float]] = {k: [] for k in cases}
    with torch.inference_mode():
        for r in range(reps + 1):  # round 0: the warm-up
            for key, (model, cache, token) in cases.items():
                c = cache.select(torch.zeros(1, dtype=torch.long))  # a copy
                t0 = clock()
                for _ in range(steps):
                    token = model(token, cache=c)[:, -1:].argmax(-1)
                if r:
                    out[key].append((clock() - t0) / steps)
    return out


def bench_decode(args) -> list[dict]:
    contexts = (64, 128, 256) if args.quick else (1024, 4096, 16384)
    arms = decoders(args.quick)
    steps = next(o["attention_chunk"] for o in arms.values() if "attention_chunk" in o)
    cases = {f"{label}|{n}": prefilled(options, n, steps)
             for label, options in arms.items() for n in contexts}
    clocks = decode_rounds(cases, steps, args.reps, args.cpu_time)
    rows = []
    print(f"\n3. decoding, batch 1, 2 layers, per token (ms) after "
          f"{' / '.join(map(str, contexts))} tokens of context ({steps} tokens per "
          f"measurement); ratio to {contexts[0]} per round, min / median / max")
    for label in arms:
        per = [clocks[f"{label}|{n}"] for n in contexts]
        ratios = {n: [x / a for a, x in zip(per[0], p)] for n, p in zip(contexts[1:], per[1:])}
        rows.append({"arm": label, "contexts": list(contexts),
                     "ms_per_token": {n: [x * 1e3 for x in p] for n, p in zip(contexts, per)},
                     "ratio_to_shortest": ratios})
        ms = " / ".join(f"{statistics.median(p) * 1e3:6.2f}" for p in per)
        rs = "   ".join(f"{n}: {spread(r)}x" for n, r in ratios.items())
        print(f"   {label:<22} {ms} ms   {rs}")
    return rows


# ------------------------------------------------------------------------------ main


SECTIONS = {"memory": bench_memory, "train": bench_train, "decode": bench_decode}


def finite(x) -> bool:
    """Every number in a result is finite (the test's check of the JSON)."""
    if isinstance(x, dict):
        return all(finite(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return all(finite(v) for v in x)
    return not isinstance(x, float) or math.isfinite(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__, SECTIONS, argv, threads=1)
    load = os.getloadavg()
    print(f"threads {args.threads}, clock {'CPU' if args.cpu_time else 'wall'}, "
          f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
          + ("; --quick: tiny shapes, a smoke run, not a measurement" if args.quick else ""))
    # memory first: its children fork from a process that has computed nothing yet
    chosen = [name for name in SECTIONS if name in (args.only or SECTIONS)]
    out = {"threads": args.threads, "cpu_time": args.cpu_time, "quick": args.quick,
           "load_average": load, **{name: SECTIONS[name](args) for name in chosen}}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    if not finite(out):
        raise SystemExit("a figure is not finite")


if __name__ == "__main__":
    main()

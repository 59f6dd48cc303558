"""Sequence mixers side by side on CPU (fp32): what each costs in training and decoding.

Every figure is a ratio measured in one run, interleaved (A B A B ...) after a warm-up, with
min / median / max over the rounds; peak memory is measured in a fresh subprocess per case
(the high-water mark ``VmHWM``, reset just before the measured work, minus the resident
set at that moment).

1. ``local``: a training step (forward + backward + AdamW) of a 2-layer decoder whose every
   layer is local (window W = 128) at T = 4096: blocklab's banded computation (blocks of
   queries over their band of keys, cost T·W) against the dense-mask path (the same model
   with banding off: a T×T boolean mask to SDPA). Peak memory of both at T = 1024 / 2048 /
   4096: the banded path grows with T·W, the dense one with T².
2. ``decode``: per-token time of cached greedy decoding after a context of 1k and 16k tokens,
   for every registered mixer (softmax global grows with the context; a local window, linear
   attention and the SSM should not: target 16k / 1k within 1.2×).
3. ``plain``: each mixer's training step (forward + backward) against a plain PyTorch
   implementation of the same computation written here (target blocklab ≥ 0.9× its speed).

Usage::

    .venv/bin/python scripts/bench_mixers.py                    # everything, ~10 minutes
    .venv/bin/python scripts/bench_mixers.py --only local --reps 5
    .venv/bin/python scripts/bench_mixers.py --quick             # tiny shapes (smoke)
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def model_config(mixer: str = "softmax", *, window: int | None = None, d_model: int = 128,
                 n_layers: int = 2, max_seq_len: int = 4096, **mixer_options):
    from blocklab.config import AttentionConfig, MixerConfig, ModelConfig, PositionConfig

    position = "rope" if mixer == "softmax" else "none"
    return ModelConfig(vocab_size=256, d_model=d_model, n_layers=n_layers, n_heads=4,
                       d_ff=4 * d_model, max_seq_len=max_seq_len,
                       position=PositionConfig(name=position),
                       attention=AttentionConfig(bias=False),
                       mixer=MixerConfig(name=mixer, **({"window": window} if window else {}),
                                         **mixer_options))


def timed_rounds(cases: dict[str, Callable[[], None]], reps: int, warmup: int = 1,
                 cpu_time: bool = False) -> dict[str, list[float]]:
    """Seconds per call of every case, interleaved: A B C A B C ... after the warm-up."""
    clock = time.process_time if cpu_time else time.perf_counter
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    out: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(reps):
        for k, fn in cases.items():
            t0 = clock()
            fn()
            out[k].append(clock() - t0)
    return out


def spread(xs: list[float]) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}"


def train_step(cfg, t: int, batch: int = 1) -> Callable[[], None]:
    from blocklab.model import build_model

    torch.manual_seed(0)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (batch, t))

    def step() -> None:
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


# ----------------------------------------------------------------------------- 1. local


def _dense(enabled: bool) -> None:
    """Banding off (every local layer takes the dense T×T mask) or back on."""
    from blocklab.model import attention

    attention.MIN_BLOCK = 1 << 30 if enabled else 32


PEAK = """
import json, sys, torch
sys.path.insert(0, {root!r} + "/scripts")
import bench_mixers as b
torch.set_num_threads(1)
b._dense({dense})
step = b.train_step(b.model_config(window={window}, max_seq_len={t}), {t})
def status(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))
# reset the high-water mark to what the process holds now (Linux: "5" to clear_refs), else the
# peak of importing torch hides the step's own peak
open("/proc/self/clear_refs", "w").write("5")
rss = status("VmRSS")
step()
print(json.dumps({{"peak_mb": (status("VmHWM") - rss) / 1024}}))
"""


def peak_mb(*, dense: bool, window: int, t: int) -> float:
    code = PEAK.format(root=str(ROOT), dense=dense, window=window, t=t)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=1800)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])["peak_mb"]


def bench_local(args) -> dict:
    window, t = (16, 512) if args.quick else (128, 4096)
    cfg = model_config(window=window, max_seq_len=t)
    banded, dense = train_step(cfg, t), train_step(cfg, t)

    def run_dense() -> None:
        _dense(True)
        try:
            dense()
        finally:
            _dense(False)

    times = timed_rounds({"banded": banded, "dense": run_dense}, args.reps,
                         cpu_time=args.cpu_time)
    ratios = [d / b for b, d in zip(times["banded"], times["dense"])]
    lengths = [t // 4, t // 2, t]
    memory = {n: {"banded": peak_mb(dense=False, window=window, t=n),
                  "dense": peak_mb(dense=True, window=window, t=n)} for n in lengths}
    print(f"\n1. local attention, window {window}, T={t}, 2 layers, d_model 128, train step")
    print(f"   banded  {spread(times['banded'])} s   dense mask  {spread(times['dense'])} s")
    print(f"   speedup dense/banded (min / median / max over rounds): {spread(ratios)}x")
    print("   peak memory of one step (MB, fresh process):")
    for n, m in memory.items():
        print(f"     T={n:>5}: banded {m['banded']:8.1f}   dense {m['dense']:8.1f}")
    return {"window": window, "T": t, "times": times, "speedup": ratios, "memory": memory}


# ----------------------------------------------------------------------------- 2. decode


DECODERS = {  # label -> (mixer, options, window)
    "softmax (global)": ("softmax", {}, None),
    "softmax (local, window 128)": ("softmax", {}, 128),
    "linear (taylor)": ("linear", {"feature_map": "taylor", "feature_dim": 16}, None),
    "linear (elu)": ("linear", {"feature_map": "elu"}, None),
    "ssm": ("ssm", {}, None),
    "gated_conv (short only)": ("gated_conv", {"long_conv": False, "short_conv": 4}, None),
}


@torch.inference_mode()
def decode_per_token(cfg, context: int, steps: int, reps: int) -> list[float]:
    """Seconds per decoded token after ``context`` tokens, measured over ``steps`` steps."""
    from blocklab.model import build_model

    torch.manual_seed(0)
    model = build_model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, context))
    out = []
    for _ in range(reps):
        cache = model.new_cache(1, context + steps + 1)
        chunk = 1024
        for s in range(0, context, chunk):  # prefill in chunks
            model(ids[:, s:s + chunk], cache=cache)
        token = ids[:, -1:]
        t0 = time.perf_counter()
        for _ in range(steps):
            token = model(token, cache=cache)[:, -1:].argmax(-1)
        out.append((time.perf_counter() - t0) / steps)
    return out


def bench_decode(args) -> dict:
    from blocklab.registry import names

    short, long = (128, 1024) if args.quick else (1024, 16384)
    steps = 16 if args.quick else 64
    results = {}
    print(f"\n2. decoding, per token after {short} vs {long} tokens of context (batch 1)")
    for label, (mixer, options, window) in DECODERS.items():
        if mixer not in names("mixer"):
            print(f"   {label:<30} (not registered)")
            continue
        cfg = model_config(mixer, window=window, max_seq_len=long + steps + 2, **options)
        a = decode_per_token(cfg, short, steps, args.reps)
        b = decode_per_token(cfg, long, steps, args.reps)
        ratio = statistics.median(b) / statistics.median(a)
        results[label] = {"short_ms": [x * 1e3 for x in a], "long_ms": [x * 1e3 for x in b],
                          "ratio": ratio}
        print(f"   {label:<30} {statistics.median(a) * 1e3:7.2f} ms  ->  "
              f"{statistics.median(b) * 1e3:7.2f} ms   ({ratio:.2f}x)")
    return results


# ------------------------------------------------------------------------------ 3. plain
# Each plain implementation computes the same mixer from the blocklab module's own parameters,
# for rows without padding or packed documents (what a paper's reference code handles), so
# the two can be checked equal before they are timed.


def plain_linear(mod, x: torch.Tensor) -> torch.Tensor:
    """Causal linear attention in chunks (the naive chunk form of flash-linear-attention):
    dense within a chunk, a running state across chunks, one Python loop over chunks."""
    phi = mod.phi
    if mod.conv is not None:  # causal depthwise conv (tap K-1 is the current token)
        k = mod.conv.weight.shape[-1]
        x = torch.nn.functional.conv1d(x.transpose(1, 2), mod.conv.weight, mod.conv.bias,
                                       padding=k - 1, groups=x.shape[-1])[..., :-(k - 1)]
        x = x.transpose(1, 2)
    b, t, _ = x.shape
    h, hkv, e, dv = mod.n_heads, mod.n_kv_heads, mod.d_key, mod.d_value
    qk, v = mod.qkv(x).split(((h + hkv) * e, hkv * dv), -1)
    q, k = phi.pointwise(qk.float()).split((h * e, hkv * e), -1)
    q = phi.features(q.view(b, t, h, e).transpose(1, 2))  # (B, H, T, F)
    k = phi.features(k.view(b, t, hkv, e).transpose(1, 2)).repeat_interleave(h // hkv, 1)
    v = v.float().view(b, t, hkv, dv).transpose(1, 2).repeat_interleave(h // hkv, 1)
    v = torch.cat((v, torch.ones_like(v[..., :1])), -1)  # (B, H, T, V+1): z rides along
    size = mod.chunk
    causal = torch.ones(size, size, dtype=torch.bool).tril()
    state = torch.zeros(b, h, q.shape[-1], v.shape[-1])
    outs = []
    for s in range(0, t, size):
        qc, kc, vc = q[:, :, s:s + size], k[:, :, s:s + size], v[:, :, s:s + size]
        n = qc.shape[2]
        scores = (qc @ kc.transpose(-1, -2)) * causal[:n, :n]
        outs.append(scores @ vc + qc @ state)
        state = state + kc.transpose(-1, -2) @ vc
    o = torch.cat(outs, 2)
    y = o[..., :-1] / (o[..., -1:] + 1e-6)
    return mod.out(y.transpose(1, 2).reshape(b, t, -1))


def plain_gated_conv(mod, x: torch.Tensor) -> torch.Tensor:
    """y = W_o(g * long(short(u))): the short taps as a causal depthwise conv1d, the long
    filter by one zero-padded FFT."""
    u, g = mod.proj(x).chunk(2, dim=-1)
    _, t, d = u.shape
    k = mod.short.shape[1]  # tap i reads x_{t-i}: conv1d's taps reversed
    w = torch.nn.functional.conv1d(u.transpose(1, 2), mod.short.flip(1)[:, None],
                                   mod.short_bias, padding=k - 1, groups=d)[..., :t]
    w = w.transpose(1, 2).float()
    if mod.long is not None:
        n = 2 * t
        kern = torch.nn.functional.pad(mod.long[:, :t].t().float(), (0, 0, 0, n - t))
        w = torch.fft.irfft(torch.fft.rfft(w, n=n, dim=1) * torch.fft.rfft(kern, n=n, dim=0),
                            n=n, dim=1)[:, :t]
    return mod.out(g * w.to(g.dtype))


def plain_ssm(mod, x: torch.Tensor, sequential: bool = False) -> torch.Tensor:
    """Mamba's mixer as mamba-minimal / HF's torch path write it: conv1d, selection, then the
    scan — ``sequential``: one step per token, autograd through the loop; else blocklab's own
    scan (``model.mixer.scan``) without the padding and document machinery."""
    import torch.nn.functional as F

    from blocklab.model.ssm import selective_scan

    u, z = mod.in_proj(x).chunk(2, dim=-1)
    t = u.shape[1]
    k = mod.d_conv
    u = F.silu(F.conv1d(u.transpose(1, 2), mod.conv.weight, mod.conv.bias, padding=k - 1,
                        groups=u.shape[-1])[..., :t].transpose(1, 2))
    dt, B, C = mod.selection(u)
    A = -torch.exp(mod.A_log.float())
    if sequential:
        h = torch.zeros(u.shape[0], u.shape[-1], A.shape[1])
        ys = []
        for i in range(t):
            h = torch.exp(dt[:, i, :, None] * A) * h + (dt[:, i] * u[:, i])[..., None] * \
                B[:, i, None, :]
            ys.append((h * C[:, i, None, :]).sum(-1))
        y = torch.stack(ys, 1)
    else:
        y, _ = selective_scan(u.float(), dt, A, B.float(), C.float(), chunk=mod.chunk,
                              method=mod._method(u))
    return mod.out((y + u * mod.D) * F.silu(z))


PLAIN = {  # label -> (mixer, options, plain implementation)
    "linear (elu)": ("linear", {"feature_map": "elu"}, plain_linear),
    "linear (taylor, feature_dim 16, short_conv 3)":
        ("linear", {"feature_map": "taylor", "feature_dim": 16, "short_conv": 3}, plain_linear),
    "gated_conv (short 3 + long)": ("gated_conv", {"short_conv": 3, "long_conv": True},
                                    plain_gated_conv),
    "ssm vs the same scan without masks": ("ssm", {}, plain_ssm),
    "ssm vs a sequential scan": ("ssm", {}, lambda m, x: plain_ssm(m, x, sequential=True)),
}


def _step(fn, mod, x: torch.Tensor) -> None:
    fn(mod, x).square().mean().backward()


def run_mixer(mod, x: torch.Tensor) -> torch.Tensor:
    """blocklab's mixer on rows without padding or packing, as a stack would call it."""
    from blocklab.model.mixer import Sequence
    from blocklab.model.position import NoPosition

    b, t = x.shape[:2]
    pos = NoPosition(None, d_model=x.shape[-1], d_head=1, n_heads=1, max_seq_len=t,
                     causal=True)
    seq = Sequence(positions=torch.arange(t).expand(b, t), valid=None, segments=None,
                   causal=True, position=pos)
    return mod(x, seq, None)


def bench_plain(args) -> dict:
    from blocklab.registry import lookup, names

    t, b = (128, 2) if args.quick else (1024, 4)
    results = {}
    print(f"\n3. mixer training step (forward + backward), B={b}, T={t}, d_model 128, 4 heads: "
          "blocklab vs a plain PyTorch implementation of the same mixer")
    for label, (name, options, plain) in PLAIN.items():
        if name not in names("mixer"):
            print(f"   {label:<46} (not registered)")
            continue
        cfg = model_config(name, max_seq_len=t, **options)
        torch.manual_seed(0)
        mod = lookup("mixer", name)(cfg, 0, causal=True)
        x = torch.randn(b, t, cfg.d_model, requires_grad=True)
        with torch.no_grad():  # the same computation, checked on a prefix
            short = x[:, :min(t, 64)]
            torch.testing.assert_close(plain(mod, short), run_mixer(mod, short),
                                       atol=1e-4, rtol=1e-4)
        times = timed_rounds({"blocklab": functools.partial(_step, run_mixer, mod, x),
                              "plain": functools.partial(_step, plain, mod, x)},
                             args.reps, cpu_time=args.cpu_time)
        ratios = [p / o for o, p in zip(times["blocklab"], times["plain"])]
        results[label] = {"times": times, "speed_ratio": ratios}
        print(f"   {label:<46} blocklab {statistics.median(times['blocklab']):6.3f} s, plain "
              f"{statistics.median(times['plain']):6.3f} s: speed ratio {spread(ratios)}")
    return results


# ------------------------------------------------------------------------------ main


SECTIONS = {"local": bench_local, "decode": bench_decode, "plain": bench_plain}


def parse_args(doc: str, sections, argv: list[str] | None, *,
               threads: int) -> argparse.Namespace:
    """The bench scripts' command line (this one's and bench_patterns.py's): ``--only`` a
    section of ``sections`` (repeatable), ``--reps``, ``--quick``, ``--threads`` (default
    ``threads``, applied to torch here), ``--cpu-time``, ``--json``; the description is the
    first paragraph of ``doc``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--only", choices=list(sections), action="append")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="tiny shapes, for a smoke run")
    p.add_argument("--threads", type=int, default=threads)
    p.add_argument("--cpu-time", action="store_true", help="process CPU time (stabler under load)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__, SECTIONS, argv, threads=2)
    out = {name: SECTIONS[name](args) for name in (args.only or SECTIONS)}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""One-command check of blocklab's GPU and compiled path: correctness on the device, bf16
training with MFU, eager vs compiled speed, the SDPA kernel actually used, and FSDP.

Sections (all results go into one JSON file and a short Markdown table):

1. ``correctness``: a compact variant grid (3 families × 6 position schemes, head layouts, norms
   and FFNs rotating, plus a windowed variant per family) on the device, in fp32 and bf16:
   changing future tokens never changes earlier logits, padding never changes real outputs,
   KV-cache decoding (dynamic and static cache) equals the full forward, and the device's
   fp32 logits equal the CPU's. Tolerances (max |Δlogit| on models whose logits are O(1)):
   fp32 1e-4 (TF32 off), bf16 5e-2 for the invariances and 1e-1 against the fp32 CPU reference.
2. ``sdpa``: the SDPA kernel the profiler sees for a training forward (no mask: ``is_causal``),
   a padded forward (boolean mask) and a static-cache decode step: flash / memory-efficient /
   cuDNN / math (on CPU: the CPU flash kernel or math).
3. ``train_run``: ``blocklab-train`` of a ~124M-parameter llama-like decoder (d 768, 12 layers,
   GQA 12/4, SwiGLU, vocab 32k, 1,024-token rows), bf16-mixed + ``torch.compile``, a few hundred
   steps; MFU from the run's own ``train/mfu`` (peak: ``--peak-flops`` or the detected GPU's
   datasheet number, ``blocklab.train.run.GPU_PEAK_FLOPS``).
4. ``train_speed``: the bare train step (forward + backward + AdamW, bf16 autocast) eager vs
   ``torch.compile``, interleaved rounds, tokens/s and the per-round ratio.
5. ``decode_speed``: greedy decoding at batch 1 and 8 (prompt 128, 256 new tokens): dynamic
   cache (eager), static cache eager, static cache compiled (``mode="reduce-overhead"``: CUDA
   graphs), tokens/s and the compiled / eager ratio; greedy tokens must agree.
6. ``fsdp``: ``blocklab-train trainer=fsdp`` on every visible GPU for a few steps (on CPU, in
   ``--dry``: ``trainer=model_parallel``, FSDP2 over gloo, the CPU stand-in).

Targets on one H100/H200-class GPU (reported as met / missed, never enforced): bf16 training MFU
>= 40 %, compiled train >= 1.2x eager, compiled static-cache decoding >= 2x eager at batch 1.
The exit status is 1 when a correctness check fails or a section crashes, else 0.

Usage::

    bash scripts/gpu_check.sh                 # on a GPU machine, <= 8 minutes
    bash scripts/gpu_check.sh --dry           # tiny sizes, runs anywhere (CI, CPU)
    bash scripts/gpu_check.sh --out DIR --peak-flops 989e12
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sizes:
    grid_d: int
    grid_layers: int
    model: list[str]  # blocklab-train model overrides of the training model
    seq: int
    batch: int
    train_steps: int  # the blocklab-train run
    bench_steps: int  # bare train steps per round
    rounds: int
    prompt: int
    new: int
    decode_batches: tuple[int, ...]
    fsdp_steps: int


FULL = Sizes(grid_d=128, grid_layers=2,
             model=["model=llama_tiny", "model.d_model=768", "model.n_layers=12",
                    "model.n_heads=12", "model.attention.n_kv_heads=4", "model.d_ff=2048",
                    "model.vocab_size=32000", "model.max_seq_len=1024"],
             seq=1024, batch=16, train_steps=300, bench_steps=10, rounds=3,
             prompt=128, new=256, decode_batches=(1, 8), fsdp_steps=20)
DRY = Sizes(grid_d=32, grid_layers=2,
            model=["model=llama_tiny", "model.d_model=32", "model.n_layers=1", "model.n_heads=4",
                   "model.attention.n_kv_heads=2", "model.d_ff=64", "model.vocab_size=512",
                   "model.max_seq_len=64"],
            seq=64, batch=2, train_steps=6, bench_steps=1, rounds=1,
            prompt=8, new=8, decode_batches=(1,), fsdp_steps=2)

TOL = {"float32": 1e-4, "bfloat16": 5e-2}
TOL_VS_CPU = {"float32": 1e-4, "bfloat16": 1e-1}
TARGETS = {"mfu": 0.40, "compiled_train": 1.2, "compiled_decode_b1": 2.0}


# ---------------------------------------------------------------------------- correctness


def grid(d: int, layers: int) -> list[tuple[str, object]]:
    from blocklab.config import (
        AttentionConfig,
        FamilyConfig,
        FFNConfig,
        MixerConfig,
        ModelConfig,
        NormConfig,
        PositionConfig,
    )

    positions = ["none", "sinusoidal", "learned", "t5_bias", "rope", "alibi"]
    heads = {"mha": None, "gqa": 2, "mqa": None}
    norms, ffns = ["layernorm", "rmsnorm"], ["gelu_mlp", "relu_mlp", "swiglu", "geglu"]
    out = []
    combos = list(itertools.product(["decoder", "encoder", "encoder_decoder"], positions))
    windowed = [("decoder", "rope"), ("encoder", "alibi"), ("encoder_decoder", "t5_bias")]
    for i, (family, pos) in enumerate(combos + windowed):
        window = 5 if i >= len(combos) else None
        attention = list(heads)[i % 3]
        cfg = ModelConfig(
            family=FamilyConfig(name=family,
                                n_encoder_layers=layers if family == "encoder_decoder" else None),
            norm=NormConfig(name=norms[i % 2]), ffn=FFNConfig(name=ffns[i % 4]),
            position=PositionConfig(name=pos),
            attention=AttentionConfig(name=attention, n_kv_heads=heads[attention]),
            mixer=MixerConfig(window=window, global_every=2 if window else 0),
            vocab_size=97, d_model=d, n_layers=layers, n_heads=4, d_ff=2 * d, max_seq_len=64)
        out.append((f"{family}-{pos}-{attention}{'-w5g2' if window else ''}", cfg))
    return out


def _forward(model, family: str, ids, valid=None, src=None, src_valid=None):
    if family == "encoder_decoder":
        return model(src, ids, valid=valid, source_valid=src_valid)
    return model(ids, valid=valid)


def check_variant(cfg, device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """Max |Δlogit| of each invariance on ``device`` in ``dtype`` (0 is exact)."""
    from blocklab.model import build_model

    torch.manual_seed(0)
    family = cfg.family.name
    cpu_model = build_model(cfg).eval()
    model = build_model(cfg).to(device=device, dtype=dtype).eval()
    model.load_state_dict({k: v.to(dtype) for k, v in cpu_model.state_dict().items()})
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 97, (2, 24), generator=g)
    src = torch.randint(4, 97, (2, 20), generator=g) if family == "encoder_decoder" else None

    def dev(t):
        return None if t is None else t.to(device)

    out: dict[str, float] = {}
    with torch.no_grad():
        full = _forward(model, family, dev(ids), src=dev(src)).float()
        ref = _forward(cpu_model, family, ids, src=src).float()
        out["vs_cpu_fp32"] = float((full.cpu() - ref).abs().max())
        if family != "encoder":  # causal target side: the future never leaks
            changed = ids.clone()
            changed[:, 16:] = torch.randint(4, 97, (2, 8), generator=g)
            other = _forward(model, family, dev(changed), src=dev(src)).float()
            out["future"] = float((other[:, :16] - full[:, :16]).abs().max())
        # padding: 5 pad tokens (left for a decoder, right otherwise) never change real rows
        pad = torch.zeros(2, 5, dtype=torch.long)
        left = family == "decoder"
        padded = torch.cat((pad, ids), 1) if left else torch.cat((ids, pad), 1)
        valid = torch.ones_like(padded, dtype=torch.bool)
        if left:
            valid[:, :5] = False
        else:
            valid[:, -5:] = False
        got = _forward(model, family, dev(padded), valid=dev(valid), src=dev(src)).float()
        real = got[:, 5:] if left else got[:, :-5]
        out["padding"] = float((real - full).abs().max())
        if src is not None:  # padded source
            psrc = torch.cat((src, pad), 1)
            svalid = torch.ones_like(psrc, dtype=torch.bool)
            svalid[:, -5:] = False
            got = _forward(model, family, dev(ids), src=dev(psrc), src_valid=dev(svalid)).float()
            out["source_padding"] = float((got - full).abs().max())
        if family != "encoder":
            for static in (False, True):
                out["static_cache" if static else "cache"] = _cache_error(
                    model, family, ids, src, full, device, static)
    return out


def _cache_error(model, family, ids, src, full, device, static: bool) -> float:
    prepared = model.prepare(source_ids=src.to(device)) if src is not None else {}
    cache = model.new_cache(ids.shape[0], 64, static=static)
    err, start = 0.0, 0
    for size in (12, 1, 3, 1, 1, 6):
        chunk = ids[:, start:start + size].to(device)
        pos = torch.arange(start, start + size, device=device).expand_as(chunk)
        logits = model.decode(chunk, positions=pos, valid=None, cache=cache, **prepared).float()
        err = max(err, float((logits - full[:, start:start + size]).abs().max()))
        start += size
    return err


def correctness(sizes: Sizes, device: torch.device) -> dict:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dtypes = [torch.float32, torch.bfloat16]
    rows, failures = [], []
    for name, cfg in grid(sizes.grid_d, sizes.grid_layers):
        for dtype in dtypes:
            key = str(dtype).removeprefix("torch.")
            errs = check_variant(cfg, device, dtype)
            ok = {k: v <= (TOL_VS_CPU if k == "vs_cpu_fp32" else TOL)[key] for k, v in errs.items()}
            rows.append({"variant": name, "dtype": key, "errors": errs, "pass": all(ok.values())})
            failures += [f"{name} {key} {k}: {errs[k]:.2e}" for k, good in ok.items() if not good]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    return {"tolerance": TOL, "tolerance_vs_cpu": TOL_VS_CPU, "variants": len(rows) // 2,
            "checks": sum(len(r["errors"]) for r in rows), "failures": failures,
            "pass": not failures, "rows": rows}


# ------------------------------------------------------------------------------ SDPA kernel

_KERNELS = [("flash", "flash"), ("efficient", "memory-efficient"), ("cudnn", "cudnn"),
            ("math", "math")]


def sdpa_kernel_of(fn: Callable[[], object]) -> str:
    """The attention kernel(s) the profiler records while ``fn`` runs."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        fn()
    names = {e.key.lower() for e in prof.key_averages()}
    found = sorted({label for key, label in _KERNELS
                    if any(key in n and ("attention" in n or "fmha" in n or "sdpa" in n
                                         or "flash" in n) for n in names)})
    return "+".join(found) or "unknown"


def sdpa(model, device: torch.device, dtype: torch.dtype, seq: int) -> dict:
    ids = torch.randint(4, 500, (2, seq), device=device)
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[0, :3] = False
    ctx = (torch.autocast(device.type, dtype=dtype) if device.type == "cuda"
           else torch.autocast("cpu", enabled=False))
    cache = model.new_cache(2, seq + 8, static=True)
    with torch.no_grad(), ctx:
        out = {"train_forward": sdpa_kernel_of(lambda: model(ids)),
               "padded_forward": sdpa_kernel_of(lambda: model(ids, valid=valid))}
        pos = torch.arange(seq, device=device).expand(2, seq)
        model.decode(ids, positions=pos, valid=None, cache=cache)
        step = ids[:, :1]
        out["static_decode_step"] = sdpa_kernel_of(lambda: model.decode(
            step, positions=torch.full((2, 1), seq, device=device), valid=None, cache=cache))
    return out


# ----------------------------------------------------------------------------- speed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def interleave(cases: dict[str, Callable[[], object]], rounds: int,
               device: torch.device) -> dict[str, list[float]]:
    for fn in cases.values():  # warm-up (compiles) untimed
        fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for k, fn in cases.items():
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[k].append(time.perf_counter() - t0)
    return times


def mmm(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def train_speed(model_cfg, sizes: Sizes, device: torch.device, peak: float | None) -> dict:
    from blocklab.model import build_model
    from blocklab.model.estimate import estimate

    dtype = torch.bfloat16 if device.type == "cuda" else None
    ids = torch.randint(4, model_cfg.vocab_size, (sizes.batch, sizes.seq), device=device)
    cases, models = {}, {}
    for name in ("eager", "compiled"):
        torch.manual_seed(0)
        model = build_model(model_cfg).to(device).train()
        fwd = torch.compile(model) if name == "compiled" else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        models[name] = model

        def step(fwd=fwd, opt=opt) -> None:
            for _ in range(sizes.bench_steps):
                opt.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    logits = fwd(ids)
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
                loss.backward()
                opt.step()

        cases[name] = step
    times = interleave(cases, sizes.rounds, device)
    tokens = sizes.batch * sizes.seq * sizes.bench_steps
    fpt = estimate(model_cfg, seq_len=sizes.seq).train_flops_per_token
    out = {"params": sum(p.numel() for p in models["eager"].parameters()),
           "batch": sizes.batch, "seq": sizes.seq, "flops_per_token": fpt}
    for name, ts in times.items():
        tps = [tokens / t for t in ts]
        out[name] = {"tokens_per_s": mmm(tps)}
        if peak:
            out[name]["mfu"] = statistics.median(tps) * fpt / peak
    out["compiled_over_eager"] = mmm([e / c for e, c in zip(times["eager"], times["compiled"])])
    return out


def decode_speed(model_cfg, sizes: Sizes, device: torch.device) -> dict:
    from blocklab.model import build_model
    from blocklab.model.generate import generate

    torch.manual_seed(0)
    model = build_model(model_cfg).to(device).eval()
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    out: dict = {"prompt": sizes.prompt, "new_tokens": sizes.new,
                 "dtype": str(model.embed.weight.dtype).removeprefix("torch.")}
    for batch in sizes.decode_batches:
        prompt = torch.randint(4, model_cfg.vocab_size, (batch, sizes.prompt), device=device)
        kinds = {"dynamic_eager": {}, "static_eager": {"static_cache": True},
                 "static_compiled": {"compile": True}}
        cases = {k: (lambda kw=kw, p=prompt: generate(model, p, max_new_tokens=sizes.new, **kw))
                 for k, kw in kinds.items()}
        tokens = {k: fn() for k, fn in cases.items()}
        times = interleave(cases, sizes.rounds, device)
        row = {k: {"tokens_per_s": mmm([batch * sizes.new / t for t in ts])}
               for k, ts in times.items()}
        row["compiled_over_eager"] = mmm([e / c for e, c in zip(times["dynamic_eager"],
                                                                 times["static_compiled"])])
        row["greedy_agreement"] = {k: float((t == tokens["dynamic_eager"]).float().mean())
                                   for k, t in tokens.items()}
        out[f"batch_{batch}"] = row
    return out


# ----------------------------------------------------------------------- training runs


def blocklab_train(overrides: list[str], out_root: Path, timeout: int) -> dict:
    """One ``blocklab-train`` run (a subprocess, as users run it); its metrics rows."""
    cmd = [sys.executable, "-c", "from blocklab.cli import train_cli; train_cli()",
           *overrides, f"out_root={out_root}", "experiment_name=gpu_check", "probes=none",
           "probes@checkpoint_probes=none", "trainer.progress_bar=false", "logger=csv"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    out = {"command": "blocklab-train " + " ".join(cmd[3:]), "returncode": r.returncode,
           "trainer": " ".join(o for o in overrides if o.startswith(("trainer=",
                                                                      "trainer.compile="))),
           "wall_s": time.perf_counter() - t0}
    if r.returncode:
        out["stderr_tail"] = r.stderr[-2000:]
        return out
    rows = []
    for path in sorted(out_root.glob("gpu_check/*/logs/version_*/metrics.csv")):
        with path.open() as f:
            rows += list(csv.DictReader(f))
    later = rows[len(rows) // 2:]  # after compilation and warm-up

    def med(key: str) -> float | None:
        xs = [float(r[key]) for r in later if r.get(key)]
        return statistics.median(xs) if xs else None

    steps = [o.split("=", 1)[1] for o in overrides if o.startswith("trainer.max_steps=")]
    out |= {"steps": int(steps[-1]), "metric_rows": len(rows),
            "mfu": med("train/mfu"), "tokens_per_s": med("train/tokens_per_s"),
            "last_loss": next((float(r["train/loss"]) for r in reversed(rows)
                               if r.get("train/loss")), None)}
    return out


def train_overrides(sizes: Sizes, dry: bool, peak: float | None,
                    trainer: list[str] | None = None) -> list[str]:
    # the dry run compiles too (trainer=gpu does): the CLI's compiled path runs in CI
    trainer = trainer or (["trainer=cpu", "trainer.threads=1", "trainer.compile=true"] if dry
                          else ["trainer=gpu"])
    return [*trainer, *sizes.model, f"data.seq_len={sizes.seq}", f"data.min_len={sizes.seq}",
            f"data.batch_size={sizes.batch}", "data.val_batches=1", "data.curriculum=[]",
            "data.num_workers=0" if dry else "data.num_workers=4",
            f"trainer.max_steps={sizes.train_steps}", f"trainer.ckpt_every_steps={sizes.train_steps}",
            f"trainer.val_every_steps={sizes.train_steps}",
            f"trainer.log_every_steps={max(1, sizes.train_steps // 30)}",
            *([f"trainer.peak_flops={peak}"] if peak else [])]


# --------------------------------------------------------------------------------- report


def table(report: dict) -> str:
    lines = [f"GPU check: {report['device']['name']} (torch {report['device']['torch']}, "
             f"{'dry run, tiny sizes' if report['dry'] else 'full sizes'})", "",
             "| check | result | target |", "|---|---|---|"]

    def add(check: str, result: str, target: str = "") -> None:
        lines.append(f"| {check} | {result} | {target} |")

    c = report.get("correctness")
    if c:
        add("correctness grid (future, padding, cache, static cache, vs CPU; fp32 + bf16)",
            f"{c['variants']} variants, {c['checks']} checks, "
            f"{'all pass' if c['pass'] else str(len(c['failures'])) + ' FAIL'}",
            f"fp32 ≤ {TOL['float32']:g}, bf16 ≤ {TOL['bfloat16']:g}")
    s = report.get("sdpa")
    if s:
        add("SDPA kernel: train / padded / decode step",
            f"{s['train_forward']} / {s['padded_forward']} / {s['static_decode_step']}")
    t = report.get("train_run")
    if t and t.get("returncode") == 0:
        mfu = t.get("mfu")
        add(f"blocklab-train {t['trainer']}, {t['steps']} steps",
            f"MFU {mfu:.1%}, {t['tokens_per_s']:,.0f} tok/s, loss {t['last_loss']:.3f}"
            if mfu is not None else f"{t['tokens_per_s']:,.0f} tok/s (no peak: no MFU)",
            f"MFU ≥ {TARGETS['mfu']:.0%}")
    elif t:
        add("blocklab-train", f"FAILED (exit {t['returncode']})")
    sp = report.get("train_speed")
    if sp:
        r = sp["compiled_over_eager"]
        add(f"train step compiled / eager ({sp['params'] / 1e6:.1f}M params)",
            f"{r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f}); eager "
            f"{sp['eager']['tokens_per_s']['median']:,.0f} tok/s",
            f"≥ {TARGETS['compiled_train']}x")
    d = report.get("decode_speed")
    if d:
        for key, row in d.items():
            if not key.startswith("batch_"):
                continue
            r = row["compiled_over_eager"]
            agree = min(row["greedy_agreement"].values())
            add(f"decode {key.replace('_', ' ')}: static compiled / eager",
                f"{r['median']:.2f}x; eager {row['dynamic_eager']['tokens_per_s']['median']:,.0f}"
                f" tok/s, compiled {row['static_compiled']['tokens_per_s']['median']:,.0f} tok/s;"
                f" greedy agreement {agree:.0%}",
                f"≥ {TARGETS['compiled_decode_b1']}x" if key == "batch_1" else "")
    f = report.get("fsdp")
    if f:
        add(f"FSDP ({f.get('strategy')}, {f.get('devices')} device(s))",
            "ok" if f.get("returncode") == 0 else f"FAILED (exit {f.get('returncode')})")
    for name, err in report.get("errors", {}).items():
        add(f"{name}", f"CRASHED: {err.splitlines()[-1][:120]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry", action="store_true", help="tiny sizes; runs on CPU (CI)")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default outputs/gpu_check/<time>)")
    p.add_argument("--peak-flops", type=float, default=None,
                   help="MFU denominator (default: the detected GPU's datasheet number)")
    p.add_argument("--only", nargs="*", default=None,
                   choices=["correctness", "sdpa", "train_run", "train_speed", "decode_speed",
                            "fsdp"])
    a = p.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    cuda = torch.cuda.is_available() and not a.dry
    if not cuda and not a.dry:
        print("gpu_check: no CUDA device visible to torch; run with --dry for the CPU smoke "
              "run, or use a Python whose torch has CUDA (PYTHON=... bash scripts/gpu_check.sh)",
              file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    sizes = DRY if a.dry else FULL
    if a.dry:
        torch.set_num_threads(1)
        _dry_compiles()
    out_dir = a.out or ROOT / "outputs" / "gpu_check" / time.strftime("%Y-%m-%d_%H-%M-%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    from blocklab.config import model_config
    from blocklab.train.run import device_peak_flops

    name = torch.cuda.get_device_name() if cuda else "CPU (dry run)"
    peak = a.peak_flops or (device_peak_flops(name, "bf16-mixed") if cuda else None)
    report: dict = {"dry": a.dry, "sizes": asdict(sizes), "errors": {},
                    "device": {"name": name, "torch": torch.__version__,
                               "cuda": torch.version.cuda, "count": torch.cuda.device_count()
                               if cuda else 0, "peak_flops": peak}}
    model_cfg = model_config(_compose_model(sizes.model))
    t_start = time.perf_counter()
    sections: dict[str, Callable[[], object]] = {
        "correctness": lambda: correctness(sizes, device),
        "sdpa": lambda: _sdpa(model_cfg, device, sizes),
        "train_run": lambda: blocklab_train(train_overrides(sizes, a.dry, peak),
                                            Path(tempfile.mkdtemp(dir=out_dir)), 1800),
        "train_speed": lambda: train_speed(model_cfg, sizes, device, peak),
        "decode_speed": lambda: decode_speed(model_cfg, sizes, device),
        "fsdp": lambda: _fsdp(sizes, a.dry, out_dir),
    }
    for section, fn in sections.items():
        if a.only and section not in a.only:
            continue
        t0 = time.perf_counter()
        print(f"gpu_check: {section} ...", file=sys.stderr, flush=True)
        try:
            report[section] = fn()
        except Exception:  # a crashed section is reported, the others still run
            report["errors"][section] = traceback.format_exc()
            print(report["errors"][section], file=sys.stderr)
        print(f"gpu_check: {section} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr,
              flush=True)
    report["elapsed_s"] = time.perf_counter() - t_start
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    text = table(report)
    (out_dir / "gpu_check.md").write_text(text)
    print(text)
    print(f"wrote {out_dir / 'gpu_check.json'} and gpu_check.md ({report['elapsed_s']:.0f} s)")
    failed = report["errors"] or not report.get("correctness", {"pass": True})["pass"] or any(
        report.get(k, {}).get("returncode", 0) for k in ("train_run", "fsdp"))
    return 1 if failed else 0


def _dry_compiles() -> None:
    """``--dry``: this process's own ``torch.compile`` calls (train_speed's model, decode_speed's
    static step) capture with dynamo and split forward / backward with AOTAutograd
    (``backend="aot_eager"``) without inductor's C++ code generation: on a CPU the dry run
    checks the sections' code, not their speed, and took most of its time compiling kernels
    of tiny models. Inductor's kernels are checked on reference shapes by
    tests/model/test_compile.py, and train_run's ``blocklab-train trainer.compile=true`` (a
    process of its own) still compiles with inductor: the CLI's compiled path."""
    compile_ = torch.compile

    def dry(model=None, **kw):
        kw.pop("mode", None)  # a mode (reduce-overhead on CUDA) is inductor's
        return compile_(model, **{**kw, "backend": "aot_eager"})

    torch.compile = dry


def _compose_model(overrides: list[str]) -> object:
    from hydra import compose, initialize_config_dir

    from blocklab.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("estimate", overrides=overrides).model


def _sdpa(model_cfg, device: torch.device, sizes: Sizes) -> dict:
    from blocklab.model import build_model

    model = build_model(model_cfg).to(device).eval()
    return sdpa(model, device, torch.bfloat16, min(sizes.seq, 256))


def _fsdp(sizes: Sizes, dry: bool, out_dir: Path) -> dict:
    devices = 1 if dry else torch.cuda.device_count()
    trainer = (["trainer=model_parallel", "trainer.devices=1", "trainer.threads=1"] if dry
               else ["trainer=fsdp", f"trainer.devices={devices}"])
    steps = sizes.fsdp_steps
    overrides = [*train_overrides(sizes, dry, None, trainer), f"trainer.max_steps={steps}",
                 f"trainer.ckpt_every_steps={steps}", f"trainer.val_every_steps={steps}",
                 "trainer.log_every_steps=1"]
    r = blocklab_train(overrides, Path(tempfile.mkdtemp(dir=out_dir)), 900)
    return {**r, "strategy": trainer[0].split("=")[1], "devices": devices}


if __name__ == "__main__":
    sys.exit(main())

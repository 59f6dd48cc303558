"""Data at scale, measured: preparation throughput against a plain tokenizer floor, peak memory
of preparation and of training at growing corpus sizes, time to the first training step on a
prepared corpus, and the loader's token rate against what the model consumes.

Corpora: the 42 plays of the ``shakespeare`` package (5.06 MB) copied until the size is
reached; copy *k* of a play keeps its paragraphs but in an order shuffled with seed *k* (so no
two copies are the same file, and BPE sees realistic text), one file per play and copy.

    .venv/bin/python scripts/bench_data.py                  # 5, 50, 500 MB (about 15 min on 2 cores)
    .venv/bin/python scripts/bench_data.py --sizes 5 50     # smaller
    .venv/bin/python scripts/bench_data.py --quick          # a < 60 s smoke (tiny corpora)

The floor is the same tokenizer's ``encode_batch`` over the same documents in one process, with
one thread (``TOKENIZERS_PARALLELISM=false``) and no writing: per-core, what tokenization alone
costs. Ratios are measured side by side in one run; absolute times are context only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def make_corpus(dest: Path, megabytes: float) -> tuple[Path, int]:
    """Shakespeare's plays copied (paragraph order shuffled per copy) to ``megabytes``."""
    from blocklab.data.sources import shakespeare_files

    plays = [(f.stem, f.read_text(encoding="utf-8", errors="replace").split("\n\n"))
             for f in shakespeare_files()]
    target, size, k = int(megabytes * 1e6), 0, 0
    dest.mkdir(parents=True, exist_ok=True)
    while size < target:
        rng = random.Random(k)
        for name, paragraphs in plays:
            order = paragraphs[:]
            if k:
                rng.shuffle(order)
            text = "\n\n".join(order)
            (dest / f"{k:04d}-{name}.txt").write_text(text, encoding="utf-8")
            size += len(text.encode())
            if size >= target:
                break
        k += 1
    return dest, size


def run_json(code: str, env: dict[str, str] | None = None) -> dict:
    """Run Python ``code`` (which prints one JSON line last) in a fresh process."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    if r.returncode:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


PREPARE = """
import json, resource, time, dataclasses
from blocklab.config import DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.data.prepare import prepare
cfg = DataConfig(name=DataName.text, files=[{files!r}], cache_dir={cache!r}, num_proc={procs},
                 seq_len=256)
tok = TokenizerConfig(name=TokenizerName.file, path={tokenizer!r})
t0 = time.perf_counter()
p = prepare(cfg, tok, log=lambda s: None)
dt = time.perf_counter() - t0
print(json.dumps({{"seconds": dt, "bytes": p.meta["bytes"], "tokens": p.meta["tokens"],
  "rss_main_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
  "rss_workers_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}}))
"""

FLOOR = """
import json, time
from tokenizers import Tokenizer
from blocklab.config import DataConfig, DataName
from blocklab.data.sources import ReadStats, plan, read_documents, resolve_files
cfg = DataConfig(name=DataName.text, files=[{files!r}])
tok = Tokenizer.from_file({tokenizer!r})
docs = [d for item in plan(cfg, resolve_files(cfg)) for d in read_documents(item, cfg, ReadStats())]
nbytes = sum(len(d.encode()) for d in docs)
t0 = time.perf_counter()
tokens = sum(len(e.ids) for i in range(0, len(docs), 64)
             for e in tok.encode_batch(docs[i:i + 64], add_special_tokens=False))
dt = time.perf_counter() - t0
print(json.dumps({{"seconds": dt, "bytes": nbytes, "tokens": tokens + 2 * len(docs)}}))
"""

LOADER = """
import json, time
from blocklab.config import DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.data.streams import build_streams
from blocklab.objectives import build_objective
cfg = DataConfig(name=DataName.text, files=[{files!r}], cache_dir={cache!r}, seq_len=256,
                 batch_size=16)
s = build_streams(cfg, TokenizerConfig(name=TokenizerName.file, path={tokenizer!r}))
obj = build_objective("decoder", cfg, s.specials)
n, tokens, t0 = 200, 0, time.perf_counter()
for b in range(n):
    batch = obj.collate([s.train(b * 16 + i, b) for i in range(16)])
    tokens += batch["input_ids"].numel()
print(json.dumps({{"tokens_per_s": tokens / (time.perf_counter() - t0)}}))
"""


def train_run(files: Path, cache: Path, tokenizer: Path, run_dir: Path, *, steps: int,
              first_step_only: bool = False) -> dict:
    """A ``model=llama_tiny`` training run on the prepared corpus: wall seconds, peak RSS
    (the process and what it started), tokens/s it logged."""
    env = {**os.environ, "BLOCKLAB_DATA_CACHE": str(cache)}
    if first_step_only:  # stop (SIGKILL, no teardown) as step 1 starts: step 0 is done
        env["BLOCKLAB_FAULT"] = "SIGKILL@step:1"
    cmd = [str(BIN / "blocklab-train"), "model=llama_tiny", "data=text_files",
           f"data.files=[{files}]", "tokenizer=file", f"tokenizer.path={tokenizer}",
           f"trainer.max_steps={steps}", "trainer.val_every_steps=1000000",
           "trainer.ckpt_every_steps=1000000", "trainer.log_every_steps=5", "probes=none",
           "checkpoint_probes.enabled=false", "trainer.progress_bar=false", "logger=csv",
           f"run_dir={run_dir}"]
    # A fresh wrapper process per run: its RUSAGE_CHILDREN is this run's peak RSS alone.
    wrapper = ("import json, resource, subprocess, sys; r = subprocess.run(sys.argv[1:], "
               "capture_output=True, text=True); print(json.dumps({'rc': r.returncode, "
               "'rss': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
               "'err': r.stderr[-3000:]}))")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True,
                       env=env)
    seconds = time.perf_counter() - t0
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if out["rc"] not in (0, -9):
        raise RuntimeError(out["err"])
    rate = None
    for f in sorted(run_dir.glob("logs/version_*/metrics.csv")):
        import csv

        rates = [float(row["train/tokens_per_s"]) for row in csv.DictReader(f.open())
                 if row.get("train/tokens_per_s")]
        rate = rates[-1] if rates else rate
    return {"seconds": seconds, "rss_mb": out["rss"] / 1024, "tokens_per_s": rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[5, 50, 500])
    ap.add_argument("--quick", action="store_true", help="tiny corpora: a smoke run")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--floor-max-mb", type=float, default=50,
                    help="measure the floor at sizes up to this (it holds the text in memory)")
    args = ap.parse_args()
    sizes = [0.3, 1.0] if args.quick else args.sizes
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_data-"))
    print(f"scratch {work}; cores {os.cpu_count()}", flush=True)
    tokenizer = work / "bpe4096"
    # One tokenizer for every measurement: a BPE (vocab 4096) trained on the plays once.
    if not (tokenizer / "tokenizer.json").is_file():
        from blocklab.config import TokenizerConfig, TokenizerName
        from blocklab.data.sources import shakespeare_files
        from blocklab.data.tokenizer import train_bpe

        tok = train_bpe(TokenizerConfig(name=TokenizerName.bpe, vocab_size=4096),
                        (f.read_text() for f in shakespeare_files()))
        tokenizer.mkdir(parents=True, exist_ok=True)
        tok.save(str(tokenizer / "tokenizer.json"))
    results = []
    for mb in sizes:
        corpus, size = make_corpus(work / f"corpus-{mb:g}MB", mb)
        row: dict = {"target_mb": mb, "mb": size / 1e6}
        print(f"\n== {size / 1e6:.1f} MB ({len(list(corpus.iterdir()))} files)", flush=True)
        env = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
        if mb <= args.floor_max_mb:
            row["floor"] = run_json(FLOOR.format(files=str(corpus),
                                                 tokenizer=str(tokenizer / "tokenizer.json")),
                                    env)
            print(f"floor (encode_batch, 1 process, 1 thread): "
                  f"{row['floor']['bytes'] / row['floor']['seconds'] / 1e6:.2f} MB/s", flush=True)
        for procs in (1, 2):
            cache = work / f"cache-{mb:g}-{procs}"
            shutil.rmtree(cache, ignore_errors=True)
            r = run_json(PREPARE.format(files=str(corpus), cache=str(cache), procs=procs,
                                        tokenizer=str(tokenizer)))
            row[f"prepare_{procs}"] = r
            print(f"prepare, {procs} process(es): {r['bytes'] / r['seconds'] / 1e6:.2f} MB/s, "
                  f"{r['tokens'] / r['seconds']:,.0f} tokens/s, peak RSS main "
                  f"{r['rss_main_mb']:.0f} MB, workers {r['rss_workers_mb']:.0f} MB", flush=True)
        cache = work / f"cache-{mb:g}-2"
        steps = 10 if args.quick else 30
        row["train"] = train_run(corpus, cache, tokenizer, work / f"run-{mb:g}", steps=steps)
        row["first_step"] = train_run(corpus, cache, tokenizer, work / f"first-{mb:g}", steps=5,
                                      first_step_only=True)
        row["loader"] = run_json(LOADER.format(files=str(corpus), cache=str(cache),
                                               tokenizer=str(tokenizer)))
        t = row["train"]
        print(f"train (llama_tiny, {steps} steps): peak RSS {t['rss_mb']:.0f} MB, "
              f"{t['tokens_per_s'] or 0:,.0f} tokens/s; first step after "
              f"{row['first_step']['seconds']:.1f} s; loader "
              f"{row['loader']['tokens_per_s']:,.0f} tokens/s", flush=True)
        results.append(row)
    print(summary(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def summary(results: list[dict]) -> str:
    lines = ["", "| corpus | prepare MB/s (1 proc / 2 procs) | vs floor (1 / 2) | tokens/s (2 procs) "
             "| prepare peak RSS main / worker | train peak RSS | first step | loader / model tokens/s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        p1, p2 = r["prepare_1"], r["prepare_2"]
        rate1, rate2 = p1["bytes"] / p1["seconds"] / 1e6, p2["bytes"] / p2["seconds"] / 1e6
        floor = r.get("floor")
        vs = "–"
        if floor:
            f = floor["bytes"] / floor["seconds"] / 1e6
            vs = f"{rate1 / f:.2f} / {rate2 / f:.2f}"
        model = r["train"]["tokens_per_s"]
        ratio = f"{r['loader']['tokens_per_s'] / model:.0f}×" if model else "–"
        lines.append(
            f"| {r['mb']:.0f} MB | {rate1:.2f} / {rate2:.2f} | {vs} | "
            f"{p2['tokens'] / p2['seconds']:,.0f} | {p2['rss_main_mb']:.0f} / "
            f"{p2['rss_workers_mb']:.0f} MB | {r['train']['rss_mb']:.0f} MB | "
            f"{r['first_step']['seconds']:.1f} s | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

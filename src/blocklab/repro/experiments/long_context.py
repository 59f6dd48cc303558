"""The ``long_context`` experiment: every long-context strategy on the same BABILong-style task
(Kuratov et al. 2024, arXiv 2406.10149) — decoders of one size and one training budget that
differ only in how they reach back, trained on ``data.name=babilong`` (bAbI qa1 hidden in the
Shakespeare text) at ``L`` tokens and measured on held-out items at ``L, 2L, 4L, 8L, 16L``.

Arms: global softmax (rotary positions), a sliding window, sinks + window (StreamingLLM, arXiv
2309.17453), chunked layers with a global layer (Llama 4), Based (Taylor linear attention beside
a sliding window, arXiv 2402.18668), a selective SSM (Mamba, arXiv 2312.00752), a linear/softmax
hybrid, Transformer-XL memory (arXiv 1901.02860), recurrent memory tokens (RMT, arXiv
2207.06881) and a retrieval memory (Memorizing Transformers, arXiv 2203.08913). The last three
read a document segment by segment (``data.segment_mode=split``) and are measured through the
segment objective's evaluation carry (:class:`~blocklab.objectives.SegmentedLM`).

Measured per arm: forced-choice accuracy over the task's labels (each label's total
log-likelihood after the training prompt, :data:`blocklab.data.babilong.PROMPT`), the decode
state at ``16L`` (``blocklab-estimate``'s cost model), training tokens/s (the run's logged
``train/tokens_per_s``, median) and decoding tokens/s (greedy steps after a ``16L`` prompt,
one thread).
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from blocklab.data import synthetic as syn
from blocklab.repro import checks as ck
from blocklab.repro import measure as ms
from blocklab.repro.protocol import SIZES, Arm, Experiment, Protocol, swap

# per size: L (training tokens), the multiples measured, held-out items per length, facts per
# story, window W / chunk C / segment S (tokens), steps, learning rate, batch, the model, and
# the arms trained. quick is sized for CI (about a minute of CPU for its runs, checks and break).
SETTINGS: dict[str, dict[str, Any]] = {
    "quick": {"length": 64, "multiples": (1, 16), "n": 16, "facts": 2, "window": 16,
              "segment": 32, "steps": 100, "lr": 3e-3, "batch": 16, "layers": 2, "width": 64,
              "vocab": 2048, "decode": 8, "arms": ("global", "window", "sinks")},
    "full": {"length": 128, "multiples": (1, 2, 4, 8, 16), "n": 48, "facts": 2, "window": 32,
             "segment": 64, "steps": 400, "lr": 3e-3, "batch": 16, "layers": 2, "width": 64,
             "vocab": 2048, "decode": 64,
             "arms": ("global", "window", "selective", "based", "sinks", "chunked", "hybrid",
                      "xl", "rmt", "retrieval")},
}
TASK = "qa1"
SALT = "repro:long_context"
N_SINKS = 4
MEMORY_TOKENS = 8
NAMES = {"global": "global softmax", "window": "sliding window", "sinks": "sinks + window",
         "chunked": "chunked + global", "based": "Based", "selective": "selective SSM",
         "hybrid": "linear/softmax hybrid", "xl": "XL memory", "rmt": "memory tokens",
         "retrieval": "retrieval memory"}
SEGMENTED = ("xl", "rmt", "retrieval")
STATE = "state bytes at 16L"
STATE_RATIO = "state bytes at 16L / at L"
TRAIN_TPS = "training tokens/s"
DECODE_TPS = "decoding tokens/s"


def chance(task: str = TASK) -> float:
    from blocklab.data.babi import TASK_LABELS

    return 1 / len(TASK_LABELS[task])


def metric(k: int) -> str:
    return f"accuracy at {k}L"


def _strategy(key: str, s: dict[str, Any]) -> tuple[str, ...]:
    """The overrides that make arm ``key`` (on top of :func:`_base`)."""
    w, seg, n = s["window"], s["segment"], s["length"]
    split = ("data.segment_mode=split", f"data.seq_len={seg}", f"data.doc_len={n}",
             f"model.max_seq_len={seg}")
    return {
        "global": (),
        "window": (f"model.mixer.window={w}",),
        "sinks": (f"model.mixer.window={w - N_SINKS}", f"model.mixer.sinks={N_SINKS}"),
        "chunked": (f"model.mixer.attention_chunk={w}", "model.mixer.global_every=2",
                    "model.mixer.global_rope=false"),
        # Based: Taylor-map linear attention (with its short convolution) and a sliding window
        "based": ("model/mixer=linear", "model.mixer.pattern=[linear,softmax]",
                  "model.mixer.feature_map=taylor", "model.mixer.feature_dim=8",
                  "model.mixer.short_conv=3", f"+model.mixer.window={w}"),
        "selective": ("model/mixer=ssm", "model.mixer.d_state=8", "model/position=none"),
        "hybrid": ("model/mixer=linear", "model.mixer.pattern=[linear,softmax]",
                   "model.mixer.feature_map=elu"),
        "xl": (*split, f"model.mixer.mem_len={seg}"),
        "rmt": (*split, f"model.memory_tokens={MEMORY_TOKENS}"),
        "retrieval": (*split, "model/mixer=memorizing", "model.mixer.pattern=[softmax,memorizing]",
                      "model.mixer.knn_top_k=8", f"model.mixer.knn_memory={16 * n}"),
    }[key]


def _base(s: dict[str, Any]) -> tuple[str, ...]:
    n, steps = s["length"], s["steps"]
    first = s["segment"]  # the curriculum: one segment's length first (retrieval needs it)
    return ("data=babilong", "tokenizer=bpe", f"tokenizer.vocab_size={s['vocab']}",
            "data.haystack=shakespeare", f"data.babilong_tasks=[{TASK}]",
            f"data.babilong_facts={s['facts']}", f"data.seq_len={n}", f"data.min_len={first}",
            f"data.val_len={n}", f"data.val_tasks=[{TASK}]",
            f"data.curriculum=[[0,{first}],[{steps // 4},{n}]]",
            f"data.batch_size={s['batch']}", "model/position=rope", f"model.d_model={s['width']}",
            "model.n_heads=4", f"model.d_ff={2 * s['width']}", f"model.n_layers={s['layers']}",
            f"model.max_seq_len={n}", "trainer.bptt=0", f"optim.lr={s['lr']}",
            "optim.weight_decay=0.1", f"schedule.warmup_steps={max(20, steps // 20)}",
            f"trainer.max_steps={steps}", f"trainer.val_every_steps={steps // 4}",
            f"trainer.ckpt_every_steps={steps}", "trainer.log_every_steps=10")


def arms(size: str) -> tuple[Arm, ...]:
    s = SETTINGS[size]
    return tuple(Arm(NAMES[k], (*_base(s), *_strategy(k, s))) for k in s["arms"])


def checks(size: str) -> tuple[ck.Check, ...]:
    s = SETTINGS[size]
    top = metric(s["multiples"][-1])
    bounded = [NAMES[k] for k in s["arms"] if k not in ("global", "hybrid", "chunked")]
    out: list[ck.Check] = [ck.AtMost(a, STATE_RATIO, 1.0) for a in bounded]
    out.append(ck.AtLeast(NAMES["global"], STATE_RATIO, s["multiples"][-1] * 0.9))
    if size == "full":
        # a bounded window keeps the last W tokens: at 16L the facts are almost never in them
        out += [ck.AtChance(NAMES[k], top, chance=chance()) for k in ("window", "sinks")]
        # the recurrent and memory strategies hold accuracy past L where the window cannot
        out += [ck.Beats(NAMES[k], top, other=NAMES["window"])
                for k in ("selective", "rmt", "retrieval") if k in s["arms"]]
    return tuple(out)


@dataclass
class Items:
    """Held-out items of one length: per item the prompt's tokens, each label's tokens and
    the index of the answer among the labels."""

    prompts: list[list[int]]
    labels: list[list[int]]
    answers: list[int]


@functools.lru_cache(maxsize=4)
def _reader(run_dir: str) -> tuple[Any, Any]:
    """A trained arm's text run (model, streams, objective) and its training config."""
    from blocklab import checkpoint as ckpt
    from blocklab.repro import text as tx

    return tx.load_text(run_dir), ckpt.read(run_dir).config


@functools.lru_cache(maxsize=2)
def _held_out_sentences(haystack: str) -> list[str]:
    """The haystack's validation sentences (its last 10 %: no run trains on them)."""
    from blocklab.data.babilong_train import haystack_documents, split_sentences

    return split_sentences(haystack_documents(haystack))[1]


def held_out(data: Any, tokenizer: str, bos: int, *, length: int, n: int,
             seed: int = ms.EVAL_SEED) -> Items:
    """``n`` items of ``length`` tokens (prompt + answer, BOS included) built as the run's
    training data builds its examples (``data``: its data config; ``tokenizer``: its
    tokenizer as JSON) — the same prompt, story size and tokens — over the held-out part of
    the haystack, from ``seed`` (no run trains on it)."""
    from tokenizers import Tokenizer

    from blocklab.data.babi import TASK_LABELS
    from blocklab.data.babilong import ANSWER
    from blocklab.data.babilong_train import BabilongStream

    val = _held_out_sentences(data.haystack)
    tok = Tokenizer.from_str(tokenizer)

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    stream = BabilongStream(data, encode, bos, val, SALT)
    labels = list(TASK_LABELS[TASK])
    out = Items([], [encode(ANSWER.format(answer=x)) for x in labels], [])
    for i in range(n):
        e = stream.example(TASK, length, syn.example_rng(seed, i, f"{SALT}:{length}"))
        cut = e.targets.index(True)
        out.prompts.append(e.tokens[:cut])
        out.answers.append(labels.index(e.meta["answer"]))
    return out


@torch.no_grad()
def forced_choice(objective: Any, model: torch.nn.Module, items: Items, *,
                  pad: int, batch_size: int = 8) -> ms.Tally:
    """Whether each item's answer has the highest total log-likelihood of the labels after
    its prompt. One row per distinct ``prompt + label[:-1]`` (labels of one token share the
    prompt's row: one row per item), right-padded (causal: no real token sees a pad), read by
    the objective's ``logits`` (segment mode: segment by segment through its evaluation
    carry, as training read it)."""
    tally = ms.Tally()
    for start in range(0, len(items.prompts), batch_size):
        rows: list[list[int]] = []
        where: list[list[int]] = []  # per item, per label: its row
        for p in items.prompts[start:start + batch_size]:
            mine = []
            for lab in items.labels:
                row = p + lab[:-1]
                if row not in rows:
                    rows.append(row)
                mine.append(rows.index(row))
            where.append(mine)
        ids = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, :len(row)] = torch.tensor(row)
        logp = objective.logits(model, {"input_ids": ids}).float().log_softmax(-1)
        for k, mine in enumerate(where):
            n = len(items.prompts[start + k])
            scores = [sum(float(logp[r, n - 1 + j, t]) for j, t in enumerate(lab))
                      for r, lab in zip(mine, items.labels)]
            best = max(range(len(scores)), key=scores.__getitem__)
            tally.add([best == items.answers[start + k]])
    return tally


@torch.no_grad()
def decode_rate(objective: Any, model: torch.nn.Module, prompt: list[int], steps: int,
                repeats: int = 3) -> float:
    """Greedy decoding tokens/s after ``prompt`` on one thread: the objective's ``greedy``
    with ``1 + steps`` new tokens against 1 (the prompt's prefill and the first token timed
    apart), the fastest of ``repeats``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            objective.greedy(model, [prompt], 1)
            t1 = time.perf_counter()
            objective.greedy(model, [prompt], 1 + steps)
            t2 = time.perf_counter()
            best = min(best, (t2 - t1) - (t1 - t0))
    finally:
        torch.set_num_threads(threads)
    return steps / max(best, 1e-9)


def training_rate(run_dir: Path) -> float:
    """The median of the run's logged ``train/tokens_per_s`` (every position of every row,
    between logged rows; the first row, with start-up, left out)."""
    from blocklab.train.metrics import read_rows

    values = [float(r["train/tokens_per_s"]) for r in read_rows(run_dir)
              if r.get("train/tokens_per_s") not in (None, "")]
    return statistics.median(values[1:] or values) if values else float("nan")


def _measure_for(size: str):
    s = SETTINGS[size]
    n = s["length"]

    def measure(run_dir: Path, arm: Arm) -> dict[str, ms.Tally]:
        from blocklab.model.estimate import state_bytes

        run, config = _reader(str(run_dir))
        model, objective, specials = run.model.eval(), run.objective, run.streams.specials
        out: dict[str, ms.Tally] = {}
        for k in s["multiples"]:  # the last, 16L, also gives the decoding prompt
            items = held_out(config.data, run.streams.tokenizer, specials.bos, length=k * n,
                             n=s["n"])
            out[metric(k)] = forced_choice(objective, model, items, pad=specials.pad)
        m, top = config.model, s["multiples"][-1] * n
        # a segment-mode model carries one segment's keys plus its memories (counted whole)
        seg = config.data.seq_len if config.data.segment_mode != "none" else top
        big = state_bytes(m, batch=1, seq_len=min(top, seg), bytes_per_value=2)
        out[STATE] = ms.Scalar(float(big))
        out[STATE_RATIO] = ms.Scalar(big / state_bytes(m, batch=1, seq_len=min(n, seg),
                                                       bytes_per_value=2))
        out[TRAIN_TPS] = ms.Scalar(training_rate(run_dir))
        out[DECODE_TPS] = ms.Scalar(decode_rate(objective, model, items.prompts[0], s["decode"]))
        return out

    return measure


def figure(exp: Experiment, outcome: Any, out: Path) -> dict[str, str]:
    """``long_context.png``: accuracy against the measured length per strategy (pooled over
    seeds, Wilson 95% intervals), and accuracy at the longest length against the decode state
    there; the chance line in both."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from blocklab.eval.aggregate import wilson_interval

    s = SETTINGS[outcome.size]
    top = s["multiples"][-1]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    colours = plt.get_cmap("tab10")
    for i, (arm, metrics) in enumerate(outcome.measurements.items()):
        ks, ys, lo, hi = [], [], [], []
        for k in s["multiples"]:
            ts = metrics.get(metric(k))
            if not ts:
                continue
            hits, trials = sum(t["hits"] for t in ts), sum(t["trials"] for t in ts)
            a, b = wilson_interval(hits, trials)
            ks.append(k)
            ys.append(hits / trials)
            lo.append(ys[-1] - a)
            hi.append(b - ys[-1])
        style = "--" if any(key in SEGMENTED for key, name in NAMES.items() if name == arm) else "-"
        left.errorbar(ks, ys, yerr=[lo, hi], marker="o", ls=style, capsize=2, label=arm,
                      color=colours(i % 10))
        if metrics.get(metric(top)) and metrics.get(STATE):
            x = statistics.mean(t["rate"] for t in metrics[STATE])
            right.errorbar([x], [ys[-1]], yerr=[[lo[-1]], [hi[-1]]], marker="o", capsize=2,
                           color=colours(i % 10))  # colours as the left panel's legend
    for ax in (left, right):
        ax.axhline(chance(), color="grey", lw=0.8, ls=":")
        ax.set_ylim(-0.02, 1.02)
    left.set_xscale("log", base=2)
    left.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}L"))
    left.set_xlabel(f"context length (L = {s['length']} tokens, the training length)")
    left.set_ylabel(f"forced-choice accuracy ({TASK}; chance {chance():.2f})")
    left.legend(fontsize=7, loc="best")
    right.set_xscale("log")
    right.set_xlabel(f"decode state at {top}L (bytes, bf16)")
    right.set_title(f"accuracy at {top}L against the state kept (colours as left)", fontsize=9)
    fig.tight_layout()
    path = out / "long_context.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {"figure": str(path)}


def make(size: str) -> Experiment:
    q, f = SETTINGS["quick"], SETTINGS["full"]
    return Experiment(
        name="long_context",
        title="Every long-context strategy on BABILong-style qa1: accuracy from L to 16L, "
              "decode state and speed",
        reference=("Kuratov et al. 2024, BABILong (arXiv 2406.10149): bAbI facts hidden in book "
                   "text; a 137M recurrent memory transformer (RMT, Bulatov et al. 2022, arXiv "
                   "2207.06881) and a 130M Mamba (Gu & Dao 2023, arXiv 2312.00752) fine-tuned "
                   "at short lengths solve qa1 far past them, while models that only see a "
                   "bounded window cannot answer about facts outside it (StreamingLLM, Xiao "
                   "et al. 2023, arXiv 2309.17453, keeps fluency, not the evicted facts), and "
                   "softmax attention with rotary positions degrades past its training length "
                   "(Press et al. 2021, arXiv 2108.12409). Transformer-XL memory (Dai et al. "
                   "2019, arXiv 1901.02860) reaches n_layers x mem_len back; a retrieval memory "
                   "(Wu et al. 2022, arXiv 2203.08913) reaches the whole stored document; Based "
                   "(Arora et al. 2024, arXiv 2402.18668) and linear/softmax hybrids keep a "
                   "fixed recurrent state beside local or global softmax; Llama 4's chunked "
                   "layers pass information on through their global layers."),
        protocol=(f"Every arm a {f['layers']}-layer decoder (d_model {f['width']}, 4 heads, "
                  f"rotary positions where it has softmax layers) trained on data=babilong "
                  f"({TASK}, {f['facts']} facts per story, quick {q['facts']}; the Shakespeare "
                  f"haystack, its last 10% held out) with a BPE of {f['vocab']} tokens built on "
                  f"the haystack (tokenizer=bpe: lengths in those tokens), at L = {f['length']} "
                  f"(quick {q['length']}) after a first quarter at one segment's length; AdamW lr "
                  f"{f['lr']:g} (quick {q['lr']:g}) cosine, batch {f['batch']} (quick "
                  f"{q['batch']}), {f['steps']} steps (quick {q['steps']}); targets on the "
                  f"answer only. Arms (W = {f['window']}, S = {f['segment']}): global softmax; "
                  f"sliding window W; sinks + window ({N_SINKS} + W-{N_SINKS}); chunks of W with "
                  f"layer 2 global (NoPE); Based (Taylor linear attention, feature_dim 8, short "
                  f"convolution 3, then a window-W softmax layer); selective SSM (d_state 8); "
                  f"a linear (elu+1) / global softmax hybrid; and read in segments of S "
                  f"(data.segment_mode=split): XL memory (mem_len S), memory tokens "
                  f"({MEMORY_TOKENS}), retrieval (layer 2 memorizing, top 8 of 16L). Measured on "
                  f"{f['n']} held-out items per length (quick {q['n']}; repro seed, held-out "
                  f"haystack) at {', '.join(f'{k}L' for k in f['multiples'])}: forced choice "
                  f"over the {round(1 / chance())} labels (each label's total log-likelihood after "
                  "the training prompt; segment arms read through the evaluation carry); the "
                  "decode state at 16L (blocklab-estimate; segment arms: one segment and their "
                  "memories); training tokens/s (the run's logged median); decoding tokens/s (greedy steps after a 16L prompt, one thread; "
                  "absolute times are this machine's, the ratios are the result). Expected from "
                  "the papers: the window and sinks arms at chance at 16L (the facts lie "
                  "outside W); the SSM, memory tokens and retrieval above the window at 16L; "
                  "global softmax falls past L (rotary angles never trained); XL memory's reach "
                  "is 2 S + S tokens. Checked at full size: window and sinks at chance at 16L, "
                  "the SSM, memory tokens and retrieval above the window at 16L, and "
                  "the state bounds; quick (CI: global, window, sinks + window) checks the state "
                  "structure only (bounded for the window and sinks, growing 16x for global)."),
        sizes={s: Protocol(arms(s), checks(s), seeds=1) for s in SIZES},
        measure=_measure_for(size),
        breaks={"window-ignored": ("the sliding-window arm trains global attention",
                                   lambda a: swap(a, NAMES["window"], NAMES["global"]))},
        figure=figure,
    )

"""The ``memory_recall`` experiment: a fact placed segments before its question is answered by
a memory carried across segments — Transformer-XL's (Dai et al., arXiv 1901.02860), a retrieval
memory (Memorizing Transformers, Wu et al., arXiv 2203.08913), recurrent memory tokens (RMT,
Bulatov et al., arXiv 2207.06881; BABILong, Kuratov et al., arXiv 2406.10149) — and not by a
model that sees one segment at a time.

Every arm is the same small rotary decoder trained in ``data.segment_mode=split`` on MQAR across
segments (``data.mqar_layout=segments``: BOS and the key-value records in the first segment of
``T`` tokens, the ``SEP k -> v`` queries in the last, filler between), read ``T`` tokens at a
time with the state carried. Arms: no memory (``mem_len=0``: each segment attends within itself,
the window-only model of the same segment length), XL memory (``mem_len``), retrieval (layer 2
``memorizing``), memory tokens (``memory_tokens``). Measured on held-out documents (the probe
seed) read segment by segment with an evaluation carry: query accuracy at the training number of
segments, and farther (more filler segments between fact and question) where the size says.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from blocklab.data import synthetic as syn
from blocklab.data.tasks.mqar import mqar_segments
from blocklab.objectives import IGNORE, SegmentedLM
from blocklab.repro import checks as ck
from blocklab.repro import measure as ms
from blocklab.repro.protocol import SIZES, Arm, Experiment, Protocol, swap

# (segment tokens T, segments per training document, segments measured, pairs, layers, width,
# steps, learning rate, held-out documents, XL memory, retrieval top-k / memory, memory tokens)
# per size. quick is sized for CI (two segments: the fact one segment back; its three arms, the
# checks and the breaks in about a minute of CPU, one thread).
SETTINGS = {
    "quick": {"seg": 16, "segments": 2, "measured": (2,), "pairs": 1, "layers": 2, "width": 64,
              "steps": 400, "lr": 3e-3, "n": 256, "mem": 16, "top_k": 4, "knn_memory": 32,
              "tokens": 0, "curriculum": "[[0,16],[150,32]]"},
    "full": {"seg": 32, "segments": 4, "measured": (4, 8), "pairs": 2, "layers": 2, "width": 64,
             "steps": 2000, "lr": 1e-3, "n": 512, "mem": 96, "top_k": 8, "knn_memory": 256,
             "tokens": 8, "curriculum": "[[0,32],[400,64],[800,96],[1200,128]]"},
}
SALT = "repro:memory_recall"
N_VALUES = 16
FOUND = 0.8  # a memory that reaches the fact answers at least this often
NONE, XL, RETRIEVAL, RMT = "no memory", "XL memory", "retrieval memory", "memory tokens"
XL_DROPPED = "XL memory, none at evaluation"  # the XL arm's weights read with no memory


def _metric(segments: int) -> str:
    return f"accuracy, {segments} segments"


def arms(size: str) -> tuple[Arm, ...]:
    s = SETTINGS[size]
    t, doc = s["seg"], s["seg"] * s["segments"]
    base = ("model/position=rope", f"model.d_model={s['width']}", "model.n_heads=4",
            f"model.d_ff={2 * s['width']}", f"model.n_layers={s['layers']}",
            f"model.max_seq_len={t}",
            "data.tasks.needle=0", "data.tasks.copy=0", "data.tasks.mqar=1",
            "data.mqar_layout=segments", f"data.mqar_pairs={s['pairs']}", "data.n_keys=16",
            f"data.n_values={N_VALUES}", "data.n_filler=16", "data.segment_mode=split",
            f"data.seq_len={t}", f"data.doc_len={doc}", f"data.min_len={t}",
            f"data.val_len={doc}", f"data.curriculum={s['curriculum']}", "data.batch_size=32",
            "data.val_tasks=[mqar]", "trainer.bptt=0", f"optim.lr={s['lr']}",
            "optim.weight_decay=0.1", f"schedule.warmup_steps={max(20, s['steps'] // 20)}",
            f"trainer.max_steps={s['steps']}", f"trainer.val_every_steps={s['steps'] // 4}",
            f"trainer.ckpt_every_steps={s['steps']}", "trainer.log_every_steps=10")
    out = [Arm(NONE, base),
           Arm(XL, (*base, f"model.mixer.mem_len={s['mem']}")),
           Arm(XL_DROPPED, (*base, f"model.mixer.mem_len={s['mem']}"),
               ("mixer.eval_mem_len=0",)),
           Arm(RETRIEVAL, (*base, "model/mixer=memorizing",
                           "model.mixer.pattern=[softmax,memorizing]",
                           f"model.mixer.knn_top_k={s['top_k']}",
                           f"model.mixer.knn_memory={s['knn_memory']}"))]
    if s["tokens"]:
        out.append(Arm(RMT, (*base, f"model.memory_tokens={s['tokens']}")))
    return tuple(out)


def checks(size: str) -> tuple[ck.Check, ...]:
    s = SETTINGS[size]
    trained = _metric(s["segments"])
    out: list[ck.Check] = [ck.AtChance(NONE, trained, chance=1 / N_VALUES),
                           ck.AtLeast(XL, trained, FOUND), ck.AtLeast(RETRIEVAL, trained, FOUND),
                           ck.AtChance(XL_DROPPED, trained, chance=1 / N_VALUES)]
    if s["tokens"]:
        out.append(ck.AtLeast(RMT, trained, 0.5))
    return tuple(out)


def examples(vocab: syn.Vocab, *, size: str, segments: int, seed: int = ms.EVAL_SEED
             ) -> list[syn.Example]:
    """Held-out documents of ``segments`` segments (a seed no run trains on)."""
    s = SETTINGS[size]
    salt = f"{SALT}:{s['seg']}:{s['pairs']}:{segments}"
    return [mqar_segments(syn.example_rng(seed, i, salt), vocab, segments * s["seg"],
                          s["pairs"], s["seg"]) for i in range(s["n"])]


@torch.no_grad()
def carried_accuracy(model: torch.nn.Module, docs: list[syn.Example], *, seg_len: int,
                     batch_size: int = 64) -> ms.Tally:
    """Query accuracy of ``docs`` read ``seg_len`` tokens at a time with an evaluation carry
    (the argmax after each prefix against every supervised token): the segment-mode
    objective's own batches and reading."""
    objective = SegmentedLM(seg_len=seg_len, mode="split")
    tally = ms.Tally()
    for start in range(0, len(docs), batch_size):
        batch = objective.collate(docs[start:start + batch_size])
        labels = batch["labels"]
        hit = objective.logits(model, batch).argmax(-1) == labels
        for row in range(labels.shape[0]):
            on = labels[row] != IGNORE
            tally.add(hit[row][on].tolist())
    return tally


def size_of(arm: Arm) -> str:
    return next(s for s in SIZES if f"trainer.max_steps={SETTINGS[s]['steps']}" in arm.overrides
                and f"data.seq_len={SETTINGS[s]['seg']}" in arm.overrides)


def measure(run: Path, arm: Arm) -> dict[str, ms.Tally]:
    t = ms.load(run, arm.eval_model)
    size = size_of(arm)
    s = SETTINGS[size]
    return {_metric(n): carried_accuracy(t.model, examples(t.vocab, size=size, segments=n),
                                         seg_len=s["seg"]) for n in s["measured"]}


def make(size: str) -> Experiment:
    q, f = SETTINGS["quick"], SETTINGS["full"]
    return Experiment(
        name="memory_recall",
        title="A fact segments before its question: answered with a memory across segments, "
              "at chance without one",
        reference=("Dai et al. 2019 (Transformer-XL, arXiv 1901.02860): cached hidden states "
                   "of the previous segment extend the context beyond the segment; Wu et al. "
                   "2022 (Memorizing Transformers, arXiv 2203.08913): top-k retrieval over a "
                   "document's past keys and values; Bulatov et al. 2022 (RMT, arXiv "
                   "2207.06881) and Kuratov et al. 2024 (BABILong, arXiv 2406.10149): memory "
                   "tokens carried from segment to segment answer questions about facts far "
                   "past the segment length. A model that sees one segment is at chance."),
        protocol=(f"A {f['layers']}-layer rotary decoder (d_model {f['width']}, 4 heads) "
                  f"trained in split segment mode on MQAR across segments: {f['pairs']} "
                  f"key-value records (quick {q['pairs']}) in the first segment of {f['seg']} "
                  f"tokens (quick {q['seg']}), the queries in the last of {f['segments']} "
                  f"(quick {q['segments']}), i.i.d. filler between, {N_VALUES} values; "
                  f"backpropagation through the whole document (trainer.bptt=0); AdamW lr "
                  f"{f['lr']:g} (quick {q['lr']:g}) cosine, batch 32, {f['steps']} steps (quick "
                  f"{q['steps']}). Arms: no memory (mem_len 0: each segment attends within "
                  f"itself); XL memory (mem_len {f['mem']}, quick {q['mem']}); retrieval (layer "
                  f"2 memorizing, top {f['top_k']} of {f['knn_memory']}, quick top "
                  f"{q['top_k']} of {q['knn_memory']}); memory tokens ({f['tokens']}, full "
                  f"only). Held-out documents ({f['n']}, quick {q['n']}; probe seed) read "
                  f"segment by segment with an evaluation carry, at {f['measured']} segments "
                  f"(quick {q['measured']}); the XL arm's weights also read with no memory "
                  f"(eval_mem_len=0). Expected: no memory at chance (1/{N_VALUES}); XL and "
                  f"retrieval >= {FOUND:g} where their memory reaches the fact; memory tokens "
                  f">= 0.5 (full); the XL arm without its memory at chance."),
        sizes={s: Protocol(arms(s), checks(s), seeds=1 if s == "quick" else 3) for s in SIZES},
        measure=measure,
        breaks={"memory-dropped": ("the XL arm is measured with no memory at evaluation "
                                   "(model.mixer.eval_mem_len=0)",
                                   lambda a: tuple(replace(x, eval_model=(
                                       "mixer.eval_mem_len=0",)) if x.name == XL else x
                                       for x in a)),
                "no-memory-as-xl": ("the XL arm trains without memory",
                                    lambda a: swap(a, XL, NONE))},
    )

"""The ``chunked`` experiment: chunked attention cannot carry a needle across chunks, and one
global layer in the stack can (Llama 4's chunked layers with interleaved global layers; the
cross-chunk dependency that chunking must handle).

Every arm is the same small rotary decoder trained on the ``needle`` task (``BOS hay … MARK k
v … SEP k -> v``, the gold needle at a uniform depth) with sequences spanning several chunks of
``C`` tokens: all layers chunked (``model.mixer.attention_chunk=C``: a token sees only the
earlier tokens of its own chunk), chunked with every second layer global
(``model.mixer.global_every=2``, the global layer without rotary angles as Llama 4's NoPE
layers: ``global_rope=false``), and full attention (the ceiling). Measured on held-out
sequences whose needles are placed: every needle (MARK k v) wholly inside one chunk earlier than
the question's ("earlier chunk"), or every needle in the question's own chunk ("same chunk", the
control: there a chunked layer sees everything the question needs).
"""

from __future__ import annotations

import random
from pathlib import Path

from blocklab.data import synthetic as syn
from blocklab.repro import checks as ck
from blocklab.repro import measure as ms
from blocklab.repro.protocol import SIZES, Arm, Experiment, Protocol, swap

# (length, chunk, layers, width, distractor needles, steps, learning rate, held-out sequences per
# placement) per size. The question (the key after SEP) is the second-to-last token, so its chunk
# is the last; every earlier chunk is out of a chunked layer's reach. quick is sized for CI (two
# chunks; about 45 CPU-seconds for its three runs, its checks and both breaks, one thread).
SETTINGS = {
    "quick": {"length": 32, "chunk": 16, "layers": 2, "width": 64, "distractors": 0,
              "steps": 200, "lr": 3e-3, "n": 128},
    "full": {"length": 128, "chunk": 32, "layers": 2, "width": 64, "distractors": 0,
             "steps": 1000, "lr": 3e-3, "n": 512},
}
SALT = "repro:chunked"
FOUND = 0.9  # the hybrid (and every arm in the question's own chunk) retrieves at least this
N_VALUES = 16
PLACEMENTS = ("earlier chunk", "same chunk")
ALL_CHUNKED, HYBRID, FULL = "all chunked", "chunked + global", "full attention"


def arms(size: str) -> tuple[Arm, ...]:
    s = SETTINGS[size]
    n, c, d = s["length"], s["chunk"], s["distractors"]
    base = ("model/position=rope", f"model.d_model={s['width']}", "model.n_heads=4",
            f"model.d_ff={2 * s['width']}", f"model.n_layers={s['layers']}",
            f"model.max_seq_len={n}",
            "data.tasks.needle=1", "data.tasks.copy=0", "data.tasks.mqar=0",
            f"data.n_distractors=[{d},{d}]", "data.fillers=[iid]", "data.n_keys=16",
            f"data.n_values={N_VALUES}", "data.n_filler=16", f"data.seq_len={n}",
            f"data.min_len={n}", f"data.val_len={n}", "data.curriculum=[]", "data.batch_size=32",
            "data.val_tasks=[needle]", f"optim.lr={s['lr']}", "optim.weight_decay=0.1",
            f"schedule.warmup_steps={max(20, s['steps'] // 20)}",
            f"trainer.max_steps={s['steps']}", f"trainer.val_every_steps={s['steps'] // 4}",
            f"trainer.ckpt_every_steps={s['steps']}", "trainer.log_every_steps=10")
    chunked = (f"model.mixer.attention_chunk={c}",)
    return (Arm(ALL_CHUNKED, (*base, *chunked)),
            Arm(HYBRID, (*base, *chunked, "model.mixer.global_every=2",
                         "model.mixer.global_rope=false")),
            Arm(FULL, base))


def checks(size: str) -> tuple[ck.Check, ...]:
    return (ck.AtChance(ALL_CHUNKED, "earlier chunk", chance=1 / N_VALUES),
            ck.AtLeast(HYBRID, "earlier chunk", FOUND),
            ck.AtLeast(ALL_CHUNKED, "same chunk", FOUND),
            ck.AtLeast(HYBRID, "same chunk", FOUND),
            ck.AtLeast(FULL, "earlier chunk", FOUND))


def placed_needles(rng: random.Random, vocab: syn.Vocab, length: int, chunk: int, *,
                   n_distractors: int, where: str) -> syn.Example:
    """``BOS hay(MARK k v needles) SEP k_gold -> v_gold`` of ``length`` tokens, every needle's
    three tokens inside one chunk of ``chunk`` tokens: chunks before the question's
    (``where="earlier chunk"``; start positions drawn uniformly) or the question's own
    chunk, before its ``SEP`` (``"same chunk"``). Filler: i.i.d."""
    query = length - 2  # the key after SEP: the position whose next token is the answer
    first = (query // chunk) * chunk  # the question's chunk starts here
    n = n_distractors + 1
    if where == "earlier chunk":
        starts = [p for p in range(1, first - 2) if p // chunk == (p + 2) // chunk]
    elif where == "same chunk":
        starts = list(range(first, length - 5))  # MARK k v before SEP (length - 3)
    else:
        raise ValueError(f"where={where!r}: one of {', '.join(PLACEMENTS)}")
    picked: list[int] = []
    for p in rng.sample(starts, len(starts)):  # non-overlapping needles, first come first kept
        if all(abs(p - q) >= 3 for q in picked):
            picked.append(p)
        if len(picked) == n:
            break
    if len(picked) < n:
        raise ValueError(f"{where}: no room for {n} needles in {length} tokens, chunk {chunk}")
    keys, values = rng.sample(vocab.keys, n), rng.sample(vocab.values, n)
    tokens = [syn.BOS, *rng.choices(vocab.filler, k=length - 1)]
    for i, p in enumerate(picked):  # needle 0 is the gold one
        tokens[p:p + 3] = [syn.MARK, keys[i], values[i]]
    tokens[length - 3:] = [syn.SEP, keys[0], values[0]]
    return syn.Example(tokens, [False] * (length - 1) + [True],
                       {"task": "needle", "gold_index": picked[0], "gold_chunk":
                        picked[0] // chunk, "query_chunk": query // chunk})


def examples(vocab: syn.Vocab, *, size: str, where: str, seed: int = ms.EVAL_SEED
             ) -> list[syn.Example]:
    """The held-out sequences of one placement (a seed no run trains on)."""
    s = SETTINGS[size]
    salt = f"{SALT}:{s['length']}:{s['chunk']}:{s['distractors']}:{where}"
    return [placed_needles(syn.example_rng(seed, i, salt), vocab, s["length"], s["chunk"],
                           n_distractors=s["distractors"], where=where) for i in range(s["n"])]


def size_of(arm: Arm) -> str:
    return next(s for s in SIZES if f"trainer.max_steps={SETTINGS[s]['steps']}" in arm.overrides
                and f"data.seq_len={SETTINGS[s]['length']}" in arm.overrides)


def measure(run: Path, arm: Arm) -> dict[str, ms.Tally]:
    t = ms.load(run, arm.eval_model)
    size = size_of(arm)
    return {where: ms.accuracy(t.model, examples(t.vocab, size=size, where=where))
            for where in PLACEMENTS}


def make(size: str) -> Experiment:
    q, f = SETTINGS["quick"], SETTINGS["full"]
    return Experiment(
        name="chunked",
        title="A needle in an earlier chunk: at chance for chunked layers, found with a "
              "global layer (Llama 4)",
        reference=("Meta 2025, Llama 4 (model card; transformers' Llama4TextConfig "
                   "attention_chunk_size 8192, every 4th layer global without rotary "
                   "positions): chunked layers attend only within their chunk, so information "
                   "crosses chunk boundaries only through the global layers. Without one, a "
                   "needle in an earlier chunk cannot reach the question (chance); with one it "
                   "is retrieved."),
        protocol=(f"A {f['layers']}-layer rotary decoder (d_model {f['width']}, 4 heads) "
                  f"trained on the needle task at {f['length']} tokens (quick: {q['length']}) "
                  f"with {f['distractors']} distractor needles, {N_VALUES} values, i.i.d. "
                  f"filler, the gold needle at a uniform depth; AdamW lr {f['lr']:g} cosine, "
                  f"batch 32, {f['steps']} steps (quick: {q['steps']}). Arms: every layer "
                  f"chunked (attention_chunk {f['chunk']}, quick {q['chunk']}); chunked with "
                  "layer 2 global (global_every=2, global_rope=false: Llama 4's NoPE global "
                  "layers; Llama 4 has a global layer every 4th of 48); full attention. "
                  f"Held-out sequences ({f['n']} per placement, quick {q['n']}; probe seed) "
                  "with every needle inside a chunk earlier than the question's, or every "
                  "needle in the question's chunk (the control). Expected: all chunked at "
                  f"chance (1/{N_VALUES}) for earlier chunks and >= {FOUND:g} in the same chunk; "
                  f"the hybrid >= {FOUND:g} on both; full attention >= {FOUND:g} (the ceiling)."),
        sizes={s: Protocol(arms(s), checks(s), seeds=1 if s == "quick" else 3) for s in SIZES},
        measure=measure,
        breaks={"no-global": ("the hybrid trains every layer chunked (no global layer)",
                              lambda a: swap(a, HYBRID, ALL_CHUNKED)),
                "chunks-ignored": ("the all-chunked arm trains full attention",
                                   lambda a: swap(a, ALL_CHUNKED, FULL))},
    )

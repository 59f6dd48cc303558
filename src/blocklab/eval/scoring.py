"""Per-example scoring of probe items on a backend (docs/probes.md, "Grids and reports").

For each item: argmax accuracy (every answer token the argmax under teacher forcing), greedy
exact match of the whole answer through the KV cache (text space: normalized substring match of
the generation; with several required answers, ``answer_texts``, every one of them), the
partial-credit share of the answers found (RULER's "all" score, arXiv 2404.06654), log-prob
of the gold answer, its margin over the best other in-context answer, the rank of the gold first token in the vocabulary, and whether the prediction is *any*
in-context answer (the copy-any-value shortcut: a model that copies some value scores
1/(k+1) with k distractors without retrieving anything).

Items are scored in batches, with no per-example Python in the model's hot path. The
statistics over these rows live in ``blocklab.eval.aggregate``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import torch

from blocklab.eval.items import ProbeItem


def normalize(text: str) -> str:
    """Lower case, every run of non-alphanumerics one space: how text-space answers are
    matched against generations."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


@torch.no_grad()
def score_items(backend, items: list[ProbeItem], *, batch_size: int,
                decode: Callable[[list[int]], str] | None = None,
                max_new_tokens: int | None = None) -> list[dict[str, Any]]:
    """Per-example scores, batched (no per-example Python in the model's hot path)."""
    out: list[dict[str, Any]] = []
    for batch in _batches(items, batch_size):
        out += _score_batch(backend, batch, decode, max_new_tokens)
    return out


def _batches(items: list[ProbeItem], batch_size: int) -> list[list[ProbeItem]]:
    """Consecutive items, at most ``batch_size`` per batch, never mixing answer lengths: an
    encoder answers in as many masked slots as the batch's longest answer, so a one-token
    answer batched with a four-token one would be asked with four masks."""
    out: list[list[ProbeItem]] = []
    for it in items:
        if (out and len(out[-1]) < batch_size and len(out[-1][0].answer) == len(it.answer)
                and (out[-1][0].labels is None) == (it.labels is None)):
            out[-1].append(it)
        else:
            out.append([it])
    return out


def partial_credit(generated: list[int], answer: list[int]) -> float:
    """RULER's "all" score in token space: the share of the gold answer tokens found among the
    first ``len(answer)`` generated tokens, order-free, each generated token matching at most
    one gold token (multiset intersection)."""
    pool = list(generated[: len(answer)])
    found = 0
    for tok in answer:
        if tok in pool:
            pool.remove(tok)
            found += 1
    return found / len(answer)


def text_match(answer_text: str | None, answer_texts: list[str] | None,
               generation: str) -> tuple[bool, float]:
    """(exact, partial) of a text-space generation: with ``answer_texts`` every string must be
    found (normalized substring) and ``partial`` is the share found; else the one
    ``answer_text`` (partial = exact)."""
    g = normalize(generation)
    if answer_texts:
        found = [normalize(a) in g for a in answer_texts]
        return all(found), sum(found) / len(found)
    hit = normalize(answer_text or "") in g
    return hit, float(hit)


def _teacher_forced(backend, items: list[ProbeItem]) -> dict[str, Any]:
    """Gold log-prob, argmax correctness, first-token rank, copy-any-value hit and margin over
    the best other in-context answer (tensors over the batch) from one teacher-forced pass,
    and ``width``, the padded answer length."""
    logp, mask = backend.answer_logprobs([it.prompt for it in items], [it.answer for it in items])
    return _stats(items, logp, mask, lambda first: _best_other(backend, items, first))


def _stats(items: list[ProbeItem], logp: torch.Tensor, mask: torch.Tensor, best_other
           ) -> dict[str, Any]:
    """The per-example statistics from the gold answers' log-distributions ``logp`` (B, A, V)
    with ``mask`` (B, A); ``best_other(first)`` gives the best other in-context answer's
    log-prob per example."""
    answers = [it.answer for it in items]
    b, a = mask.shape
    gold = torch.zeros((b, a), dtype=torch.long)
    for i, ans in enumerate(answers):
        gold[i, : len(ans)] = torch.tensor(ans)
    tok_lp = logp.gather(-1, gold[..., None]).squeeze(-1).masked_fill(~mask, 0.0)
    gold_lp = tok_lp.sum(-1)
    pred = logp.argmax(-1)
    first = logp[:, 0]
    # Other in-context answers: margins and the copy-any-value diagnostic.
    n_c = max(len(it.candidates) for it in items)
    cand_first = torch.full((b, max(n_c, 1)), -1, dtype=torch.long)
    for i, it in enumerate(items):
        for c, cand in enumerate(it.candidates):
            cand_first[i, c] = cand[0]
    return {"width": a, "logprob": gold_lp, "argmax": ((pred == gold) | ~mask).all(-1),
            "rank": (first > first.gather(-1, gold[:, :1])).sum(-1) + 1,
            "any_value": (cand_first == pred[:, :1]).any(-1),
            "margin": gold_lp - best_other(first)}


def _from_prefix(backend, items: list[ProbeItem], n_new: int | None
                 ) -> tuple[dict[str, Any], list[list[int]] | None]:
    """The same statistics (and greedy generations when ``n_new``) with each prompt run once:
    gold and other answers are scored from its KV cache (backend.score_from_prefix)."""
    others = [[c for j, c in enumerate(it.candidates) if j != it.gold] for it in items]
    results = backend.score_from_prefix([it.prompt for it in items],
                                        [[it.answer, *o] for it, o in zip(items, others)],
                                        n_new or 0)
    width = max(len(it.answer) for it in items)
    logp = torch.zeros(len(items), width, results[0][0][0].shape[-1])
    mask = torch.zeros(len(items), width, dtype=torch.bool)
    best = torch.full((len(items),), -math.inf)
    for i, (it, (lps, _)) in enumerate(zip(items, results)):
        logp[i, : len(it.answer)] = lps[0]
        mask[i, : len(it.answer)] = True
        for lp, c in zip(lps[1:], others[i]):
            best[i] = max(best[i], lp.gather(-1, torch.tensor(c)[:, None]).sum())
    generated = [g for _, g in results] if n_new else None
    return _stats(items, logp, mask, lambda first: best), generated


def within_positions(backend, items: list[ProbeItem]) -> list[ProbeItem]:
    """The items with only the in-context alternatives that fit the model's positions after
    the prompt: the gold answer always fits (its cell would be N/A otherwise), but another
    value may tokenize longer; scoring it would index past a learned table, and cutting it
    would understate its log-prob (and so overstate the margin)."""
    limit = backend.max_length() if hasattr(backend, "max_length") else None
    if limit is None:
        return items
    out = []
    for it in items:
        room = limit - len(it.prompt)
        keep = [j for j, c in enumerate(it.candidates) if j == it.gold or len(c) <= room]
        if len(keep) < len(it.candidates):
            it = dataclasses.replace(it, candidates=[it.candidates[j] for j in keep],
                                     gold=keep.index(it.gold))
        out.append(it)
    return out


def _score_batch(backend, items: list[ProbeItem], decode, max_new_tokens) -> list[dict[str, Any]]:
    items = within_positions(backend, items)
    width = max(len(it.answer) for it in items)
    # One-token answers without text: the first greedy token *is* the argmax of this
    # distribution (the KV-cached generation path is checked to agree in tests), so no greedy.
    needs_greedy = not (decode is None and width == 1)
    # Text space generates max_new_tokens, but never fewer than the gold answer's tokens plus
    # a little: a multi-value answer (several numbers, one token per digit) must be able to fit.
    n_new = width if max_new_tokens is None else max(max_new_tokens, width + 4)
    n_new = generation_room(backend, items, n_new)
    if _prefix(backend, items):
        s, generated = _from_prefix(backend, items, n_new if needs_greedy else None)
    else:
        s = _teacher_forced(backend, items)
        generated = (backend.greedy([it.prompt for it in items], n_new)
                     if needs_greedy else None)
    if generated is None:
        exact = s["argmax"].tolist()
        partial = [float(x) for x in exact]
    else:
        exact, partial = [], []
        for it, g in zip(items, generated):
            if decode is not None and it.labels is not None:
                hit = single_label(decode(g), it)
                share = float(hit)
            elif decode is not None and (it.answer_text is not None or it.answer_texts):
                hit, share = text_match(it.answer_text, it.answer_texts, decode(g))
            else:
                hit, share = g[: len(it.answer)] == it.answer, partial_credit(g, it.answer)
            exact.append(hit)
            partial.append(share)
    rows = []
    for i, it in enumerate(items):
        row = {**it.cell, "argmax": bool(s["argmax"][i]), "exact": bool(exact[i]),
               "partial": partial[i], **({"new_tokens": n_new} if generated is not None else {}),
               "logprob": float(s["logprob"][i]), "margin": float(s["margin"][i]),
               "rank": int(s["rank"][i]), "any_value": bool(s["any_value"][i]), **it.meta}
        if generated is not None and decode is not None:
            row["generated"] = decode(generated[i])
        if it.labels is not None:  # forced choice: the gold label strictly above every other
            row["choice"] = bool(s["margin"][i] > 0)
        rows.append(row)
    return rows


def _prefix(backend, items: list[ProbeItem]) -> bool:
    """Whether to score ``items`` from each prompt's cache (``score_from_prefix``): always
    where the backend shares prefixes; for items with labels (every label a candidate) also on
    a backend that offers it without ``shares_prefix`` (a Hugging Face model: one prompt pass
    instead of one per label)."""
    if getattr(backend, "shares_prefix", False):
        return True
    return (items[0].labels is not None and callable(getattr(backend, "score_from_prefix", None))
            and not hasattr(backend, "shares_prefix"))


def single_label(generation: str, item: ProbeItem) -> bool:
    """The single-label rule on a generation (data/babilong.py ``answer_correct``)."""
    from blocklab.data.babilong import answer_correct

    return answer_correct(generation, item.answer_text or "", item.question or "",
                          item.labels or ())


def generation_room(backend, items: list[ProbeItem], n_new: int) -> int:
    """Greedy tokens to generate for a batch: ``n_new``, cut where the longest prompt would run
    past the last position the model can index (a learned table: generating beyond it would
    index past the table). Every item's prompt and gold answer fit by construction (a cell
    longer than the model's positions is N/A), so at least the answer's tokens always remain."""
    limit = backend.max_length() if hasattr(backend, "max_length") else None
    if limit is None:
        return n_new
    room = limit - max(len(it.prompt) for it in items)
    return max(min(n_new, room), max(len(it.answer) for it in items))


def _best_other(backend, items: list[ProbeItem], first: torch.Tensor) -> torch.Tensor:
    """Best log-prob among the other in-context answers (-inf when there are none). One-token
    candidates are read off the same distribution; longer ones are scored jointly with the
    prompt, batched."""
    b = len(items)
    best = torch.full((b,), -math.inf)
    if all(len(c) == 1 for it in items for c in it.candidates) and all(
            len(it.answer) == 1 for it in items):
        for i, it in enumerate(items):
            others = [c[0] for j, c in enumerate(it.candidates) if j != it.gold]
            if others:
                best[i] = first[i, others].max()
        return best
    pairs = [(i, c) for i, it in enumerate(items) for j, c in enumerate(it.candidates) if j != it.gold]
    if not pairs:
        return best
    lp, mask = backend.answer_logprobs([items[i].prompt for i, _ in pairs], [c for _, c in pairs])
    ids = torch.zeros(mask.shape, dtype=torch.long)
    for r, (_, c) in enumerate(pairs):
        ids[r, : len(c)] = torch.tensor(c)
    total = lp.gather(-1, ids[..., None]).squeeze(-1).masked_fill(~mask, 0.0).sum(-1)
    for r, (i, _) in enumerate(pairs):
        best[i] = max(best[i], total[r])
    return best

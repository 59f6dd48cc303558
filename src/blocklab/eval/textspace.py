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
share one body (:meth:`TextBuilder.scatter`): statements at depths drawn uniformly per item,
each inserted at the sentence boundary nearest its depth, every statement and value checked to
occur exactly as often as it was placed, and each statement's actual token depth recorded.

This module holds what the kinds share — the tokenizer wrapper, the haystack, the joint
tokenization, the layout of statements, the cell — and each probe kind
(``blocklab.eval.kinds``) renders its own cells with it.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blocklab.config import ProbeSpec
from blocklab.data.haystack import ESSAY, place
from blocklab.data.synthetic import example_rng
from blocklab.eval.items import Cell, NotApplicable, PerplexityText, ProbeItem, fits
from blocklab.eval.texts import haystack_sentences, perplexity_text

KEYS = ("Alice", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines",
        "Jonas", "Kira", "Luca", "Maya", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Samir",
        "Tessa", "Umar", "Vera", "Wendell", "Ximena", "Yusuf", "Zoe", "Amara", "Bjorn",
        "Chiara", "Dario", "Esme", "Felix", "Gwen", "Hector", "Isla", "Jasper", "Leila",
        "Milo", "Noor", "Otto", "Pia", "Rafael", "Sana", "Theo", "Uma", "Viktor", "Willa")

# The multi-needle probes' keys: no name is a prefix of another ("Uma" / "Umar"), so no key can
# be read inside another.
MULTI_KEYS = tuple(k for k in KEYS if not any(o != k and o.startswith(k) for o in KEYS))
VALUES = range(10000, 100000)  # needle and chain-root values: random 5-digit numbers

#: How much of a haystack source is read (about 4 of Shakespeare's plays: ~150k tokens)
HAYSTACK_CHARS = 600_000

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


def join_and(names: list[str]) -> str:
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


class TextBuilder:
    """The shared pieces every probe kind renders its text-space cells with, for
    ``tokenizer``: the haystack (``sentences``, :meth:`hay`), the prompt's head and tail,
    joint tokenization, one-needle items (:meth:`item`), scattered statements
    (:meth:`scatter`, :meth:`probe_item`) and N/A-aware cells (:meth:`cell`)."""

    space = "text"

    def __init__(self, tokenizer: TextTokenizer, spec: ProbeSpec,
                 chat: Callable[[str, str], str] | None = None, *,
                 validation: Callable[[], tuple[str, list[list[int]]]] | None = None,
                 trained_on: str | None = None) -> None:
        self.tok, self.t = tokenizer, spec.text
        self.sentences = haystack_sentences(self.t.haystack, ESSAY, avoid=KEYS,
                                            max_chars=HAYSTACK_CHARS)
        self.chat = chat  # (user message, assistant prefix) -> prompt text, when enabled
        # the run's own validation text (description, documents), for the perplexity probe
        self.validation, self.trained_on = validation, trained_on
        self._suffix: list[int] | None = None  # -(tokens from each sentence to the end)
        self.hay_text = " ".join(self.sentences)
        low = self.hay_text.lower()
        # aggregation candidates that never occur in the haystack, not even inside a word
        self.words = [w for w in WORDS if w not in low]
        self.sentence_tokens: dict[str, int] = {}

    # ------------------------------------------------------------------------ shared pieces
    def head(self) -> list[int]:
        return [self.tok.bos] if self.t.add_bos and self.tok.bos is not None else []

    def ntok(self, text: str) -> int:
        return len(self.tok.encode(text)[0])

    def tail(self, question: str, prefix: str, context: str) -> str:
        if self.chat is not None:
            return self.chat(context + "\n\n" + question, prefix)
        return context + "\n\n" + question + " " + prefix

    def joint(self, prompt_text: str, answer_text: str) -> tuple[list[int], list[int], list]:
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

    def item(self, key: dict[str, Any], text: str, gold: str, others: list[str],
              marker: str | None, meta: dict[str, Any]) -> ProbeItem:
        answer_text = " " + gold if not text.endswith(('"', " ")) else gold
        prompt, answer, offsets = self.joint(text, answer_text)
        want = 1 if others or marker is not None or meta.get("n_records", 1) else 0
        if text.count(gold) != want:  # exactly once; never in a closed-book prompt
            raise AssertionError(f"answer {gold!r} occurs {text.count(gold)} times in the "
                                 f"prompt (expected {want})")
        # Multi-token alternatives each cost a forward pass: score the first few in context
        # order (the margin is then over the best of those).
        others = others[: self.t.margin_candidates]
        cands = [answer] + [self.joint(text, answer_text.replace(gold, o))[1] for o in others]
        head = self.head()
        if marker is not None:
            assert text.count(marker) == 1, "the needle must occur exactly once"
            start = text.index(marker)
            at = next(i for i, (s, e) in enumerate(offsets) if e > start)
            span = self.ntok(marker)
            meta = {**meta, "needle_token": at + len(head),
                    "actual_depth": at / max(1, self.context_tokens - span),
                    "distance": len(prompt) - at}
        return ProbeItem(cell=key, prompt=head + prompt, answer=answer, candidates=cands, gold=0,
                         answer_text=gold, meta={"n_tokens": len(head) + len(prompt) + len(answer),
                                                 **meta})

    def hay(self, rng: random.Random, budget: int) -> list[str]:
        """Consecutive sentences from a random start, up to ``budget`` tokens — never wrapping
        round to the start (a needle in repeated filler): the start is drawn among the
        sentences with at least ``budget`` tokens after them; :class:`NotApplicable` when the
        whole haystack is shorter."""
        if self._suffix is None:  # minus the tokens from each sentence to the end (ascending)
            total, neg = 0, []
            for sentence in reversed(self.sentences):
                total += self.sent_ntok(sentence)
                neg.append(-total)
            self._suffix = neg[::-1]
        starts = bisect.bisect_right(self._suffix, -budget)  # sentences leaving >= budget
        if starts == 0:
            raise NotApplicable(f"the {self.t.haystack} haystack holds {-self._suffix[0]:,} "
                                f"tokens, fewer than the {budget:,} this length needs (it is "
                                "never repeated): probes.text.haystack=shakespeare or a "
                                "longer text file")
        out, used, start = [], 0, rng.randrange(starts)
        for s in self.sentences[start:]:
            n = self.sent_ntok(s)
            if used + n > budget:
                break
            out.append(s)
            used += n
        return out

    # ------------------------------------------------- statements scattered through a haystack
    def sent_ntok(self, sentence: str) -> int:
        """Tokens of a haystack sentence after its separating space (cached)."""
        n = self.sentence_tokens.get(sentence)
        if n is None:
            n = self.sentence_tokens[sentence] = self.ntok(" " + sentence)
        return n

    def place(self, hay: list[str], stmts: list[str], depths: list[float]
               ) -> tuple[str, list[int]]:
        """Insert each statement at the sentence boundary nearest its depth (a fraction of the
        haystack's tokens); statements sharing a boundary keep the order of their depths (ties:
        list order), so the order of appearance is the order of ``depths`` — chains keep their
        order. Returns the context and each statement's character offset in it."""
        return place(hay, stmts, depths, self.sent_ntok)

    def scatter(self, rng: random.Random, length: int, stmts: list[str], depths: list[float],
                 question: str, prefix: str, answer: str) -> Layout:
        """The shared body of the multi-needle, hops and aggregation items: a haystack sized in
        the model's tokens around ``stmts`` (placed by :meth:`_place`), question and answer
        prefix after it, the answer tokenized jointly, each statement located through the
        offset mapping. Sentences are dropped from the haystack (never a statement, never the
        question) until prompt + answer fit ``length``; ``NotApplicable`` when they cannot."""
        head = len(self.head())
        tail = self.tail(question, prefix, "")
        answer_text = (answer if tail.endswith(('"', " ")) else " " + answer)
        fixed = (self.ntok(" ".join(stmts)) + self.ntok(tail) + self.ntok(answer_text)
                 + head)
        if length - fixed < 4:
            raise NotApplicable(f"length {length} too short for the {len(stmts)} statements, "
                                f"the question and the answer (needs > {fixed + 4} tokens)")
        hay = self.hay(rng, length - fixed)
        while len(hay) >= 2:  # fewer: no haystack to hide statements in, not a probe
            context, chars = self.place(hay, stmts, depths)
            text = self.tail(question, prefix, context)
            prompt, ans, offsets = self.joint(text, answer_text)
            if head + len(prompt) + len(ans) <= length:
                return self._locate(text, context, chars, stmts, prompt, ans, offsets,
                                    answer_text)
            hay = hay[:-1]  # one sentence too many: drop one and rebuild
        raise NotApplicable(f"length {length} leaves no haystack around the {len(stmts)} "
                            "statements and the question")

    def _locate(self, text: str, context: str, chars: list[int], stmts: list[str],
                prompt: list[int], answer: list[int], offsets: list, answer_text: str
                ) -> Layout:
        """Token index (in the prompt, BOS included) and actual token depth of each statement:
        its first token (through the offset mapping) over the context's tokens, so the first
        boundary is depth 0 and the last is depth 1."""
        base = text.index(context)
        ends = [e for _, e in offsets]
        starts = [s for s, _ in offsets]
        first = bisect.bisect_right(ends, base)  # the context's first token
        n_ctx = bisect.bisect_left(starts, base + len(context)) - first
        head = len(self.head())
        tokens, depths = [], []
        for c, s in zip(chars, stmts):
            at = bisect.bisect_right(ends, base + c)
            span = bisect.bisect_left(starts, base + c + len(s)) - at
            tokens.append(at + head)
            depths.append((at - first) / max(1, n_ctx - span))
        return Layout(text, prompt, answer, answer_text, tokens, depths)

    def _alternatives(self, lay: Layout, alts: list[str]) -> list[list[int]]:
        """Other in-context answers, each tokenized jointly with the prompt (the first
        ``margin_candidates`` of them: each costs a forward pass)."""
        lead = lay.answer_text[: len(lay.answer_text) - len(lay.answer_text.lstrip(" "))]
        return [self.joint(lay.text, lead + a)[1] for a in alts[: self.t.margin_candidates]]

    def probe_item(self, key: dict[str, Any], lay: Layout, golds: list[str],
                    alts: list[str], meta: dict[str, Any], *, multi: bool) -> ProbeItem:
        head = self.head()
        prompt = head + lay.prompt
        return ProbeItem(cell=key, prompt=prompt, answer=lay.answer,
                         candidates=[lay.answer, *self._alternatives(lay, alts)], gold=0,
                         answer_text=lay.answer_text.strip(),
                         answer_texts=list(golds) if multi else None,
                         meta={"n_tokens": len(prompt) + len(lay.answer), **meta})

    @staticmethod
    def count(text: str, what: str, want: int) -> None:
        if text.count(what) != want:
            raise AssertionError(f"{what!r} occurs {text.count(what)} times in the prompt "
                                 f"(expected {want})")

    def cell(self, key: dict[str, Any], length: int, max_length: int | None, n: int,
              seed: int, salt: str, make: Callable[[random.Random], ProbeItem], *,
              copy_any_value: float, chance: float) -> Cell:
        """``n`` items ``make(example_rng(seed, i, salt))``; N/A (with the reason) when the
        position scheme cannot index ``length`` or the statements and question cannot fit."""
        cell = Cell(key, [], fits(length, max_length), copy_any_value=copy_any_value,
                    chance=chance)
        if cell.na is None:
            try:
                cell.items = [make(example_rng(seed, i, salt)) for i in range(n)]
            except NotApplicable as e:
                cell.na = e.status
        return cell

    # --------------------------------------------------------------------------- perplexity
    def perplexity_text(self, spec: ProbeSpec, need: int) -> PerplexityText:
        """The perplexity text ``probes.perplexity.text`` in this tokenizer's tokens, about
        ``need`` of them (eval/texts.py: never cycled; a repeating text is refused)."""
        return perplexity_text(spec.perplexity.text, lambda t: self.tok.encode(t)[0], need,
                               essay=ESSAY, validation=self.validation,
                               trained_on=self.trained_on)

    @property
    def bos(self) -> int | None:
        """The BOS each perplexity window starts with (as the probes' prompts)."""
        return self.tok.bos if self.t.add_bos else None


@dataclass
class Layout:
    """A built prompt of scattered statements: its text, prompt and answer tokens (BOS not
    included), the answer text as tokenized, and each statement's token index (BOS included)
    and actual token depth in the context."""

    text: str
    prompt: list[int]
    answer: list[int]
    answer_text: str
    tokens: list[int]
    depths: list[float]

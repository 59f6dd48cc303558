"""``data.name=babilong``: BABILong items as a training (and validation) stream (Kuratov et al.
2024, arXiv 2406.10149: models fine-tuned on BABILong at short lengths are measured far past
them).

Example ``i`` is a pure function of (``data.seed``, ``i``, the step): a task drawn from
``data.babilong_tasks``, a bAbI story (:mod:`blocklab.data.babi`), hidden in the haystack
(:func:`blocklab.data.babilong.build_sample`) at one length per batch uniform in
``[min_len, max_len(step)]`` (the length curriculum of the synthetic mixture), then

    bos + tokens(context + "\\n\\n" + question + " Answer:") + tokens(" " + answer)

with targets on the answer's tokens only. Training and validation are disjoint twice over: their
stories are drawn under different salts, and their haystacks are different text — validation
reads the last :data:`VAL_SHARE` of the haystack's sentences, training the rest. The tokenizer
is byte, char or bpe (the last two built on the haystack text and bAbI's words, the BPE cached
like a text run's) or a file.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blocklab.config import ConfigError, DataConfig, TokenizerConfig, TokenizerName
from blocklab.config.validate_data import longest
from blocklab.data.babi import MIN_FACTS, STORY_FACTS, VOCABULARY, story
from blocklab.data.babilong import ANSWER, PROMPT, TooShort, build_sample
from blocklab.data.haystack import ESSAY, sentences_of, source_texts
from blocklab.data.synthetic import Example, example_rng
from blocklab.provenance import digest

#: The share of the haystack's sentences (its end) that validation reads.
VAL_SHARE = 0.1
FORMAT = 1  # bumped when the examples of a config change


def haystack_documents(source: str) -> list[tuple[str, str]]:
    """(name, text) of ``data.haystack``; a missing file is a config error naming the key."""
    try:
        return source_texts(source, ESSAY)
    except ValueError as e:
        raise ConfigError(f"config error: data.haystack={source!r}: not essay, shakespeare or "
                          "a readable text file") from e


def split_sentences(docs: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(training, validation) sentences: the haystack's in text order, the last
    :data:`VAL_SHARE` for validation."""
    sentences = [s for _, text in docs for s in sentences_of(text)]
    cut = len(sentences) - max(1, int(len(sentences) * VAL_SHARE))
    return sentences[:cut], sentences[cut:]


def _babi_text(n: int = 400) -> list[str]:
    """Stories of every task as prompts, so a char / BPE vocabulary knows bAbI's words."""
    rng = random.Random(0)
    out = []
    for i in range(n):
        s = story(("qa1", "qa2", "qa3", "qa4", "qa5")[i % 5], rng)
        out.append(PROMPT.format(context=" ".join(s.facts), question=s.question)
                   + ANSWER.format(answer=s.answer))
    return out


def tokenizer_for(data: DataConfig, cfg: TokenizerConfig, docs: list[tuple[str, str]]
                  ) -> tuple[Any, Any]:
    """(tokenizer, specials) of a babilong run: byte; char or bpe built on the haystack and
    bAbI's words (the BPE cached under the data cache); a file."""
    from blocklab.data import tokenizer as t

    name = cfg.name
    if name is TokenizerName.file:
        tok, specials, _ = t.load_user_tokenizer(cfg.path)
        return tok, specials
    if name is TokenizerName.byte:
        return t.byte_tokenizer(), t.BLOCKLAB_SPECIALS
    texts = [text for _, text in docs] + _babi_text()
    if name is TokenizerName.char:
        return t.char_tokenizer(set("".join(texts))), t.BLOCKLAB_SPECIALS
    if name is TokenizerName.bpe:
        from blocklab.data.prepare import _cached, cache_root

        key = digest({"babilong": FORMAT, "haystack": [(n, digest(x)) for n, x in docs],
                      "vocab_size": cfg.vocab_size, "sample_bytes": cfg.sample_bytes})

        def build() -> Any:
            budget, out = cfg.sample_bytes, []
            for x in texts:
                out.append(x[:budget])
                budget -= len(out[-1])
                if budget <= 0:
                    break
            return t.train_bpe(cfg, out)

        return _cached(cache_root(data), f"babilong-bpe-{key}", build), t.BLOCKLAB_SPECIALS
    raise ConfigError(f"config error: tokenizer.name={name.value!r}: babilong data uses "
                      "tokenizer=byte, char, bpe or file")


class BabilongStream:
    """``stream(index, step)`` -> :class:`Example` over ``sentences`` (``salt``: train / val);
    ``only``: draw from these tasks alone (``data.val_tasks``); ``length``: every example this
    long (``data.val_len``)."""

    def __init__(self, data: DataConfig, encode: Callable[[str], list[int]], bos: int,
                 sentences: list[str], salt: str, *, only: list[str] | None = None,
                 length: int | None = None, count: Callable[[str], int] | None = None) -> None:
        """``count``: the number of tokens of a text without encoding it, where the tokenizer
        allows (byte: its UTF-8 bytes; char: its characters)."""
        self.d, self.encode, self.bos, self.sentences, self.salt = data, encode, bos, sentences, salt
        self.count = count
        self.tasks = [t for t in data.babilong_tasks if not only or t in only]
        self.length = length
        self._counts: dict[str, int] = {}
        self.depth = (float(data.babilong_depth[0]), float(data.babilong_depth[1]))

    def ntok(self, text: str) -> int:
        """Tokens of ``text``; a short one (a sentence) remembered (haystack sentences recur
        across examples)."""
        if self.count is not None:
            return self.count(text)
        if len(text) > 400:
            return len(self.encode(text))
        n = self._counts.get(text)
        if n is None:
            if len(self._counts) > 500_000:
                self._counts.clear()
            n = self._counts[text] = len(self.encode(text))
        return n

    def max_len(self, step: int) -> int:
        started = [n for start, n in self.d.curriculum if start <= step]
        top = longest(self.d)
        return min(started[-1], top) if started else top

    def facts(self, task: str) -> int | None:
        return None if task == "qa4" else self.d.babilong_facts

    def __call__(self, index: int, step: int | None = None) -> Example:
        d = self.d
        rng = example_rng(d.seed, index, self.salt)
        task = rng.choice(self.tasks)
        batch_rng = example_rng(d.seed, index // d.batch_size, self.salt + ":length")
        hi = longest(d) if step is None else self.max_len(step)
        lo = min(d.min_len, hi)
        if self.length:
            length = self.length
        elif d.segment_mode == "split" and hi >= d.seq_len:  # whole segments, as the mixture
            t = d.seq_len
            length = t * batch_rng.randint(max(-(-lo // t), 1), hi // t)
        else:
            length = batch_rng.randint(lo, hi)
        return self.example(task, length, rng)

    def example(self, task: str, length: int, rng: random.Random,
                n_facts: int | None = None) -> Example:
        s = story(task, rng, n_facts=n_facts or self.facts(task))
        answer = self.encode(ANSWER.format(answer=s.answer))
        reserve = 1 + self.ntok(PROMPT.format(context="", question=s.question)) + len(answer)
        for _ in range(4):
            try:
                x = build_sample(s, self.sentences, length, self.ntok, rng, depth=self.depth,
                                 reserve=reserve)
            except TooShort:
                if n_facts is not None and n_facts <= MIN_FACTS[task]:
                    raise
                # a story longer than this length holds (rare past the check of
                # check_lengths): the smallest story of the task instead
                return self.example(task, length, rng, MIN_FACTS[task])
            prompt = self.encode(x.prompt())
            over = 1 + len(prompt) + len(answer) - length
            if over <= 0:
                break
            reserve += over  # the joint tokenization came out longer than its parts
        tokens = [self.bos, *prompt, *answer]
        return Example(tokens, [False] * (1 + len(prompt)) + [True] * len(answer),
                       meta={"task": task, "answer": s.answer, "question": s.question,
                             "depths": list(x.depths), "n_facts": len(s.facts),
                             "supporting_depths": list(x.supporting_depths)})


def check_lengths(stream: BabilongStream) -> None:
    """A config error (one line) when ``data.min_len`` cannot hold a story of the usual largest
    size of a task (its facts, question and answer in this tokenizer's tokens)."""
    d = stream.d
    for task in stream.tasks:
        n = stream.facts(task) or STORY_FACTS[task][1]
        s = story(task, random.Random(0), n_facts=n)
        need = (1 + sum(stream.ntok(" " + f) for f in s.facts)
                + stream.ntok(PROMPT.format(context="", question=s.question))
                + stream.ntok(ANSWER.format(answer=s.answer)))
        if need > d.min_len:
            raise ConfigError(
                f"config error: data.min_len={d.min_len}: a {task} story of {n} facts, its "
                f"question and answer take about {need} tokens of this tokenizer; raise "
                "data.min_len (and seq_len) or lower data.babilong_facts")


def haystack_identity(source: str, docs: list[tuple[str, str]], how: str) -> Any:
    """What identifies the haystack in the fingerprint: a file by path + size + mtime (``stat``)
    or content; the built-in sources by their text's digest."""
    path = Path(source)
    if source not in ("essay", "shakespeare") and how == "stat":
        st = path.stat()
        return [str(path.resolve()), st.st_size, st.st_mtime_ns]
    return [(n, digest(x)) for n, x in docs]


def babilong_streams(data: DataConfig, tok_cfg: TokenizerConfig) -> dict[str, Any]:
    """The fields of the :class:`~blocklab.data.streams.Streams` of ``data.name=babilong``."""
    docs = haystack_documents(data.haystack)
    train_s, val_s = split_sentences(docs)
    tok, specials = tokenizer_for(data, tok_cfg, docs)

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    count = {TokenizerName.byte: lambda t: len(t.encode("utf-8")),
             TokenizerName.char: len}.get(tok_cfg.name)
    train = BabilongStream(data, encode, specials.bos, train_s, "train", count=count)
    val = BabilongStream(data, encode, specials.bos, val_s, "val",
                         only=list(data.val_tasks), length=data.val_len, count=count)
    check_lengths(train)
    for stream, part in ((train, "training"), (val, "validation")):
        try:  # the longest example of each part: the haystack is never repeated
            stream.example(stream.tasks[0], longest(data), random.Random(0))
        except TooShort:
            raise ConfigError(
                f"config error: data.haystack={data.haystack!r}: its {part} part "
                f"({len(stream.sentences):,} sentences) is too short for "
                f"{longest(data)} tokens (it is never repeated); use a longer text "
                "(shakespeare) or shorter items (data.seq_len / doc_len)") from None
    tok_json = tok.to_str()
    spec = {"babilong": FORMAT, "tasks": list(data.babilong_tasks),
            "depth": [float(x) for x in data.babilong_depth], "facts": data.babilong_facts,
            "haystack": haystack_identity(data.haystack, docs, data.fingerprint),
            "val_share": VAL_SHARE, "tokenizer": digest(tok_json),
            "curriculum": [list(st) for st in data.curriculum], "val_len": data.val_len,
            "val_tasks": sorted(data.val_tasks),
            **{k: getattr(data, k) for k in ("seed", "seq_len", "min_len", "batch_size")},
            **({"segment_mode": data.segment_mode, "doc_len": data.doc_len}
               if data.segment_mode != "none" else {})}
    chars = sum(len(s) for s in train_s)
    described = (f"babilong {', '.join(data.babilong_tasks)} in the {data.haystack} haystack "
                 f"({len(train_s):,} training sentences, {chars:,} characters; "
                 f"validation: the last {len(val_s):,} sentences, other stories); facts at "
                 f"depths {data.babilong_depth[0]:g}..{data.babilong_depth[1]:g}; no haystack "
                 f"sentence naming any of the {len(VOCABULARY)} bAbI words is used")
    return {"train": train, "val": lambda i, step=None: val(i, None), "tokenizer": tok_json,
            "vocab_size": tok.get_vocab_size(), "fingerprint": digest(spec),
            "description": described, "specials": specials}

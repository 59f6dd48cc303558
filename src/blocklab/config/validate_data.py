"""The rules of the data and tokenizer configs: sizes, rates and choices, the synthetic
mixture (enough distinct keys and values for every task used) and where text comes from.
Files are read later, by the data package (missing or malformed data is a data error, exit 3)."""

from __future__ import annotations

import dataclasses
import glob
import sys
from pathlib import Path

from blocklab.config.checks import _check, _fail, _finite, _name, _one_of, val_tasks_trained
from blocklab.config.schema import (
    DATA_FORMATS,
    DOCUMENT_SPLITS,
    FILLERS,
    FORMAT_SUFFIXES,
    LONG_DOCUMENTS,
    MARKOV_MIN_FILLER,
    MQAR_LAYOUTS,
    SEGMENT_MODES,
    SOURCE_FINGERPRINTS,
    UTF8_ERRORS,
    DataConfig,
    DataName,
    TaskWeights,
    TokenizerConfig,
    TokenizerName,
    counting_min_length,
    distinct_ids,
    mqar_min_length,
    multihop_min_length,
    needle_min_length,
)
from blocklab.errors import ConfigError


def longest(d: DataConfig) -> int:
    """The longest training sequence: ``data.doc_len`` (null: ``seq_len``) when a document is
    read segment by segment (``data.segment_mode=split``), else ``data.seq_len``."""
    return (d.doc_len or d.seq_len) if d.segment_mode == "split" else d.seq_len


def validate_segments(d: DataConfig, key: str = "data") -> None:
    """``data.segment_mode`` and ``data.doc_len`` (docs/memory.md): stream reads text, neither
    mode packs, a document is a whole number of segments of ``data.seq_len``."""
    _one_of(f"{key}.segment_mode", d.segment_mode, SEGMENT_MODES,
            "none: rows as they are; split: one document per example, segment by segment; "
            "stream: a text corpus as data.batch_size lanes")
    mode = d.segment_mode
    _check(mode != "stream" or _name(d.name) == DataName.text.value, f"{key}.segment_mode",
           mode, "stream reads a text corpus as lanes; synthetic data uses split")
    _check(mode == "none" or not d.packing, f"{key}.packing", d.packing,
           f"segment modes lay documents out themselves ({key}.segment_mode={mode})",
           f"set {key}.packing=false")
    if d.doc_len is not None:
        _check(mode == "split", f"{key}.doc_len", d.doc_len,
               f"the longest document of {key}.segment_mode=split (not {mode})",
               "leave it null")
        _check(d.doc_len >= d.seq_len and d.doc_len % d.seq_len == 0, f"{key}.doc_len",
               d.doc_len, f"a whole number of segments of {key}.seq_len={d.seq_len}")


def validate_mixture(d: DataConfig, key: str = "data") -> DataConfig:
    """The synthetic mixture: task weights, distractors, curriculum, lengths, fillers and
    enough distinct keys and values for the longest sequence of every task used."""
    weights = d.tasks if isinstance(d.tasks, dict) else dataclasses.asdict(d.tasks)
    known = [f.name for f in dataclasses.fields(TaskWeights)]
    unknown = sorted(set(weights) - set(known))
    if unknown:
        raise ConfigError(f"config error: {key}.tasks.{unknown[0]}: unknown task; known: "
                          f"{', '.join(sorted(known))}")
    users = dict(d.user_tasks or {})
    for name, w in users.items():  # a user's task: registered, weighted, its own rules
        _check(name not in known, f"{key}.user_tasks.{name}", w,
               f"a task of blocklab's own is weighted at {key}.tasks.{name}")
        _check(_finite(w) and w >= 0, f"{key}.user_tasks.{name}", w, "must be >= 0")
        if w:
            from blocklab.registry import lookup  # only a config that names a user task

            lookup("task", name, f"{key}.user_tasks.{name}").check(d, f"{key}.user_tasks.{name}")
    if not all(_finite(w) and w >= 0 for w in weights.values()) or (
            sum(weights.values()) + sum(users.values()) <= 0):
        raise _fail(f"{key}.tasks", weights, "weights must be >= 0 with a positive sum")
    used = {k for k, w in weights.items() if w}
    trained = used | {k for k, w in users.items() if w}
    val_tasks_trained(key, list(d.val_tasks), trained, "data.tasks with weight > 0")
    top = longest(d)  # seq_len, or doc_len in split mode
    top_name = "doc_len" if top != d.seq_len else "seq_len"
    _check(d.val_len is None or d.min_len <= d.val_len <= top, f"{key}.val_len",
           d.val_len, f"must be null or in min_len..{top_name} ({d.min_len}..{top})")
    _check(len(d.n_distractors) == 2, f"{key}.n_distractors", d.n_distractors,
           "needs [min, max]")
    lo, hi = d.n_distractors
    _check(0 <= lo <= hi, f"{key}.n_distractors", d.n_distractors, "need 0 <= min <= max")
    stages = [list(st) for st in d.curriculum]
    _check(all(len(st) == 2 and st[0] >= 0 and st[1] >= d.min_len for st in stages)
           and stages == sorted(stages), f"{key}.curriculum", stages,
           f"needs [[from_step, max_len], ...] sorted by step, each max_len >= "
           f"min_len={d.min_len}")
    _check(d.segment_mode != "split" or all(st[1] <= top for st in stages), f"{key}.curriculum",
           stages, f"each max_len must be <= the document length {top} (data.doc_len)")
    _check(8 <= d.min_len <= top, f"{key}.min_len", d.min_len,
           f"need 8 <= min_len <= seq_len={d.seq_len}" if top == d.seq_len else
           f"need 8 <= min_len <= the document length {top} (data.doc_len)")
    if "needle" in used:
        _check(bool(d.fillers) and set(d.fillers) <= set(FILLERS), f"{key}.fillers", d.fillers,
               f"needs one or more of {', '.join(FILLERS)}")
        needed = needle_min_length(hi)
        _check(d.min_len >= needed, f"{key}.min_len", d.min_len,
               f"needle with {hi} distractors needs sequences of at least {needed} tokens")
    _check(d.n_filler >= MARKOV_MIN_FILLER, f"{key}.n_filler", d.n_filler,
           f"must be >= {MARKOV_MIN_FILLER} (the Markov filler gives each filler token "
           f"{MARKOV_MIN_FILLER} distinct successors)")
    for name in ("n_keys", "n_values"):
        _check(getattr(d, name) >= 1, f"{key}.{name}", getattr(d, name), "must be >= 1")
    _check(len(d.multihop_hops) == 2 and 1 <= d.multihop_hops[0] <= d.multihop_hops[1],
           f"{key}.multihop_hops", list(d.multihop_hops), "needs [min, max] with 1 <= min <= max")
    for task, shortest in (("multihop", multihop_min_length(d.multihop_hops[0], 1)),
                           ("counting", counting_min_length(2, 1))):
        _check(task not in used or d.min_len >= shortest, f"{key}.min_len", d.min_len,
               f"{task} needs sequences of at least {shortest} tokens")
    if d.mqar_pairs is not None:  # Zoology's layout: exactly mqar_pairs pairs per sequence
        _check(d.mqar_pairs >= 1, f"{key}.mqar_pairs", d.mqar_pairs,
               "must be null (as many pairs as fit) or >= 1")
        lo = d.mqar_min_pairs
        _check(lo is None or 1 <= lo <= d.mqar_pairs, f"{key}.mqar_min_pairs", lo,
               f"must be null or in 1..data.mqar_pairs={d.mqar_pairs}")
        _one_of(f"{key}.mqar_layout", d.mqar_layout, MQAR_LAYOUTS)
        shortest = mqar_min_length(d.mqar_pairs, d.mqar_layout)
        _check("mqar" not in used or d.min_len >= shortest, f"{key}.min_len", d.min_len,
               f"mqar with data.mqar_pairs={d.mqar_pairs} ({d.mqar_layout} layout) needs "
               f"sequences of at least {shortest} tokens")
    _check(d.mqar_layout != "segments" or (d.segment_mode == "split" and top >= 2 * d.seq_len),
           f"{key}.mqar_layout", d.mqar_layout, "records in the first segment, queries in the "
           "last: needs data.segment_mode=split and data.doc_len >= 2 x data.seq_len")
    if d.mqar_layout == "segments" and d.mqar_pairs and "mqar" in used and \
            d.min_len < 2 * d.seq_len:  # documents of one segment: records, then queries
        n, t = d.mqar_pairs, d.seq_len
        _check(t // 2 - 1 >= 2 * n and t - t // 2 >= 3 * n, f"{key}.mqar_pairs", n,
               f"a document of one segment (data.min_len={d.min_len} < 2 x data.seq_len) "
               f"holds its records in the first half of data.seq_len={t} and its queries in "
               f"the second: {n} pairs need data.seq_len >= {2 * max(2 * n + 1, 3 * n)} "
               "(or data.min_len >= 2 x data.seq_len)")
    _check(d.mqar_min_pairs is None or d.mqar_pairs is not None, f"{key}.mqar_min_pairs",
           d.mqar_min_pairs, "needs data.mqar_pairs (the Zoology layout) set")
    _check(d.mqar_layout == "spread" or d.mqar_pairs is not None, f"{key}.mqar_layout",
           d.mqar_layout, "needs data.mqar_pairs (the number of pairs) set")
    _check(d.listops_gap >= 0 and ("listops" not in used
                                    or d.min_len >= 2 * d.listops_gap + 16),
           f"{key}.listops_gap", d.listops_gap,
           f"must be >= 0, and listops needs data.min_len >= 2 x gap + 16 (min_len={d.min_len})")
    for task in sorted(used):
        n_k, n_v = ((d.mqar_pairs,) * 2 if task == "mqar" and d.mqar_pairs is not None
                    else distinct_ids(task, top, hi, d.multihop_hops))
        if d.n_keys < n_k or d.n_values < n_v:
            name = "n_keys" if d.n_keys < n_k else "n_values"
            raise _fail(f"{key}.{name}", getattr(d, name), f"{task} at {top_name}={top} "
                        f"needs {n_k} distinct keys and {n_v} distinct values",
                        "raise data.n_keys/n_values or lower data.seq_len")
    return d


def validate_data(d: DataConfig, tok: TokenizerConfig, key: str = "data") -> DataConfig:
    """Sizes, rates and choices of the data and tokenizer configs (files are read later, by
    the data package: missing or malformed data is a data error, exit 3)."""
    _check(d.batch_size >= 1, f"{key}.batch_size", d.batch_size, "must be >= 1")
    _check(d.seq_len >= 8, f"{key}.seq_len", d.seq_len, "must be >= 8")
    _check(d.val_batches >= 1, f"{key}.val_batches", d.val_batches, "must be >= 1")
    _check(d.pad_to_multiple is None or d.pad_to_multiple >= 1, f"{key}.pad_to_multiple",
           d.pad_to_multiple, "must be null (pad to the longest row) or >= 1")
    _check(d.num_workers >= 0, f"{key}.num_workers", d.num_workers,
           "must be >= 0 (0 = load in the main process)")
    _check(_finite(d.val_fraction) and 0 < d.val_fraction < 1, f"{key}.val_fraction",
           d.val_fraction, "must be in (0, 1)")
    _check(_finite(d.mlm_probability) and 0 < d.mlm_probability <= 1,
           f"{key}.mlm_probability", d.mlm_probability, "must be in (0, 1]")
    _one_of(f"{key}.format", d.format, DATA_FORMATS,
            "the reader of data.files; convert other formats to JSON lines or parquet")
    _one_of(f"{key}.long_documents", d.long_documents, LONG_DOCUMENTS)
    _one_of(f"{key}.utf8_errors", d.utf8_errors, UTF8_ERRORS)
    validate_segments(d, key)
    synthetic_tok = _name(tok.name) == TokenizerName.synthetic.value
    if _name(d.name) == DataName.synthetic.value:
        _check(synthetic_tok, "tokenizer.name", _name(tok.name),
               "synthetic data uses tokenizer=synthetic")
        validate_mixture(d, key)
    else:
        _check(not synthetic_tok, "tokenizer.name", _name(tok.name),
               "the synthetic vocabulary only tokenizes synthetic data",
               "use tokenizer=bpe, byte, char or file")
        if _name(d.name) == DataName.babilong.value:
            from blocklab.config.validate_babilong import validate_babilong

            validate_babilong(d, key)
        else:
            validate_text_sources(d, key)
    if _name(tok.name) == TokenizerName.file.value:
        _check(bool(tok.path), "tokenizer.path", tok.path, "tokenizer=file needs a path to a "
               "tokenizer.json")
    if _name(tok.name) == TokenizerName.bpe.value:
        _check(tok.vocab_size >= 1, "tokenizer.vocab_size", tok.vocab_size, "must be >= 1")
    if _name(tok.name) in (TokenizerName.bpe.value, TokenizerName.char.value):
        _check(tok.sample_bytes >= 1, "tokenizer.sample_bytes", tok.sample_bytes, "must be >= 1")
    return d


def has_sources(d: DataConfig | None) -> bool:
    """Whether a data config names any text (``blocklab-eval``'s ``data``: none = no corpus)."""
    return d is not None and bool(d.files or d.val_files or d.corpus or d.hub_dataset)


#: data.val_split's choices besides a split name
VAL_SPLITS = ("auto", "none", "last")  # last: the held-out tail whatever the document count


def validate_text_sources(d: DataConfig, key: str = "data", *, evaluation: bool = False
                          ) -> DataConfig:
    """Where text comes from and how it is read: a corpus, files or a hub dataset (for an
    evaluation corpus, ``blocklab-eval data=``, validation files alone do), and the validation
    source (``val_files`` / ``val_split``) that replaces the held-out fraction."""
    if d.corpus:
        from blocklab import registry

        registry.lookup("corpus", d.corpus, f"{key}.corpus")
    else:
        _check(bool(d.files) or bool(d.hub_dataset) or (evaluation and bool(d.val_files)),
               f"{key}.files", list(d.files),
               "text data needs data.corpus, data.files or data.hub_dataset"
               + (" (or data.val_files)" if evaluation else ""))
    _check(d.format != "disk" or d.corpus or not d.files or len(d.files) == 1, f"{key}.files",
           list(d.files), "format=disk reads one dataset directory (saved with datasets' "
           "save_to_disk)")
    _check(d.format != "disk" or len(d.val_files) <= 1, f"{key}.val_files", list(d.val_files),
           "format=disk reads one dataset directory (saved with datasets' save_to_disk)")
    has_splits = bool(d.hub_dataset) or (d.format == "disk" and not d.corpus)
    _check(has_splits or d.hub_split == "train", f"{key}.hub_split", d.hub_split,
           f"only a hub dataset or a saved DatasetDict (format=disk) has splits; "
           f"{_source_words(d)} have none", "leave it at 'train'")
    named = d.val_split not in VAL_SPLITS
    _check(bool(d.val_split) and (not named or has_splits), f"{key}.val_split", d.val_split,
           f"auto, none, last or the name of a split of a hub dataset or a saved DatasetDict "
           f"(format=disk); {_source_words(d)} have no splits",
           "give validation files with data.val_files")
    _check(not ((named or d.val_split == "last") and d.val_files), f"{key}.val_split",
           d.val_split,
           f"data.val_files={list(d.val_files)} is the validation source already; give one")
    for name in ("val_tasks", "val_len"):
        value = getattr(d, name)
        _check(not value, f"{key}.{name}", list(value) if name == "val_tasks" else value,
               "synthetic data only (text validates on data.val_files, data.val_split or a "
               "held-out part)")
    _one_of(f"{key}.documents", d.documents, DOCUMENT_SPLITS)
    _one_of(f"{key}.fingerprint", d.fingerprint, SOURCE_FINGERPRINTS)
    _check(d.num_proc is None or d.num_proc >= 1, f"{key}.num_proc", d.num_proc,
           "must be null (every core) or >= 1")
    _check(d.format == "text" or bool(d.text_key), f"{key}.text_key", d.text_key,
           f"{d.format} records need the name of their text column")
    if not evaluation:
        _warn_validation_on_training(d, key)
    return d


def _warn_validation_on_training(d: DataConfig, key: str) -> None:
    """One warning line when ``data.val_files`` names a file the training sources hold too
    (the same path, another spelling of it, a link to it, a directory or glob holding it):
    every validation loss on it is a training loss. A warning, not a refusal: measuring
    exactly that is a deliberate control (blocklab-repro's ``val-on-train`` break)."""
    shared = shared_files(d)
    if shared:
        names = [str(p) for p in shared]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        train = f"{key}.corpus={d.corpus}" if d.corpus else f"{key}.files"
        print(f"warning: {key}.val_files and {train} share {len(names)} "
              f"file{'s' if len(names) > 1 else ''} ({shown}): the validation loss on "
              f"{'them' if len(names) > 1 else 'it'} is a training loss", file=sys.stderr)


def shared_files(d: DataConfig) -> list[Path]:
    """The files of ``data.val_files`` that the training sources (``data.files`` or the
    corpus's files) also read, found by identity (device and inode: a symbolic link, a hard
    link or another spelling of a path is the same file), expanded as the data package reads
    them (a file; a directory: its files of the format, recursively; a glob). Entries that
    match nothing are left to the data package to report; a hub dataset has no files here."""
    if not d.val_files or d.hub_dataset:
        return []
    if d.corpus:
        from blocklab import registry

        train = [str(f) for f in registry.lookup("corpus", d.corpus, "data.corpus")()]
    else:
        train = list(d.files)
    seen = {_identity(f): f for f in _expand(train, d.format)}
    return [f for f in _expand(list(d.val_files), d.format) if _identity(f) in seen]


def _expand(entries: list[str], fmt: str) -> list[Path]:
    out: list[Path] = []
    for entry in entries:
        p = Path(entry)
        if fmt == "disk":  # one saved dataset directory
            out += [p] if p.exists() else []
        elif any(ch in entry for ch in "*?["):
            out += sorted(Path(f) for f in glob.glob(entry, recursive=True) if Path(f).is_file())
        elif p.is_dir():
            suffixes = FORMAT_SUFFIXES.get(fmt, ())
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in suffixes)
        elif p.is_file():
            out.append(p)
    return list(dict.fromkeys(out))


def _identity(path: Path) -> tuple[int, int] | Path:
    try:
        st = path.stat()
    except OSError:
        return path.absolute()
    return st.st_dev, st.st_ino


def _source_words(d: DataConfig) -> str:
    return (f"corpus {d.corpus}'s files" if d.corpus else
            f"data.files in format {d.format}")

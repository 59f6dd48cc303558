"""The data a checkpoint is evaluated on when ``blocklab-eval`` computes its validation loss.

A checkpoint may come from someone else, and the paths its config names are only data: they
are opened on request alone (``run_data``). ``auto`` (the default) computes the loss on the
run's own data only where that needs no file — synthetic data, generated from seeds — and skips
it for a text run, saying so and how to ask; ``true`` evaluates on the run's recorded text
sources: resolved and shown, refused if they changed since the run (the file list and
fingerprint recorded at training, as resume checks them), tokenized with the checkpoint's own
tokenizer (never one trained or loaded from a stored path), and prepared under the evaluation's
destination, never at a stored ``data.cache_dir``; ``false`` computes no validation loss.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from blocklab.config import DataConfig, DataName, TokenizerConfig, TokenizerName
from blocklab.errors import DataError
from blocklab.provenance import text_hash

MAX_LISTED = 10_000  # source files a checkpoint lists by name, size and mtime (more: count only)
CACHE = "data-cache"  # under the evaluation's destination


def run_streams(loaded: Any, run_data: str, dest: Path, log=print) -> tuple[Any, str | None]:
    """(the streams to compute the validation loss on, None) or (None, why it is skipped) for
    checkpoint ``loaded`` (``checkpoint.Loaded``); ``dest`` is the evaluation's destination."""
    from blocklab.data.streams import build_streams

    tc = loaded.config
    if run_data == "false":
        return None, "validation loss skipped (run_data=false)"
    if tc.data.name is not DataName.text:  # generated from the stored seeds: no corpus read
        tok = (TokenizerConfig(name=TokenizerName.synthetic) if tc.data.name is
               DataName.synthetic else embedded_tokenizer(loaded.meta, dest / CACHE))  # babilong
        return build_streams(tc.data, tok, bptt=tc.trainer.bptt), None
    named = describe(tc.data)
    if run_data != "true":
        return None, (f"validation loss skipped: the run trained on text ({named}) that only "
                      "the checkpoint names; to read and evaluate on it pass run_data=true")
    tc = _relocated(loaded, log)
    named = describe(tc.data)
    try:
        now = listing(tc.data)
    except DataError as e:  # a source that is no longer there (or not readable)
        raise _changed(loaded, str(e).removeprefix("data error: ")) from None
    log(f"run data: evaluating on the run's recorded sources: {named} "
        f"({len(now)} files, prepared under {dest / CACHE})")
    changed = sources_changed(loaded.meta.get("data_sources"), now)
    if changed:
        raise _changed(loaded, changed)
    data = dataclasses.replace(tc.data, cache_dir=str(dest / CACHE))
    streams = build_streams(data, embedded_tokenizer(loaded.meta, dest / CACHE),
                            bptt=tc.trainer.bptt)
    recorded = loaded.meta.get("data_fingerprint")
    if streams.fingerprint != recorded:
        raise _changed(loaded, f"data fingerprint {recorded}, now {streams.fingerprint}")
    return streams, None


def _relocated(loaded: Any, log) -> Any:
    """The stored config with its relative sources that are missing from here read from the
    directory the run was started in (data/relocate.py; said); a source found nowhere is
    refused naming the key and the override (``blocklab-eval data=`` takes other text)."""
    from blocklab.data.relocate import relocate, run_origin

    tc = loaded.config
    r = relocate(tc.data, None, run_origin(loaded.meta, loaded.run_dir), "run_data=true",
                 fix="data=text_files {key}={value} (another corpus: no check against the run)")
    for note in r.notes:
        log(note)
    return dataclasses.replace(tc, data=r.data)


def _changed(loaded: Any, what: str) -> DataError:
    return DataError(f"data error: run_data=true: the run's sources changed since checkpoint "
                     f"{loaded.path} was saved ({what}); its loss on them would not be the "
                     "run's — restore the sources as they were to evaluate on the run's data")


def describe(data: DataConfig) -> str:
    """The text sources a data config names, without opening anything."""
    from blocklab.data.splits import named_sources

    return named_sources(data)


def listing(data: DataConfig) -> list[list[Any]]:
    """``[path, bytes, mtime_ns]`` of every source file a text config resolves to (what the
    ``stat`` fingerprint reads), its validation files included; a hub dataset has none. A
    missing source is a data error."""
    if data.name is not DataName.text:
        return []
    from blocklab.data.sources import resolve_files

    found = [] if data.hub_dataset else resolve_files(data)
    if data.val_files:
        found += resolve_files(dataclasses.replace(data, files=list(data.val_files),
                                                   corpus=None), "data.val_files")
    out = []
    for f in dict.fromkeys(found):
        st = f.stat()
        out.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
    return out


def record(data: DataConfig) -> list[list[Any]] | None:
    """What a checkpoint records of its run's sources (None: not text, or too many to list)."""
    if data.name is not DataName.text:
        return None
    now = listing(data)
    return now if len(now) <= MAX_LISTED else None


def sources_changed(recorded: list[list[Any]] | None, now: list[list[Any]]) -> str | None:
    """Which files were added, removed or changed (size, mtime) since ``recorded`` (None when
    nothing was recorded or nothing changed)."""
    if recorded is None:
        return None
    old = {str(p): (s, m) for p, s, m in recorded}
    new = {str(p): (s, m) for p, s, m in now}
    parts = []
    for word, names in (("added", sorted(new.keys() - old.keys())),
                        ("removed", sorted(old.keys() - new.keys()))):
        if names:
            parts.append(f"{word} {_some(names)}")
    changed = [f"{p} ({_how(old[p], new[p])})" for p in sorted(old.keys() & new.keys())
               if old[p] != new[p]]
    if changed:
        parts.append(f"changed {_some(changed)}")
    return "; ".join(parts) or None


def _how(old: tuple[int, int], new: tuple[int, int]) -> str:
    return f"size {old[0]:,} -> {new[0]:,} bytes" if old[0] != new[0] else "modified since"


def _some(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def embedded_tokenizer(meta: dict[str, Any], root: Path) -> TokenizerConfig:
    """The checkpoint's own tokenizer (and special ids) as a ``tokenizer=file`` config: written
    once, by content, under ``root`` (the evaluation's destination)."""
    tokenizer = meta["tokenizer"]
    specials = meta.get("specials") or {}
    d = root / "tokenizers" / f"checkpoint-{text_hash(tokenizer + json.dumps(specials))}"
    if not (d / "blocklab_specials.json").is_file():
        d.mkdir(parents=True, exist_ok=True)
        (d / "tokenizer.json").write_text(tokenizer)
        (d / "blocklab_specials.json").write_text(json.dumps(specials))
    return TokenizerConfig(name=TokenizerName.file, path=str(d))


#: How the model reads the text of an evaluation corpus (``blocklab-eval data=``): the run's
#: values, unless the command line sets one (``data.seq_len=4096``: then that one).
RUN_READING = ("seq_len", "packing", "long_documents", "pad_to_multiple", "mlm_probability",
               "seed")
#: The data keys an evaluation corpus reads besides RUN_READING: its sources, their format,
#: where it is prepared, and (``data.batch_size`` / ``data.val_batches``, as ``batch_size`` /
#: ``val_batches``) its batches. Any other data key set on the command line (a synthetic
#: task's, ``data.val_fraction``, ``data.num_workers``) would do nothing: refused.
CORPUS_KEYS = ("name", "files", "corpus", "format", "text_key", "documents", "hub_dataset",
               "hub_split", "val_files", "val_split", "cache_dir", "num_proc", "fingerprint",
               "utf8_errors", "batch_size", "val_batches")


def corpus_config(loaded: Any, data: DataConfig, given: frozenset[str] = frozenset()
                  ) -> tuple[DataConfig, list[str]]:
    """(the data config an evaluation corpus is read with, notes to say): ``data``'s sources
    and format, and of RUN_READING the command line's where it set the key (``given``: the
    ``data.*`` fields it set), the run's otherwise. A sequence length past the model's position
    table is refused naming the table (a learned one); past the training length (a scheme
    without a table: rotary, ALiBi, none) it is read and said. A data key the evaluation
    would not read is refused."""
    from blocklab import registry
    from blocklab.config.checks import require
    from blocklab.config.schema import LONG_DOCUMENTS

    for key in sorted(given):
        require(key in RUN_READING or key in CORPUS_KEYS, f"data.{key}", getattr(data, key, None),
                "not read by blocklab-eval data= (it scores every sequence of the corpus's "
                "validation source, else of all its sources, with the checkpoint's tokenizer)")
    run, model = loaded.config.data, loaded.config.model
    merged = dataclasses.replace(data, **{k: getattr(run, k) for k in RUN_READING
                                          if k not in given})
    require(merged.seq_len >= 8, "data.seq_len", merged.seq_len, "must be >= 8")
    require(merged.pad_to_multiple is None or merged.pad_to_multiple >= 1, "data.pad_to_multiple",
            merged.pad_to_multiple, "must be null (pad to the longest row) or >= 1")
    require(0 < merged.mlm_probability <= 1, "data.mlm_probability", merged.mlm_probability,
            "must be in (0, 1]")
    require(merged.long_documents in LONG_DOCUMENTS, "data.long_documents",
            merged.long_documents, f"one of {list(LONG_DOCUMENTS)}")
    scheme = registry.lookup("position", model.position.name)
    limit = scheme.positions_limit(model.position, max_seq_len=model.max_seq_len)
    require(limit is None or merged.seq_len <= limit, "data.seq_len", merged.seq_len,
            f"checkpoint {loaded.path}'s model has {model.position.name} positions, a table of "
            f"{limit} (model.max_seq_len): it reads at most {limit} tokens (the run trained at "
            f"{run.seq_len})")
    notes = []
    mine = [k for k in RUN_READING if k in given]
    if mine:
        said = ", ".join(f"data.{k}={getattr(merged, k)}" for k in mine)
        theirs = ", ".join(f"data.{k}={getattr(merged, k)}" for k in RUN_READING
                           if k not in given)
        notes.append(f"eval: reading the corpus with {said} (the command line's)"
                     + (f" and {theirs} (the run's)" if theirs else ""))
    if merged.seq_len > run.seq_len:
        notes.append(f"note: data.seq_len={merged.seq_len} is beyond the run's training length "
                     f"({run.seq_len}): positions past {run.seq_len} were never trained")
    return merged, notes


def corpus_streams(loaded: Any, data: DataConfig, dest: Path) -> Any:
    """The streams of another corpus (``blocklab-eval data=``), ``data`` as
    :func:`corpus_config` made it, tokenized with the checkpoint's own tokenizer and prepared
    under ``data.cache_dir`` (else ``$BLOCKLAB_DATA_CACHE``, else ``dest/data-cache``). A
    checkpoint whose tokenizer is the synthetic vocabulary tokenizes no text: refused."""
    import os

    from blocklab.data.prepare import CACHE_ENV
    from blocklab.data.streams import build_eval_streams
    from blocklab.errors import ConfigError

    if json.loads(loaded.meta["tokenizer"]).get("kind") == "synthetic":
        raise ConfigError(f"config error: data={describe(data)}: checkpoint {loaded.path} uses "
                          "the synthetic task vocabulary, which tokenizes no text; data= is "
                          "for checkpoints of text runs (a synthetic run's own loss: run_data)")
    cache = data.cache_dir or os.environ.get(CACHE_ENV) or str(dest / CACHE)
    data = dataclasses.replace(data, cache_dir=cache)
    return build_eval_streams(data, embedded_tokenizer(loaded.meta, Path(cache)))

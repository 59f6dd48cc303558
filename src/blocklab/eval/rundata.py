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
    if tc.data.name is not DataName.text:  # generated from the stored seeds: no file opened
        return build_streams(tc.data, TokenizerConfig(name=TokenizerName.synthetic)), None
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
    streams = build_streams(data, embedded_tokenizer(loaded.meta, dest / CACHE))
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


#: what an evaluation corpus takes from the run rather than from data= (how the model reads
#: text: its training length, packing, masking)
RUN_READING = ("seq_len", "packing", "long_documents", "pad_to_multiple", "mlm_probability",
               "seed")


def corpus_streams(loaded: Any, data: DataConfig, dest: Path) -> tuple[Any, DataConfig]:
    """(streams, data config) of another corpus (``blocklab-eval data=``): the sources and
    reading format of ``data`` (the command line's), the run's RUN_READING, tokenized with the
    checkpoint's own tokenizer and prepared under ``data.cache_dir`` (else
    ``$BLOCKLAB_DATA_CACHE``, else ``dest/data-cache``). A checkpoint whose tokenizer is the
    synthetic vocabulary tokenizes no text: refused."""
    import os

    from blocklab.data.prepare import CACHE_ENV
    from blocklab.data.streams import build_eval_streams
    from blocklab.errors import ConfigError

    if json.loads(loaded.meta["tokenizer"]).get("kind") == "synthetic":
        raise ConfigError(f"config error: data={describe(data)}: checkpoint {loaded.path} uses "
                          "the synthetic task vocabulary, which tokenizes no text; data= is "
                          "for checkpoints of text runs (a synthetic run's own loss: run_data)")
    run = loaded.config.data
    cache = data.cache_dir or os.environ.get(CACHE_ENV) or str(dest / CACHE)
    merged = dataclasses.replace(data, cache_dir=cache,
                                 **{k: getattr(run, k) for k in RUN_READING})
    return build_eval_streams(merged, embedded_tokenizer(loaded.meta, Path(cache))), merged

"""Evaluate a checkpoint on its own: rebuild model and tokenizer from the checkpoint (read,
verified and loaded once; its stored config plain data, never resolved or instantiated) and
report validation loss and probes. The data streams (data/streams.py) and the objective
(objectives/) are built by the same functions training uses, so the validation loss equals the
one the run logged; which data it is computed on, and which files that opens, is
eval/rundata.py's (``run_data``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from blocklab import checkpoint as ckpt
from blocklab.config import (
    ConfigError,
    DataConfig,
    TrainConfig,
    validate_run_probe_spec,
)
from blocklab.config.stored import stored_config
from blocklab.eval.report import strict_json
from blocklab.eval.rundata import corpus_config


def stored_train_config(meta: dict[str, Any]) -> TrainConfig:
    """A checkpoint's training config, checked as data (``config/stored.py``)."""
    return stored_config(meta.get("config"), "checkpoint metadata")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


@torch.no_grad()
def validation_loss(target: str | Path | ckpt.Loaded, *, batches: int | None = None,
                    batch_size: int | None = None, out_dir: str | Path | None = None,
                    run_data: str = "auto", model: torch.nn.Module | None = None,
                    dest: str | Path | None = None, keep: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """The checkpoint's validation loss on its run's validation stream, written to
    ``out_dir/val.json`` (default ``<run dir>/eval/<checkpoint>/val.json``); ``val_loss`` is
    None, with the reason in ``skipped``, where ``run_data`` (eval/rundata.py) says not to.
    ``target`` may be a checkpoint read already (and ``model`` its model); ``dest`` is where a
    prepared corpus may be cached (default: ``out_dir``'s, else ``<run dir>/eval``); ``keep``
    receives the streams read (``keep["streams"]``: the probes' perplexity reads the same
    validation text)."""
    from blocklab.data.datamodule import ResumableBatches
    from blocklab.eval.rundata import run_streams
    from blocklab.objectives import build_objective

    loaded = target if isinstance(target, ckpt.Loaded) else ckpt.read(target)
    meta, tc = loaded.meta, loaded.config
    if tc.data.segment_mode == "stream" and batch_size not in (None, tc.data.batch_size):
        raise ConfigError(f"config error: batch_size={batch_size}: a data.segment_mode=stream "
                          f"run reads its validation text as data.batch_size="
                          f"{tc.data.batch_size} lanes; leave batch_size unset")
    result = {"checkpoint": str(loaded.path), "step": meta["step"], "val_loss": None,
              "val_targets": 0, "arch_hash": meta["arch_hash"]}
    dest = Path(dest or out_dir or loaded.run_dir / "eval")
    streams, skipped = run_streams(loaded, run_data, dest, log=_stderr)
    if streams is None:
        return {**result, "skipped": skipped}
    if keep is not None:
        keep["streams"] = streams
    if model is None:
        model, _ = ckpt.model_of(loaded)
    objective = build_objective(tc.model.family.name, tc.data, streams.specials)
    summed = summed_loss(model, objective, streams.val, ResumableBatches(
        batch_size or tc.data.batch_size, stop=batches or tc.data.val_batches))
    result.update(val_loss=summed.loss, val_targets=summed.count)
    if summed.accuracy is not None:
        result["val_accuracy"] = summed.accuracy
    out_dir = Path(out_dir) if out_dir is not None else loaded.run_dir / "eval" / loaded.name
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "val.json").write_text(strict_json(result, indent=2))
    return result


@dataclasses.dataclass
class Summed:
    """Loss summed over ``count`` targets, and how many of them the argmax predicts (None
    where the objective does not count them)."""

    total: float = 0.0
    count: int = 0
    correct: int | None = 0

    @property
    def loss(self) -> float:
        return self.total / max(self.count, 1)

    @property
    def accuracy(self) -> float | None:
        return None if self.correct is None else self.correct / max(self.count, 1)


def summed_loss(model: torch.nn.Module, objective: Any, make: Callable[..., Any],
                batches: Iterable[Sequence[tuple[int, int | None]]]) -> Summed:
    """Summed loss, targets and correct targets of ``model`` over the examples
    ``make(index, step)`` of each batch of ``(index, step)`` keys, collated and scored by the
    family's ``objective`` (as validation in training does)."""
    s = Summed()
    with objective.reading():  # one pass (a segment mode's lanes continue batch to batch)
        for keys in batches:
            out = objective.loss(model, objective.collate([make(*k) for k in keys]))
            s.total, s.count = s.total + float(out.total), s.count + int(out.count)
            s.correct = None if s.correct is None or out.correct is None else (
                s.correct + int(out.correct))
    return s


@torch.no_grad()
def corpus_loss(loaded: ckpt.Loaded, data: DataConfig, *, model: torch.nn.Module,
                batches: int | None = None, batch_size: int | None = None,
                out_dir: str | Path | None = None, given: Iterable[str] = ()) -> dict[str, Any]:
    """``blocklab-eval ckpt=... data=...``: the loss and perplexity of the checkpoint's model on
    every sequence of another corpus (the first ``batches`` batches when given), tokenized
    with the checkpoint's tokenizer and read as eval/rundata.py ``corpus_config`` says (the
    run's sequence length, packing and masking, unless ``given`` — the ``data.*`` fields the
    command line set — names one); written to ``out_dir/data-<fingerprint>.json`` (default
    ``<run dir>/eval/<checkpoint>/``), the corpus's fingerprint (reading included) in the
    name, so results on different corpora never overwrite each other."""
    import math

    from blocklab.data.splits import validation_source
    from blocklab.eval.rundata import RUN_READING, corpus_config, corpus_streams, describe
    from blocklab.objectives import build_objective
    from blocklab.progress import Progress

    say = Progress("eval")
    given = frozenset(given)
    data, _ = corpus_config(loaded, data, given)
    out = Path(out_dir) if out_dir is not None else loaded.run_dir / "eval" / loaded.name
    if json.loads(loaded.meta["tokenizer"]).get("kind") != "synthetic":  # else refused below
        say(f"reading {describe(data)} with the checkpoint's tokenizer (prepared once, then "
            "cached)")
    streams = corpus_streams(loaded, data, Path(out_dir or loaded.run_dir / "eval"))
    size = batch_size or loaded.config.data.batch_size
    n = streams.val_examples if not batches else min(streams.val_examples, batches * size)
    objective = build_objective(loaded.config.model.family.name, data, streams.specials)
    starts = range(0, n, size)
    with say.count(f"loss over {n:,} sequences of up to {data.seq_len} tokens: batches",
                   len(starts)) as tick:
        def counted():
            for a in starts:
                yield [(i, None) for i in range(a, min(a + size, n))]
                tick()

        summed = summed_loss(model, objective, streams.val, counted())
    loss, count = summed.loss, summed.count
    source, what = validation_source(data)  # what was read: its validation source, if named
    file = out / (f"data-{streams.fingerprint}"
                  + (f"-{n}" if n < streams.val_examples else "") + ".json")
    result = {"checkpoint": str(loaded.path), "step": loaded.meta["step"],
              "data": what if source is not None else describe(data), "fingerprint": streams.fingerprint, "loss": loss,
              "perplexity": math.exp(min(loss, 700.0)), "tokens": count, "sequences": n,
              "of_sequences": streams.val_examples, "description": streams.description,
              "arch_hash": loaded.meta["arch_hash"], "file": str(file),
              # how the text was read, and which of it the command line set (else the run's)
              "reading": {k: getattr(data, k) for k in RUN_READING},
              "reading_from_command_line": [k for k in RUN_READING if k in given]}
    out.mkdir(parents=True, exist_ok=True)
    file.write_text(strict_json(result, indent=2))
    return result


def result_lines(r: dict[str, Any]) -> list[str]:
    """What ``blocklab-eval ckpt=...`` prints of a result of :func:`evaluate_checkpoint`."""
    lines = []
    if r.get("val_loss") is not None:
        lines.append(f"checkpoint {r['checkpoint']} (step {r['step']}): val/loss "
                     f"{r['val_loss']:.4f} over {r['val_targets']} targets"
                     + (f" (val/accuracy {r['val_accuracy']:.4f})" if "val_accuracy" in r
                        else ""))
    elif r.get("skipped"):
        lines.append(f"checkpoint {r['checkpoint']}: {r['skipped']}")
    c = r.get("corpus")
    if c:
        part = ("" if c["sequences"] == c["of_sequences"] else
                f", the first {c['sequences']:,} of {c['of_sequences']:,} sequences")
        lines.append(f"checkpoint {c['checkpoint']} (step {c['step']}) on {c['data']}: loss "
                     f"{c['loss']:.4f}, perplexity {c['perplexity']:.2f} over {c['tokens']:,} "
                     f"tokens{part} -> {c['file']}")
    h = r.get("harness")
    if h:
        from blocklab.eval.harness_tasks import headline_lines

        lines += [f"harness results {h['file']}", *headline_lines(h["metrics"])]
    return lines


def evaluate_checkpoint(target: str | Path, spec, *, val_batches: int | None = None,
                        batch_size: int | None = None, out: str | Path | None = None,
                        run_data: str = "auto", data: DataConfig | None = None,
                        data_keys: Iterable[str] | None = None,
                        harness: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    """``blocklab-eval ckpt=...``: validation loss — with ``data`` (a data config naming text),
    the loss and perplexity on that corpus instead (and the run's own too with
    ``run_data=true``: :func:`corpus_loss`) — then the probes (when ``spec`` is enabled).
    With ``out`` every output goes there (``val.json``, and the probe files in
    ``<spec>-<spec hash>/``) and the run directory is only read; without it they
    go under the run directory, which is then held like a training process holds it (one
    owner at a time). The checkpoint is resolved, verified and loaded once — of a run still
    training, its newest complete checkpoint — and everything is checked (the destination
    writable, the run free, the probe grid against the run's vocabulary, the corpus's reading
    against the model) before the first file is written. ``data_keys``: the ``data.*`` fields
    set on purpose — read as given, not taken from the run (default: those the command line
    set; from Python, none). ``harness``: lm-evaluation-harness tasks to run on the model
    (``tasks``, ``fewshot``, ``limit``, ``include``; eval/harness_tasks.py), their results file
    and headline metrics in ``result["harness"]``."""
    from blocklab.config import has_sources
    from blocklab.runlock import run_lock, writable_dir

    given = frozenset(command_line_keys("data") if data_keys is None else data_keys)
    if not has_sources(data):  # a data config naming no text: no corpus
        _refuse_unread(data, given)
        data = None
    # the corpus's batches: batch_size / val_batches, or data.batch_size / data.val_batches
    sizes = {k: _one_of(k, v, data) if data is not None and k in given else v
             for k, v in (("batch_size", batch_size), ("val_batches", val_batches))}
    if out is not None:
        owner = contextlib.nullcontext(writable_dir(out, "out="))
    else:
        run_dir = ckpt.run_dir_of(target)
        if not run_dir.is_dir():  # nothing there: its own error, and no lock file made
            ckpt.read(target)
        owner = run_lock(writable_dir(run_dir, "run directory"), "eval")
    with owner:
        loaded = ckpt.read(target)
        if spec.enabled:  # the grid that fits the run's tokenizer, checked before any work
            spec = validate_run_probe_spec(spec, loaded.config)
        if data is not None:  # how the corpus is read, checked against the model, said
            for note in corpus_config(loaded, data, given)[1]:
                _stderr(note)
        model, _ = ckpt.model_of(loaded)
        loaded = dataclasses.replace(loaded, weights={})  # the model holds them now
        own = data is None or run_data != "auto"  # with data=, the run's loss only if asked
        kept: dict[str, Any] = {}  # the streams validation read, for the probes' perplexity
        if loaded.meta.get("imported") or not own:  # imported: no training data to validate on
            result = {"checkpoint": str(loaded.path), "step": loaded.meta["step"],
                      "val_loss": None, "val_targets": 0, "arch_hash": loaded.meta["arch_hash"],
                      "skipped": "imported (no training data: validation loss skipped)"
                      if own else None}
        else:
            result = validation_loss(loaded, batches=val_batches, batch_size=batch_size,
                                     out_dir=out, run_data=run_data, model=model, keep=kept)
        if data is not None:
            result["corpus"] = corpus_loss(loaded, data, model=model,
                                           batches=sizes["val_batches"],
                                           batch_size=sizes["batch_size"], out_dir=out,
                                           given=given)
        validation = (validation_text(kept["streams"], kept["streams"].specials)
                      if "streams" in kept else None)
        probes = (probe_checkpoint(loaded, spec, out=probe_out(out, spec), model=model,
                                   validation=validation) if spec.enabled else None)
        if harness and harness.get("tasks"):
            result["harness"] = _harness(loaded, model, harness, out, batch_size)
    return result, probes


def _harness(loaded: ckpt.Loaded, model: torch.nn.Module, h: dict[str, Any],
             out: str | Path | None, batch_size: int | None) -> dict[str, Any]:
    """The harness tasks on the loaded model, their results beside the probe reports."""
    from blocklab.eval.harness import HarnessModel
    from blocklab.eval.harness_tasks import run_harness

    lm = HarnessModel(model, loaded.meta, loaded.config, batch_size=batch_size or 8)
    root = Path(out) if out is not None else loaded.run_dir / "probes" / loaded.name
    file, metrics = run_harness(lm, list(h["tasks"]), out_root=root, fewshot=h.get("fewshot"),
                                limit=h.get("limit"), include=h.get("include"), log=_stderr)
    return {"file": str(file), "metrics": metrics}


def command_line_keys(section: str) -> set[str]:
    """The fields of ``section`` (``data``) the command line sets (``data.seq_len=4096`` ->
    ``seq_len``; a group option, ``data=text_files``, sets none by name); none outside a
    Hydra command."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if not HydraConfig.initialized():
        return set()
    keys = set()
    for text in HydraConfig.get().overrides.task:
        try:
            (parsed,) = OverridesParser.create().parse_overrides([text])
        except HydraException:
            continue
        key = parsed.key_or_group
        if key.startswith(section + "."):
            keys.add(key[len(section) + 1:].split(".")[0])
    return keys


def _refuse_unread(data: DataConfig | None, given: frozenset[str]) -> None:
    """``data.*`` keys given without a corpus to apply them to are refused: the run's own
    validation loss reads the run's data as the run read it."""
    if given:
        key = sorted(given)[0]
        raise ConfigError(f"config error: data.{key}={getattr(data, key, None)!r}: a data key "
                          "applies to another corpus (data.files, data.val_files or "
                          "data=<option>), and none is named; the run's own validation loss "
                          "(run_data) reads the run's data as it was trained")


def _one_of(name: str, top: int | None, data: DataConfig) -> int | None:
    """``batch_size`` / ``val_batches``, or the corpus's ``data.batch_size`` /
    ``data.val_batches`` given instead; both given and different: refused."""
    mine = getattr(data, name)
    if top is not None and top != mine:
        raise ConfigError(f"config error: data.{name}={mine}: {name}={top} is given too; give "
                          "one")
    return mine


def probe_out(out: str | Path | None, spec) -> Path | None:
    """Where ``blocklab-eval out=DIR`` puts a spec's probe files: ``DIR/<spec>-<spec hash>``
    (beside ``DIR/val.json``); None without ``out``."""
    from blocklab.eval.items import spec_hash

    return None if out is None else Path(out) / f"{spec.name}-{spec_hash(spec)}"


# The probes on a blocklab model or a Hugging Face one live in eval/onmodel.py; these names stay
# importable from here.
from blocklab.eval.onmodel import (  # noqa: E402
    HF_TRAIN_LENGTH,
    probe_builder,
    probe_checkpoint,
    probe_dir,
    probe_hf,
    probe_keys,
    probe_model,
    run_title,
    train_length,
    validation_text,
)

__all__ = ["HF_TRAIN_LENGTH", "corpus_loss", "evaluate_checkpoint", "probe_builder",
           "probe_checkpoint", "probe_dir", "probe_hf", "probe_keys", "probe_model", "probe_out",
           "result_lines", "run_title", "summed_loss", "train_length", "validation_loss",
           "validation_text"]

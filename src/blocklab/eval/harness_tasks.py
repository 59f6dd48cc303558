"""``blocklab-eval ckpt=<run> harness=[task,...]``: lm-evaluation-harness tasks run in this
process (``lm_eval.simple_evaluate``) on the checkpoint's model already loaded, through
:class:`blocklab.eval.harness.HarnessModel`. The harness's results JSON is written beside the
probe reports — ``<run>/probes/<checkpoint>/harness-<hash>/results.json`` (with ``out=``:
``<out>/harness-<hash>/results.json``), the hash over the tasks and settings — and its headline
metrics (every numeric metric of every task, ``harness/<task>/<metric>``) are returned for the
printed table and any logger."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from blocklab.provenance import digest


def harness_settings(tasks: list[str], fewshot: int | None, limit: float | None,
                     include: str | None) -> dict[str, Any]:
    return {"tasks": list(tasks), "num_fewshot": fewshot, "limit": limit,
            "include": str(include) if include else None}


def harness_dir(root: Path, settings: dict[str, Any]) -> Path:
    """``<root>/harness-<hash of the settings>``: results with other settings never overwrite
    these."""
    return Path(root) / f"harness-{digest(settings)[:10]}"


def headline(results: dict[str, Any]) -> dict[str, float]:
    """``harness/<task>/<metric>`` for every finite numeric metric (filters kept in the name as
    the harness writes them, ``acc,none``; standard errors and sample counts left out)."""
    out = {}
    for task, metrics in sorted((results.get("results") or {}).items()):
        for key, value in metrics.items():
            if ("_stderr" in key or key == "sample_len" or isinstance(value, bool)
                    or not isinstance(value, int | float)):
                continue
            if math.isfinite(value):
                out[f"harness/{task}/{key}"] = float(value)
    return out


def run_harness(model, tasks: list[str], *, out_root: Path, fewshot: int | None = None,
                limit: float | None = None, include: str | None = None,
                log=print) -> tuple[Path, dict[str, float]]:
    """Run ``tasks`` on ``model`` (a :class:`~blocklab.eval.harness.HarnessModel`); write the
    harness's results to ``harness_dir(out_root)/results.json``; return that file and the
    headline metrics."""
    import lm_eval
    from lm_eval.utils import handle_non_serializable

    from blocklab.eval.harness import lm_class

    if limit is not None and limit >= 1:
        limit = int(limit)  # a count (a share is below 1)
    settings = harness_settings(tasks, fewshot, limit, include)
    manager = task_manager(tasks, include)
    log(f"harness: {', '.join(tasks)} (lm-evaluation-harness {_version()}, num_fewshot="
        f"{fewshot}, limit={limit})")
    results = lm_eval.simple_evaluate(model=lm_class()(model=model), tasks=list(tasks),
                                      num_fewshot=fewshot, limit=limit, task_manager=manager,
                                      batch_size=model.batch_size)
    if results is None:  # another rank's (never here: one process)
        raise RuntimeError("lm_eval.simple_evaluate returned no results")
    results.pop("samples", None)
    out = harness_dir(out_root, settings)
    out.mkdir(parents=True, exist_ok=True)
    file = out / "results.json"
    file.write_text(json.dumps({"blocklab": settings, **results}, indent=2,
                               default=handle_non_serializable))
    return file, headline(results)


def task_manager(tasks: list[str], include: str | None):
    """lm-eval's task index: of ``include`` alone when it holds every task named (indexing the
    harness's own thousands of task files takes seconds), else of both."""
    from lm_eval.tasks import TaskManager

    if include:
        own = TaskManager(include_path=str(include), include_defaults=False)
        if set(tasks) <= set(own.all_tasks):
            return own
    return TaskManager(include_path=str(include) if include else None)


def headline_lines(scalars: dict[str, float]) -> list[str]:
    """The printed table: one ``metric  value`` line each."""
    width = max((len(k) for k in scalars), default=0)
    return [f"{k:<{width}}  {v:.6g}" for k, v in scalars.items()]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return "?"

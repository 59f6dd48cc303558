"""The BABILong probe's items as a dataset other tools run (``probes.<kind>.export=DIR``):
exactly the prompts the probe scores, sized in the probed model's tokenizer.

``DIR`` receives

- ``<name>.jsonl``: every item, one JSON object a line — ``id``, ``task``, ``length``,
  ``depth`` (the band), ``prompt_style``, ``input`` (the whole prompt text, chat template
  included when used; it ends with ``Answer:``), ``context``, ``question``, ``target``,
  ``labels``, ``gold`` (the target's index in ``labels``), ``facts``, ``fact_depths``,
  ``supporting_depths``, ``bos`` (whether the probe put the tokenizer's BOS before the text),
  and token counts in the given tokenizer (``prompt_tokens`` — BOS included —,
  ``context_tokens``, ``label_tokens``; ``tokenizer`` names it);
- per task × length, ``<name>_<task>_<length>.jsonl`` (its items) and two lm-evaluation-harness
  task files: ``…_mc.yaml`` (``multiple_choice`` over ``labels``, the continuation
  ``" " + label`` after ``input``: the probe's forced choice) and ``…_gen.yaml``
  (``generate_until``, judged by BABILong's single-label rule in ``<name>_utils.py``, a
  copy of data/babilong.py's ``answer_correct`` that runs without blocklab);
- ``<name>.yaml``: the group of every task (``lm_eval --include_path DIR --tasks <name>``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: What lm-eval's generation stops at: a blank line, or an instruct model's end of turn.
UNTIL = ["\n\n", "<|im_end|>", "<|eot_id|>", "</s>"]
MAX_GEN_TOKS = 32


def export(folder: str | Path, records: Iterable[dict[str, Any]], *, name: str,
           tokenizer: str) -> Path:
    """Write ``records`` (the probe's items in grid order) to ``folder``; returns it."""
    from blocklab.errors import ConfigError

    out = Path(folder).expanduser().resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"config error: probes.{name}.export={str(folder)!r}: cannot create "
                          f"the folder ({e.strerror})") from None
    rows, seen = [], {}
    for r in records:
        cell = (r["task"], r["length"], f"{r['depth'][0]:g}-{r['depth'][1]:g}")
        seen[cell] = seen.get(cell, -1) + 1
        rows.append({"id": f"{cell[0]}-{cell[1]}-{cell[2]}-{seen[cell]}", **r,
                     "tokenizer": tokenizer})
    _jsonl(out / f"{name}.jsonl", rows)
    (out / f"{name}_utils.py").write_text(_utils_source())
    tasks = []
    for task, length in dict.fromkeys((r["task"], r["length"]) for r in rows):
        stem = f"{name}_{task}_{length}"
        data = out / f"{stem}.jsonl"
        _jsonl(data, [r for r in rows if r["task"] == task and r["length"] == length])
        for kind in ("mc", "gen"):
            (out / f"{stem}_{kind}.yaml").write_text(_task_yaml(f"{stem}_{kind}", data, kind,
                                                                 name))
            tasks.append(f"{stem}_{kind}")
    (out / f"{name}.yaml").write_text(
        f"group: {name}\ntask:\n" + "".join(f"  - {t}\n" for t in tasks)
        + "aggregate_metric_list:\n  - metric: acc\n    aggregation: mean\n"
          "    weight_by_size: true\n")
    return out


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")


def _task_yaml(task: str, data: Path, kind: str, name: str) -> str:
    head = (f"task: {task}\ntag: {name}_{kind}\ndataset_path: json\ndataset_kwargs:\n"
            f"  data_files:\n    test: {json.dumps(str(data))}\ntest_split: test\n"
            "doc_to_text: input\n")
    if kind == "mc":
        return head + ("output_type: multiple_choice\ndoc_to_choice: labels\n"
                       "doc_to_target: gold\ntarget_delimiter: \" \"\nmetric_list:\n"
                       "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    return head + ("output_type: generate_until\ndoc_to_target: target\ngeneration_kwargs:\n"
                   f"  until: {json.dumps(UNTIL)}\n  do_sample: false\n"
                   f"  max_gen_toks: {MAX_GEN_TOKS}\n"
                   f"process_results: !function {name}_utils.process_results\nmetric_list:\n"
                   "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")


def _utils_source() -> str:
    """lm-eval's ``process_results`` for the generation task: BABILong's rule, the source of
    data/babilong.py's own functions (one implementation, no blocklab import needed)."""
    from blocklab.data import babilong

    return ('"""BABILong\'s single-label rule for lm-eval (written by blocklab\'s export)."""\n\n'
            "from __future__ import annotations\n\nfrom collections.abc import Sequence\n\n\n"
            + inspect.getsource(babilong.preprocess_output) + "\n\n"
            + inspect.getsource(babilong.answer_correct) + "\n\n"
            "def process_results(doc, results):\n"
            '    return {"acc": float(answer_correct(results[0], doc["target"], doc["question"],\n'
            '                                        doc["labels"]))}\n')

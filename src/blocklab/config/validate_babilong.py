"""The rules of ``data.name=babilong`` (bAbI stories hidden in real text, data/babilong_train.py):
its tasks, fact depths, story size and haystack; lengths and curriculum as the synthetic
mixture's. The haystack file itself is read later (a missing file is a data error, exit 3)."""

from __future__ import annotations

from blocklab.config.checks import _check, _finite, val_tasks_trained
from blocklab.config.choices import BABILONG_MIN_FACTS, BABILONG_TASKS
from blocklab.config.schema import DataConfig


def validate_babilong(d: DataConfig, key: str = "data") -> DataConfig:
    tasks = list(d.babilong_tasks)
    _check(bool(tasks) and all(t in BABILONG_TASKS for t in tasks), f"{key}.babilong_tasks",
           tasks, f"one or more of {', '.join(BABILONG_TASKS)}")
    _check(len(set(tasks)) == len(tasks), f"{key}.babilong_tasks", tasks, "names a task twice")
    depth = list(d.babilong_depth)
    _check(len(depth) == 2 and all(_finite(x) for x in depth) and 0 <= depth[0] <= depth[1] <= 1,
           f"{key}.babilong_depth", depth, "needs [lo, hi] with 0 <= lo <= hi <= 1")
    told = [t for t in tasks if t != "qa4"]  # qa4 always has 2 facts
    need = max((BABILONG_MIN_FACTS[t] for t in told), default=1)
    _check(d.babilong_facts is None or d.babilong_facts >= need, f"{key}.babilong_facts",
           d.babilong_facts, f"must be null (each task's usual size) or >= {need} (the fewest "
           f"facts a question of {', '.join(told)} rests on)")
    _check(bool(d.haystack), f"{key}.haystack", d.haystack,
           "essay, shakespeare or the path of a text file")
    _check(not d.packing, f"{key}.packing", d.packing, "babilong examples are one story each",
           "set data.packing=false")
    _check(d.segment_mode in ("none", "split"), f"{key}.segment_mode", d.segment_mode,
           "babilong examples are whole items: none (read whole) or split (one item read "
           "segment by segment); stream is for a text corpus")
    # the longest item (validate_data.longest; not imported: that module calls this one):
    # split reads data.doc_len tokens, whole segments of seq_len, segment by segment
    top = (d.doc_len or d.seq_len) if d.segment_mode == "split" else d.seq_len
    what = f"doc_len={top}" if d.segment_mode == "split" else f"seq_len={d.seq_len}"
    _check(8 <= d.min_len <= top, f"{key}.min_len", d.min_len, f"need 8 <= min_len <= {what}")
    stages = [list(st) for st in d.curriculum]
    _check(all(len(st) == 2 and st[0] >= 0 and st[1] >= d.min_len for st in stages)
           and stages == sorted(stages), f"{key}.curriculum", stages,
           f"needs [[from_step, max_len], ...] sorted by step, each max_len >= "
           f"min_len={d.min_len}")
    _check(d.val_len is None or d.min_len <= d.val_len <= top, f"{key}.val_len",
           d.val_len, f"must be null or in min_len..{what.split('=')[0]} ({d.min_len}..{top})")
    val_tasks_trained(key, list(d.val_tasks), tasks, "data.babilong_tasks")
    return d

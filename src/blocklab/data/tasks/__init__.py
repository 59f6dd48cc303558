"""Synthetic tasks as components: one module per task holds its generator and what a training
mixture draws for it (:class:`Task`, ``base.py``); the vocabulary, the example and what every
task builds with are in :mod:`blocklab.data.synthetic`. The mixture (``data/mixture.py``)
looks tasks up by name (registry axis ``task``) and names none.

A user adds a task like any component (docs/extending.md, "Synthetic tasks")::

    from blocklab.data.tasks.base import Task
    from blocklab.registry import register

    @register("task", "first_token")
    class FirstToken(Task):
        name = "first_token"

        @staticmethod
        def generate(rng, vocab, length, *, seed=0):
            ...

and weights it under ``data.user_tasks.first_token`` (blocklab's own tasks: ``data.tasks``).
"""

from __future__ import annotations

from blocklab.data.tasks.base import Task
from blocklab.data.tasks.copy import CopyTask
from blocklab.data.tasks.counting import CountingTask
from blocklab.data.tasks.flip_flop import FlipFlopTask
from blocklab.data.tasks.kv_records import KvRecordsQueryAwareTask, KvRecordsTask
from blocklab.data.tasks.listops import ListOpsTask
from blocklab.data.tasks.markov_lm import MarkovLmTask
from blocklab.data.tasks.mqar import MqarTask
from blocklab.data.tasks.multihop import MultihopTask
from blocklab.data.tasks.needle import NeedleTask

TASKS: dict[str, type[Task]] = {
    "needle": NeedleTask,
    "kv_records": KvRecordsTask,
    "kv_records_query_aware": KvRecordsQueryAwareTask,
    "mqar": MqarTask,
    "copy": CopyTask,
    "markov_lm": MarkovLmTask,
    "multihop": MultihopTask,
    "counting": CountingTask,
    "flip_flop": FlipFlopTask,
    "listops": ListOpsTask,
}

"""What a synthetic task is: one component that generates a token-space example and says which
of its settings a training mixture draws (docs/extending.md, "Synthetic tasks").

A task is a class with a ``name`` (its registry key and its ``data.tasks`` weight's name) and:

- ``generate(rng, vocab, length, **settings) -> Example``: one example, a pure function of the
  generator ``rng`` (:func:`blocklab.data.synthetic.example_rng`) and the settings; every
  task accepts ``seed`` (the data seed, for the fixed per-seed structures: filler phrases,
  Markov chains);
- ``check(cfg, key)``: its rules on the data config (a user task's, asked by validation);
- ``draw(cfg, rng) -> dict``: the settings one mixture example uses, read from the data config
  (``DataConfig``) and drawn with the example's generator before ``generate`` runs (default:
  none beyond ``seed``).

blocklab's tasks are in ``TASKS`` (``blocklab.data.tasks``); a user adds one with
``register("task", name)`` and weights it under ``data.user_tasks.<name>``.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from blocklab.config import DataConfig
from blocklab.data.synthetic import Example, Vocab


class Task:
    """Base of a synthetic task (see the module docstring); subclass it and register the
    subclass with ``register("task", name)``."""

    name: ClassVar[str] = ""

    @staticmethod
    def generate(rng: random.Random, vocab: Vocab, length: int, **settings: Any) -> Example:
        raise NotImplementedError

    @classmethod
    def check(cls, cfg: DataConfig, key: str) -> None:
        """The task's own rules on the data config (``key``: where its weight is set); raise a
        one-line ``ConfigError`` (``blocklab.config.checks.require``). Asked for a user's task
        with a positive weight."""

    @classmethod
    def draw(cls, cfg: DataConfig, rng: random.Random) -> dict[str, Any]:
        """The settings of one mixture example (drawn with its generator, before
        :meth:`generate`)."""
        return {}

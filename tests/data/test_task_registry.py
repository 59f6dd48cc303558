"""Synthetic tasks are components: the registry's ``task`` axis lists blocklab's tasks (one
module each in ``blocklab.data.tasks``), and a user's task registered with
``register("task", name)`` is weighted under ``data.user_tasks.<name>`` from a composed config,
mixed into training and validation like a built-in, fingerprinted, and checked by its own
rules (one line naming the key). A config that names no user task streams exactly as before."""

from __future__ import annotations

import dataclasses
import random

import pytest
from omegaconf import OmegaConf

from blocklab import registry
from blocklab.config import (
    ConfigError,
    DataConfig,
    TaskWeights,
    compose,
    validate_mixture,
    validate_train,
)
from blocklab.config.checks import require
from blocklab.data.mixture import Mixture
from blocklab.data.streams import build_streams
from blocklab.data.synthetic import BOS, SEP, Example, Vocab
from blocklab.data.tasks.base import Task


class FirstToken(Task):
    """``BOS x1 … xn SEP → x1``: the first filler token of the row."""

    name = "first_token"

    @staticmethod
    def generate(rng: random.Random, vocab: Vocab, length: int, *, seed: int = 0,
                 n: int | None = None) -> Example:
        xs = rng.choices(vocab.filler, k=n or length - 3)
        tokens = [BOS, *xs, SEP, xs[0]]
        return Example(tokens, [False] * (len(tokens) - 1) + [True], {"task": "first_token"})

    @classmethod
    def draw(cls, cfg: DataConfig, rng: random.Random) -> dict:
        return {"n": rng.randint(2, cfg.min_len - 3)}

    @classmethod
    def check(cls, cfg: DataConfig, key: str) -> None:
        require(cfg.min_len >= 8, "data.min_len", cfg.min_len, "first_token needs >= 8")


@pytest.fixture
def first_token():
    registry.register("task", "first_token")(FirstToken)
    yield FirstToken
    registry.table("task").pop("first_token", None)
    registry._registered.pop(("task", "first_token"), None)


def test_blocklabs_tasks_are_the_schemas_weights():
    assert registry.builtin_names("task") == [f.name for f in dataclasses.fields(TaskWeights)]


def test_a_user_task_is_selected_from_the_config_and_mixed_in(first_token):
    cfg = compose("train", ["experiment=smoke", "+data.user_tasks.first_token=1",
                            "data.tasks.needle=0.5", "data.tasks.copy=0", "data.tasks.mqar=0",
                            "data.val_tasks=[first_token]"])
    validate_train(OmegaConf.to_object(cfg))  # the whole config, as blocklab-train checks it
    data = OmegaConf.to_object(cfg.data)
    assert data.user_tasks == {"first_token": 1.0}
    streams = build_streams(data, OmegaConf.to_object(cfg.tokenizer))
    train = [streams.train(i, 0) for i in range(64)]
    tasks = {ex.meta["task"] for ex in train}
    assert "first_token" in tasks and tasks <= {"first_token", "needle"}
    for ex in train:
        if ex.meta["task"] == "first_token":
            assert ex.tokens[-1] == ex.tokens[1] and ex.targets[-1]
    assert {streams.val(i).meta["task"] for i in range(16)} == {"first_token"}
    assert registry.registered()[("task", "first_token")] == __name__


def test_a_user_task_changes_the_fingerprint_and_nothing_else(first_token):
    base = DataConfig(tasks=TaskWeights(needle=1, mqar=1))
    plain = Mixture(base)
    assert Mixture(dataclasses.replace(base, user_tasks={})).fingerprint() == plain.fingerprint()
    # a user task with weight 0 is not used: the same stream
    zero = Mixture(dataclasses.replace(base, user_tasks={"first_token": 0.0}))
    assert zero.fingerprint() == plain.fingerprint()
    assert [zero(i).tokens for i in range(20)] == [plain(i).tokens for i in range(20)]
    mixed = Mixture(dataclasses.replace(base, user_tasks={"first_token": 1.0}))
    assert mixed.fingerprint() != plain.fingerprint()
    only = Mixture(dataclasses.replace(base, tasks=TaskWeights(needle=0),
                                       user_tasks={"first_token": 1.0}))
    assert {only(i).meta["task"] for i in range(10)} == {"first_token"}


@pytest.mark.parametrize("change,needle", [
    ({"user_tasks": {"nope": 1.0}},
     "config error: data.user_tasks.nope='nope': unknown choice; known: copy, counting, "
     "first_token, "),
    ({"user_tasks": {"needle": 1.0}},
     "config error: data.user_tasks.needle=1.0: a task of blocklab's own is weighted at "
     "data.tasks.needle"),
    ({"user_tasks": {"first_token": -1.0}}, "config error: data.user_tasks.first_token=-1.0: "
                                            "must be >= 0"),
    ({"user_tasks": {"first_token": 1.0}, "tasks": TaskWeights(needle=0), "val_tasks": ["copy"]},
     "config error: data.val_tasks=['copy']: every validation task must be trained on"),
])
def test_user_task_weights_are_checked_in_one_line(first_token, change, needle):
    with pytest.raises(ConfigError) as e:
        validate_mixture(dataclasses.replace(DataConfig(), **change))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(needle), msg


def test_a_user_tasks_rules_are_its_own(first_token, monkeypatch):
    """The validator asks the registered task (its ``check``), only when it is weighted."""
    seen = []
    monkeypatch.setattr(FirstToken, "check", classmethod(lambda cls, cfg, key: seen.append(key)))
    validate_mixture(DataConfig(user_tasks={"first_token": 1.0}))
    validate_mixture(DataConfig(user_tasks={"first_token": 0.0}))
    assert seen == ["data.user_tasks.first_token"]

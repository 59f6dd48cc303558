"""The global random generators' state as weights_only-safe values, saved in every checkpoint
(train/module.py) and restored at a resumed run's first training batch."""

from __future__ import annotations

import random
from typing import Any

import torch


def get_rng_state() -> dict[str, Any]:
    """Global RNG state as weights_only-safe values (tensors, ints, lists)."""
    py = random.getstate()
    return {"torch": torch.get_rng_state(), "python": [py[0], list(py[1]), py[2]],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

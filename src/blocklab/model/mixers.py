"""The sequence mixers a layer can use (``model.mixer.name`` / ``model.mixer.pattern``), one
concept per file: softmax attention (attention.py), linear attention (linear.py). The contract
is mixer.py's; users add their own with ``register("mixer", name)`` (docs/extending.md)."""

from __future__ import annotations

from blocklab.model.attention import SoftmaxAttention
from blocklab.model.linear import LinearAttention
from blocklab.model.mixer import Mixer

MIXERS: dict[str, type[Mixer]] = {
    "softmax": SoftmaxAttention,
    "linear": LinearAttention,
}

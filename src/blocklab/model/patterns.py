"""What the softmax mixer's attention patterns compute beyond which key a query sees (that is
masks.py's alone): Llama 4's attention temperature on its no-rotary global layers.

Shapes: B batch, T tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor


def query_temperature(positions: Tensor, scale: float, floor: int) -> Tensor:
    """(B, T) the factor on a no-rotary global layer's queries, ``1 + scale · log(⌊(pos + 1)
    / floor⌋ + 1)`` (Llama 4's attention temperature tuning, ``attn_scale`` / ``floor_scale``;
    "Scalable-Softmax", arXiv 2501.19399): 1 below ``floor - 1``, growing with the log."""
    steps = torch.floor((positions.float() + 1.0) / floor)
    return 1.0 + scale * torch.log(steps + 1.0)

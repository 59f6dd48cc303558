"""The sequence mixers a layer can use (``model.mixer.name`` / ``.pattern`` / ``.encoder``), one
concept per file: softmax attention (attention.py), linear attention (linear.py), gated
convolutions (conv.py), selective state spaces (ssm.py), low-rank approximations of softmax
for encoders (lowrank.py: Linformer, Nyström), softmax with a retrieval memory of the
document's past (knn.py: Memorizing Transformers). The contract is mixer.py's; users add
their own with ``register("mixer", name)`` (docs/extending.md)."""

from __future__ import annotations

from blocklab.model.attention import SoftmaxAttention
from blocklab.model.conv import GatedConv
from blocklab.model.knn import Memorizing
from blocklab.model.linear import LinearAttention
from blocklab.model.lowrank import LinformerAttention, NystromAttention
from blocklab.model.mixer import Mixer
from blocklab.model.ssm import SelectiveSSM

MIXERS: dict[str, type[Mixer]] = {
    "softmax": SoftmaxAttention,
    "linear": LinearAttention,
    "gated_conv": GatedConv,
    "ssm": SelectiveSSM,
    "linformer": LinformerAttention,
    "nystrom": NystromAttention,
    "memorizing": Memorizing,
}

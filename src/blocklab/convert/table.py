"""The architectures ``convert`` reads and writes, by name (archs.py, windows.py, qknorm.py,
llama4.py, gemma.py), and the lookup by Hugging Face ``model_type``. Order matters for export:
of the architectures that express a model exactly, the first is written (a window-free
Llama-layout model as llama)."""

from __future__ import annotations

from blocklab.convert.archs import GPT2, Arch, Llama
from blocklab.convert.encoders import T5, Bert
from blocklab.convert.gemma import Gemma2, Gemma3
from blocklab.convert.llama4 import Llama4
from blocklab.convert.qknorm import Olmo2, Qwen3
from blocklab.convert.windows import Mistral, Qwen2
from blocklab.errors import ConfigError

ARCHITECTURES: dict[str, Arch] = {a.name: a for a in (
    Llama(), Mistral(), Qwen2(), Qwen3(), Olmo2(), Llama4(), Gemma2(), Gemma3(), GPT2(), Bert(),
    T5())}

#: Hugging Face model types blocklab knows it cannot express yet, and why (docs/pretrained.md
#: "Llama 4 and Gemma")
LEFT_OUT: dict[str, str] = {
    "gemma3": "the multimodal Gemma 3 (vision tower); blocklab imports its text model "
              "(model_type gemma3_text) where the sliding layers rotate like the full ones",
    "qwen3_moe": "Qwen3's mixture-of-experts FFNs are not a blocklab component (the dense "
                 "Qwen3, model_type qwen3, is imported)",
    "llama4": "the multimodal Llama 4 (vision encoder, MoE layers); blocklab imports the text "
              "model with dense layers (model_type llama4_text)",
}


def arch_for_model_type(model_type: str | None, where: str) -> Arch:
    for arch in ARCHITECTURES.values():
        if model_type in arch.model_types:
            return arch
    if model_type in LEFT_OUT:
        raise ConfigError(f"hf config {where}: model_type={model_type!r}: {LEFT_OUT[model_type]}")
    known = sorted(t for a in ARCHITECTURES.values() for t in a.model_types)
    raise ConfigError(f"hf config {where}: model_type={model_type!r}: blocklab imports {known}")

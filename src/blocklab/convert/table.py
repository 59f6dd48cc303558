"""The architectures ``convert`` reads and writes, by name (archs.py, windows.py, llama4.py),
and the lookup by Hugging Face ``model_type``. Order matters for export: of the architectures that
express a model exactly, the first is written (a window-free Llama-layout model as llama)."""

from __future__ import annotations

from blocklab.convert.archs import GPT2, Arch, Llama
from blocklab.convert.encoders import T5, Bert
from blocklab.convert.llama4 import Llama4
from blocklab.convert.windows import Mistral, Qwen2
from blocklab.errors import ConfigError

ARCHITECTURES: dict[str, Arch] = {a.name: a for a in (Llama(), Mistral(), Qwen2(), Llama4(),
                                                      GPT2(), Bert(), T5())}


def arch_for_model_type(model_type: str | None, where: str) -> Arch:
    for arch in ARCHITECTURES.values():
        if model_type in arch.model_types:
            return arch
    known = sorted(t for a in ARCHITECTURES.values() for t in a.model_types)
    raise ConfigError(f"hf config {where}: model_type={model_type!r}: blocklab imports {known}")

"""Pretrained models in and out of blocklab's zoo.

``import_model`` maps a Hugging Face model directory (safetensors or ``pytorch_model.bin``), a
GGUF file (llama architecture) or a hub id onto blocklab's own modules and writes an ordinary
checkpoint; ``export_model`` writes a checkpoint back as a directory ``transformers`` loads;
``read_pretrained`` is the in-memory source of ``blocklab-train init_from=...``. Architectures:
``ARCHITECTURES`` (llama, mistral, qwen2, qwen3, olmo2, llama4, gemma2, gemma3, gpt2, bert, t5
— see table.py). Config fields are mapped one by one; one blocklab cannot express is refused
in one line naming it and its value.
Every file read stays inside the model directory; destinations are written whole or not at all.
"""

from blocklab.convert.api import (
    CONVERTER_VERSION,
    Pretrained,
    import_model,
    read_pretrained,
)
from blocklab.convert.export import export_model, pick_arch
from blocklab.convert.gguf_file import unpermute_rotary_rows
from blocklab.convert.table import ARCHITECTURES

__all__ = ["ARCHITECTURES", "CONVERTER_VERSION", "Pretrained", "export_model", "import_model",
           "pick_arch", "read_pretrained", "unpermute_rotary_rows"]

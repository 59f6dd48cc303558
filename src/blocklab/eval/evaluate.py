"""Evaluate a checkpoint on its own: rebuild model, tokenizer and data stream from the
checkpoint's stored config (plain data, never instantiated) and report validation loss."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from blocklab import checkpoint as ckpt
from blocklab.config import TrainConfig


def stored_train_config(meta: dict[str, Any]) -> TrainConfig:
    """The checkpoint's training config, checked against today's schema."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), meta["config"]))


@torch.no_grad()
def validation_loss(path: str | Path, *, batches: int | None = None,
                    batch_size: int | None = None) -> dict[str, Any]:
    from blocklab.data.datamodule import ExampleSource, ResumableBatches
    from blocklab.train.objectives import OBJECTIVES
    from blocklab.train.run import _data

    path = ckpt.resolve(path)
    model, _, meta = ckpt.load_model(path)
    tc = stored_train_config(meta)
    _, val_make, _, _, _ = _data(tc)
    family = tc.model.family.name.value
    kw = {"pack_to": tc.data.seq_len if tc.data.packing else None} if family == "decoder" else {}
    objective = OBJECTIVES[family](**kw)
    source = ExampleSource(val_make)
    total, count = 0.0, 0
    for batch_keys in ResumableBatches(batch_size or tc.data.batch_size,
                                       stop=batches or tc.data.val_batches):
        out = objective.loss(model, objective.collate([source[k] for k in batch_keys]))
        total, count = total + float(out.total), count + int(out.count)
    result = {"checkpoint": str(path), "step": meta["step"], "val_loss": total / max(count, 1),
              "val_targets": count, "arch_hash": meta["arch_hash"]}
    out_dir = path.parent.parent / "eval" / path.name
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "val.json").write_text(json.dumps(result, indent=2))
    return result

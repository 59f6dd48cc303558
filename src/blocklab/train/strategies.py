"""Sharded data parallelism on Lightning's own strategies.

- ``fsdp`` (GPU clusters): ``FSDPStrategy`` wrapping each transformer block (FSDP1), full
  state dicts gathered on rank 0 into blocklab's checkpoint directory.
- ``model_parallel``: ``ModelParallelStrategy`` with FSDP2 (``fully_shard`` per block, then the
  whole model; see ``LitModel.configure_model``) — runs on CPU over gloo as well as on GPUs.
  Checkpoints are gathered to full state dicts on rank 0 (``save_distributed_checkpoint=False``)
  so they stay ordinary blocklab checkpoints (verified manifest, ``load_model``); loading one
  back reads ``state.pt`` inside the directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

from blocklab import checkpoint as ckpt


def _state_file(path: Any) -> Path:
    path = Path(path)
    if path.is_dir() and (path / ckpt.MANIFEST).exists():
        ckpt.verify(path)
        return path / "state.pt"
    return path


class BlocklabModelParallel(ModelParallelStrategy):
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        return super().load_checkpoint(_state_file(self.broadcast(checkpoint_path)),
                                       weights_only=True)


class BlocklabFSDP(FSDPStrategy):
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        return super().load_checkpoint(_state_file(self.broadcast(checkpoint_path)),
                                       weights_only=True)


def model_parallel(world_size: int) -> ModelParallelStrategy:
    """Pure sharded data parallelism over all ``world_size`` processes (no tensor parallel)."""
    return BlocklabModelParallel(data_parallel_size=world_size, tensor_parallel_size=1,
                                 save_distributed_checkpoint=False)


def fsdp() -> FSDPStrategy:
    from blocklab.model.blocks import Block

    return BlocklabFSDP(auto_wrap_policy={Block}, state_dict_type="full",
                        sharding_strategy="FULL_SHARD")

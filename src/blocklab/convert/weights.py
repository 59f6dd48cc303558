"""A source state dict being consumed by an architecture's weight map: every tensor is taken
once or refused by name, and a tensor whose shape the config does not describe is refused
naming the source tensors it was made from."""

from __future__ import annotations

import torch
from torch import Tensor

from blocklab.errors import ConfigError

# Buffers some checkpoints carry that are not weights (recomputed by every implementation).
_BUFFERS = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias", "embeddings.position_ids",
            "embeddings.token_type_ids")


class Weights:
    """A source state dict being consumed: ``take`` each tensor once; ``finish`` refuses
    tensors nobody took (except known non-weight buffers and ``droppable`` prefixes, which
    are reported)."""

    def __init__(self, tensors: dict[str, Tensor], where: str) -> None:
        self.tensors, self.where = tensors, where
        self.left = {k for k in tensors if not k.endswith(_BUFFERS)}
        self.notes: list[str] = []
        # what each tensor handed out was made from (source keys, transposed?), for errors
        self._origin: dict[int, tuple[Tensor, tuple[str, ...], bool]] = {}

    def has(self, key: str) -> bool:
        return key in self.tensors

    def take(self, key: str) -> Tensor:
        if key not in self.tensors:
            raise ConfigError(f"hf weights {self.where}: tensor {key!r} is missing (the config "
                              "describes a layer the weights do not have)")
        self.left.discard(key)
        return self._made(self.tensors[key], (key,))

    def take_t(self, key: str) -> Tensor:
        """``key`` transposed (a Conv1D weight stored input-major)."""
        return self._made(self.take(key).t().contiguous(), (key,), transposed=True)

    def cat(self, *keys: str) -> Tensor:
        parts = [self.take(k) for k in keys]
        try:
            return self._made(torch.cat(parts, dim=0), keys)
        except RuntimeError:
            shapes = ", ".join(f"{k!r} {list(t.shape)}" for k, t in zip(keys, parts))
            raise ConfigError(f"hf weights {self.where}: tensors {shapes} cannot be "
                              "concatenated into blocklab's fused projection (their "
                              "shapes disagree with each other)") from None

    def _made(self, t: Tensor, keys: tuple[str, ...], transposed: bool = False) -> Tensor:
        self._origin[id(t)] = (t, keys, transposed)
        return t

    def shape_error(self, name: str, t: Tensor, want: tuple[int, ...]) -> ConfigError:
        """The one-line refusal of a tensor whose shape is not the one the config describes
        (``name``: the blocklab parameter it was to fill), naming the source tensors."""
        entry = self._origin.get(id(t))
        keys, transposed = (entry[1], entry[2]) if entry and entry[0] is t else ((), False)
        want_l = list(reversed(want)) if transposed else list(want)
        if len(keys) == 1:
            return ConfigError(f"hf weights {self.where}: tensor {keys[0]!r} has shape "
                               f"{list(self.tensors[keys[0]].shape)}; the config describes "
                               f"{want_l} (blocklab's {name})")
        if keys:
            shapes = ", ".join(f"{k!r} {list(self.tensors[k].shape)}" for k in keys)
            return ConfigError(f"hf weights {self.where}: tensors {shapes} make "
                               f"{list(t.shape)} for blocklab's fused {name}; the config "
                               f"describes {want_l}")
        return ConfigError(f"hf weights {self.where}: blocklab's {name} gets shape "
                           f"{list(t.shape)}; the config describes {want_l}")

    def finish(self, droppable: tuple[str, ...] = ()) -> list[str]:
        dropped = sorted(k for k in self.left if k.startswith(droppable))
        if dropped:
            self.notes.append(f"not imported (no blocklab counterpart): {len(dropped)} tensors "
                              f"under {sorted({d.split('.')[0] + '.' + d.split('.')[1] for d in dropped})}")
        rest = sorted(self.left - set(dropped))
        if rest:
            raise ConfigError(f"hf weights {self.where}: tensor {rest[0]!r} (and {len(rest) - 1} "
                              "more) has no place in the blocklab model the config describes")
        return self.notes

"""The softmax mixer's options (``SoftmaxOptions``, ``model.mixer.<option>``) and their rules:
their values (``SoftmaxAttention.check_options``) and the window pattern against the stacks
(``SoftmaxAttention.check``), kept beside attention.py so that file stays one readable file
and everything that reads a softmax option (masks, the estimator, conversions) imports it from
here without importing the mixer."""

from __future__ import annotations

from dataclasses import dataclass, field

from blocklab.config import ModelConfig
from blocklab.config.checks import finite, require

#: the entries of ``model.mixer.layers``
LAYER_KINDS = ("global", "local")


@dataclass
class SoftmaxOptions:
    """The ``softmax`` mixer's options (``model.mixer.<option>``). Cross-attention of an
    encoder–decoder is softmax attention too: it reads ``scale`` and ``dropout``, so these
    options are in use whenever a model has cross-attention."""

    # sliding-window self-attention: keys per query, the query included (null = global; odd
    # in a bidirectional stack); cross-attention is never windowed
    window: int | None = None
    global_every: int = 0  # with a window: 0 = every layer local; n >= 2: n, 2n, ... global
    layers: list[str] = field(default_factory=list)  # or per layer: global / local, repeated
    scale: float | None = None  # score scale; null = 1/sqrt(d_head) (T5: 1.0)
    dropout: float = 0.0  # on the attention probabilities (self- and cross-attention)


def softmax_options(m: ModelConfig) -> SoftmaxOptions:
    return m.mixer.read(SoftmaxOptions)


def check_values(opts: SoftmaxOptions, key: str) -> None:
    """The values of softmax's options, whenever they are in use (cross-attention too)."""
    require(opts.scale is None or (finite(opts.scale) and opts.scale > 0),
            f"{key}.scale", opts.scale, "must be null (1/sqrt(d_head)) or a finite number > 0")
    require(finite(opts.dropout) and 0.0 <= opts.dropout < 1.0, f"{key}.dropout",
            opts.dropout, "must be in [0, 1)")
    w, every, kinds = opts.window, opts.global_every, opts.layers
    require(w is None or (isinstance(w, int) and w >= 1), f"{key}.window", w,
            "must be null (global attention) or >= 1 (keys per query, the query included)")
    require(every == 0 or every >= 2, f"{key}.global_every", every,
            "must be 0 (every layer local) or >= 2 (layers n, 2n, ... global)")
    require(every == 0 or w is not None, f"{key}.global_every", every,
            f"needs {key}.window (null: every layer is already global)")
    if not kinds:
        return
    bad = [x for x in kinds if x not in LAYER_KINDS]
    require(not bad, f"{key}.layers", kinds, f"entries must be one of "
            f"{', '.join(LAYER_KINDS)} (not {bad[0]!r})" if bad else "")
    require(w is not None, f"{key}.layers", kinds,
            f"needs {key}.window (null: every layer is already global)")
    require(every == 0, f"{key}.layers", kinds, f"says which layers are global, and so "
            f"does {key}.global_every={every}", "set global_every: 0 with an explicit list")
    require("local" in kinds, f"{key}.layers", kinds, "no layer would be local, so the "
            "window would change nothing", "window: null makes every layer global")


def check_window(m: ModelConfig, opts: SoftmaxOptions, *, causal: bool, key: str) -> None:
    """The window against the stacks: odd in a bidirectional stack (a centred window), and
    a pattern that leaves a layer global and no entry unread."""
    from blocklab.registry import lookup

    w = opts.window
    require(w is None or causal or w % 2 == 1, f"{key}.window", w,
            f"must be odd for family {m.family.name!r}: a bidirectional stack sees "
            "(window - 1) / 2 tokens on each side")
    if w is None:
        return
    stacks = lookup("family", m.family.name).stacks(m)
    deepest = max(n for n, _, _ in stacks)  # a shallower stack may be all local
    depths = (f"model.n_layers={m.n_layers}" if m.family.n_encoder_layers is None else
              f"model.n_layers={m.n_layers}, model.family.n_encoder_layers="
              f"{m.encoder_layers}")
    require(opts.global_every <= deepest, f"{key}.global_every", opts.global_every,
            f"no layer would be global: must be <= the deepest stack's {deepest} layers "
            f"({depths})", "global_every: 0 makes every layer local")
    require(len(opts.layers) <= deepest, f"{key}.layers", opts.layers,
            f"{len(opts.layers)} entries, more than the deepest stack's {deepest} layers "
            f"({depths}): the rest would never be read")

"""The softmax mixer's option rules (model/attention.py ``SoftmaxOptions``): their values
(``SoftmaxAttention.check_options``) and the window pattern against the stacks
(``SoftmaxAttention.check``), kept here so attention.py stays one readable file."""

from __future__ import annotations

from blocklab.config import ModelConfig
from blocklab.config.checks import finite, require
from blocklab.model.attention import LAYER_KINDS, SoftmaxOptions


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

"""Which weights write into the residual stream (the init the model scales by depth)."""

from __future__ import annotations

from torch import nn

from blocklab.model.mixer import Mixer


def residual_outputs(model: nn.Module) -> set[str]:
    """The parameter names of every residual-output projection in ``model``: for each module
    that declares ``residual_outputs`` (child names: a mixer's, an FFN's, cross-attention's
    output projections), those children's weights. A mixer that declares none gets plain init
    for every weight, said once per class in a warning."""
    import warnings

    found: set[str] = set()
    for prefix, module in model.named_modules():
        names = getattr(module, "residual_outputs", None)
        if names is None:
            if isinstance(module, Mixer) and type(module) not in _UNDECLARED:
                _UNDECLARED.add(type(module))
                warnings.warn(f"mixer {type(module).__name__} declares no residual_outputs (its "
                              "output projections): every weight of it gets plain N(0, "
                              "model.init_std) init, unscaled by depth", stacklevel=2)
            continue
        for child in names:
            weight = getattr(getattr(module, child, None), "weight", None)
            if not isinstance(weight, nn.Parameter):
                raise TypeError(f"{type(module).__name__}.residual_outputs names {child!r}, "
                                "which is not a submodule with a weight")
            found.add(f"{prefix}.{child}.weight" if prefix else f"{child}.weight")
    return found


_UNDECLARED: set[type] = set()

"""The architecture zoo. ``build_model(cfg.model)`` is the one entry point."""

from blocklab.model.transformer import FAMILIES, build_model

__all__ = ["FAMILIES", "build_model"]

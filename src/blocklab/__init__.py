"""blocklab: train and evaluate Transformer architecture variants from Hydra configs."""

__version__ = "0.1.0"

"""Test setup: never touch the network; deterministic CPU math; the example user components
(docs/examples/plugin) registered, so every grid test covers them like built-ins."""

import os
import sys
from pathlib import Path

for _k, _v in {"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1"}.items():
    os.environ.setdefault(_k, _v)

import pytest  # noqa: E402
import torch  # noqa: E402

EXAMPLE_PLUGIN = Path(__file__).resolve().parents[1] / "docs" / "examples" / "plugin"
sys.path.insert(0, str(EXAMPLE_PLUGIN))
import blocklab_example  # noqa: E402, F401  (registers squared_relu, scalenorm, parallel)

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


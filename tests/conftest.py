"""Test setup: never touch the network; deterministic CPU math."""

import os

for _k, _v in {"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1"}.items():
    os.environ.setdefault(_k, _v)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)

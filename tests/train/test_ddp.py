"""Data parallelism on CPU: 2 processes over gloo, launched through the CLI (DDP re-executes the
command, so it cannot run inside pytest's own process). The same global batch gives the same
per-step losses as one process — targets are normalized by the *global* count, so ranks with
fewer answer tokens are not over-weighted — and a resumed run equals the uninterrupted one
exactly (every rank's generator is saved; dropout on). The same for sharded data parallelism
(FSDP2 through Lightning's ModelParallelStrategy, ``trainer=model_parallel``)."""

from __future__ import annotations

import shutil

import pytest
import torch

from train.test_train_cli import assert_resumed_equals_straight, cli, losses

pytestmark = pytest.mark.slow

# Fixed-length sequences, so that one process with 8 and two with 4 see identical batches.
BASE = ["experiment=smoke", "trainer.log_every_steps=1", "trainer.max_steps=16",
        "trainer.ckpt_every_steps=8", "trainer.val_every_steps=8", "data.min_len=64",
        "data.seq_len=64", "trainer.progress_bar=false", "probes=none"]
DDP = ["trainer=ddp", "trainer.devices=2", "data.batch_size=4"]
SHARDED = ["trainer=model_parallel", "trainer.devices=2", "data.batch_size=4"]
TOLERANCE = 1e-5  # fp32 sums in another order (gloo all-reduce); measured: <= 1e-6


@pytest.fixture(scope="module", params=["ddp", "model_parallel"])
def parallel(request, tmp_path_factory):
    """(strategy args, an uninterrupted 16-step run with dropout under that strategy)."""
    args = DDP if request.param == "ddp" else SHARDED
    out = tmp_path_factory.mktemp(request.param)
    r = cli(*BASE, *args, "model.dropout=0.1", f"run_dir={out / 'run'}")
    assert r.returncode == 0, r.stderr[-3000:]
    return args, out / "run"


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """The one-process run with the global batch (8) both strategies are compared with."""
    run = tmp_path_factory.mktemp("one") / "one"
    r = cli(*BASE, "data.batch_size=8", f"run_dir={run}")
    assert r.returncode == 0, r.stderr[-2000:]
    return run


@pytest.mark.parametrize("args", [DDP, SHARDED], ids=["ddp", "model_parallel"])
def test_two_processes_match_one_with_the_same_global_batch(one, tmp_path, args):
    two = cli(*BASE, *args, f"run_dir={tmp_path / 'two'}")
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = losses(one), losses(tmp_path / "two")
    assert sorted(a) == sorted(b) == list(range(1, 17))
    diffs = [abs(float(a[k]) - float(b[k])) for k in a]
    assert max(diffs) <= TOLERANCE, diffs
    wa = torch.load(one / "checkpoints/step-000016/state.pt", weights_only=True)
    wb = torch.load(tmp_path / "two/checkpoints/step-000016/state.pt", weights_only=True)
    for k, v in wa["state_dict"].items():
        torch.testing.assert_close(v, wb["state_dict"][k], atol=1e-5, rtol=1e-4)


def test_resume_from_the_middle_is_exact(parallel, tmp_path):
    args, straight = parallel
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    shutil.rmtree(run / "checkpoints" / "step-000016")  # as if killed after step 8's save
    r = cli(*BASE, *args, "model.dropout=0.1", f"resume={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_resumed_equals_straight(straight, run,
                                   ("rng_ranks", "batches_seen", "tokens_seen", "step"))
    meta = torch.load(straight / "checkpoints/step-000016/state.pt", weights_only=True)["blocklab"]
    assert len(meta["rng_ranks"]) == 2  # both ranks' generators were saved

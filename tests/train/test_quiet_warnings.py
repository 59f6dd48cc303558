"""Lightning's warnings in a run (issue 41): the noise dropped, the rest one line in blocklab's
form with no source path, other code's warnings untouched, ``trainer.quiet=false`` showing
them as Lightning writes them."""

from __future__ import annotations

import shutil
import warnings
from pathlib import PurePath

import pytest

from blocklab.train.quiet import lightning_quiet
from inprocess import run_cli

SITE = "/venv/lib/python3.11/site-packages"
TINY = ["experiment=smoke", "trainer.max_steps=2", "trainer.val_every_steps=2",
        "trainer.ckpt_every_steps=2", "probes=none", "checkpoint_probes.enabled=false",
        "trainer.progress_bar=false", "model.n_layers=1"]


def _lightning(filename: str) -> bool:
    return "lightning" in PurePath(filename).parts


def test_lightning_warnings_are_one_line_and_others_untouched(capsys):
    from blocklab.train.quiet import from_lightning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with lightning_quiet():
            warnings.warn_explicit("It is recommended to use `self.log(sync_dist=True)`,\n"
                                   "second line", UserWarning,
                                   f"{SITE}/lightning/pytorch/trainer/connectors/x.py", 434)
            warnings.warn_explicit("The dirpath has changed from 'a' to 'b', therefore ...",
                                   UserWarning, f"{SITE}/lightning/pytorch/callbacks/x.py", 566)
            warnings.warn_explicit("The 'train_dataloader' does not have many workers which "
                                   "may be a bottleneck.", UserWarning,
                                   f"{SITE}/lightning/pytorch/trainer/connectors/y.py", 434)
            warnings.warn_explicit("not Lightning's", UserWarning, f"{SITE}/torch/nn/z.py", 1)
        with lightning_quiet(False):
            warnings.warn_explicit("shown as it is", UserWarning, f"{SITE}/lightning/a.py", 1)
    assert capsys.readouterr().err == ("warning: lightning: It is recommended to use "
                                       "`self.log(sync_dist=True)`,\n")
    assert [str(w.message) for w in caught] == ["not Lightning's", "shown as it is"]
    assert from_lightning(f"{SITE}/lightning_fabric/a.py") and not from_lightning("/a/b.py")


@pytest.mark.slow
def test_a_run_on_a_machine_with_many_cores_shows_no_raw_lightning_warning(tmp_path, capfd,
                                                                          monkeypatch):
    """Lightning suggests DataLoader workers on any machine with more than two cores (the
    user's: ``.../lightning/pytorch/trainer/connectors/data_connector.py:434: The
    'train_dataloader' does not have many workers ...``); this one has 8."""
    monkeypatch.setattr("lightning.fabric.utilities.data._num_cpus_available", lambda: 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = run_cli(capfd, "blocklab-train", *TINY, f"run_dir={tmp_path / 'a'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not [str(w.message) for w in caught if _lightning(w.filename)]
    assert "lightning" not in r.stdout + r.stderr and ".py:" not in r.stderr
    with warnings.catch_warnings(record=True) as caught:  # the control: it was raised
        warnings.simplefilter("always")
        r = run_cli(capfd, "blocklab-train", *TINY, f"run_dir={tmp_path / 'b'}",
                    "trainer.quiet=false", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [w for w in caught if "does not have many workers" in str(w.message)]

    # a run directory copied elsewhere and resumed: Lightning's "The dirpath has changed"
    for quiet, copy in (("true", "c"), ("false", "d")):
        shutil.copytree(tmp_path / "a", tmp_path / copy)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = run_cli(capfd, "blocklab-train", f"resume={tmp_path / copy}",
                        "trainer.max_steps=3", f"trainer.quiet={quiet}", cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        said = [str(w.message) for w in caught if _lightning(w.filename)]
        if quiet == "true":
            assert not said and "lightning" not in r.stderr, said
        else:  # the control: it was raised
            assert [m for m in said if m.startswith("The dirpath has changed")], said

"""``init_from`` compares weight shapes, not scheme names (issue 42): a change the rules allow
(``model.max_seq_len``) is refused in one line naming the key when it resizes any weight — a
learned position table or a gated convolution's long filter alike — and goes through when no
weight is sized by it (before: refused only for a scheme named "learned"; a gated-conv run died
in ``load_state_dict`` with a raw size mismatch)."""

from __future__ import annotations

import pytest

from inprocess import run_cli

BASE = ["experiment=smoke", "probes=none", "trainer.max_steps=1", "trainer.val_every_steps=1",
        "trainer.ckpt_every_steps=1", "model.max_seq_len=64", "data.seq_len=32"]


@pytest.mark.parametrize(("arch", "resized"), [
    (["model/mixer=gated_conv", "model/position=none"], True),  # the long filter has max_seq_len taps
    (["model/position=learned"], True),  # the table has max_seq_len rows
    (["model/position=rope"], False),  # no weight is sized by it: extending is allowed
])
def test_a_longer_context_is_refused_exactly_when_it_resizes_a_weight(arch, resized, tmp_path,
                                                                      capfd):
    src = tmp_path / "src"
    r = run_cli(capfd, "blocklab-train", *BASE, *arch, f"run_dir={src}")
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli(capfd, "blocklab-train", *BASE, f"init_from={src}", "model.max_seq_len=128",
                f"run_dir={tmp_path / 'dst'}")
    if not resized:
        assert r.returncode == 0, r.stderr[-3000:]
        return
    assert r.returncode == 2, r.stderr[-3000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("init_from refused: model.max_seq_len: 64 -> 128 changes the shape "
                           "of "), line
    assert "64" in line.split("changes the shape of ")[1] and "Traceback" not in r.stderr
    assert not (tmp_path / "dst" / "checkpoints").exists()  # refused before anything ran

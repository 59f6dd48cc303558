"""Fault-injection tests for blocklab's checkpoint format (docs/reliability.md: "Atomic,
verified checkpoints", "Integrity and security", "Storage faults").

Every test corrupts, interrupts or starves a save/load and asserts the documented promise:
verified before deserialization, ``weights_only=True`` only, atomic replacement, and clear
errors that name the checkpoint path.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from blocklab import checkpoint as ckpt
from blocklab.checkpoint import (
    CONFIG,
    FORMAT_VERSION,
    MANIFEST,
    META,
    STATE,
    TOKENIZER,
    CheckpointError,
    StorageError,
)
from blocklab.train.checkpoint_io import BlocklabCheckpointIO

TOKENIZER_JSON = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}})
UNSAFE_HINT = re.compile(r"weights_only\W*(=|set to|to)\W*False", re.IGNORECASE)


# --------------------------------------------------------------------------------- helpers
def _checkpoint(step: int = 3, seed: int = 0) -> dict[str, Any]:
    """A Lightning-shaped checkpoint dict with a large, distinctive weight tensor (so the middle
    of state.pt lands inside tensor payload bytes)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "state_dict": {
            "w": torch.arange(16384, dtype=torch.float32) + seed,
            "b": torch.randn(8, generator=g),
            "steps": torch.tensor(step, dtype=torch.int64),
        },
        "global_step": step,
        "blocklab": {
            "config": {"model": {"d_model": 16, "n_layers": 2}, "lr": 3e-4, "name": "tiny",
                       "tags": ["a", "b"], "resume": None},
            "config_yaml": "a: 1\n",
            "tokenizer": TOKENIZER_JSON,
            "step": step,
            "rng": {"torch": torch.get_rng_state(), "seed": 7},
        },
    }


def _tree_digest(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path`` (relative names), to prove byte-identity."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def _flip_middle_byte(path: Path) -> int:
    data = bytearray(path.read_bytes())
    pos = len(data) // 2
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))
    return pos


def _step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}"


def _save_steps(run_dir: Path, *steps: int) -> list[Path]:
    return [ckpt.write_checkpoint(_step_dir(run_dir, s), _checkpoint(step=s, seed=s))
            for s in steps]


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith((".tmp-", ".old-")))


def _assert_state_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["state_dict"].keys() == want["state_dict"].keys()
    for k, v in want["state_dict"].items():
        assert torch.equal(got["state_dict"][k], v), k


class SimulatedKill(BaseException):
    """Stands in for the process dying mid-save: not an OSError, so nothing cleans up."""


# ------------------------------------------------------------------------------ 1. round trip
def test_round_trip_writes_all_files_and_loads_equal(tmp_path: Path) -> None:
    src = _checkpoint(step=3)
    path = tmp_path / "step-000003"
    assert ckpt.write_checkpoint(path, src) == path

    assert sorted(p.name for p in path.iterdir()) == sorted([STATE, META, CONFIG, TOKENIZER,
                                                             MANIFEST])
    got = ckpt.load(path)
    _assert_state_equal(got, src)
    assert got["global_step"] == 3
    bl, want = got["blocklab"], src["blocklab"]
    assert bl["config"] == want["config"]
    assert bl["config_yaml"] == "a: 1\n"
    assert bl["tokenizer"] == TOKENIZER_JSON
    assert bl["step"] == 3
    assert torch.equal(bl["rng"]["torch"], want["rng"]["torch"])
    assert bl["rng"]["seed"] == 7

    meta = json.loads((path / META).read_text())
    assert meta == {k: v for k, v in want.items() if k not in ("rng", "tokenizer")}
    assert "rng" not in meta and "tokenizer" not in meta
    assert (path / CONFIG).read_text() == "a: 1\n"
    assert (path / TOKENIZER).read_text() == TOKENIZER_JSON

    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["format_version"] == FORMAT_VERSION
    assert sorted(manifest["files"]) == sorted([STATE, META, CONFIG, TOKENIZER])
    for name, info in manifest["files"].items():
        data = (path / name).read_bytes()
        assert info == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}, name
    assert ckpt.verify(path) == manifest

    md = ckpt.metadata(path)
    assert md["config"] == want["config"] and md["step"] == 3
    assert md.keys() == want.keys()


def test_metadata_without_blocklab_key_is_an_error(tmp_path: Path) -> None:
    path = ckpt.write_checkpoint(tmp_path / "step-000001", {"state_dict": {"w": torch.ones(2)}})
    assert sorted(p.name for p in path.iterdir()) == [MANIFEST, STATE]
    assert torch.equal(ckpt.load(path)["state_dict"]["w"], torch.ones(2))
    with pytest.raises(CheckpointError, match="no blocklab metadata"):
        ckpt.metadata(path)


# ------------------------------------------------------------------------------ 2. integrity
def test_flipped_byte_is_caught_but_plain_torch_load_is_silent(tmp_path: Path) -> None:
    src = _checkpoint()
    path = ckpt.write_checkpoint(tmp_path / "step-000003", src)
    payload = src["state_dict"]["w"].numpy().tobytes()
    start = (path / STATE).read_bytes().find(payload)
    assert start >= 0
    pos = _flip_middle_byte(path / STATE)
    assert start <= pos < start + len(payload), "the flipped byte must hit tensor payload"

    # Why the manifest matters: torch itself deserializes the corrupted file without complaint.
    silent = torch.load(path / STATE, map_location="cpu", weights_only=True)
    assert not torch.equal(silent["state_dict"]["w"], src["state_dict"]["w"])

    want = f"checkpoint {path}: {STATE} sha256 mismatch"
    for fn in (ckpt.verify, ckpt.load, ckpt.metadata):
        with pytest.raises(CheckpointError) as ei:
            fn(path)
        assert str(ei.value).startswith(want), str(ei.value)
    assert CheckpointError.exit_code == 4


def test_load_never_deserializes_before_verifying(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = ckpt.write_checkpoint(tmp_path / "step-000003", _checkpoint())
    _flip_middle_byte(path / STATE)
    calls: list[Any] = []
    monkeypatch.setattr(ckpt.torch, "load", lambda *a, **k: calls.append(a))
    with pytest.raises(CheckpointError, match="sha256 mismatch"):
        ckpt.load(path)
    assert calls == []


def test_truncated_state_is_reported_as_truncated(tmp_path: Path) -> None:
    path = ckpt.write_checkpoint(tmp_path / "step-000003", _checkpoint())
    full = (path / STATE).stat().st_size
    with open(path / STATE, "r+b") as f:
        f.truncate(full // 2)
    for fn in (ckpt.verify, ckpt.load):
        with pytest.raises(CheckpointError) as ei:
            fn(path)
        msg = str(ei.value)
        assert msg.startswith(f"checkpoint {path}: {STATE} truncated"), msg
        assert f"{full // 2:,} of {full:,} bytes" in msg


def test_grown_file_is_a_mismatch(tmp_path: Path) -> None:
    path = ckpt.write_checkpoint(tmp_path / "step-000003", _checkpoint())
    with open(path / META, "ab") as f:
        f.write(b" ")
    with pytest.raises(CheckpointError, match=rf"^checkpoint .*: {re.escape(META)} sha256 mismatch"):
        ckpt.load(path)


def test_missing_manifest_is_an_incomplete_checkpoint(tmp_path: Path) -> None:
    path = ckpt.write_checkpoint(tmp_path / "step-000003", _checkpoint())
    (path / MANIFEST).unlink()
    for fn in (ckpt.verify, ckpt.load):
        with pytest.raises(CheckpointError) as ei:
            fn(path)
        assert str(ei.value).startswith(f"checkpoint {path}: no {MANIFEST}"), str(ei.value)


def test_unreadable_manifest_is_an_error(tmp_path: Path) -> None:
    path = ckpt.write_checkpoint(tmp_path / "step-000003", _checkpoint())
    text = (path / MANIFEST).read_text()
    (path / MANIFEST).write_text(text[: len(text) // 2])  # a torn manifest write
    with pytest.raises(CheckpointError, match=rf"{MANIFEST} unreadable"):
        ckpt.load(path)


def test_missing_tokenizer_is_reported(tmp_path: Path) -> None:
    path = ckpt.write_checkpoint(tmp_path / "step-000003", _checkpoint())
    (path / TOKENIZER).unlink()
    for fn in (ckpt.verify, ckpt.load):
        with pytest.raises(CheckpointError) as ei:
            fn(path)
        assert str(ei.value) == f"checkpoint {path}: {TOKENIZER} missing"


# ------------------------------------------------------------------------------- 3. security
class _Payload:
    """Unpickling this creates ``marker`` via a builtin (no shell needed)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


class _ShellPayload:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch '{self.marker}'",))


@pytest.mark.parametrize("payload_cls", [_Payload, _ShellPayload], ids=["builtin", "os.system"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path, payload_cls: type) -> None:
    # Control: the payload really is live when unpickled unsafely (so this test can fail).
    control = tmp_path / "control-marker"
    probe = tmp_path / "probe.pt"
    torch.save({"x": payload_cls(control)}, probe)
    torch.load(probe, weights_only=False)
    assert control.exists()

    marker = tmp_path / "pwned-marker"
    bad = _checkpoint()
    bad["callbacks"] = {"evil": payload_cls(marker)}  # e.g. a callback's state_dict
    # write_checkpoint regenerates a consistent manifest, so verification passes...
    path = ckpt.write_checkpoint(tmp_path / "step-000003", bad)
    ckpt.verify(path)
    assert not marker.exists()

    # ...and the refusal comes from weights_only=True.
    for fn in (ckpt.load, ckpt.metadata, BlocklabCheckpointIO().load_checkpoint):
        with pytest.raises(CheckpointError) as ei:
            fn(path)
        msg = str(ei.value)
        assert msg.startswith(f"checkpoint {path}: "), msg
        assert "weights_only=True" in msg, msg
        assert not marker.exists(), "the malicious payload ran"


def test_refusal_message_never_suggests_weights_only_false(tmp_path: Path) -> None:
    marker = tmp_path / "pwned-marker"
    path = ckpt.write_checkpoint(tmp_path / "step-000003",
                                 {"state_dict": {}, "evil": _ShellPayload(marker)})
    with pytest.raises(CheckpointError) as ei:
        ckpt.load(path)
    msg = str(ei.value)
    assert not UNSAFE_HINT.search(msg), f"the error suggests unsafe loading: {msg!r}"
    assert not marker.exists()


# ------------------------------------------------------------------------- 4. format version
def test_newer_format_version_is_refused(tmp_path: Path) -> None:
    path = ckpt.write_checkpoint(tmp_path / "step-000003", _checkpoint())
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    (path / MANIFEST).write_text(json.dumps(manifest))
    for fn in (ckpt.verify, ckpt.load):
        with pytest.raises(CheckpointError) as ei:
            fn(path)
        msg = str(ei.value)
        assert msg.startswith(f"checkpoint {path}: "), msg
        assert "newer" in msg and str(FORMAT_VERSION + 1) in msg, msg


# ---------------------------------------------------------------------- 5. crash mid-save
def test_killed_save_leaves_previous_checkpoint_intact(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    (prev,) = _save_steps(run, 1)
    before = _tree_digest(prev)
    real_write = ckpt._write
    written: list[str] = []

    def dying_write(path: Path, data: bytes) -> None:
        if path.name == MANIFEST:
            path.write_bytes(data[: len(data) // 3])  # the kill lands mid-write
            raise SimulatedKill
        written.append(path.name)
        real_write(path, data)

    monkeypatch.setattr(ckpt, "_write", dying_write)
    with pytest.raises(SimulatedKill):
        ckpt.write_checkpoint(_step_dir(run, 2), _checkpoint(step=2, seed=2))
    monkeypatch.undo()
    assert STATE in written

    ckdir = run / "checkpoints"
    tmps = [p for p in ckdir.iterdir() if p.name.startswith(".tmp-")]
    assert len(tmps) == 1 and tmps[0].is_dir()
    assert not _step_dir(run, 2).exists()
    assert ckpt.list_checkpoints(run) == [prev]
    assert ckpt.resolve(run) == prev
    assert _tree_digest(prev) == before

    removed = ckpt.clean_partial(run)
    assert removed == tmps
    assert _leftovers(ckdir) == []
    assert ckpt.list_checkpoints(run) == [prev]
    assert ckpt.resolve(run) == prev
    assert _tree_digest(prev) == before
    _assert_state_equal(ckpt.load(prev), _checkpoint(step=1, seed=1))


def test_killed_resave_between_renames_keeps_a_valid_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-saving a step moves the old dir to ``.old-*`` and then renames ``.tmp-*`` in; a kill
    between the two renames leaves the only complete copies in hidden dirs. Cleaning up after it
    must not destroy both."""
    run = tmp_path / "run"
    (path,) = _save_steps(run, 1)
    real_rename = Path.rename
    calls: list[str] = []

    def dying_rename(self: Path, target: Any) -> Any:
        calls.append(self.name)
        if self.name.startswith(".tmp-"):
            raise SimulatedKill
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", dying_rename)
    with pytest.raises(SimulatedKill):
        ckpt.write_checkpoint(path, _checkpoint(step=1, seed=9))
    monkeypatch.undo()
    assert calls == [path.name, f".tmp-{path.name}-{os.getpid()}"]  # old moved aside first

    ckpt.clean_partial(run)  # what the next start does
    got = ckpt.load(ckpt.resolve(run))  # either the old or the new step-1 is acceptable
    assert got["global_step"] == 1


def test_a_kill_inside_the_writer_during_a_resave_leaves_the_old_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints are written by files.write_dir_atomic: a kill at its ``dir-aside`` point
    (the old copy moved aside, the new one not yet in) leaves the old copy, which the next
    start (clean_partial) puts back byte for byte."""
    from blocklab import files

    run = tmp_path / "run"
    (path,) = _save_steps(run, 1)
    before = _tree_digest(path)

    def kill(point: str, n: int) -> None:
        if point == "dir-aside":
            raise SimulatedKill

    monkeypatch.setattr(files, "maybe_fault", kill)
    with pytest.raises(SimulatedKill):
        ckpt.write_checkpoint(path, _checkpoint(step=1, seed=9))
    monkeypatch.undo()
    pid = os.getpid()
    assert not path.exists()
    assert _leftovers(path.parent) == [f".old-{path.name}-{pid}", f".tmp-{path.name}-{pid}"]
    ckpt.clean_partial(run)
    assert _tree_digest(path) == before and _leftovers(path.parent) == []


# ---------------------------------------------------------------------------- 6. disk full
@pytest.mark.parametrize("same_path", [False, True], ids=["new-step", "resave-same-step"])
def test_disk_full_raises_storage_error_and_keeps_previous(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, same_path: bool) -> None:
    run = tmp_path / "run"
    (prev,) = _save_steps(run, 1)
    before = _tree_digest(prev)
    target = prev if same_path else _step_dir(run, 2)
    new = _checkpoint(step=2, seed=2)

    # The space the checkpoint needs: the sum of its files, as a successful save records it.
    ref = ckpt.write_checkpoint(tmp_path / "ref" / "step-000002", new)
    needed = sum(i["bytes"] for i in json.loads((ref / MANIFEST).read_text())["files"].values())
    real_write = ckpt._write

    def full_disk(path: Path, data: bytes) -> None:
        if path.name == STATE:
            path.write_bytes(data[: len(data) // 2])  # the disk fills up partway
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(ckpt, "_write", full_disk)
    with pytest.raises(StorageError) as ei:
        ckpt.write_checkpoint(target, new)
    monkeypatch.undo()

    err = ei.value
    assert isinstance(err, OSError)
    assert err.exit_code == 6 and err.errno == errno.ENOSPC
    msg = str(err)
    assert f"checkpoint {target}" in msg, msg
    assert f"needs {needed:,} bytes" in msg, msg
    assert "unexpected pos" not in msg
    assert _leftovers(run / "checkpoints") == []
    assert _tree_digest(prev) == before
    assert ckpt.resolve(run) == prev
    assert ckpt.list_checkpoints(run) == [prev]
    assert target.exists() == same_path


def test_other_write_errors_are_storage_errors_naming_the_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    (prev,) = _save_steps(run, 1)
    before = _tree_digest(prev)

    def broken(path: Path, data: bytes) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ckpt, "_write", broken)
    target = _step_dir(run, 2)
    with pytest.raises(StorageError, match=rf"checkpoint {re.escape(str(target))}: cannot write"):
        ckpt.write_checkpoint(target, _checkpoint(step=2))
    monkeypatch.undo()
    assert _leftovers(run / "checkpoints") == []
    assert _tree_digest(prev) == before


def test_parent_is_a_regular_file_is_a_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "checkpoints"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match=rf"checkpoint {re.escape(str(blocker))}"):
        ckpt.write_checkpoint(blocker / "step-000001", _checkpoint())
    assert blocker.read_text() == "not a directory"


# ---------------------------------------------------------------------------- 7. re-save
def test_resave_same_step_replaces_atomically(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (path,) = _save_steps(run, 5)
    old_digest = _tree_digest(path)
    new = _checkpoint(step=5, seed=42)
    new["blocklab"]["config_yaml"] = "a: 2\n"
    assert ckpt.write_checkpoint(path, new) == path

    assert _tree_digest(path) != old_digest
    got = ckpt.load(path)
    _assert_state_equal(got, new)
    assert (path / CONFIG).read_text() == "a: 2\n"
    assert _leftovers(run / "checkpoints") == []
    assert ckpt.list_checkpoints(run) == [path]


# ---------------------------------------------------------------------------- 8. resolve
def test_resolve_picks_newest_valid(tmp_path: Path) -> None:
    run = tmp_path / "run"
    paths = _save_steps(run, 10, 2, 30)
    (run / "checkpoints" / ".tmp-step-000040-1").mkdir()
    (run / "checkpoints" / "notes.txt").write_text("x")
    assert ckpt.list_checkpoints(run) == sorted(paths)
    assert ckpt.resolve(run) == _step_dir(run, 30)
    assert ckpt.resolve(paths[0]) == paths[0]  # a checkpoint dir resolves to itself


def test_resolve_falls_back_past_corrupt_newest_with_warning(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s1, s2, s3 = _save_steps(run, 1, 2, 3)
    _flip_middle_byte(s3 / STATE)
    with pytest.warns(UserWarning) as rec:
        got = ckpt.resolve(run)
    assert got == s2
    msgs = [str(w.message) for w in rec]
    assert len(msgs) == 1
    assert str(s3) in msgs[0] and "sha256 mismatch" in msgs[0] and "falling back" in msgs[0]
    assert ckpt.load(got)["global_step"] == 2

    # two corrupt ones in a row (one truncated): falls back twice, one warning each
    with open(s2 / STATE, "r+b") as f:
        f.truncate(10)
    with pytest.warns(UserWarning) as rec:
        assert ckpt.resolve(run) == s1
    assert [str(s3) in str(w.message) for w in rec] == [True, False]
    assert "truncated" in str(rec[1].message) and str(s2) in str(rec[1].message)


def test_resolve_explicit_corrupt_checkpoint_raises(tmp_path: Path) -> None:
    (path,) = _save_steps(tmp_path / "run", 1)
    _flip_middle_byte(path / STATE)
    with pytest.raises(CheckpointError, match="sha256 mismatch"):
        ckpt.resolve(path)


def test_resolve_all_corrupt_raises(tmp_path: Path) -> None:
    run = tmp_path / "run"
    paths = _save_steps(run, 1, 2)
    for p in paths:
        _flip_middle_byte(p / STATE)
    with pytest.warns(UserWarning), pytest.raises(CheckpointError) as ei:
        ckpt.resolve(run)
    assert str(ei.value) == f"checkpoint {run}: every checkpoint failed verification"


def test_resolve_without_checkpoints_raises(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(CheckpointError, match="no checkpoints under"):
        ckpt.resolve(run)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / ".tmp-step-000001-1").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoints under"):
        ckpt.resolve(run)


def test_resolve_nonexistent_path_raises(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(CheckpointError, match=rf"checkpoint {re.escape(str(missing))}: no such"):
        ckpt.resolve(missing)


# ---------------------------------------------------------------------- 9. Lightning plugin
def test_checkpoint_io_round_trip_and_remove(tmp_path: Path) -> None:
    io_ = BlocklabCheckpointIO()
    src = _checkpoint(step=4)
    path = tmp_path / "checkpoints" / "step-000004"
    io_.save_checkpoint(src, str(path))
    assert (path / MANIFEST).is_file()

    got = io_.load_checkpoint(str(path))
    _assert_state_equal(got, src)
    assert got["blocklab"]["step"] == 4
    got = io_.load_checkpoint(path, map_location=None, weights_only=False)  # still verified+safe
    _assert_state_equal(got, src)

    _flip_middle_byte(path / STATE)
    with pytest.raises(CheckpointError, match="sha256 mismatch"):
        io_.load_checkpoint(path)

    # remove only deletes blocklab checkpoint directories (ones with a manifest)
    stranger = tmp_path / "checkpoints" / "step-000009"
    stranger.mkdir()
    (stranger / STATE).write_bytes(b"not ours")
    plain_file = tmp_path / "file.ckpt"
    plain_file.write_bytes(b"x")
    io_.remove_checkpoint(stranger)
    io_.remove_checkpoint(plain_file)
    io_.remove_checkpoint(tmp_path / "never-existed")
    assert (stranger / STATE).read_bytes() == b"not ours"
    assert plain_file.read_bytes() == b"x"

    io_.remove_checkpoint(str(path))
    assert not path.exists()
    assert stranger.exists()


def test_checkpoint_io_save_disk_full_is_storage_error(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "_write", full_disk)
    path = tmp_path / "checkpoints" / "step-000001"
    with pytest.raises(StorageError, match="no space left"):
        BlocklabCheckpointIO().save_checkpoint(_checkpoint(), path)
    assert not path.exists()
    assert _leftovers(path.parent) == []


"""Imports and exports of models someone else made, as users run them (the console entry
function in process, tests/inprocess.py): a model directory's files stay inside it (shard index
entries and symlinks included); a destination that holds anything is refused unless
``overwrite=true``, which swaps the new content in atomically; an export onto a file, a full
disk, and malformed inputs (GGUF without architecture or tensors, weights of the wrong shape,
a config.json that is a list, a corrupt tokenizer.json or shard index) end in one line naming
the file (and the tensor or key) with the exit code of their class; progress lines on stderr.
"""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from blocklab import checkpoint as ckpt
from blocklab.convert import import_model
from convert.test_hf_roundtrip import _save
from inprocess import run_cli

PROGRESS = ("import: ", "export: ")


def _src(tmp_path: Path, case: str = "llama-mha-untied-nobias") -> Path:
    return _save(tmp_path, case)[1]


def _import(capfd, src: Path, out: Path, *extra: str):
    return run_cli(capfd, "blocklab-import", f"from_hf={src}", f"out={out}", *extra)


def _export(capfd, ckpt_dir: Path, out: Path, *extra: str):
    return run_cli(capfd, "blocklab-export", f"ckpt={ckpt_dir}", f"out={out}", *extra)


def _refused(r, code: int) -> str:
    """The one error line of a refused command: exit ``code``, no traceback, nothing on stderr
    but progress lines before it."""
    assert r.returncode == code, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert lines and all(x.startswith(PROGRESS) for x in lines[:-1]), lines
    assert not lines[-1].startswith(PROGRESS), lines
    return lines[-1]


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith((".tmp-", ".old-")))


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


# ------------------------------------------------------- 1. files confined to the directory


def _shard_index(src: Path, entry: str, weights: Path) -> Path:
    """A shard index in ``src`` naming ``entry`` for every tensor of ``weights``."""
    from safetensors.torch import load_file

    names = sorted(load_file(str(weights)))
    index = src / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": dict.fromkeys(names, entry)}))
    return index


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_a_shard_index_entry_outside_the_directory_is_refused(tmp_path, capfd, how):
    src = _src(tmp_path)
    outside = tmp_path / "outside.safetensors"
    (src / "model.safetensors").rename(outside)
    if how == "symlink":  # a shard inside by name, a link out of the directory
        (src / "shard.safetensors").symlink_to(outside)
        entry = "shard.safetensors"
    else:
        entry = "../outside.safetensors" if how == "dotdot" else str(outside)
    index = _shard_index(src, entry, outside)
    line = _refused(_import(capfd, src, tmp_path / "imp"), 2)
    assert str(index) in line and repr(entry) in line, line
    assert "outside the model directory" in line and str(outside) in line, line
    assert not (tmp_path / "imp").exists()


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors",
                                  "special_tokens_map.json"])
def test_a_file_linked_out_of_the_directory_is_refused(tmp_path, capfd, name):
    src = _src(tmp_path)
    outside = tmp_path / f"elsewhere-{name}"
    (src / name).rename(outside)
    (src / name).symlink_to(outside)
    line = _refused(_import(capfd, src, tmp_path / "imp"), 2)
    assert str(src / name) in line and str(outside) in line, line
    assert "outside the model directory" in line, line
    assert not (tmp_path / "imp").exists()


def test_links_inside_the_directory_and_the_hub_cache_layout_are_read(tmp_path, capfd):
    """A snapshot of the Hugging Face cache links every file to ``../../blobs/<hash>``: that
    is the model's own store, not outside it; a shard index entry in a subfolder is too."""
    src = _src(tmp_path)
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    (snap / "weights").mkdir(parents=True)
    for i, f in enumerate(sorted(p for p in src.iterdir() if p.is_file())):
        blob = repo / "blobs" / f"blob{i}"
        f.rename(blob)
        link = snap / ("weights/" if f.name == "model.safetensors" else "") / f.name
        link.symlink_to(Path(os.path.relpath(blob, link.parent)))
    _shard_index(snap, "weights/model.safetensors", snap / "weights" / "model.safetensors")
    r = _import(capfd, snap, tmp_path / "imp")
    assert r.returncode == 0, r.stderr[-3000:]
    meta = json.loads((ckpt.list_checkpoints(tmp_path / "imp")[0] / "meta.json").read_text())
    assert set(meta["imported"]["files"]) == {"config.json", "weights/model.safetensors"}


# -------------------------------------------------------------- 2. destinations and overwrite


def _user_files(out: Path) -> dict[str, bytes]:
    (out / "tokenizer").mkdir(parents=True)
    for name in ("config.yaml", "run.json", "tokenizer/tokenizer.json", "notes.txt"):
        (out / name).write_text(f"the user's own {name}\n")
    return _tree(out)


def test_import_into_a_non_empty_directory_is_refused_and_touches_nothing(tmp_path, capfd):
    src, out = _src(tmp_path), tmp_path / "mine"
    before = _user_files(out)
    line = _refused(_import(capfd, src, out), 2)
    assert line.startswith(f"config error: out={str(out)!r}: holds 4 entries"), line
    assert "overwrite=true" in line, line
    assert _tree(out) == before and _leftovers(tmp_path) == []


def test_import_overwrite_replaces_the_destination(tmp_path, capfd):
    src, out = _src(tmp_path), tmp_path / "mine"
    _user_files(out)
    r = _import(capfd, src, out, "overwrite=true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.yaml", "run.json",
                                                     "tokenizer"]
    assert ckpt.list_checkpoints(out) and "the user's" not in (out / "run.json").read_text()
    assert json.loads((out / "run.json").read_text())["run_dir"] == str(out)
    assert _leftovers(tmp_path) == []


def test_import_into_an_empty_directory_needs_no_overwrite(tmp_path, capfd):
    src, out = _src(tmp_path), tmp_path / "empty"
    out.mkdir()
    r = _import(capfd, src, out)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ckpt.list_checkpoints(out) and _leftovers(tmp_path) == []


def _full_disk(monkeypatch, module, name: str):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(module, name, full)


@pytest.mark.parametrize("overwrite", [False, True])
def test_import_disk_full_leaves_nothing_and_the_old_content_intact(tmp_path, capfd,
                                                                    monkeypatch, overwrite):
    src, out = _src(tmp_path), tmp_path / "mine"
    before = _user_files(out) if overwrite else None
    _full_disk(monkeypatch, ckpt, "_write")
    line = _refused(_import(capfd, src, out, *(["overwrite=true"] if overwrite else [])), 6)
    assert line.startswith(f"storage error: import to {out}: no space left on device"), line
    assert "bytes free" in line, line
    assert ("is as it was" if overwrite else "nothing was written") in line, line
    if overwrite:
        assert _tree(out) == before
    else:
        assert not out.exists()
    assert _leftovers(tmp_path) == []


def test_import_disk_full_writing_the_tokenizer_leaves_nothing(tmp_path, capfd, monkeypatch):
    """The disk fills after the checkpoint, at the tokenizer: no run directory with a
    checkpoint and no tokenizer is left behind."""
    import importlib

    api = importlib.import_module("blocklab.convert.api")  # import_model's own module
    src, out = _src(tmp_path), tmp_path / "imp"
    real = api.write_file

    def full_at_tokenizer(path, data):
        if Path(path).name == "tokenizer.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(api, "write_file", full_at_tokenizer)
    line = _refused(_import(capfd, src, out), 6)
    assert "no space left on device" in line, line
    assert not out.exists() and _leftovers(tmp_path) == []


@pytest.fixture
def imported(tmp_path) -> Path:
    return import_model(str(_src(tmp_path)), tmp_path / "imported", log=lambda *_: None)


def test_export_into_a_non_empty_directory_is_refused_unless_overwrite(tmp_path, capfd,
                                                                       imported):
    out = tmp_path / "hf_out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    line = _refused(_export(capfd, imported, out), 2)
    assert line.startswith(f"config error: out={str(out)!r}: holds 1 entry"), line
    assert (out / "mine.txt").read_text() == "keep me"
    r = _export(capfd, imported, out, "overwrite=true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (out / "mine.txt").exists() and (out / "model.safetensors").is_file()
    assert _leftovers(tmp_path) == []


def test_overwrite_never_replaces_what_the_command_reads(tmp_path, capfd, imported):
    """``out`` equal to (or above) the source: replacing it would delete the input itself."""
    run = imported.parent.parent
    before = _tree(run)
    line = _refused(_export(capfd, run, run, "overwrite=true"), 2)
    assert line.startswith(f"config error: out={str(run)!r}: is or holds {run}, which this "
                           "command reads"), line
    src = _src(tmp_path)
    line = _refused(_import(capfd, src, tmp_path, "overwrite=true"), 2)
    assert f"is or holds {src}" in line, line
    assert _tree(run) == before and (src / "config.json").is_file()


def test_one_export_resolves_verifies_and_loads_its_checkpoint_once(tmp_path, capfd, imported,
                                                                   checkpoint_reads):
    r = _export(capfd, imported.parent.parent, tmp_path / "hf_out")  # the run: newest chosen
    assert r.returncode == 0, r.stderr[-3000:]
    assert checkpoint_reads == {"verify": [imported.name], "torch.load": 1}


# -------------------------------------------------------------------- 3. export write faults


@pytest.mark.parametrize("overwrite", [False, True])
def test_export_onto_a_file_is_an_io_error(tmp_path, capfd, imported, overwrite):
    out = tmp_path / "a-file"
    out.write_text("not a directory")
    line = _refused(_export(capfd, imported, out, *(["overwrite=true"] if overwrite else [])), 6)
    assert line.startswith(f"I/O error: out={str(out)!r}: is a file, not a directory"), line
    assert out.read_text() == "not a directory" and _leftovers(tmp_path) == []
    # below a file; and the import's destination likewise, refused before reading anything
    line = _refused(_export(capfd, imported, out / "sub"), 6)
    assert line.startswith(f"I/O error: out={str(out / 'sub')!r}: {out} is a file"), line
    r = run_cli(capfd, "blocklab-import", f"from_hf={tmp_path / 'nowhere'}", f"out={out}")
    assert _refused(r, 6).startswith(f"I/O error: out={str(out)!r}: is a file"), r.stderr


@pytest.mark.parametrize("overwrite", [False, True])
def test_export_disk_full_leaves_nothing_and_the_old_content_intact(tmp_path, capfd,
                                                                    monkeypatch, imported,
                                                                    overwrite):
    import safetensors.torch

    out = tmp_path / "hf_out"
    if overwrite:
        out.mkdir()
        (out / "old.txt").write_text("the previous export")
    _full_disk(monkeypatch, safetensors.torch, "save_file")
    line = _refused(_export(capfd, imported, out, *(["overwrite=true"] if overwrite else [])), 6)
    assert line.startswith(f"storage error: export to {out}: no space left on device"), line
    assert "bytes free" in line, line
    if overwrite:
        assert _tree(out) == {"old.txt": b"the previous export"}
    else:
        assert not out.exists()
    assert _leftovers(tmp_path) == []


def test_export_fails_at_the_swap_the_old_content_comes_back(tmp_path, capfd, monkeypatch,
                                                             imported):
    """The rename that puts the new export in place fails after the old one was moved aside:
    the old one is moved back."""
    out = tmp_path / "hf_out"
    out.mkdir()
    (out / "old.txt").write_text("the previous export")
    real = os.rename

    def failing(a, b):
        if Path(a).name.startswith(".tmp-"):
            raise OSError(errno.EIO, "Input/output error")
        real(a, b)

    monkeypatch.setattr(os, "rename", failing)
    line = _refused(_export(capfd, imported, out, "overwrite=true"), 6)
    assert f"export to {out}" in line and "Input/output error" in line, line
    assert _tree(out) == {"old.txt": b"the previous export"} and _leftovers(tmp_path) == []


class SimulatedKill(BaseException):
    """Stands in for the process dying: not an error, so nothing cleans up."""


@pytest.mark.parametrize("tool", ["export", "import"])
def test_a_kill_between_the_renames_leaves_the_old_content(tmp_path, capfd, monkeypatch,
                                                           imported, tool):
    """Exports and imports are written by files.write_dir_atomic: a kill at its ``dir-aside``
    point (the old content moved aside, the new not yet in) leaves the old content whole,
    put back by the next write to that destination."""
    from blocklab import files

    out = tmp_path / "dest"
    out.mkdir()
    (out / "old.txt").write_text("the previous content")

    def kill(point: str, n: int) -> None:
        if point == "dir-aside":
            raise SimulatedKill

    monkeypatch.setattr(files, "maybe_fault", kill)
    with pytest.raises(SimulatedKill):
        if tool == "export":
            _export(capfd, imported, out, "overwrite=true")
        else:
            _import(capfd, _src(tmp_path), out, "overwrite=true")
    monkeypatch.undo()
    assert not out.exists()
    assert _tree(tmp_path / f".old-dest-{os.getpid()}") == {"old.txt": b"the previous content"}
    files.recover_leftovers(out)
    assert _tree(out) == {"old.txt": b"the previous content"} and _leftovers(tmp_path) == []


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True, check=True)
    return int(p.stdout)


def test_write_dir_atomic_recovers_what_a_killed_writer_left(tmp_path):
    """A writer killed between its two renames leaves the old content as ``.old-<name>-<pid>``
    and no ``<name>``: the next write puts it back before anything else (and, without
    overwrite, refuses onto it). A dead writer's ``.tmp-`` is removed; a live one's is not."""
    from blocklab.errors import ConfigError
    from blocklab.files import recover_leftovers, write_dir_atomic

    dead, live = _dead_pid(), os.getppid()
    out = tmp_path / "out"
    (tmp_path / f".old-out-{dead}").mkdir()
    (tmp_path / f".old-out-{dead}" / "mine.txt").write_text("the user's")
    (tmp_path / f".tmp-out-{dead}").mkdir()
    (tmp_path / f".tmp-out-{live}").mkdir()
    with pytest.raises(ConfigError, match="holds 1 entry"):
        write_dir_atomic(out, lambda d: (d / "new.txt").write_text("new"), what="w")
    assert _tree(out) == {"mine.txt": b"the user's"}
    assert _leftovers(tmp_path) == [f".tmp-out-{live}"]
    write_dir_atomic(out, lambda d: (d / "new.txt").write_text("new"), what="w", overwrite=True)
    assert _tree(out) == {"new.txt": b"new"} and _leftovers(tmp_path) == [f".tmp-out-{live}"]
    (tmp_path / f".old-out-{dead}").mkdir()  # a swap that completed but was cut before the delete
    assert recover_leftovers(out) == [tmp_path / f".old-out-{dead}"]
    assert _tree(out) == {"new.txt": b"new"}


# ------------------------------------------------------------ 4. malformed inputs, one line


def _gguf(path: Path, *, arch: str | None, tensors: bool) -> Path:
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    if arch is None:  # GGUFWriter always writes general.architecture when given one
        w.add_uint32("llama.block_count", 1)
    else:
        for key, value in (("block_count", 1), ("embedding_length", 8),
                           ("feed_forward_length", 16), ("attention.head_count", 2)):
            w.add_uint32(f"{arch}.{key}", value)
    if tensors:
        w.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch,tensors,says", [
    (None, True, "no general.architecture"),
    ("llama", False, "no tensors"),
])
def test_a_gguf_without_architecture_or_tensors(tmp_path, capfd, arch, tensors, says):
    pytest.importorskip("gguf")
    d = tmp_path / "g"
    d.mkdir()
    f = _gguf(d / "m.gguf", arch=arch, tensors=tensors)
    r = run_cli(capfd, "blocklab-import", f"from_hf={d}", "gguf=m.gguf", f"out={tmp_path / 'o'}")
    line = _refused(r, 2)
    assert line.startswith(f"gguf {f}: {says}"), line
    assert not (tmp_path / "o").exists()


def test_a_gguf_outside_the_directory_is_refused(tmp_path, capfd):
    pytest.importorskip("gguf")
    (tmp_path / "g").mkdir()
    _gguf(tmp_path / "m.gguf", arch="llama", tensors=True)
    r = run_cli(capfd, "blocklab-import", f"from_hf={tmp_path / 'g'}", "gguf=../m.gguf",
                f"out={tmp_path / 'o'}")
    line = _refused(r, 2)
    assert line.startswith("config error: gguf='../m.gguf'") and "outside the model" in line


def _rewrite_weights(src: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(src / "model.safetensors"))
    edit(state)
    save_file(state, str(src / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("key,shape", [
    ("model.layers.1.mlp.down_proj.weight", (32, 40)),  # placed as is
    ("model.layers.0.self_attn.q_proj.weight", (36, 32)),  # concatenated with k, v
    ("model.layers.0.self_attn.k_proj.weight", (32, 30)),  # concatenation impossible
    ("model.embed_tokens.weight", (96, 30)),
])
def test_weights_of_the_wrong_shape(tmp_path, capfd, key, shape):
    src = _src(tmp_path)
    _rewrite_weights(src, lambda s: s.__setitem__(key, torch.zeros(shape)))
    line = _refused(_import(capfd, src, tmp_path / "o"), 2)
    assert line.startswith(f"hf weights {src / 'model.safetensors'}: "), line
    assert repr(key) in line and str(list(shape)) in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text,says", [
    ("[1, 2]", "a JSON object expected, found a list"),
    ('"llama"', "a JSON object expected, found a str"),
    ("{not json", "not valid JSON ("),
    ('{"model_type": "llama"}', "not a llama config blocklab can read (a size is missing"),
    ('{"model_type": "llama", "hidden_size": "32", "num_attention_heads": 4}',
     "not a llama config blocklab can read (a size is missing or of the wrong type"),
])
def test_a_config_json_that_is_not_an_object(tmp_path, capfd, text, says):
    src = _src(tmp_path)
    (src / "config.json").write_text(text)
    line = _refused(_import(capfd, src, tmp_path / "o"), 2)
    assert line.startswith(f"hf config {src / 'config.json'}: {says}"), line


@pytest.mark.parametrize("text", ["{not json", '{"version": "1.0", "model": 3}'])
def test_a_corrupt_tokenizer_json(tmp_path, capfd, text):
    src = _src(tmp_path)
    (src / "tokenizer.json").write_text(text)
    line = _refused(_import(capfd, src, tmp_path / "o"), 2)
    assert line.startswith(f"tokenizer {src / 'tokenizer.json'}: unreadable ("), line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text,says", [
    ("{truncated", "not valid JSON"),
    ('{"metadata": {}}', "no weight_map"),
    ('{"weight_map": ["a.safetensors"]}', "weight_map: an object of tensor name -> file "
                                          "expected, found a list"),
    ('{"weight_map": {"w": 3}}', "weight_map entry 'w' -> 3: a file name expected"),
    ('[]', "a JSON object expected, found a list"),
])
def test_a_corrupt_shard_index(tmp_path, capfd, text, says):
    src = _src(tmp_path)
    (src / "model.safetensors").unlink()
    index = src / "model.safetensors.index.json"
    index.write_text(text)
    line = _refused(_import(capfd, src, tmp_path / "o"), 2)
    assert line.startswith(f"hf weights index {index}: {says}"), line


# ----------------------------------------------------------------------------- 5. progress


def test_import_and_export_report_each_stage_on_stderr(tmp_path, capfd):
    src = _src(tmp_path)
    r = _import(capfd, src, tmp_path / "imp")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [x for x in r.stderr.splitlines() if x.startswith("import: ")]
    stages = [x.split(":")[1].split()[0] for x in lines]
    for stage in ("reading", "mapping", "tokenizer", "building", "writing", "done"):
        assert stage in stages, lines
    assert stages.index("reading") < stages.index("writing") < stages.index("done")
    assert f"{src / 'model.safetensors'}" in lines[0], lines

    ckpt_dir = ckpt.list_checkpoints(tmp_path / "imp")[0]
    r = _export(capfd, ckpt_dir, tmp_path / "hf_out")
    assert r.returncode == 0, r.stderr[-3000:]
    stages = [x.split(":")[1].split()[0] for x in r.stderr.splitlines()
              if x.startswith("export: ")]
    assert stages[:1] == ["loading"] and "converting" in stages and "writing" in stages, stages


def test_progress_is_periodic_on_a_log_and_a_bar_on_a_terminal():
    """Plain lines at most every ``every`` seconds (a fake clock: no timing), first and last
    always; a terminal gets a tqdm bar instead."""
    from blocklab.progress import Progress

    now = [0.0]
    log = io.StringIO()
    p = Progress("import", stream=log, every=10.0, clock=lambda: now[0])
    with p.count("dequantizing", 5) as tick:
        for t in (1.0, 4.0, 11.0, 12.0, 30.0):
            now[0] = t
            tick()
    assert log.getvalue().splitlines() == [
        "import: dequantizing 0/5", "import: dequantizing 3/5 (60%, about 7 s left)",
        "import: dequantizing 5/5 (100%)"]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    with Progress("import", stream=term).count("dequantizing", 3) as tick:
        for _ in range(3):
            tick()
    assert "dequantizing" in term.getvalue() and "3/3" in term.getvalue()

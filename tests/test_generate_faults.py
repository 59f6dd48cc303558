"""``blocklab-generate`` never ends in a traceback: any accepted ``max_new_tokens`` samples (the
KV cache grows as the sample does), a real out-of-memory is one line naming
``max_new_tokens``, any accepted temperature / ``top_k`` / ``top_p`` samples (one that
underflows is greedy), weights holding NaN stop at the first non-finite logits in one line
naming the checkpoint (exit 5), a prompt file that is a directory, unreadable or not UTF-8 is
named in one line, and standard output closed by its reader (``| head``) ends the command
quietly."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest
import torch

from blocklab import checkpoint as ckpt
from blocklab.config import compose
from blocklab.model.generate import generate
from blocklab.sample import token_names
from blocklab.train.run import train
from inprocess import SAFETY_S, run_cli
from train.test_train_cli import BIN

pytestmark = pytest.mark.slow

PROMPT = "bos k3 v5 sep k3"  # token names (the specials without their brackets)
HUGE = 10**12  # prompt + HUGE slots of K/V: terabytes, were they allocated before the first


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A two-step smoke run: a rotary decoder on the synthetic vocabulary (no position table,
    so nothing bounds a sample's length)."""
    run = tmp_path_factory.mktemp("gen") / "smoke"
    train(compose("train", ["experiment=smoke", "trainer.max_steps=2",
                            "trainer.ckpt_every_steps=2", "trainer.val_every_steps=2",
                            "probes=none", f"run_dir={run}"]))
    return run


def gen(capfd, run: Path, *args: str) -> subprocess.CompletedProcess:
    return run_cli(capfd, "blocklab-generate", f"ckpt={run}", f"prompt={PROMPT}", *args)


@pytest.fixture(scope="module")
def names(run) -> list[str]:
    """The run's token names, in id order."""
    return token_names(ckpt.load_model(run)[1])


@pytest.fixture(scope="module")
def greedy(run, names) -> list[int]:
    """``generate()`` itself, greedy, on the run's checkpoint: six new ids."""
    model = ckpt.load_model(run)[0]
    ids = torch.tensor([[names.index(p if p in names else f"<{p}>") for p in PROMPT.split()]])
    return generate(model, ids, max_new_tokens=6)[0].tolist()


def printed(names: list[str], new: list[int]) -> str:
    """What the command prints for the prompt and ``new``."""
    return " ".join([PROMPT, *(names[i] for i in new)]) + "\n"


def rewritten(run: Path, dest: Path, change) -> Path:
    """``run``'s newest checkpoint again under ``dest``, ``change(state)`` applied first."""
    newest = ckpt.list_checkpoints(run)[-1]
    state = torch.load(newest / ckpt.STATE, weights_only=True)
    change(state)
    ckpt.write_checkpoint(dest / "checkpoints" / newest.name, state)
    return dest


# -------------------------------------------------------------------- max_new_tokens, memory


def test_any_max_new_tokens_samples_and_stops_at_eos(run, names, greedy, tmp_path, capfd):
    """max_new_tokens=10^12 on a rotary model (once: a cache of 10^12 slots allocated before
    the first token, a traceback): the sample runs to its end of sequence, as it would with
    a small limit."""
    new = greedy
    eos = new[3]  # the id greedy decoding emits fourth ends the sample (its first occurrence)
    stop = new.index(eos) + 1
    ended = rewritten(run, tmp_path / "eos", lambda s: s["blocklab"]["specials"]
                      .__setitem__("eos", eos))
    r = gen(capfd, ended, "temperature=0", f"max_new_tokens={HUGE}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == printed(names, new[:stop])
    assert f" {stop} new tokens" in r.stderr and "Traceback" not in r.stderr


def test_a_cache_that_grows_mid_sample_samples_the_same_tokens(run, names, greedy, capfd,
                                                                monkeypatch):
    """The growing cache made to start at 2 slots: the prompt's prefill and the sample grow it
    three times; the sample is the one a cache allocated whole gives."""
    from blocklab.model import kv

    monkeypatch.setattr(kv, "FIRST_SLOTS", 2)
    r = gen(capfd, run, "temperature=0", "max_new_tokens=6", "stop_at_eos=false")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == printed(names, greedy)


def test_running_out_of_memory_is_one_line_naming_max_new_tokens(run, capfd, monkeypatch):
    """A machine whose allocator refuses any tensor over 1 MiB (with the error torch's CPU
    allocator raises when memory runs out): the weights (256 KiB at most) load, the KV cache
    of a long sample does not fit — one line naming max_new_tokens, exit 6, no traceback."""
    limit = 1 << 20
    real_zeros, real_empty = torch.zeros, torch.empty

    def refusing(real):
        def alloc(*size, **kw):
            t = real(*size, **{**kw, "device": "meta"})
            if t.nbytes > limit:
                raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. "
                                   "DefaultCPUAllocator: can't allocate memory: you tried to "
                                   f"allocate {t.nbytes} bytes. Error code 12 (Cannot "
                                   "allocate memory)")
            return real(*size, **kw)
        return alloc

    monkeypatch.setattr(torch, "zeros", refusing(real_zeros))
    monkeypatch.setattr(torch, "empty", refusing(real_empty))
    r = gen(capfd, run, "temperature=0", "max_new_tokens=100000")
    assert r.returncode == 6, r.stderr[-3000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("I/O error: out of memory") and "max_new_tokens=100000" in line
    assert "Traceback" not in r.stderr


# --------------------------------------------------------------------- temperature, top-k/p


@pytest.mark.parametrize("knobs", [
    ["temperature=1e-45"],
    ["temperature=1e-300", "top_k=3", "top_p=0.5"],
    ["temperature=5e-324", "top_k=0", "top_p=1"],
])
def test_a_temperature_that_underflows_samples_greedily(run, names, greedy, capfd, knobs):
    """logits / 1e-45 overflowed to inf and torch.multinomial raised; the logits are now
    shifted to a maximum of 0 first, and a temperature below float32's smallest normal
    number is greedy — what sampling tends to as the temperature goes to 0."""
    r = gen(capfd, run, *knobs, "max_new_tokens=6", "stop_at_eos=false")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == printed(names, greedy)


def test_any_accepted_temperature_and_nucleus_sample(run, capfd):
    """A huge temperature (a uniform draw) and the smallest top_p (the top token: once, in
    float32, no token at all) sample too."""
    for knobs in (["temperature=1e300"], ["temperature=1", "top_p=1e-300"]):
        r = gen(capfd, run, *knobs, "max_new_tokens=4", "stop_at_eos=false")
        assert r.returncode == 0, r.stderr[-3000:]
        assert len(r.stdout.split()) == len(PROMPT.split()) + 4


# ------------------------------------------------------------------------------ NaN weights


@pytest.mark.parametrize("temperature", ["0", "0.8"])
def test_nan_weights_stop_at_the_first_logits_in_one_line(run, tmp_path, capfd, temperature):
    """A checkpoint whose weights hold NaN: greedy decoding once printed argmax(NaN) as if it
    were a sample, sampling raised torch.multinomial's error; both are now one line naming
    the checkpoint, exit 5."""
    def poison(state):
        w = state["state_dict"]["model.embed.weight"]
        w[:] = float("nan")

    bad = rewritten(run, tmp_path / "nan", poison)
    r = gen(capfd, bad, f"temperature={temperature}", "max_new_tokens=4")
    assert r.returncode == 5, r.stderr[-3000:]
    line = r.stderr.strip().splitlines()[-1]
    where = ckpt.list_checkpoints(bad)[-1]
    assert line.startswith(f"numerical error: {where}: the model's logits are not finite at "
                           "token 1 (prompt)"), line
    assert "weights" in line and "Traceback" not in r.stderr
    assert r.stdout == PROMPT  # the prompt, no sample


# ------------------------------------------------------------------------------ prompt files


def _unreadable(path: Path, monkeypatch) -> None:
    """``path`` unreadable: mode 000, or (as root, whom modes do not stop) opening it fails as
    it would for another user."""
    path.chmod(0)
    if os.geteuid() == 0:
        real = Path.open

        def refuse(self, *a, **kw):
            if Path(self) == path:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *a, **kw)

        monkeypatch.setattr(Path, "open", refuse)


@pytest.mark.parametrize("kind, rule", [
    ("directory", "is a directory (a text file is required)"),
    ("latin-1", "not UTF-8 text (invalid byte 0xe9 at offset 3); save it as UTF-8"),
    ("unreadable", "unreadable (Permission denied)"),
])
def test_a_prompt_file_that_cannot_be_a_prompt_is_named_in_one_line(run, tmp_path, capfd,
                                                                     monkeypatch, kind, rule):
    p = tmp_path / "p.txt"
    if kind == "directory":
        p.mkdir()
    else:
        p.write_bytes("caf\u00e9\n".encode("latin-1") if kind == "latin-1" else b"k3 v5\n")
    if kind == "unreadable":
        _unreadable(p, monkeypatch)
    r = run_cli(capfd, "blocklab-generate", f"ckpt={run}", f"prompt_file={p}")
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [f"config error: prompt_file={str(p)!r}: {rule}"]
    assert r.stdout == ""


# ----------------------------------------------------------------- standard output, closed


def test_a_reader_that_stops_reading_ends_the_sample_quietly(run):
    """``blocklab-generate ... | head -c 10`` with a sample that never ends by itself: the
    reader closes the pipe after 10 bytes; the command's next write finds it closed and the
    command ends as Unix tools do — exit 141 (128 + SIGPIPE), nothing on stderr but its usual
    notes: no BrokenPipeError traceback, no "Exception ignored" at exit."""
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 4096)  # the smallest pipe: blocked after 4 KiB
    proc = subprocess.Popen(
        [str(BIN / "blocklab-generate"), f"ckpt={run}", f"prompt={PROMPT}",
         f"max_new_tokens={HUGE}", "stop_at_eos=false", "threads=1"],
        stdout=write, stderr=subprocess.PIPE, text=True)
    os.close(write)
    with os.fdopen(read, "rb") as reader:
        head = reader.read(10)
    try:
        _, err = proc.communicate(timeout=SAFETY_S)
    finally:
        proc.kill()
    assert head.decode() == PROMPT[:10]
    assert proc.returncode == 141, err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err and "Error" not in err

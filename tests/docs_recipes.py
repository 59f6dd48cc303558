"""The recipes of the README and docs/*.md, read and run as a user would, so none can rot.

A page's fenced ```bash blocks are its recipes: each one runs, in page order, in one temporary
directory per page that looks like a checkout (``.venv``, ``docs``, ``scripts`` and
``configs`` linked in; everything written — ``outputs/``, ``data/`` — stays there), so a later
block can use what an earlier one made. A block that cannot run here (network, a GPU, a
minutes-long job, a path of the reader's own) is preceded by a marker line that says why::

    <!-- norun: needs network (a hub dataset) -->

and may then be fenced ```bash or ```console; a ```console block needs the marker too, so
every skipped command carries its reason. Command output is fenced ```text. A ```python block
of docs/python-api.md runs too, in the page's directory, blocks sharing one namespace.

A command runs in this process when it is a blocklab tool (``tests/inprocess.py``: no ~5 s
interpreter start-up per command); with shell syntax (pipes, redirection, ``$(...)``, ``&&``),
``PYTHONPATH`` / ``BLOCKLAB_FAULT`` in its environment (a module path, a signal), or an override
that starts processes (``trainer=ddp``, ``hydra/launcher=...``), it runs under bash as typed.
It must exit 0, or the code its trailing comment names as ``(exit N)``."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from inprocess import SAFETY_S

ROOT = Path(__file__).resolve().parents[1]
LINKED = (".venv", "docs", "scripts", "configs")
_FENCE = re.compile(r"^```(\w*)\s*$")
_NORUN = re.compile(r"^<!--\s*norun:(.*?)-->\s*$")
_EXPECT = re.compile(r"#.*\(exit (\d+)\)")
_SHELL = re.compile(r"[|<>;`]|\$\(|&&")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# overrides that start processes of their own (DDP ranks, launcher workers): not in this one
_OWN_PROCESS = re.compile(r"^(trainer=(ddp|model_parallel|fsdp)|hydra/launcher=)")


class RecipeFailed(AssertionError):
    """A recipe exited with another code than its page promises."""


@dataclass
class Block:
    """One fenced block of a page: its language, text, first line and skip reason (if any)."""
    page: Path
    lang: str
    text: str
    line: int
    norun: str | None = None
    commands: list[tuple[str, int]] = field(default_factory=list)


def pages() -> list[Path]:
    """Every page whose recipes are run: the README and docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of ``page`` in order, each with the norun reason of the marker line
    right before its fence (None without one; "" for a marker with no reason)."""
    lines = (page.read_text() if text is None else text).splitlines()
    found, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        before = lines[i - 1] if i else ""
        marker = _NORUN.match(before)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")),
                   len(lines))
        block = Block(page, m.group(1), "\n".join(lines[i + 1:end]), i + 1,
                      marker.group(1).strip() if marker else None)
        block.commands = commands(block.text) if block.lang == "bash" else []
        found.append(block)
        i = end + 1
    return found


def commands(text: str) -> list[tuple[str, int]]:
    """A bash block's commands: continuation lines joined, blank and comment lines dropped;
    each with its expected exit code (a trailing ``# ... (exit N)`` comment, else 0)."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if not line or line.startswith("#"):
            continue
        m = _EXPECT.search(line)
        out.append((line, int(m.group(1)) if m else 0))
    return out


def problems(page: Path, text: str | None = None) -> list[str]:
    """What is wrong with a page's fences: a skipped block without its reason, a ```console
    block without a marker, a marker before no block, shell fenced as anything but bash."""
    lines = (page.read_text() if text is None else text).splitlines()
    bad = []
    fenced = {b.line - 1 for b in blocks(page, text)}
    for n, line in enumerate(lines):
        if _NORUN.match(line) and n + 1 not in fenced:
            bad.append(f"{page.name}:{n + 1}: a norun marker right before no block")
    for b in blocks(page, text):
        where = f"{page.name}:{b.line}"
        if b.norun == "":
            bad.append(f"{where}: a norun marker without a reason")
        if b.lang == "console" and b.norun is None:
            bad.append(f"{where}: a ```console block without a <!-- norun: reason --> marker")
        if b.lang in ("sh", "shell", "zsh", "shell-session"):
            bad.append(f"{where}: shell fenced as {b.lang!r}: use bash (run) or console (norun)")
    return bad


def prepare_dir(where: Path) -> Path:
    """A directory that looks like a checkout to a recipe: the repository's tools, docs,
    scripts and configs linked in, nothing else."""
    where.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        if not (where / name).exists():
            (where / name).symlink_to(ROOT / name)
    return where


Runner = Callable[[str, list[str], dict[str, str], Path], subprocess.CompletedProcess]


def run_command(line: str, expect: int, cwd: Path, in_process: Runner) -> str:
    """Run one recipe line in ``cwd``; raise :class:`RecipeFailed` unless it exits ``expect``.
    Returns its output (stdout then stderr)."""
    words = shlex.split(line, comments=True)
    env = {}
    while words and _ASSIGN.match(words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    tool = words[0].removeprefix(".venv/bin/") if words else ""
    shell = bool(_SHELL.search(line.split(" #")[0]))
    own = any(_OWN_PROCESS.match(w) for w in words)
    if shell or own or {"PYTHONPATH", "BLOCKLAB_FAULT"} & env.keys() or not tool.startswith(
            "blocklab-"):
        path = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        done = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True,
                              env={**os.environ, "PATH": path}, timeout=SAFETY_S)
    else:
        done = in_process(tool, words[1:], env, cwd)
    output = (done.stdout or "") + (done.stderr or "")
    if done.returncode != expect:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise RecipeFailed(f"`{line}` in {cwd} exited {done.returncode}, expected {expect}:\n"
                           f"{tail}")
    return output


def run_python(block: Block, namespace: dict, cwd: Path) -> None:
    """Execute a ```python block in ``cwd`` (the page's blocks share ``namespace``)."""
    saved = os.getcwd()
    os.chdir(cwd)
    try:
        exec(compile(block.text, f"{block.page.name}:{block.line}", "exec"), namespace)
    finally:
        os.chdir(saved)


def run_page(page: Path, cwd: Path, in_process: Runner, text: str | None = None,
             log: Callable[[str], None] = print) -> int:
    """Every runnable block of ``page`` in order in ``cwd``; returns how many commands ran
    (each logged with its wall time, for keeping the docs' recipes cheap)."""
    prepare_dir(cwd)
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    for b in blocks(page, text):
        if b.norun is not None:
            continue
        if b.lang == "bash":
            for line, expect in b.commands:
                start = time.perf_counter()
                run_command(line, expect, cwd, in_process)
                log(f"{page.name}:{b.line}: {time.perf_counter() - start:5.1f} s  {line}")
                ran += 1
        elif b.lang == "python" and page.name == "python-api.md":
            start = time.perf_counter()
            run_python(b, namespace, cwd)
            log(f"{page.name}:{b.line}: {time.perf_counter() - start:5.1f} s  python block")
            ran += 1
    return ran


def compare_in_process(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``blocklab-compare`` (no torch, no Hydra) through its ``main``."""
    from blocklab.compare.cli import main

    saved = os.getcwd()
    os.chdir(cwd)
    try:
        code = main(args)
    finally:
        os.chdir(saved)
    return subprocess.CompletedProcess(["blocklab-compare", *args], code, "", "")

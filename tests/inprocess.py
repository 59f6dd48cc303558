"""A blocklab command run in this test process, through the same entry function its console
script calls (``blocklab.cli.*_cli``: plugin loading, Hydra's argument parsing and composition,
the one-line error reporting and exit codes) — without the ~5 s of interpreter start-up and
imports a subprocess costs. Exit status, stdout and stderr come back as a
``subprocess.CompletedProcess``; stdout/stderr are read at the file-descriptor level (pytest's
``capfd``), so whatever any library writes to them is seen, as from a real process.

Each tool keeps at least one real subprocess case in the suite (the console script itself);
what needs a process of its own (signals, crashes, locks held by another process, peak memory,
DDP) stays a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# The one timeout a test puts on a subprocess or a wait: a safety net against a hang, never a
# measurement. Generous (a command that takes 40 s idle takes minutes on a loaded 2-core CI
# machine): it must never be what fails a test that would pass.
SAFETY_S = 3600

TOOLS = {"blocklab-train": "train_cli", "blocklab-eval": "eval_cli",
         "blocklab-estimate": "estimate_cli", "blocklab-prepare": "prepare_cli",
         "blocklab-import": "import_cli", "blocklab-export": "export_cli",
         "blocklab-generate": "generate_cli"}


def run_cli(capfd, tool: str, *args: str, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``tool *args`` in process; the process-wide state a command touches (argv, cwd,
    environment, Hydra's singletons, torch's thread count) is restored afterwards."""
    import torch
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from blocklab import cli

    entry = getattr(cli, TOOLS[tool])
    assert "BLOCKLAB_FAULT" not in {**os.environ, **(env or {})}, \
        "a fault signals its own process: run it as a subprocess"
    capfd.readouterr()  # what the test printed before is not the command's
    saved_argv, saved_cwd, saved_env = sys.argv, os.getcwd(), dict(os.environ)
    saved_threads = torch.get_num_threads()
    sys.argv = [tool, *args]
    os.environ.update(env or {})
    if cwd is not None:
        os.chdir(cwd)
    cli._STARTED = False  # a fresh process: nothing has started yet
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None
    code = 0
    try:
        entry()
    except SystemExit as e:  # what the interpreter would turn into the exit status
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        cli._STARTED = False
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None
        torch.set_num_threads(saved_threads)
        sys.stdout.flush()
        sys.stderr.flush()
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess([tool, *args], code, out, err)

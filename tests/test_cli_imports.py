"""The commands that do not train never import Lightning (issue 41: ``blocklab-import`` sat
silent for seconds before its first progress line while the error handling imported the
training driver, and Lightning with it). Each runs in a fresh interpreter to an early
one-line error, then says which modules it imported; nothing is timed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inprocess import SAFETY_S

PROGRAM = """
import sys
sys.argv = {argv!r}
from blocklab import cli
try:
    getattr(cli, {entry!r})()
except SystemExit as e:
    print("exit", e.code)
print("lightning imported:", "lightning" in sys.modules)
"""


@pytest.mark.slow
@pytest.mark.parametrize("entry, argv, code", [
    ("import_cli", ["blocklab-import", "from_hf={tmp}", "gguf=nope.gguf", "out={tmp}/o"], 2),
    ("export_cli", ["blocklab-export", "ckpt={tmp}/none", "out={tmp}/o"], 4),
    ("generate_cli", ["blocklab-generate", "ckpt={tmp}/none", "prompt=a"], 4),
    ("eval_cli", ["blocklab-eval", "ckpt={tmp}/none", "probes=none"], 4),
])
def test_a_command_that_does_not_train_imports_no_lightning(tmp_path, entry, argv, code):
    argv = [a.format(tmp=tmp_path) for a in argv]
    r = subprocess.run([sys.executable, "-c", PROGRAM.format(argv=argv, entry=entry)],
                       capture_output=True, text=True, timeout=SAFETY_S, cwd=tmp_path)
    assert f"exit {code}" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "lightning imported: False" in r.stdout, r.stderr[-2000:]

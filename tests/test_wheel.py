"""blocklab as an installable library: a wheel built with ``python -m build`` installs into a
fresh virtual environment outside the repository and, from an empty directory, trains the smoke
experiment, evaluates its checkpoint, and trains with a user component that an installed plugin
package registers through the ``blocklab.plugins`` entry point.

Offline by construction: the wheels are built without build isolation, installed with
``--no-index --no-deps``, and the fresh environment borrows its third-party dependencies (torch,
lightning, ...) from the test environment through a ``.pth`` path entry — what is tested is that
blocklab's own wheel carries everything blocklab needs (code and configs), not pip's resolver.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from inprocess import SAFETY_S

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=SAFETY_S,
                       cwd=cwd, env=env)
    assert r.returncode == 0, f"{cmd}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def _copy_sources(dest: Path) -> Path:
    """The repository's files as a clone has them (tracked and new, never ignored ones)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for rel in listed:
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """(venv bin dir, empty work dir, clean environment) with blocklab and the example plugin
    installed from wheels."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = _copy_sources(tmp / "src")
    dist = tmp / "dist"
    run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, src,
        cwd=tmp)
    run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist,
        src / "docs" / "examples" / "plugin", cwd=tmp)
    venv = tmp / "venv"
    run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv, cwd=tmp)
    py = venv / "bin" / "python"
    site = run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
               cwd=tmp).stdout.strip()
    Path(site, "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheels = sorted(dist.glob("*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == ["blocklab", "blocklab_example_plugin"]
    run(py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *wheels, cwd=tmp)
    work = tmp / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "BLOCKLAB_PLUGINS", "VIRTUAL_ENV")}
    return venv / "bin", work, env


def test_the_installed_package_is_the_wheel_with_its_configs(fresh):
    bin_dir, work, env = fresh
    out = run(bin_dir / "python", "-c",
              "import blocklab, blocklab.config as c; print(blocklab.__file__); "
              "print(c.config_dir())", cwd=work, env=env).stdout.split()
    venv = str(bin_dir.parent)
    assert out[0].startswith(venv) and out[1].startswith(venv), out  # not the source tree
    assert (Path(out[1]) / "train.yaml").is_file()
    assert (Path(out[1]) / "model" / "position" / "rope.yaml").is_file()


def test_smoke_experiment_and_eval_run_from_an_empty_directory(fresh):
    bin_dir, work, env = fresh
    r = run(bin_dir / "blocklab-train", "experiment=smoke", "trainer.max_steps=4",
            "trainer.val_every_steps=4", "trainer.ckpt_every_steps=4", "run_dir=run",
            cwd=work, env=env)
    assert "val/loss" in r.stdout and (work / "run" / "checkpoints" / "step-000004").is_dir()
    r = run(bin_dir / "blocklab-eval", "ckpt=run", "probes=coarse", cwd=work, env=env)
    assert "effective length" in r.stdout and "val/loss" in r.stdout


def test_a_plugin_installed_as_a_package_registers_its_components(fresh):
    bin_dir, work, env = fresh
    r = run(bin_dir / "blocklab-train", "experiment=smoke", "model.ffn.name=squared_relu",
            "model.norm.name=scalenorm", "trainer.max_steps=2", "trainer.val_every_steps=2",
            "trainer.ckpt_every_steps=2", "probes=none", "run_dir=plugin_run", cwd=work, env=env)
    assert "val/loss" in r.stdout
    config = (work / "plugin_run" / "config.yaml").read_text()
    assert "name: squared_relu" in config and "name: scalenorm" in config

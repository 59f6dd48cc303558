"""The package stands on floors: a module imports only from its own floor or below, evaluation
never imports training, no private name crosses a package boundary, and the floor under
everything imports no torch.

Every import statement counts wherever it is — at the top of a module or inside a function
(an import put inside a function still reaches that floor, only later) — and blocklab's Hydra
launchers (``src/hydra_plugins/blocklab_launchers``, the unit ``launchers``) are on the sweep
layer's floor, so a call-time import of them from a lower floor is caught too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from inprocess import SAFETY_S

SRC = Path(__file__).resolve().parents[1] / "src" / "blocklab"
LAUNCHERS = SRC.parent / "hydra_plugins" / "blocklab_launchers"
LAUNCHERS_MODULE = "hydra_plugins.blocklab_launchers"

# Floor of each top-level module or package of blocklab (docs/design.md, "Layout").
FLOORS = {
    "errors": 0,
    "provenance": 1, "registry": 1, "plotting": 1, "faults": 1, "runlock": 1, "files": 1,
    "progress": 1,
    "config": 2,
    "model": 3, "data": 3,
    "objectives": 4, "checkpoint": 4,
    "eval": 5, "train": 5, "compare": 5, "convert": 5, "sample": 5,
    "sweep": 6, "repro": 6, "launchers": 6,
    "cli": 7,
}
# Same-floor imports that are allowed: training runs the probe callback and the probe runner.
# Training starts from a pretrained source (init_from) through the converters. The atomic
# directory writer fires its fault points.
# blocklab's launchers record a dead job through the sweep layer.
SIDEWAYS = {("train", "eval"), ("train", "convert"), ("files", "faults"), ("launchers", "sweep")}


def _unit(path: Path) -> str:
    if path.is_relative_to(LAUNCHERS):
        return "launchers"
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def _imports_in(tree: ast.AST) -> list[tuple[str, list[str], int]]:
    """(imported unit, imported names, line) for every import anywhere in ``tree`` — module
    level and inside functions, classes, ``try`` and ``if`` blocks alike (``ast.walk``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if alias.name == LAUNCHERS_MODULE or alias.name.startswith(LAUNCHERS_MODULE + "."):
                    out.append(("launchers", [], node.lineno))
                elif parts[0] == "blocklab" and len(parts) > 1:
                    out.append((parts[1], [], node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if node.module == LAUNCHERS_MODULE or node.module.startswith(LAUNCHERS_MODULE + "."):
                out.append(("launchers", [a.name for a in node.names], node.lineno))
                continue
            if parts[0] != "blocklab":
                continue
            names = [a.name for a in node.names]
            if len(parts) == 1:  # from blocklab import x
                out += [(n, [], node.lineno) for n in names if n in FLOORS]
            else:
                out.append((parts[1], names, node.lineno))
    return out


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(imported unit, imported names, line) for every import in the file."""
    return _imports_in(ast.parse(path.read_text()))


FILES = sorted(p for p in [*SRC.rglob("*.py"), *LAUNCHERS.rglob("*.py")]
               if _unit(p) != "__init__")


def test_every_module_has_a_floor():
    assert {_unit(p) for p in FILES} <= set(FLOORS), {_unit(p) for p in FILES} - set(FLOORS)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC.parent)))
def test_imports_go_down_never_up_or_sideways(path):
    bad = _violations(_unit(path), _imports(path))
    assert not bad, "\n".join(bad)


def _violations(here: str, imports: list[tuple[str, list[str], int]]) -> list[str]:
    bad = []
    for there, names, line in imports:
        if there == here or there == "__init__":
            continue
        up = FLOORS[there] > FLOORS[here]
        sideways = FLOORS[there] == FLOORS[here] and (here, there) not in SIDEWAYS
        if up or sideways:
            bad.append(f"line {line}: {here} (floor {FLOORS[here]}) imports {there} "
                       f"(floor {FLOORS[there]})")
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        if private:
            bad.append(f"line {line}: private names {private} imported across packages")
    return bad


def test_an_import_inside_a_function_counts():
    """Negative control: the config floor reaching the launchers or the sweep layer at call
    time (what ``compose`` once did) is caught, as is the same import at the top."""
    tree = ast.parse("def compose():\n"
                     "    from hydra_plugins.blocklab_launchers import register\n"
                     "    import blocklab.sweep\n")
    assert _violations("config", _imports_in(tree)) == [
        "line 2: config (floor 2) imports launchers (floor 6)",
        "line 3: config (floor 2) imports sweep (floor 6)"]


def test_eval_never_imports_train():
    offenders = [f"{p.relative_to(SRC)}:{line}" for p in FILES if _unit(p) == "eval"
                 for there, _, line in _imports(p) if there == "train"]
    assert not offenders, offenders


def test_the_lowest_floor_and_the_compare_tool_import_no_torch():
    """``--help`` and ``--cfg job`` stay fast: importing the config floor (its validators ask
    components for their rules, config/validate_model.py) looks no component up — no package
    above the config floor is imported and no plugin is loaded — and imports no torch."""
    code = ("import sys, blocklab.config, blocklab.provenance, blocklab.registry, "
            "blocklab.plotting, blocklab.compare; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'lightning', 'matplotlib'))); "
            "print(sorted(m for m in sys.modules if m.startswith('blocklab.') and "
            f"m.split('.')[1] in {ABOVE_CONFIG!r})); "
            "print(blocklab.registry._plugins_loaded)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=SAFETY_S)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["[]", "[]", "False"], r.stdout


# the units above the config floor a config import must not reach (compare is torch-free and
# imported on purpose above)
ABOVE_CONFIG = tuple(sorted(u for u, floor in FLOORS.items() if floor > 2 and u != "compare"))


def test_the_wheel_lists_every_package():
    """pyproject.toml names the packages explicitly (configs/ is mapped into the package): a new
    subpackage must be listed there, or the wheel ships without it."""
    import tomllib

    pyproject = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {"blocklab." + ".".join(p.parent.relative_to(SRC).parts) if p.parent != SRC
             else "blocklab" for p in SRC.rglob("__init__.py")}
    launchers = {".".join(p.parent.relative_to(SRC.parent).parts)  # Hydra plugins (namespace)
                 for p in (SRC.parent / "hydra_plugins").rglob("__init__.py")}
    assert launchers == {"hydra_plugins.blocklab_launchers"}
    assert set(pyproject["packages"]) == found | launchers | {"blocklab.configs"}
    assert pyproject["package-dir"]["blocklab.configs"] == "configs"

"""A probe kind lives in one module: no source file outside ``eval/kinds/<kind>.py`` names a
kind, so the driver, the report, the plots and the callback work for any registered kind.

What "names a kind" means here (read off each file's syntax tree, comments and docstrings
aside): for every built-in probe kind K (the registry's ``probe`` axis),

- a string literal equal to K's registry name, or to ``probes.K`` / starting ``probes.K.``;
- the identifier of K's component class or of its settings' dataclass (``Needle``,
  ``NeedleProbeConfig``), anywhere but in an import statement or ``__all__`` (re-exports are
  wiring);
- an attribute ``.K`` (``spec.needle``: reading K's settings off the spec by name).

Not counted: K's own module; the registry wiring (``eval/kinds/__init__.py``'s
``PROBE_KINDS``); the declaration of K's settings on the config floor
(``config/probe_schema.py``: K's dataclass and its field of ``ProbeSpec``). The training TASK
axis is a different axis that shares words: ``data.tasks.needle`` (like ``mqar`` and
``copy``) is a task of the training mixture and ``data.name=babilong`` training data, so the
modules of that axis may say ``needle`` or ``babilong`` (listed in TASK_AXIS, word by word) — as may an example's metadata there (``"hops"``). The
remaining exceptions are listed with their reason in ALLOWED.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from blocklab.registry import builtin_names, table

SRC = Path(__file__).resolve().parents[1] / "src" / "blocklab"

# Modules of the training-task axis (data.tasks.*, the synthetic generators and the mixture),
# and the words of it that coincide with a probe kind's name.
TASK_AXIS = {
    "data/tasks/__init__.py": {"needle"},  # TASKS["needle"]
    "data/tasks/needle.py": {"needle"},  # the needle task's name and its examples' meta
    "data/tasks/multihop.py": {"hops"},  # multihop's meta key "hops"
    "config/validate_data.py": {"needle", "babilong"},  # rules of data.tasks.needle and of
    # data.name=babilong, the training data the BABILong probe kind reads items like
    "config/facts.py": {"needle"},  # distinct keys a needle-task sequence draws
    "config/schema.py": {"babilong"},  # DataName.babilong
    "data/babilong_train.py": {"babilong"},  # the data.name=babilong stream
    "data/streams.py": {"babilong"},  # builds it
}
# Other places that say a kind's word on purpose, with the reason.
ALLOWED = {
    # probes.text.needle is the text template of a needle sentence (a TextProbeConfig field,
    # used by the needle and multi-needle kinds), not the kind
    ("config/probes.py", "needle"), ("eval/kinds/multi_needle.py", "needle"),
    # blocklab-compare reads saved summary.json files of past runs by their keys; it is
    # torch-free and beside eval (floor 5), so it cannot ask the kinds
    ("compare/runs.py", "needle"), ("compare/runs.py", "litm"),
    # the chunked experiment builds the needle *task*'s examples at chosen chunks: their meta
    # says task "needle", as data/tasks/needle.py's do
    ("repro/experiments/chunked.py", "needle"),
    # the BABILong probe's prompt styles (BABILONG_PROMPTS: "plain" or the benchmark's own,
    # named after it), a string choice of its settings on the config floor
    ("config/choices.py", "babilong"),
}


def _kinds() -> dict[str, set[str]]:
    """Kind name -> the identifiers that name it (its class and its settings' class)."""
    kinds = table("probe")
    return {k: {kinds[k].__name__, kinds[k].config.__name__} for k in builtin_names("probe")}


def _own(path: Path, kind: str) -> bool:
    rel = path.relative_to(SRC).as_posix()
    return rel in (f"eval/kinds/{kind}.py", "eval/kinds/__init__.py", "config/probe_schema.py")


def _import_or_all(tree: ast.AST) -> set[int]:
    """ids of nodes inside import statements and ``__all__`` assignments (wiring)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        wiring = isinstance(node, ast.Import | ast.ImportFrom) or (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets))
        if wiring:
            skip |= {id(n) for n in ast.walk(node)}
    return skip


def mentions(path: Path, kind: str, idents: set[str]) -> list[str]:
    """Where ``path`` names ``kind`` (see the module docstring), as ``line: what``."""
    tree = ast.parse(path.read_text())
    skip = _import_or_all(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            v = node.value
            if v == kind or v == f"probes.{kind}" or v.startswith(f"probes.{kind}."):
                out.append(f"{node.lineno}: string {v!r}")
        elif isinstance(node, ast.Name) and node.id in idents:
            out.append(f"{node.lineno}: identifier {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in idents:
            out.append(f"{node.lineno}: identifier .{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr == kind:
            out.append(f"{node.lineno}: attribute .{kind}")
    return out


FILES = sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(SRC).as_posix())
def test_no_source_file_outside_a_kinds_module_names_the_kind(path):
    rel = path.relative_to(SRC).as_posix()
    bad = []
    for kind, idents in _kinds().items():
        if _own(path, kind) or (rel, kind) in ALLOWED or kind in TASK_AXIS.get(rel, set()):
            continue
        bad += [f"{rel}:{m} (probe kind {kind!r})" for m in mentions(path, kind, idents)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("kind", builtin_names("probe"))
def test_a_builtin_kind_module_offers_its_class_only(kind):
    """Like a plugin kind, a built-in kind is its class: cells, items, summary and figures are
    its methods (no public free function, so one import path per name), and it reads its
    settings through ``cls.settings(spec)``, never as ``spec.<kind>``."""
    tree = ast.parse((SRC / "eval" / "kinds" / f"{kind}.py").read_text())
    public = [n.name for n in tree.body
              if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    assert not public, f"eval/kinds/{kind}.py: free functions {public}"
    by_name = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute)
               and isinstance(n.value, ast.Name) and n.value.id == "spec"
               and n.attr in builtin_names("probe")]
    assert not by_name, f"eval/kinds/{kind}.py reads spec.<kind> at lines {by_name}"


def test_the_check_finds_a_kind_named_where_it_should_not_be(tmp_path):
    """The negative control: a driver that names kinds the old way is caught, each form."""
    f = tmp_path / "driver.py"
    f.write_text("from blocklab.config import NeedleProbeConfig\n"
                 "def build(spec, b):\n"
                 "    if spec.litm.enabled:\n"
                 "        return b.cells('hops', NeedleProbeConfig(), 'probes.aggregation.n')\n")
    found = {k: mentions(f, k, i) for k, i in _kinds().items()}
    assert found["litm"] == ["3: attribute .litm"]
    assert found["hops"] == ["4: string 'hops'"]
    assert found["needle"] == ["4: identifier NeedleProbeConfig"]
    assert found["aggregation"] == ["4: string 'probes.aggregation.n'"]


def test_the_allowances_are_still_needed():
    """Every exception above is used (a stale one would hide a new mention)."""
    kinds = _kinds()
    for rel, kind in ALLOWED:
        assert mentions(SRC / rel, kind, kinds[kind]), (rel, kind)
    for rel, words in TASK_AXIS.items():
        for kind in words:
            assert mentions(SRC / rel, kind, kinds[kind]), (rel, kind)

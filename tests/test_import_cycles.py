"""No import circle inside ``src/blocklab``: the module graph is a DAG.

The rule: every ``import`` / ``from ... import`` of a blocklab module that can run counts — at
the top of a module and inside functions, methods, ``try`` and ``if`` blocks alike (an import
put inside a function to dodge a circle is still a circle: it only moves the failure from import
time to call time). Imports under ``if TYPE_CHECKING:`` never run and do not count. The edge
goes to the module imported: ``from blocklab.a import b`` is an edge to ``blocklab.a.b`` when
that is a module, else to ``blocklab.a``; relative imports are not used in ``src/``.

The test is static (``ast``): it reads the files, imports nothing."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "blocklab"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _module_of(name: str) -> str | None:
    """The blocklab module ``name`` is, or the one that defines it."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imported(tree: ast.AST) -> set[str]:
    """The blocklab modules that the imports in ``tree`` (skipping TYPE_CHECKING blocks) reach."""
    found: set[str | None] = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        if _type_checking(node):
            todo += node.orelse
            continue
        if isinstance(node, ast.Import):
            found |= {_module_of(a.name) for a in node.names if a.name.startswith("blocklab.")}
        elif (isinstance(node, ast.ImportFrom) and node.module and node.level == 0
              and node.module.split(".")[0] == "blocklab"):
            found |= {_module_of(f"{node.module}.{a.name}") for a in node.names}
        todo += ast.iter_child_nodes(node)
    return {m for m in found if m}


def import_graph() -> dict[str, set[str]]:
    return {m: _imported(ast.parse(p.read_text())) - {m} for m, p in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (``a -> b -> ... -> a``) per strongly connected component of more than one
    module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == v:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_circle(graph, c) for c in components]


def _circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest circle through the component's first module (breadth-first)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(component)


def test_no_import_circle_in_src():
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_check_finds_a_circle_and_ignores_type_checking_imports():
    """Negative control: a circle through a function-level import is found and named; one
    closed only under ``if TYPE_CHECKING:`` is not a circle."""
    a = ast.parse("from blocklab.b import f\n")
    b = ast.parse("def f():\n    from blocklab.a import g\n")
    c = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                  "    from blocklab.a import g\n")
    MODULES.update({"blocklab.a": Path("a"), "blocklab.b": Path("b"), "blocklab.c": Path("c")})
    try:
        graph = {"blocklab.a": _imported(a), "blocklab.b": _imported(b),
                 "blocklab.c": _imported(c)}
    finally:
        for m in ("blocklab.a", "blocklab.b", "blocklab.c"):
            del MODULES[m]
    assert graph["blocklab.c"] == set()
    assert cycles(graph) == [["blocklab.a", "blocklab.b", "blocklab.a"]]

"""A sequence mixer or a position scheme lives in its own module: no other source file names a
built-in one, so shared code (the stack, the cache, the estimator, init, init_from, probes)
works for any registered mixer or scheme by asking it — never ``if mixer == "softmax"``
(issue 42: the estimator labelled windows that way, init scaled projections by their names,
``init_from`` keyed on a scheme named "learned").

What "names" means (read off each file's syntax tree, comments and docstrings aside): for every
built-in mixer and position scheme C (the registry's ``mixer`` and ``position`` axes),

- a string literal equal to C's registry name ("none", the position scheme, is left out: it
  is every axis's word for nothing);
- the identifier of C's class (``SoftmaxAttention``, ``RoPE``), anywhere but in an import.

Not counted: C's own module (``inspect.getsourcefile`` of the registered class). The remaining
exceptions are listed with their reason in ALLOWED — each one is a config *value*, a mapping
to an outside format, or another axis that shares the word; none decides behaviour by name.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from blocklab.registry import builtin_names, table

SRC = Path(__file__).resolve().parents[1] / "src" / "blocklab"
AXES = ("mixer", "position")

ALLOWED = {
    # the registry wiring: the built-in mixers' table
    "model/mixers.py": {"softmax", "linear", "gated_conv", "ssm", "SoftmaxAttention",
                        "LinearAttention", "GatedConv", "SelectiveSSM", "linformer", "nystrom",
                        "LinformerAttention", "NystromAttention", "memorizing", "Memorizing"},
    # the memorizing mixer is softmax attention plus a retrieval memory: its subclass
    "model/knn.py": {"SoftmaxAttention"},
    # the schema's default value of model.mixer.name; RopeScaling.linear is a rope scaling
    "config/model_schema.py": {"softmax", "linear"},
    # Hugging Face mappings: an outside architecture maps to named blocklab components
    # (a Llama is rope + softmax; GPT-2 a learned table); "linear" is also HF's rope scaling
    "convert/archs.py": {"softmax", "rope", "learned", "linear"},
    "convert/encoders.py": {"softmax", "learned", "t5_bias"},
    "convert/gemma.py": {"softmax"},
    # a reference experiment's arms: the position schemes it compares, config values
    "repro/experiments/extrapolation.py": {"alibi", "learned", "sinusoidal"},
    "repro/experiments/sinks.py": {"rope"},  # its model's scheme: the protocol says why
    # the reference experiments' deliberate breaks are mixers built on a built-in one
    "repro/experiments/recall_state.py": {"LinearAttention", "SelectiveSSM"},
    "repro/experiments/shakespeare_char.py": {"SoftmaxAttention"},
    # the learning-rate schedule named linear
    "train/optim.py": {"linear"},
}


def _components() -> dict[str, dict[str, str]]:
    """{"names": registry name -> the file that owns it, "classes": class name -> file}."""
    out: dict[str, dict[str, str]] = {"names": {}, "classes": {}}
    for axis in AXES:
        for name in builtin_names(axis):
            cls = table(axis)[name]
            own = Path(inspect.getsourcefile(cls)).resolve().relative_to(SRC).as_posix()
            if name != "none":
                out["names"][name] = own
            out["classes"][cls.__name__] = own
    return out


def named(source: str, words: dict[str, dict[str, str]], rel: str) -> set[str]:
    """The built-in components ``source`` names outside their own modules: registry names as
    string literals, class names as identifiers (imports aside)."""
    tree = ast.parse(source)
    imported = {id(n) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in imported:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            word, owners = node.value, words["names"]
        elif isinstance(node, ast.Name):
            word, owners = node.id, words["classes"]
        else:
            continue
        if word in owners and owners[word] != rel:
            found.add(word)
    return found


def _files() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.relative_to(SRC).as_posix())
def test_shared_code_names_no_builtin_mixer_or_position_scheme(path):
    rel = path.relative_to(SRC).as_posix()
    found = named(path.read_text(), _components(), rel) - ALLOWED.get(rel, set())
    assert not found, (f"{rel} names {sorted(found)}: ask the component (a class attribute or "
                       "method of the mixer / position scheme) instead, or list the file in "
                       "ALLOWED with its reason")


def test_every_allowed_word_is_still_used():
    """No stale exception: each listed word occurs in its file."""
    words = _components()
    for rel, allowed in ALLOWED.items():
        found = named((SRC / rel).read_text(), words, rel)
        assert allowed <= found, f"{rel}: {sorted(allowed - found)} listed but not named"


def test_the_rule_finds_a_name_test_and_a_class_check():
    """Negative control: what the estimator and init used to do is caught; imports are not."""
    words = _components()
    src = ("from blocklab.model.attention import SoftmaxAttention\n"
           "def f(m, module):\n"
           "    if m.mixer.name == 'softmax':\n"
           "        return isinstance(module, SoftmaxAttention)\n"
           "    return m.position.name == 'learned'\n")
    assert named(src, words, "model/estimate.py") == {"softmax", "SoftmaxAttention", "learned"}
    assert named("from blocklab.model.position import RoPE\n", words, "x.py") == set()
    assert named("x = 'softmax'\n", words, "model/attention.py") == set()  # its own module
    assert named("softmax = ('model/mixer=softmax',)\n", words, "x.py") == set()  # a variable

"""Probe kinds are components: the registry's ``probe`` axis lists blocklab's kinds in report
order, a user kind registered with ``register("probe", name)`` is set under
``probes.kinds.<name>`` and checked by its own dataclass (one line naming the key), and a spec
that names no user kind hashes and reports exactly as before."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from blocklab.config import ConfigError, ProbeContext, ProbeKindConfig, ProbeSpec
from blocklab.config import validate_probe_spec as validate
from blocklab.config.checks import require
from blocklab.eval.items import NotApplicable, spec_hash
from blocklab.progress import quiet
from blocklab.registry import builtin_names, names, table


def test_blocklabs_kinds_in_report_order_then_registered_ones():
    assert builtin_names("probe") == ["needle", "litm", "multi_needle", "hops", "aggregation",
                                      "babilong"]
    assert names("probe")[6:] == ["first_value"]  # the example plugin (tests/conftest.py)


def test_a_spec_without_user_kinds_hashes_as_before():
    """``probes.kinds`` (empty) leaves every older spec's hash, hence its report folder name,
    as it was (9dda9943bd8c: the default spec's hash before probe kinds were components)."""
    assert spec_hash(ProbeSpec()) == "9dda9943bd8c"
    assert spec_hash(ProbeSpec(kinds={"first_value": {"enabled": True}})) != "9dda9943bd8c"


@pytest.mark.parametrize("kinds,needle", [
    ({"nope": {}}, "config error: probes.kinds.nope='nope': unknown choice; known: aggregation"),
    ({"first_value": {"lenghts": [1.0]}}, "config error: probes.kinds.first_value="),
    ({"first_value": {"enabled": True, "n": 0}},
     "config error: probes.kinds.first_value.n=0: must be >= 1"),
    ({"first_value": {"lengths": [-1.0]}}, "config error: probes.kinds.first_value.lengths="),
    ({"needle": {"n": 3}}, "config error: probes.kinds.needle={'n': 3}: a probe kind of "
                           "blocklab's own is set at its own key; use probes.needle"),
])
def test_user_kind_settings_are_checked_in_one_line(kinds, needle):
    with pytest.raises(ConfigError) as e:
        validate(ProbeSpec(kinds=kinds))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(needle), msg


def test_a_user_kinds_rules_are_its_own(monkeypatch):
    """A registered kind's dataclass brings its rule; blocklab's validator only asks it."""
    from blocklab.eval import kinds as kinds_module
    from blocklab.eval.kinds import ProbeKind

    @dataclass
    class Odd(ProbeKindConfig):
        enabled: bool = True
        sizes: list[int] = field(default_factory=lambda: [1, 3])

        def check(self, ctx: ProbeContext) -> None:
            require(all(s % 2 for s in self.sizes), f"{ctx.key}.sizes", list(self.sizes),
                    "odd sizes only")

    class OddKind(ProbeKind):
        name, config = "odd", Odd

    monkeypatch.setitem(kinds_module.PROBE_KINDS, "odd", OddKind)
    validate(ProbeSpec(kinds={"odd": {"sizes": [5]}}), "checkpoint_probes")
    with pytest.raises(ConfigError, match=r"^config error: checkpoint_probes\.kinds\.odd\.sizes="
                                          r"\[2\]: odd sizes only$"):
        validate(ProbeSpec(kinds={"odd": {"sizes": [2]}}), "checkpoint_probes")


@pytest.mark.parametrize("name", builtin_names("probe"))
def test_a_builtin_kind_copied_under_another_name_is_a_plugin_kind(name):
    """blocklab's kinds use only the interface a plugin kind has: the same class under another
    name reads its settings from ``probes.kinds.<that name>`` (``cls.settings``, never
    ``spec.<kind>``) and labels its cells with that name, in both spaces' entry points."""
    from blocklab.data.synthetic import Vocab
    from blocklab.eval.items import TokenBuilder

    kind = table("probe")[name]
    copy = type("Copy", (kind,), {"name": f"copy_of_{name}"})
    spec = ProbeSpec(kinds={copy.name: replace(kind.settings(ProbeSpec()), n=2, enabled=True)})
    assert kind.settings(spec).n != 2  # the built-in's own key keeps its settings
    builder, unit = TokenBuilder(Vocab(), 1234), 64
    if all(c.na for c in kind.cells(builder, spec, 64, None)):  # a text-only kind
        from blocklab.data.tokenizer import byte_tokenizer
        from blocklab.eval.textspace import TextBuilder, TextTokenizer

        spec.text.haystack = "shakespeare"
        builder = TextBuilder(TextTokenizer.from_tokenizers(byte_tokenizer(), bos=1), spec)
        unit = 1024
    cells = copy.cells(builder, spec, unit, None)
    assert cells and {c.key["probe"] for c in cells} == {copy.name}
    assert {len(c.items) for c in cells if c.na is None} == {2}
    assert all(it.cell["probe"] == copy.name for c in cells for it in c.items)


def test_not_applicable_is_a_value_not_a_string_prefix():
    """N/A is :class:`NotApplicable` (its ``status`` the report's text); an ordinary
    ``ValueError`` whose message happens to start with "n/a" is an error, not an N/A row."""
    from blocklab.eval import probes

    assert NotApplicable("too short").status == "n/a: too short"

    class Backend:
        supports_perplexity = True

    class Builder:
        def perplexity_text(self, spec, need):
            raise ValueError("n/a: a bug that only looks like an N/A")

    spec = ProbeSpec()
    with pytest.raises(ValueError, match="a bug"):
        probes._perplexity(Backend(), spec, Builder(), 64, quiet())

    class NA(Builder):
        def perplexity_text(self, spec, need):
            raise NotApplicable("no language-modelling slice")

    rows, text = probes._perplexity(Backend(), spec, NA(), 64, quiet())
    assert text is None
    assert rows and {r["status"] for r in rows} == {"n/a: no language-modelling slice"}

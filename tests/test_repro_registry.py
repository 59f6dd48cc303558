"""Reference experiments are components: the registry's ``experiment`` axis lists blocklab's
(one module each in ``blocklab.repro.experiments``), and a user's experiment registered with
``register("experiment", name)`` is listed and chosen by ``blocklab-repro`` like a built-in."""

from __future__ import annotations

import pytest

from blocklab import registry
from blocklab.repro.experiments import experiment, names
from blocklab.repro.protocol import Arm, Experiment, Protocol


def tiny_study(size: str) -> Experiment:
    arms = (Arm("two layers", ("model.n_layers=2",)),)
    return Experiment(name="tiny_study", title="A user's study", reference="-", protocol="-",
                      sizes={s: Protocol(arms, ()) for s in ("quick", "full")},
                      measure=lambda run, arm: {},
                      breaks={"one-layer": ("one layer", lambda arms: arms)})


@pytest.fixture
def registered():
    registry.register("experiment", "tiny_study")(tiny_study)
    yield
    registry.table("experiment").pop("tiny_study", None)
    registry._registered.pop(("experiment", "tiny_study"), None)


def test_blocklabs_experiments_in_listing_order():
    assert registry.builtin_names("experiment") == [
        "mqar", "extrapolation", "receptive_field", "shakespeare_char", "recall_state", "listops",
        "chunked", "sinks", "xl_memory", "memory_recall", "long_context", "stability"]
    for name in registry.builtin_names("experiment"):
        assert experiment(name, "quick").name == name


def test_a_user_experiment_is_listed_and_chosen(registered, capsys):
    from blocklab.repro import main

    assert names()[-1] == "tiny_study"
    assert experiment("tiny_study", "quick").title == "A user's study"
    main(["--list"])
    out = capsys.readouterr().out
    assert "tiny_study: A user's study" in out and "--break one-layer: one layer" in out


def test_an_unknown_experiment_is_a_usage_error(capsys):
    from blocklab.repro import main

    with pytest.raises(SystemExit) as e:
        main(["no_such_study"])
    assert e.value.code == 2
    assert "invalid choice: 'no_such_study'" in capsys.readouterr().err

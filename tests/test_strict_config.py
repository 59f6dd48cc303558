"""Strict configuration (issue 21): every key outside a command's schema is refused in one
line naming it and the closest known key, ``+``-appended keys too, for every command and for
the Python ``compose``; Hydra's composition errors reworded to the same one-line form (exit 2,
no traceback); each command's ``--help`` says what it does, its own keys, the groups that apply
and where the docs are; a run prints no Lightning advertisement or accelerator lines unless
asked, and the sweeper warning only under a sweep. Commands run in process (tests/inprocess.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import pytest

from blocklab.config import SCHEMAS, ConfigError, compose, open_keys
from inprocess import run_cli


def refused(r, *needles: str) -> str:
    """The one line of a config refusal (exit 2, no traceback), holding every needle."""
    lines = [s for s in r.stderr.splitlines() if s.strip()]
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and "HYDRA_FULL_ERROR" not in r.stderr, r.stderr
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------- 1. keys outside the schema


@pytest.mark.parametrize("tool,args,needles", [
    ("blocklab-train", ["experiment=smoke", "+model.n_layer=3"],
     ["model.n_layer=3", "did you mean model.n_layers?"]),
    ("blocklab-train", ["experiment=smoke", "+trainer.callbacks=[foo]"],
     ["trainer.callbacks", "not a config key"]),
    ("blocklab-train", ["experiment=smoke", "++optim.learning_rate=0.1"],
     ["optim.learning_rate", "did you mean optim.lr?"]),
    ("blocklab-train", ["experiment=smoke", "+modle.n_layers=3"],
     ["modle", "did you mean model"]),
    ("blocklab-prepare", ["experiment=smoke", "+data.file=x.txt"],
     ["data.file", "did you mean data.files?"]),
    ("blocklab-estimate", ["+model.n_head=3"], ["model.n_head", "did you mean model.n_heads?"]),
    ("blocklab-import", ["from_hf=nowhere", "+ignore_field=[x]"],
     ["ignore_field", "did you mean ignore_fields?"]),
    ("blocklab-export", ["ckpt=nowhere", "out=x", "+arch_name=llama"],
     ["arch_name", "did you mean arch?"]),
    ("blocklab-generate", ["ckpt=nowhere", "+temprature=0"],
     ["temprature", "did you mean temperature?"]),
])
def test_a_key_outside_the_schema_is_refused_in_one_line(tmp_path, capfd, tool, args, needles):
    r = run_cli(capfd, tool, *args, cwd=tmp_path)
    refused(r, *needles)
    assert list(tmp_path.iterdir()) == [], "nothing is written for a refused config"


def test_eval_data_files_name_the_corpus_evaluated_never_ignored(tmp_path, capfd):
    """``blocklab-eval ckpt=<run> '+data.files=[val.txt]'`` used to be accepted, ignored, and the
    training hold-out's loss printed as if it were val.txt's. ``data`` is now eval's own key
    (the corpus to evaluate on, tests/eval/test_eval_data.py checks its loss): with or without
    the ``+`` it lands there, and a misspelt key below it is refused before anything loads."""
    for arg in ("+data.files=[val.txt]", "data.files=[val.txt]"):
        cfg = compose("eval", ["ckpt=run", arg])
        assert list(cfg.data.files) == ["val.txt"], arg
    (tmp_path / "val.txt").write_text("some text\n")
    r = run_cli(capfd, "blocklab-eval", f"ckpt={tmp_path / 'run'}", "+data.file=[val.txt]",
                cwd=tmp_path)
    refused(r, "data.file", "did you mean data.files?")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["val.txt"]


def test_a_typo_without_plus_names_the_closest_key_not_add_a_plus(tmp_path, capfd):
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", "model.n_layer=3", cwd=tmp_path)
    line = refused(r, "model.n_layer=3", "did you mean model.n_layers?")
    assert "+model" not in line
    r = run_cli(capfd, "blocklab-estimate", "modell.n_layers=3", cwd=tmp_path)
    refused(r, "modell", "did you mean model")


def test_compose_refuses_the_same_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.n_layer=3: not a config key; did you mean "
                                          r"model\.n_layers\?"):
        compose("train", ["experiment=smoke", "+model.n_layer=3"])
    with pytest.raises(ConfigError, match=r"model/position=rop: .*options: alibi"):
        compose("train", ["model/position=rop"])


def test_places_open_on_purpose_stay_open():
    """A user mixer's own options are checked by that mixer, a callback's by that callback, not
    by the schema; those are the only open places (the docs list them: a new one must be added there)."""
    cfg = compose("train", ["experiment=smoke", "+model.mixer.options.my_knob=3"])
    assert cfg.model.mixer.options.my_knob == 3
    assert {name: open_keys(s) for name, s in SCHEMAS.items()} == {
        # callbacks: each named callback's options, checked by that callback's own dataclass
        # (tests/train/test_callbacks.py::test_bad_callback_and_trainer_options_fail_in_one_line)
        # probes.kinds: each user probe kind's settings, checked by that kind's own dataclass
        # (tests/test_user_extensions_cli.py::test_a_user_probe_kind_runs_end_to_end)
        # data.user_tasks: a registered task's weight, checked by that task
        # (tests/data/test_task_registry.py)
        "train": ["model.mixer", "data.user_tasks", "probes.kinds", "checkpoint_probes.kinds",
                  "callbacks"],
        "prepare": ["model.mixer", "data.user_tasks", "probes.kinds", "checkpoint_probes.kinds",
                    "callbacks"],
        "estimate": ["model.mixer"], "eval": ["probes.kinds", "data.user_tasks"],
        "import": [],
        "export": [], "generate": []}


def test_a_sweep_with_an_unknown_key_is_refused_before_any_job(tmp_path, capfd):
    r = run_cli(capfd, "blocklab-train", "-m", "experiment=smoke", f"out_root={tmp_path}",
                "+model.n_layer=3,4", cwd=tmp_path)
    refused(r, "model.n_layer", "did you mean model.n_layers?")
    r = run_cli(capfd, "blocklab-train", "-m", "experiment=smoke", f"out_root={tmp_path}",
                "model/position=rope,rop", cwd=tmp_path)
    refused(r, "'rop'", "did you mean rope?", "options: alibi")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------- 2. Hydra's composition errors


@pytest.mark.parametrize("args,needles", [
    (["model/position=rop"],
     ["model/position=rop", "did you mean rope?", "options: alibi, learned, none, rope"]),
    (["model=gpt2_tny"], ["model=gpt2_tny", "options:", "gpt2_tiny"]),
    (["trainer.max_steps=many"], ["trainer.max_steps=many", "many"]),
    (["model.position=rope"], ["model.position", "config group", "model/position="]),
    (["seed=0,1"], ["seed=0,1", "-m"]),
    (["+seed=3"], ["+seed=3", "without the +"]),
    (["data.files=[a.txt"], ["data.files=[a.txt", "not a valid override"]),
    (["model.mixer.options.my_knob=3"],
     ["model.mixer.options is a free-form mapping", "+model.mixer.options.my_knob=3"]),
])
def test_hydra_composition_errors_are_one_line(tmp_path, capfd, args, needles):
    r = run_cli(capfd, "blocklab-train", "experiment=smoke", *args, cwd=tmp_path)
    line = refused(r, *needles)
    assert "schema" not in line.split("options:")[-1]
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------ 3. --help


HELP = {"blocklab-train": ("train", "docs/training.md"), "blocklab-eval": ("eval", "docs/evaluation.md"),
        "blocklab-estimate": ("estimate", "docs/training.md"),
        "blocklab-prepare": ("prepare", "docs/data.md"),
        "blocklab-import": ("import", "docs/pretrained.md"),
        "blocklab-export": ("export", "docs/pretrained.md"),
        "blocklab-generate": ("generate", "docs/generation.md")}


def _top_level_keys(schema: type, groups: set[str]) -> list[str]:
    return [f.name for f in dataclasses.fields(schema) if f.name not in groups]


@pytest.mark.parametrize("tool", sorted(HELP))
def test_help_says_what_the_command_does_its_keys_groups_and_docs(capfd, tool):
    name, doc = HELP[tool]
    r = run_cli(capfd, tool, "--help")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"{tool}: "), out[:200]
    assert "powered by Hydra" not in out and "== Config ==" not in out
    assert doc in out
    assert len(out.splitlines()) < 80, "a page, not a config dump"
    lines = out.splitlines()
    if name in ("train", "eval", "estimate"):
        groups_at = lines.index("Config groups (group=option: the choice made, then every option):")
        groups = {s.split()[0].split("=")[0].split("@")[0].split("/")[0]
                  for s in lines[groups_at + 1:] if s.startswith("  ") and "=" in s}
        for key in _top_level_keys(SCHEMAS[name], groups | {"checkpoint_probes"}):
            assert f"  {key} " in out, f"{tool} --help does not name its key {key}"
        for row in lines[groups_at + 1:]:
            assert "schema" not in row, row  # the structured-config base is no preset
    if name in ("import", "export", "generate"):
        for key in _top_level_keys(SCHEMAS[name], set()):
            assert f"  {key} " in out, f"{tool} --help does not name its key {key}"
        assert "model/position" not in out and "trainer=" not in out


def test_train_help_lists_the_groups_with_their_choices(capfd):
    out = run_cli(capfd, "blocklab-train", "--help").stdout
    assert "model/position=rope" in out and "alibi, learned, none, rope" in out
    assert "hydra/launcher=" in out
    out = run_cli(capfd, "blocklab-train", "model/position=alibi", "--help").stdout
    assert "model/position=alibi" in out


def test_a_help_template_that_names_hydras_group_lists_gets_them(tmp_path, capfd):
    """blocklab's own templates list groups with ${blocklab_groups:} and Hydra skips its group
    listing for them (10 s of a 12 s --help); a user's hydra/help that names
    $APP_CONFIG_GROUPS still gets Hydra's list, user config directories included."""
    (tmp_path / "hydra" / "help").mkdir(parents=True)
    (tmp_path / "hydra" / "help" / "mine.yaml").write_text(
        "app_name: mine\nheader: ''\nfooter: ''\ntemplate: |-\n  MINE\n  $APP_CONFIG_GROUPS\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "my_tiny.yaml").write_text("defaults:\n  - retrieval_tiny\n")
    out = run_cli(capfd, "blocklab-estimate", "--config-dir", str(tmp_path), "hydra/help=mine",
                  "--help").stdout
    assert out.startswith("MINE") and "model/position: " in out, out[:400]
    assert "my_tiny" in out.split("\nmodel: ")[1].splitlines()[0]
    plain = run_cli(capfd, "blocklab-estimate", "--config-dir", str(tmp_path), "--help").stdout
    assert "$APP_CONFIG_GROUPS" not in plain and "my_tiny" in plain  # blocklab's listing


@pytest.mark.parametrize("tool,doc", [("compare", "docs/sweeps.md"),
                                      ("repro", "docs/reproductions.md")])
def test_the_other_commands_help_says_where_the_docs_are(capsys, tool, doc):
    import importlib

    with pytest.raises(SystemExit) as e:
        importlib.import_module(f"blocklab.{tool}").main(["--help"])
    assert e.value.code == 0 and f"Docs: {doc}" in capsys.readouterr().out


# ------------------------------------------------------------------------------ 4. quiet runs


NOISE = ("litlogger", "litmodels", "GPU available", "TPU available", "💡")
TINY = ["experiment=smoke", "trainer.max_steps=2", "trainer.val_every_steps=2",
        "trainer.ckpt_every_steps=2", "trainer.log_every_steps=1", "probes=none",
        "data.val_batches=1", "model.n_layers=1"]


class _Records(logging.Handler):
    """Lightning's log records, wherever its own handler writes: in one pytest worker that
    handler is bound to whichever stream was ``sys.stderr`` when lightning was first imported
    (a captured stream of an earlier test, maybe), so the records are read here, not the
    output."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _lightning_records():
    handler = _Records()
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric")]
    for lg in loggers:  # they do not propagate further up
        lg.addHandler(handler)
    try:
        yield handler.lines
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


@pytest.mark.slow
def test_a_run_prints_no_lightning_advertisement_or_accelerator_lines(tmp_path, capfd):
    with _lightning_records() as said:
        r = run_cli(capfd, "blocklab-train", *TINY, f"out_root={tmp_path / 'a'}",
                    "objective=val/no_such_metric", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = r.stdout + r.stderr + "\n".join(said)
    assert not [n for n in NOISE if n in seen], seen
    assert "sweeper" not in seen, "a single run is no sweep"
    import warnings

    (run,) = (tmp_path / "a").glob("*/*/config.yaml")
    with warnings.catch_warnings(record=True) as caught:  # what pytest would otherwise swallow
        warnings.simplefilter("always")
        r = run_cli(capfd, "blocklab-train", f"resume={run.parent}", "trainer.max_steps=4",
                    cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [str(w.message) for w in caught if "lightning" in w.filename]
    assert not [m for m in said if "exists and is not empty" in m], said  # a resume's own dir
    with _lightning_records() as said:
        r = run_cli(capfd, "blocklab-train", *TINY, f"out_root={tmp_path / 'b'}",
                    "trainer.quiet=false", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "GPU available" in r.stdout + r.stderr + "\n".join(said)


def test_the_sweeper_warning_only_under_a_sweep(tmp_path, capfd, monkeypatch):
    """A run without its objective metric (too short to validate) returns NaN to a sweeper,
    which is worth a warning only when there is a sweeper."""
    import json
    import math

    from blocklab import cli

    (tmp_path / "summary.json").write_text(json.dumps({"metrics": {"train/loss": 1.0}}))
    assert math.isnan(cli.objective_value(tmp_path, "val/loss"))
    assert "a sweeper sees NaN" in capfd.readouterr().err
    ran = []
    monkeypatch.setattr("blocklab.train.run.train", lambda cfg, o: ran.append(1) or tmp_path)
    monkeypatch.setattr("blocklab.sweep.in_multirun", lambda: False)
    cfg = compose("train", ["experiment=smoke"])
    assert cli._train(cfg) is None and ran
    assert "sweeper" not in capfd.readouterr().err

"""blocklab-compare over hand-made run directories (no training), and proof that it never
imports torch."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from blocklab import compare
from inprocess import SAFETY_S

MODEL = {"family": {"name": "decoder"}, "vocab_size": 64, "d_model": 32, "n_layers": 1,
         "n_heads": 2, "d_ff": 64, "max_seq_len": 64, "position": {"name": "rope"}}
HEADER = ["epoch", "step", "train/loss", "train/tokens_per_s", "val/loss"]


def make_config(position: str = "rope", n_layers: int = 1, **top: Any) -> dict[str, Any]:
    model = {**MODEL, "n_layers": n_layers, "position": {"name": position}}
    return {"model": model,
            "data": {"name": "synthetic", "seq_len": 32, "curriculum": [[0, 16], [10, 32]]},
            "trainer": {"name": "cpu", "max_steps": 20, "progress_bar": False},
            "logger": {"name": "csv"},
            "probes": {"enabled": True, "needle": {"n": 8}},
            "checkpoint_probes": {"enabled": False},
            "seed": 0, "out_root": "outputs", "run_dir": None, "resume": None,
            "allow_data_change": False, **top}


def probes(within: float = 0.9, beyond: float = 0.4, eff: int | None = 32) -> dict[str, Any]:
    def pooled(acc: float) -> dict[str, Any]:
        return {"n": 100, "accuracy": acc, "ci_low": acc - 0.05, "ci_high": min(1.0, acc + 0.05)}

    return {
        "train_length": 32,
        "needle": {
            "1 distractors": {"within_train_length": pooled(1.0),
                              "beyond_train_length": pooled(1.0), "effective_length": 64},
            "3 distractors": {"accuracy_by_length": {"16": 1.0, "32": within, "64": None},
                              "within_train_length": pooled(within),
                              "beyond_train_length": pooled(beyond),
                              "effective_length": eff, "threshold": 0.8},
        },
        "litm": {"kv_records/m=8": {"best_worst_gap": 0.5},
                 "kv_records/m=16": {"best_worst_gap": 0.25, "middle_drop": 0.1},
                 "query_aware/m=32": {"best_worst_gap": 0.9},
                 "closed_book": {"accuracy": 0.0}, "oracle": {"accuracy": 1.0}},
        "perplexity": [
            {"variant": "nonoverlapping", "length": 32, "n": 10, "nll": 1.0, "ppl": 2.7,
             "status": "ok"},
            {"variant": "sliding", "length": 32, "n": 10, "nll": 1.0, "ppl": 2.5, "status": "ok"},
            {"variant": "sliding", "length": 64, "n": 10, "nll": 2.0, "ppl": 7.5, "status": "ok"},
            {"variant": "sliding", "length": 128, "n": 0, "nll": None, "ppl": None,
             "status": "n/a: longer than max_seq_len"},
        ],
    }


def make_run(root: Path, name: str, config: dict[str, Any] | None, *,
             summary: dict[str, Any] | None = None, status: dict[str, Any] | None = None,
             logs: list[list[list[Any]]] | None = None, run_json: dict[str, Any] | None = None,
             checkpoints: dict[int, dict[str, Any] | None] | None = None) -> Path:
    """A run directory as training and the sweep leave it; ``checkpoints`` maps a step to the
    checkpoint's meta.json (None: a checkpoint without one)."""
    d = root / name
    d.mkdir(parents=True)
    if config is not None:
        (d / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if status is not None:
        (d / "status.json").write_text(json.dumps(status))
    if run_json is not None:
        (d / "run.json").write_text(json.dumps(run_json))
    for step, meta in (checkpoints or {}).items():
        ckpt = d / "checkpoints" / f"step-{step:06d}"
        ckpt.mkdir(parents=True)
        if meta is not None:
            (ckpt / "meta.json").write_text(json.dumps(meta))
    for version, rows in enumerate(logs or []):
        f = d / "logs" / f"version_{version}" / "metrics.csv"
        f.parent.mkdir(parents=True)
        with f.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(HEADER)
            w.writerows(rows)
    return d


def summary(step: int, train: float, val: float, with_probes: dict | None = None,
            **extra: Any) -> dict:
    return {"run_dir": "x", "step": step, "tokens_seen": 1000,
            "metrics": {"train/loss": train, "val/loss": val, "train/tokens_per_s": 12345.0},
            "probes": with_probes, "last_checkpoint": None, **extra}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """A multirun-like sweep: 4 jobs varying position x n_layers, nested 2 levels deep. The
    parameter count is in run.json (job 0), summary.json (job 1), a checkpoint's meta.json
    (job 2) or nowhere (job 3)."""
    root = tmp_path / "multirun" / "2026-01-01"
    ok_logs = [[[0, 0, 4.0, 1000.0, ""], [0, 9, 3.0, 1100.0, ""], [0, 9, "", "", 3.2],
                [0, 19, 2.0, 1200.0, ""], [0, 19, "", "", 2.5]]]
    make_run(root / "12-00-00", "0", make_config("rope", 1, out_root="/a", run_dir="/a/0"),
             summary=summary(20, 2.0, 2.5, probes(0.9, 0.4, 32)),
             status={"status": "ok", "error": None, "job": 0, "run_dir": "x",
                     "overrides": ["model/position=rope", "model.n_layers=1"]},
             logs=ok_logs, run_json={"params": 1000, "arch_hash": "a"})
    make_run(root / "12-00-00", "1", make_config("alibi", 1, out_root="/b", run_dir="/b/1"),
             summary=summary(20, 1.5, 1.8, probes(0.95, 0.8, 64), params=1001),
             status={"status": "ok", "error": None, "job": 1, "run_dir": "x",
                     "overrides": ["model/position=alibi", "model.n_layers=1"]},
             logs=ok_logs)
    # job 2 crashed mid-training: config + logs (resumed once), no summary
    make_run(root / "12-00-00", "2", make_config("rope", 2, logger={"name": "wandb"}),
             status={"status": "failed", "job": 2, "run_dir": "x",
                     "error": "RuntimeError: CUDA out of memory. " + "x" * 200 + "\nTraceback..",
                     "overrides": ["model/position=rope", "model.n_layers=2"]},
             logs=[[[0, 0, 4.0, 900.0, ""], [0, 9, 3.5, 900.0, ""], [0, 14, 3.4, 900.0, ""]],
                   [[0, 9, 3.3, 950.0, ""], [0, 9, "", "", 3.6], [0, 12, 3.1, 950.0, ""]]],
             checkpoints={10: {"step": 10, "params": 2000}})
    # job 3 still running / never reached status: only config.yaml
    make_run(root / "12-00-00", "3", make_config("alibi", 2))
    return tmp_path / "multirun"


def test_varied_keys_exact_and_bookkeeping_ignored() -> None:
    a = make_config("rope", 1, out_root="/x", run_dir="/x/1", resume="/x/1/ckpt")
    b = make_config("alibi", 2, out_root="/y", run_dir="/y/2", allow_data_change=True)
    b["logger"] = {"name": "wandb", "project": "p"}
    b["probes"] = {"enabled": False}
    b["checkpoint_probes"] = {"enabled": True, "name": "coarse"}
    # training length, cadence and the sweeper's metric are bookkeeping too
    # (blocklab.provenance.BOOKKEEPING): never an experimental axis
    b["trainer"] = {**b["trainer"], "progress_bar": True, "max_steps": 40, "log_every_steps": 5,
                    "val_every_steps": 7, "ckpt_every_steps": 9, "keep_checkpoints": 1}
    b["objective"] = "val/loss"
    b["data"] = {**b["data"], "curriculum": [[0, 32]]}
    c = make_config("rope", 1, probes={})  # probes collapsed to an empty mapping
    assert compare.varied_keys([a, b, c]) == ["model.n_layers", "model.position.name",
                                              "data.curriculum"]
    assert compare.varied_keys([a]) == []
    assert compare.varied_keys([a, make_config("rope", 1)]) == []
    # a key missing from one config counts as varied
    d = make_config("rope", 1)
    d["model"] = {**d["model"], "d_head": 16}
    assert compare.varied_keys([a, d]) == ["model.d_head"]
    # other trainer keys still count
    e = make_config("rope", 1)
    e["trainer"] = {**e["trainer"], "max_steps": 99, "accumulate": 4}
    assert compare.varied_keys([a, e]) == ["trainer.accumulate"]


def test_collect_sweep(sweep: Path) -> None:
    rows = compare.collect([sweep])
    assert [r["run"] for r in rows] == ["job 0", "job 1", "job 2", "3"]
    assert rows[0]["axes"] == ["model.n_layers", "model.position.name"]
    assert [r["model.position.name"] for r in rows] == ["rope", "alibi", "rope", "alibi"]
    assert rows[1]["label"] == "n_layers=1, position=alibi"
    ok, alibi, failed, running = rows
    assert [r["params"] for r in rows] == [1000, 1001, 2000, None]
    assert (ok["status"], ok["step"], ok["train_loss"], ok["val_loss"]) == ("ok", 20, 2.0, 2.5)
    assert ok["tokens_per_s"] == 12345.0
    # probe headlines come from the variant with the most distractors / the largest m
    assert (ok["needle_in"], ok["needle_beyond"], ok["eff_len"]) == (0.9, 0.4, 32)
    assert ok["needle_variant"] == "3 distractors"
    assert ok["copy_any_value"] == pytest.approx(0.25)
    assert ok["needle_in_ci"] == pytest.approx((0.85, 0.95))
    assert ok["litm_gap"] == 0.25
    assert (ok["ppl_L"], ok["ppl_max"], ok["ppl_max_len"]) == (2.5, 7.5, 64)
    assert alibi["needle_beyond"] == 0.8
    # the failed job: its status and the first line of its error, 80 chars at most
    assert failed["status"] == "failed"
    assert failed["error"].startswith("RuntimeError: CUDA out of memory.")
    assert len(failed["error"]) == 80 and "Traceback" not in failed["error"]
    # resumed logs: versions concatenated, the later row wins for a repeated step
    assert failed["curves"]["train/loss"] == [(0, 4.0), (9, 3.3), (12, 3.1), (14, 3.4)]
    assert failed["curves"]["val/loss"] == [(9, 3.6)]
    assert (failed["step"], failed["train_loss"], failed["val_loss"]) == (14, 3.4, 3.6)
    assert failed["needle_in"] is None
    # a job that left only its config is listed as incomplete
    assert running["status"] == "incomplete"
    assert running["step"] is None and running["train_loss"] is None
    assert running["model.n_layers"] == 2


def test_find_runs_depth_and_no_descent(tmp_path: Path) -> None:
    run = make_run(tmp_path / "a" / "b", "run", make_config())
    ckpt = run / "checkpoints" / "step-000010"
    ckpt.mkdir(parents=True)
    (ckpt / "config.yaml").write_text("model: {}\n")
    make_run(tmp_path / "a" / "b" / "c", "too_deep", make_config())
    make_run(tmp_path / "a" / ".hydra", "hidden", make_config())
    assert compare.find_runs(tmp_path) == [run]
    assert compare.find_runs(run) == [run]


def test_cli_writes_outputs(sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "report"
    assert compare.main([str(sweep), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    lines = printed.strip().splitlines()
    assert lines[0].startswith("| run | model.n_layers | model.position.name | params | status")
    assert "ppl_L" in lines[0] and "needle_in" in lines[0]
    assert len(lines) == 2 + 4
    assert "| job 2 | 2 | rope |" in printed and "| failed |" in printed
    assert "| incomplete |" in printed
    assert "| 0.9 | 0.4 | 32 | 0.25 |" in printed
    for name in ("compare.csv", "compare.md", "loss_curves.png", "probe_accuracy.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (out / "compare.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["run"] for r in rows] == ["job 0", "job 1", "job 2", "3"]
    assert rows[1]["val_loss"] == "1.8" and rows[3]["val_loss"] == ""
    assert rows[2]["status"] == "failed" and rows[2]["error"].startswith("RuntimeError")
    md = (out / "compare.md").read_text()
    assert "| job 1 |" in md and "![loss_curves](loss_curves.png)" in md


def test_cli_sort_and_default_out(sweep: Path, capsys: pytest.CaptureFixture) -> None:
    assert compare.main([str(sweep), "--sort", "val_loss", "--no-plots"]) == 0
    body = capsys.readouterr().out.strip().splitlines()[2:]
    assert [ln.split(" | ")[0] for ln in body] == ["| job 1", "| job 0", "| job 2", "| 3"]
    assert (sweep / "compare.csv").exists() and not (sweep / "loss_curves.png").exists()
    assert compare.main([str(sweep), "--sort=-val_loss", "--no-plots"]) == 0
    body = capsys.readouterr().out.strip().splitlines()[2:]
    assert [ln.split(" | ")[0] for ln in body] == ["| job 2", "| job 0", "| job 1", "| 3"]
    assert compare.main([str(sweep), "--sort", "nope", "--no-plots"]) == 2
    assert "nope" in capsys.readouterr().err


def test_missing_path_and_empty_dir(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "does-not-exist"
    assert compare.main([str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and err.count("\n") == 1
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    assert compare.main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "empty") in err and err.count("\n") == 1


def test_several_paths_no_probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture) -> None:
    a = make_run(tmp_path, "a", make_config(n_layers=1), summary=summary(5, 1.0, 1.1),
                 logs=[[[0, 1, 2.0, 10.0, ""], [0, 5, 1.0, 10.0, 1.1]]])
    b = make_run(tmp_path, "b", {**make_config(n_layers=1), "model": {"vocab_size": -1}})
    monkeypatch.chdir(tmp_path)
    assert compare.main([str(a), str(b), str(a)]) == 0  # duplicates listed once
    captured = capsys.readouterr()
    assert "probe_accuracy.png" in captured.err and "skip" in captured.err
    rows = [ln for ln in captured.out.splitlines() if ln.startswith("| a") or ln.startswith("| b")]
    assert len(rows) == 2
    assert "ppl_L" not in captured.out  # optional columns only when some run has them
    (out,) = (tmp_path / "outputs").glob("compare_*")
    assert (out / "loss_curves.png").exists() and not (out / "probe_accuracy.png").exists()
    rows = compare.collect([a, b])
    assert rows[0]["params"] is rows[1]["params"] is None  # no file records it: left blank


def test_params_are_read_from_the_run_files_in_order(tmp_path: Path) -> None:
    """run.json, then summary.json, then the newest checkpoint that records it; never computed
    from the config (which would need torch), so an invalid model config does not matter."""
    cfg = {**make_config(), "model": {"vocab_size": -1}}
    run = make_run(tmp_path, "all", cfg, run_json={"params": 1}, summary={"params": 2},
                   checkpoints={5: {"params": 3}})
    assert compare.read_params(run) == 1
    run = make_run(tmp_path, "summary", cfg, run_json={"arch_hash": "a"},
                   summary={"params": 2}, checkpoints={5: {"params": 3}})
    assert compare.read_params(run) == 2
    # newest checkpoint by step number (not by name order of unpadded names), one without
    # meta.json skipped, hidden half-written copies ignored
    run = make_run(tmp_path, "ckpt", cfg, checkpoints={9: {"params": 9}, 100: {"params": 100},
                                                       200: None})
    (run / "checkpoints" / "step-9").mkdir()
    (run / "checkpoints" / "step-9" / "meta.json").write_text('{"params": 7}')
    tmp = run / "checkpoints" / ".tmp-step-000300-1"
    tmp.mkdir()
    (tmp / "meta.json").write_text('{"params": 300}')
    assert compare.read_params(run) == 100
    # unreadable or meaningless values count as absent
    run = make_run(tmp_path, "bad", cfg, run_json={"params": "many"}, summary={"params": None},
                   checkpoints={1: {"params": -5}})
    (run / "run.json").write_text("{half-written")
    assert compare.read_params(run) is None
    assert compare.read_params(tmp_path / "does-not-exist") is None
    row = compare.load_run(tmp_path / "summary")
    assert row["params"] == 2 and row["status"] == "ok"


def test_compare_never_imports_torch(sweep: Path, tmp_path: Path) -> None:
    """blocklab-compare in a fresh interpreter where importing torch fails loudly: the table
    and every output are written, and nothing even tried to import torch (directly or through
    another blocklab module)."""
    out = tmp_path / "report"
    code = textwrap.dedent(f"""
        import sys

        attempts = []

        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    attempts.append(name)
                    raise ImportError("torch is blocked in this test")
                return None

        sys.meta_path.insert(0, NoTorch())
        from blocklab import compare

        rc = compare.main([{str(sweep)!r}, "--out", {str(out)!r}])
        assert rc == 0, rc
        assert not attempts, attempts
        assert "torch" not in sys.modules
        assert "matplotlib" in sys.modules and "matplotlib.pyplot" not in sys.modules
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=SAFETY_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("| run | model.n_layers | model.position.name | params | status")
    assert len(lines) == 2 + 4 and "| job 0 | 1 | rope | 1000 | ok |" in proc.stdout
    for name in ("compare.csv", "compare.md", "loss_curves.png", "probe_accuracy.png"):
        assert (out / name).stat().st_size > 0, name


def test_loss_axis_ticks_read_as_plain_numbers(tmp_path: Path) -> None:
    """A loss curve over a narrow range (5.4 -> 5.0, log y): no "5.35×10^0" tick labels."""
    import matplotlib.pyplot as plt

    from blocklab.compare.plots import plot_loss_curves

    curves = {"train/loss": [(s, 5.4 - 0.02 * s) for s in range(1, 21)]}
    seen = {}

    real_save = plt.Figure.savefig

    def keep(fig, *a, **kw):
        fig.canvas.draw()
        ax = fig.axes[0]
        seen["labels"] = [t.get_text() for t in ax.get_yticklabels(minor=True)
                          + ax.get_yticklabels() if t.get_text()]
        return real_save(fig, *a, **kw)

    plt.Figure.savefig = keep
    try:
        plot_loss_curves([{"run": "a", "name": "a", "curves": curves}], tmp_path / "loss.png")
    finally:
        plt.Figure.savefig = real_save
    labels = seen["labels"]
    assert labels and not any("10^" in t or "times" in t or "\\\\" in t for t in labels), labels
    assert all(float(t.replace(",", "")) > 0 for t in labels), labels


def test_a_number_from_an_older_step_is_marked_with_its_step(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    """Issue 41: a run trained 20 steps (validation at 10 and 20), resumed to 25 by a blocklab
    that did not validate the last step: its summary (the resumed launch's) has no val/loss,
    so the table's val_loss is step 20's, beside step 25 — now marked, with the step in the
    CSV too. A run whose numbers are all from its last step is not marked."""
    logs = [[[0, 10, 3.0, 900.0, 3.2], [0, 20, 2.5, 900.0, 2.8]], [[0, 25, 2.4, 950.0, ""]]]
    old = make_run(tmp_path, "resumed", make_config(n_layers=1),
                   summary={"step": 25, "metrics": {"train/loss": 2.4,
                                                    "train/tokens_per_s": 950.0}},
                   logs=logs)
    new = make_run(tmp_path, "new", make_config(n_layers=2),
                   summary={**summary(25, 2.3, 2.6), "metric_steps": {
                       "train/loss": 25, "val/loss": 25, "train/tokens_per_s": 24}},
                   logs=[[[0, 24, 2.3, 999.0, ""], [0, 25, 2.3, "", 2.6]]])
    rows = {r["name"]: r for r in compare.collect([old, new])}
    assert (rows["resumed"]["val_loss"], rows["resumed"]["val_loss_step"]) == (2.8, 20)
    assert (rows["resumed"]["train_loss"], rows["resumed"]["train_loss_step"]) == (2.4, 25)
    assert rows["new"]["val_loss_step"] == 25 and rows["new"]["tokens_per_s_step"] == 24
    assert compare.main([str(old), str(new), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    line = next(ln for ln in printed.splitlines() if ln.startswith("| resumed"))
    assert "| 2.4 | 2.8 (step 20) |" in line
    line = next(ln for ln in printed.splitlines() if ln.startswith("| new"))
    assert "| 2.3 | 2.6 |" in line and "| 12345 (step 24) |" in line
    with (tmp_path / "out" / "compare.csv").open() as fh:
        csv_rows = {r["run"]: r for r in csv.DictReader(fh)}
    assert csv_rows["resumed"]["val_loss"] == "2.8" and csv_rows["resumed"]["val_loss_step"] == "20"
    assert "(step" in (tmp_path / "out" / "compare.md").read_text()


def test_an_old_summarys_number_takes_its_step_from_the_curve_when_they_agree(
        tmp_path: Path) -> None:
    run = make_run(tmp_path, "r", make_config(), summary=summary(20, 2.0, 2.5),
                   logs=[[[0, 10, 3.0, 9.0, 2.5], [0, 20, 2.0, 9.0, ""]]])
    (row,) = compare.collect([run])
    assert (row["val_loss"], row["val_loss_step"], row["train_loss_step"]) == (2.5, 10, 20)
    assert row["tokens_per_s_step"] is None  # 12345 in the summary, 9 in the curve: unknown
    assert "2.5 (step 10)" in compare.markdown_table([row])


def test_a_fifo_in_a_run_directory_is_no_file_and_blocks_nothing(tmp_path: Path) -> None:
    """Someone's run directory whose summary, checkpoint meta.json and metrics.csv are FIFOs:
    opening one would wait for a writer for ever. blocklab-compare (a fresh interpreter; the
    timeout is only a safety net) reads them as missing and still prints the run."""
    run = make_run(tmp_path, "r", make_config("rope", 1), checkpoints={4: None})
    for f in (run / "summary.json", run / "checkpoints" / "step-000004" / "meta.json",
              run / "logs" / "version_0" / "metrics.csv"):
        f.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(f)
    code = (f"from blocklab import compare; import sys; "
            f"sys.exit(compare.main([{str(run)!r}, '--out', {str(tmp_path / 'out')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| r |" in proc.stdout or "| r " in proc.stdout, proc.stdout

"""What a run gives its trackers: metric rows keyed by the same step numbers as the
checkpoints (the row of step 10 and ``step-000010`` describe the same model); the resolved
config as hyperparameters, the probe tables and plots, the checkpoints (opt-in) in wandb's
offline record and TensorBoard's event files, read back from the run directory (no mocks);
gradient norms and peak memory in every row."""

from __future__ import annotations

import csv
import glob
import json
import os
import struct
from pathlib import Path

import pytest

from blocklab import checkpoint as ckpt
from blocklab.config import compose
from blocklab.train.run import train


def rows(run_dir: Path) -> list[dict[str, str]]:
    return [r for f in sorted(run_dir.glob("logs/version_*/metrics.csv"))
            for r in csv.DictReader(f.open())]


def steps(rows_: list[dict[str, str]], column: str) -> list[int]:
    return sorted(int(r["step"]) for r in rows_ if r.get(column))


def test_metric_rows_are_keyed_by_the_checkpoint_step_numbers(tmp_path):
    run = train(compose("train", ["experiment=smoke", f"out_root={tmp_path}", "probes=none"]))
    logged = rows(run)
    saved = [int(p.name.removeprefix("step-")) for p in ckpt.list_checkpoints(run)]
    assert saved == [10, 20]
    assert steps(logged, "val/loss") == saved  # validated on exactly the checkpointed models
    assert steps(logged, "train/loss") == [5, 10, 15, 20]  # every log_every_steps=5 steps done
    assert ckpt.metadata(run / "checkpoints" / "step-000020")["step"] == 20


# ------------------------------------------------------------------ wandb's offline record
def wandb_records(offline_run: Path) -> list:
    """Every record of an offline run's ``run-*.wandb`` file: wandb's log format (LevelDB's:
    32 KiB blocks of chunks, each ``crc32 | length (2 bytes) | type``) of protobuf records."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = offline_run.glob("run-*.wandb")
    data, pos, chunk, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if room < 7 or (kind == 0 and length == 0):  # a block's zero-filled tail
            pos += room
            continue
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(chunk)
            out.append(record)
            chunk = b""
    return out


def history(records: list) -> dict[str, object]:
    """Every logged ``key -> value`` of the run's history (later steps win); a media value
    (a table, an image) is stored field by field under ``nested_key`` and put back together."""
    out: dict[str, object] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            for item in r.history.item:
                value = json.loads(item.value_json)
                if item.nested_key:
                    *outer, last = item.nested_key
                    node = out.setdefault("/".join(outer), {})
                    node[last] = value
                else:
                    out[item.key] = value
    return out


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> Path:
    """One short run with wandb (offline) and TensorBoard at once, per-layer gradient norms
    and checkpoints as artifacts; the final probes (coarse) give tables and plots."""
    out = tmp_path_factory.mktemp("tracked")
    return train(compose("train", [
        "experiment=smoke", f"out_root={out}", "logger=many", "logger.loggers=[wandb,tensorboard]",
        "logger.log_checkpoints=true", "trainer.log_grad_norm=layer", "trainer.max_steps=10",
        "model/position=alibi"]))


@pytest.mark.slow
def test_the_wandb_offline_record_holds_the_config_probe_tables_images_and_checkpoints(tracked):
    (offline,) = (tracked / "wandb").glob("offline-run-*")
    records = wandb_records(offline)
    config = {u.key: json.loads(u.value_json) for r in records
              if r.WhichOneof("record_type") == "config" for u in r.config.update}
    assert config["model.position.name"] == "alibi"  # runs group and filter by any key
    assert config["optim.name"] == "adamw" and config["trainer.max_steps"] == 10
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == tracked.name
    logged = history(records)
    table = logged["probe/coarse/cells"]
    assert table["_type"] == "table-file" and table["nrows"] > 0
    cells = json.loads((offline / "files" / table["path"]).read_text())
    assert "accuracy" in cells["columns"] and len(cells["data"]) == table["nrows"]
    assert logged["probe/coarse/litm"]["_type"] == "table-file"  # the lost-in-the-middle curve
    image = logged["probe/coarse/plot/niah"]
    assert image["_type"] == "images/separated" and image["format"] == "png"
    (png,) = image["filenames"]
    assert (offline / "files" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"
                 and r.artifact.type == "model"]
    assert [a.metadata and json.loads(a.metadata)["step"] for a in artifacts] == [10]


def _children_named(word: str) -> list[int]:
    """The live child processes of this one whose command name holds ``word`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone while we looked
            continue
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if word in name and int(rest[1]) == os.getpid() and rest[0] != "Z":
            out.append(int(stat.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads child processes from /proc")
def test_the_wandb_record_is_whole_when_the_run_returns(tracked):
    """``run.finish()`` returns before wandb's service has written the run's last records (the
    config among them): a reader right after the run could miss them. The run returns only
    once the service has closed the record and exited: the file ends with the exit record."""
    (offline,) = (tracked / "wandb").glob("offline-run-*")
    kinds = [r.WhichOneof("record_type") for r in wandb_records(offline)]
    assert kinds[-1] == "exit" and "config" in kinds
    assert _children_named("wandb") == []  # no service of this process is left running


@pytest.mark.slow
def test_tensorboard_gets_the_config_the_metrics_and_the_probe_plots(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {Path(p).parent for p in glob.glob(str(tracked / "tensorboard/**/events.*"),
                                                    recursive=True)}
    acc = EventAccumulator(str(events), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    assert "probe/coarse/plot/niah" in tags["images"]
    assert {"config/text_summary", "probe/coarse/cells/text_summary"} <= set(tags["tensors"])
    config = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "name: alibi" in config  # the resolved config, as YAML text
    hparams = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    assert b"model.position.name" in hparams and b"alibi" in hparams  # the HPARAMS dashboard
    assert [e.step for e in acc.Scalars("train/loss")] == [5, 10]


@pytest.mark.slow
def test_every_row_holds_the_gradient_norms_and_peak_memory(tracked):
    logged = [r for r in rows(tracked) if r.get("train/loss")]
    assert [int(r["step"]) for r in logged] == [5, 10]
    for r in logged:
        total = float(r["train/grad_norm"])
        layers = [float(v) for k, v in r.items() if k.startswith("train/grad_norm/") and v]
        assert any(k.startswith("train/grad_norm/") and ".blocks." in k for k in r)
        assert total == pytest.approx(sum(x * x for x in layers) ** 0.5, rel=1e-4)
        assert float(r["train/cpu_rss_peak_mb"]) > 0


def test_sweep_jobs_are_named_by_their_varied_keys_and_grouped_by_sweep(tmp_path):
    from omegaconf import OmegaConf

    from blocklab.train.loggers import sweep_job_names

    sweep = tmp_path / "sweep_2026-01-01_00-00-00"
    sweep.mkdir()
    OmegaConf.save({"hydra": {"overrides": {"task": [
        "experiment=smoke", "model/position=rope,alibi", "optim.lr=0.001,0.01"]},
        "sweeper": {"params": {"schedule.warmup_steps": "range(0,10)"}}}},
        sweep / "multirun.yaml")
    job = ["experiment=smoke", "model/position=alibi", "optim.lr=0.01", "schedule.warmup_steps=3"]
    assert sweep_job_names(sweep, job, 3) == (
        "model/position=alibi,optim.lr=0.01,schedule.warmup_steps=3", sweep.name)
    assert sweep_job_names(tmp_path / "elsewhere", job, 3) == ("job 3", "elsewhere")

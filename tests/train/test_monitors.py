"""The stability monitors (train/monitors.py): each reading against a direct computation on a
tiny model, the keys in every logger's files, the figures, the summary's divergence report (a
run made to diverge names it and the first monitor out of range; a healthy one reports none),
and an exact resume with the monitors on."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from blocklab.config import compose
from blocklab.config.monitor_schema import MonitorConfig
from blocklab.model import build_model
from blocklab.objectives import IGNORE, build_objective
from blocklab.train.monitor_plots import describe
from blocklab.train.monitors import Monitors, Readings, layer_name, param_group
from blocklab.train.run import train
from model.variants import VOCAB, tiny
from train.test_train_cli import losses, states_equal

PAD = 0


def batch_with_padding() -> dict[str, torch.Tensor]:
    """Two decoder rows, the second shorter (right-padded): labels IGNORE on padding."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (2, 12), generator=g)
    ids[1, 8:] = PAD
    labels = torch.roll(ids, -1, 1)
    labels[:, -1] = IGNORE
    labels[1, 7:] = IGNORE
    return {"input_ids": ids, "labels": labels}


def decoder_and_objective():
    torch.manual_seed(0)
    model = build_model(tiny("decoder")).eval()
    cfg = compose("train", ["experiment=smoke"])
    return model, build_objective("decoder", cfg.data)


def test_names_of_layers_and_parameter_groups():
    assert layer_name("decoder.blocks.3.attn") == "decoder.3"
    assert layer_name("decoder.blocks.3.cross") == "decoder.3.cross"
    assert layer_name("encoder.blocks.0") == "encoder.0"
    model, _ = decoder_and_objective()
    groups = {param_group(n) for n, _ in model.named_parameters()}
    assert groups == {"embedding", "attention", "ffn", "norm"} | ({"other"} & groups)
    assert param_group("decoder.blocks.0.norms.1.weight") == "norm"
    assert param_group("decoder.blocks.0.attn.q_norm.weight") == "norm"
    assert param_group("decoder.blocks.0.ffn.up.weight") == "ffn"
    assert param_group("head.weight") == "other"


def test_log_z_and_the_residual_stream_against_direct_computations():
    model, objective = decoder_and_objective()
    batch = batch_with_padding()
    row = Readings(model, objective, PAD)(batch)
    # log Z: torch.logsumexp over the vocabulary at the supervised positions
    with torch.no_grad():
        logits = model(batch["input_ids"]).float()
    logz = torch.logsumexp(logits[batch["labels"] != IGNORE], -1)
    assert row["monitor/logz_mean"] == pytest.approx(float(logz.mean()), rel=1e-5)
    assert row["monitor/logz_max"] == pytest.approx(float(logz.abs().max()), rel=1e-5)
    # the residual stream: every block's output captured by hooks of our own
    outs: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda m, a, o: outs.append(o.detach()))
             for b in model.decoder.blocks]
    with torch.no_grad():
        model(batch["input_ids"])
    for h in hooks:
        h.remove()
    real = batch["input_ids"] != PAD
    for i, x in enumerate(outs):
        rms = float(torch.sqrt(torch.mean(x[real] ** 2)))
        assert row[f"monitor/residual_rms/decoder.{i}"] == pytest.approx(rms, rel=1e-5)
        assert row[f"monitor/residual_max/decoder.{i}"] == pytest.approx(
            float(x[real].abs().max()), rel=1e-6)
        # negative control: the padding counted would give another RMS
        assert float(torch.sqrt(torch.mean(x ** 2))) != pytest.approx(rms, rel=1e-4)


def test_attention_logit_max_and_entropy_against_q_dot_k(monkeypatch):
    """The fused path's own q and k (captured from SDPA's arguments in a forward without the
    monitors), scored by hand: the largest causal q·k·scale and each head's mean entropy."""
    from blocklab.model import attention

    model, objective = decoder_and_objective()
    with torch.no_grad():  # sharper than at init: heads that differ
        for name, p in model.named_parameters():
            if ".attn." in name and p.dim() == 2:
                p.mul_(20.0)
    batch = batch_with_padding()
    row = Readings(model, objective, PAD)(batch)
    seen: list[tuple] = []
    real = attention.F.scaled_dot_product_attention

    def capture(q, k, v, **kw):
        seen.append((q, k, kw))
        return real(q, k, v, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", capture)
    with torch.no_grad():
        model(batch["input_ids"])
    assert len(seen) == len(model.decoder.blocks)
    for i, (q, k, kw) in enumerate(seen):
        assert kw.get("is_causal") and kw.get("attn_mask") is None
        scale = kw.get("scale") or q.shape[-1] ** -0.5
        s = (q @ k.transpose(-1, -2)) * scale  # (B, H, T, T)
        causal = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        s = s.masked_fill(~causal, float("-inf"))
        assert row[f"monitor/attn_logit_max/decoder.{i}"] == pytest.approx(float(s.max()),
                                                                           rel=1e-5)
        p = torch.softmax(s, -1)
        entropy = -(p * torch.log(p.clamp(min=1e-45))).sum(-1).mean((0, 2))  # (H,)
        assert row[f"monitor/attn_entropy_min/decoder.{i}"] == pytest.approx(
            float(entropy.min()), rel=1e-4)
        # negative control: the mean over heads is not the lowest head
        assert row[f"monitor/attn_entropy_min/decoder.{i}"] != pytest.approx(
            float(entropy.mean()), rel=1e-3)


def test_attention_stats_are_aggregated_per_layer():
    """What the ``stats`` hook gives (one dict per call): the largest logit over the calls, the
    lowest head of the entropy averaged over the calls."""
    model, objective = decoder_and_objective()
    reader = Readings(model, objective, PAD)
    fake = torch.nn.Module()
    fake.stats = None
    calls = [{"logit_max": torch.tensor(3.0), "entropy": torch.tensor([1.0, 0.2])},
             {"logit_max": torch.tensor(5.0), "entropy": torch.tensor([1.0, 0.6])}]

    def forward_hook(m, a, o):
        for module in (fake,):
            if module.stats is not None:
                module.stats.extend(calls)

    reader.attention = [("decoder.0", fake)]
    h = model.decoder.blocks[0].register_forward_hook(forward_hook)
    row = reader(batch_with_padding())
    h.remove()
    assert row["monitor/attn_logit_max/decoder.0"] == 5.0
    assert row["monitor/attn_entropy_min/decoder.0"] == pytest.approx(0.4)
    assert fake.stats is None  # reset after the read


@pytest.mark.parametrize("family", ["encoder", "encoder_decoder"])
def test_every_family_reads_through_its_objective(family):
    """The encoder (``valid``) and the encoder–decoder (``source_valid``, the target) stacks:
    every layer's readings, cross-attention included."""
    from blocklab.data.synthetic import Example

    torch.manual_seed(0)
    model = build_model(tiny(family)).eval()
    objective = build_objective(family, compose("train", ["experiment=smoke"]).data)
    examples = [Example(tokens=list(range(4, 4 + n)), targets=[False] * (n - 3) + [True] * 3)
                for n in (9, 6)]
    row = Readings(model, objective, PAD)(objective.collate(examples))
    stacks = ["encoder"] + (["decoder"] if family == "encoder_decoder" else [])
    for stack in stacks:
        blocks = getattr(model, stack).blocks
        for i in range(len(blocks)):
            for kind in ("attn_logit_max", "attn_entropy_min", "residual_rms"):
                assert math.isfinite(row[f"monitor/{kind}/{stack}.{i}"]), (kind, stack, i)
    if family == "encoder_decoder":
        assert "monitor/attn_logit_max/decoder.0.cross" in row
    assert math.isfinite(row["monitor/logz_mean"])


def test_update_ratio_by_hand():
    model, objective = decoder_and_objective()
    model.train()
    cb = Monitors(MonitorConfig(every=1), None)
    module = SimpleNamespace(model=model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = batch_with_padding()
    objective.loss(model, batch).loss.backward()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cb.on_before_optimizer_step(SimpleNamespace(global_step=0), module, opt)
    opt.step()
    ratios = cb.update_ratios(module)
    params = dict(model.named_parameters())
    for group in ("embedding", "attention", "ffn", "norm"):
        names = [n for n in before if param_group(n) == group]
        delta = sum(float(((params[n].detach() - before[n]) ** 2).sum())
                    for n in names)
        norm = sum(float((before[n] ** 2).sum()) for n in names)
        assert ratios[f"monitor/update_ratio/{group}"] == pytest.approx(
            math.sqrt(delta / norm), rel=1e-5)
    # SGD: the update is lr · gradient
    g = [p.grad for n, p in model.named_parameters() if param_group(n) == "ffn"]
    by_grad = 0.1 * torch.cat([x.reshape(-1) for x in g]).norm() / torch.cat(
        [before[n].reshape(-1) for n in before if param_group(n) == "ffn"]).norm()
    assert ratios["monitor/update_ratio/ffn"] == pytest.approx(float(by_grad), rel=1e-4)


def test_ranges_and_the_first_monitor_out_of_range():
    cb = Monitors(MonitorConfig(every=1, residual_max=10.0, logz_max=5.0, loss_window=1), None)
    cb.record(1, {"monitor/residual_rms/decoder.0": 1.0, "monitor/logz_mean": -1.0})
    cb.record(2, {"monitor/residual_rms/decoder.0": 9.0, "monitor/logz_mean": -6.0})
    cb.record(3, {"monitor/residual_rms/decoder.0": 11.0})
    assert cb.first_out["name"] == "logz_mean" and cb.first_out["step"] == 2
    assert [f["name"] for f in cb.report()["out_of_range"]] == ["logz_mean",
                                                                "residual_rms/decoder.0"]
    for step, loss in [(1, 5.0), (2, 4.0), (3, 4.9), (4, 5.2)]:
        cb._loss(step, loss)
    assert cb.diverged == {"step": 4, "loss": 5.2, "running_min": 4.0,
                           "why": "the loss more than 1 nats over its running minimum"}
    line = describe(cb.report())
    assert line.startswith("diverged at step 4 (loss 5.2, running min 4; the loss more than 1 "
                           "nats over its running minimum); first monitor out "
                           "of range: logz_mean at step 2 (|-6| > limit 5)"), line


def test_a_noisy_loss_is_no_divergence_and_a_blow_up_is_caught_at_once():
    """The default run's task mixture gives step losses 1.2 nats apart batch to batch: the
    moving average (monitors.loss_window) does not call that a divergence, the raw loss does
    (the control); a loss that jumps for good is caught at its first step all the same."""
    noisy = [4.0 - 0.01 * i + (1.2 if i % 7 == 3 else 0.0) for i in range(200)]
    smooth = Monitors(MonitorConfig(every=1), None)
    raw = Monitors(MonitorConfig(every=1, loss_window=1), None)
    for step, loss in enumerate(noisy):
        smooth._loss(step, loss)
        raw._loss(step, loss)
    assert smooth.diverged is None
    assert raw.diverged is not None and raw.diverged["step"] == 3  # the first spike
    blow = Monitors(MonitorConfig(every=1), None)
    for step, loss in enumerate([3.0] * 50 + [20.0] * 5):
        blow._loss(step, loss)
    assert blow.diverged["step"] == 50
    # the weight is 2 / (window + 1): 3 + (2 / 21) · 17 = 4.62 > 3 + 1
    assert blow.diverged["loss"] == pytest.approx(3.0 + 2 / 21 * 17.0)
    assert blow.diverged["running_min"] == pytest.approx(3.0)


# ------------------------------------------------------------------ runs end to end
RUN = ["experiment=smoke", "probes=none", "trainer.log_every_steps=1"]


def run(out: Path, *extra: str) -> Path:
    overrides = [*RUN, *extra, f"run_dir={out}"]
    train(compose("train", overrides), overrides)
    return out


@pytest.mark.slow
def test_every_logger_gets_the_rows_and_the_figures_are_written(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    d = run(tmp_path / "run", "monitors.every=5", "logger=many",
            "logger.loggers=[tensorboard,wandb]")
    keys = ["monitor/attn_logit_max/decoder.0", "monitor/attn_entropy_min/decoder.1",
            "monitor/logz_mean", "monitor/logz_max", "monitor/residual_rms/decoder.0",
            "monitor/residual_max/decoder.1", "monitor/update_ratio/ffn",
            "monitor/update_ratio/embedding"]
    header = (next(d.glob("logs/version_*/metrics.csv"))).read_text().splitlines()[0]
    for k in keys:
        assert k in header.split(","), k
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = d.glob("tensorboard/**/events.out.tfevents.*")
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for k in keys:
        assert k in tags, k
    assert [e.step for e in acc.Scalars("monitor/logz_mean")] == [5, 10, 15, 20]
    (wandb_file,) = d.glob("wandb/**/run-*.wandb")
    data = wandb_file.read_bytes()
    for k in keys:
        assert k.encode() in data, k
    for png in ("attn_logit_max", "attn_entropy_min", "logz", "residual_rms", "residual_max",
                "update_ratio", "grad_norm"):
        assert (d / "monitors" / f"{png}.png").stat().st_size > 1000, png
    series = json.loads((d / "monitors" / "monitors.json").read_text())["series"]
    assert [p[0] for p in series["monitor/logz_mean"]] == [5, 10, 15, 20]
    summary = json.loads((d / "summary.json").read_text())
    assert summary["precision"].startswith("32-true: fp32")
    # negative control: a healthy run reports no divergence
    assert summary["monitors"].startswith("no divergence"), summary["monitors"]
    assert summary["monitor_report"]["diverged"] is None


@pytest.mark.slow
def test_a_run_made_to_diverge_names_the_step_and_the_first_monitor_out_of_range(tmp_path,
                                                                                 capsys):
    d = run(tmp_path / "run", "monitors.every=1", "optim.lr=30", "optim.grad_clip=0",
            "schedule.warmup_steps=0", "trainer.skip_nonfinite=100")
    out = capsys.readouterr().out
    summary = json.loads((d / "summary.json").read_text())
    report = summary["monitor_report"]
    assert report["diverged"] is not None and report["first_out_of_range"] is not None
    line = summary["monitors"]
    assert line.startswith(f"diverged at step {report['diverged']['step']} (loss ")
    assert f"first monitor out of range: {report['first_out_of_range']['name']} at step " in line
    assert line in out  # printed with the summary
    # the figures mark the divergence
    assert (d / "monitors" / "update_ratio.png").is_file()


@pytest.mark.slow
def test_a_resume_with_the_monitors_on_is_exact(tmp_path):
    args = ("monitors.every=2", "model.dropout=0.1", "trainer.accumulate=2",
            "trainer.max_steps=16", "trainer.ckpt_every_steps=8")
    straight = run(tmp_path / "straight", *args)
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-000016")
    overrides = [*RUN, *args, f"resume={resumed}"]
    train(compose("train", overrides), overrides)
    assert losses(straight) == losses(resumed)
    a = torch.load(straight / "checkpoints/step-000016/state.pt", weights_only=True)
    b = torch.load(resumed / "checkpoints/step-000016/state.pt", weights_only=True)
    for key in ("state_dict", "optimizer_states"):
        assert not states_equal(a[key], b[key]), key
    sa = json.loads((straight / "monitors" / "monitors.json").read_text())["series"]
    sb = json.loads((resumed / "monitors" / "monitors.json").read_text())["series"]
    assert sa == sb and len(sa["monitor/logz_mean"]) == 8
